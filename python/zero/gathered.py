"""zero.GatheredParameters: read stage-3 parameters whole outside a module's forward."""
from ._lib import ZeroError
from ._stage3 import live_fetcher_of


class GatheredParameters:
    """Context manager: inside it, the given parameters (one, or an iterable) of a zero engine's
    model hold their full values. At stages 0-2 they always do, and it does nothing. Collective at
    stage 3: every rank enters it with the same parameters.

    modifier_rank: DeepSpeed broadcasts modifications made on that rank when the context exits;
    zero does not support modifying parameters this way yet (modify them before initialize),
    so it must be None."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        if modifier_rank is not None:
            raise ZeroError(f"GatheredParameters(modifier_rank={modifier_rank}): modifying "
                            "parameters inside the context is not supported; set their values "
                            "before zero.initialize, or load a checkpoint")
        if params is None:
            params = []
        elif hasattr(params, "data") and hasattr(params, "requires_grad"):
            params = [params]
        self.params = list(params)
        self.enabled = enabled
        self.units = []
        self.fetcher = None

    def __enter__(self):
        if not self.enabled:
            return self
        for p in self.params:
            fetcher, unit = live_fetcher_of(p)
            if fetcher is None:
                continue
            self.fetcher = fetcher
            if unit not in self.units:
                self.units.append(unit)
        for u in self.units:
            self.fetcher.forward_refs[u] = self.fetcher.forward_refs.get(u, 0) + 1
            self.fetcher.ensure_gathered(u)
        return self

    def __exit__(self, *exc):
        for u in self.units:
            self.fetcher.forward_refs[u] -= 1
            if self.fetcher.forward_refs[u] == 0:
                self.fetcher.release(u)
        self.units = []
        return False
