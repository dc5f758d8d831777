"""deepspeed.zero: GatheredParameters (zero's). Init, the stage-3 context that builds a model
already partitioned, is not served yet: entering it raises ZeroError naming what to do."""
from ..gathered import GatheredParameters
from .._lib import ZeroError

__all__ = ["GatheredParameters", "Init"]


class Init:
    """deepspeed.zero.Init(...): not served yet (issue 32). Raises on entry, so that a script
    learns it at once rather than training a model that was never partitioned."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        raise ZeroError("deepspeed.zero.Init (building a model already partitioned for ZeRO "
                        "stage 3) is not supported by zero yet: build the model outside it; "
                        "zero.initialize partitions it at stage 3")

    def __exit__(self, *exc):
        return False
