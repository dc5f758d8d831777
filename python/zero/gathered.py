"""zero.GatheredParameters: read (and change) parameters whole outside a module's forward."""
from ._lib import ZeroError
from ._stage3 import live_fetcher_of
from .partitioned_init import _world as partitioned_world
from .partitioned_init import gather, is_partitioned_param, partition


class GatheredParameters:
    """Context manager: inside it, the given parameters (one, or an iterable) of a zero engine's
    model hold their full values. At stages 0-2 they always do; at stage 3 their units are
    gathered on entry and released on exit. Collective: every rank enters it with the same
    parameters in the same order.

    modifier_rank: None, or the rank whose changes to the parameters' values inside the context
    count. On exit that rank's values go to every rank and become the engine's master weights
    and model copy (rounded to the training dtype), at every stage, so training continues from
    them; optimizer states are kept. Inside such a context each rank's parameters at stages 0-2
    are its own copies (where the ranks share one model copy, another rank's writes would
    otherwise land in the modifier's). With None, changes made inside the context are not kept
    at stage 3 (the gathered copy is dropped), as in DeepSpeed.

    Parameters built under zero.Init that no engine holds yet are gathered over torch's default
    process group on entry and partitioned again on exit (keeping modifier_rank's values).

    fwd_module is accepted for DeepSpeed compatibility and not used."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        if params is None:
            params = []
        elif hasattr(params, "data") and hasattr(params, "requires_grad"):
            params = [params]
        self.params = list(params)
        if modifier_rank is not None and (isinstance(modifier_rank, bool)
                                          or not isinstance(modifier_rank, int)):
            raise ZeroError(f"GatheredParameters: modifier_rank={modifier_rank!r}; expected None "
                            "or a rank (an int)")
        self.modifier_rank = modifier_rank
        self.enabled = enabled
        self.units = []
        self.fetcher = None
        self.partitioned = []
        self.own_copies = []  # engines (stages 0-2) whose parameters are copies inside the context
        self.own_persistent = []  # (engine, stage-3 persistent parameter) likewise

    def __enter__(self):
        if not self.enabled:
            return self
        if self.modifier_rank is not None:
            for p in self.params:
                engine = self._engine_of(p)
                if engine is not None and not 0 <= self.modifier_rank < engine.world_size:
                    raise ZeroError(f"GatheredParameters: modifier_rank={self.modifier_rank} is "
                                    f"not a rank (the world has {engine.world_size})")
        self.partitioned = [p for p in self.params if is_partitioned_param(p)]
        world = partitioned_world()[1]
        if self.partitioned and self.modifier_rank is not None and not (
                0 <= self.modifier_rank < world):
            raise ZeroError(f"GatheredParameters: modifier_rank={self.modifier_rank} is not a "
                            f"rank (the world has {world})")
        for p in self.partitioned:
            gather(p)
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
        if self.modifier_rank is not None:
            # Where a parameter views a model copy other ranks may read (stages 0-2, and stage 3's
            # persistent units, which processes of one host may share), each rank writes a copy
            # of its own inside the context: only the modifier's values count.
            self.own_copies = [e for e in self._engines() if e._fetcher is None]
            for p in self.params:
                engine = self._engine_of(p)
                if engine in self.own_copies:
                    p.data = p.data.clone()
                elif engine is not None and engine._fetcher.is_persistent(p):
                    p.data = p.data.clone()
                    self.own_persistent.append((engine, p))
        return self

    def _engines(self):
        """The live engines holding any of the parameters, each once, in order."""
        engines = []
        for p in self.params:
            engine = self._engine_of(p)
            if engine is not None and engine not in engines:
                engines.append(engine)
        return engines

    def __exit__(self, exc_type, *_):
        try:
            # A failure inside the context on one rank would leave the others waiting in the
            # broadcast: keep nothing then (the exception goes on).
            if self.enabled and self.modifier_rank is not None and exc_type is None:
                for p in self.params:
                    engine = self._engine_of(p)
                    if engine is not None:
                        engine._set_param(p._zero_index, p.data, self.modifier_rank)
        finally:
            # Stages 0-2: the parameters are the engine's model copy again (their own copies of
            # the context, or a .data replaced in it, dropped), whatever happened inside.
            for engine in self.own_copies:
                if engine._handle is not None:
                    engine._alias_model_copy()
            self.own_copies = []
            for engine, p in self.own_persistent:
                if engine._handle is not None:
                    engine._fetcher.rebind(p)
            self.own_persistent = []
            keep = self.enabled and self.modifier_rank is not None and exc_type is None
            for p in self.partitioned:
                partition(p, keep_values=keep, root=self.modifier_rank if keep else 0)
            self.partitioned = []
            for u in self.units:
                self.fetcher.forward_refs[u] -= 1
                if self.fetcher.forward_refs[u] == 0:
                    self.fetcher.release(u)
            self.units = []
        return False

    @staticmethod
    def _engine_of(param):
        """The live engine that holds `param`, or None (not a zero engine's parameter)."""
        owner = getattr(param, "_zero_owner", None)
        engine = owner() if owner is not None else None
        return engine if engine is not None and engine._handle is not None else None
