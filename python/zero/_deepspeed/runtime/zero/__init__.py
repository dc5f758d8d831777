"""deepspeed.runtime.zero: the stage-3 names callers reach through this path."""
from ....gathered import GatheredParameters
from ....partitioned_init import Init
from . import partition_parameters  # noqa: F401

__all__ = ["GatheredParameters", "Init"]
