"""deepspeed.zero: Init (build a model already partitioned for stage 3) and GatheredParameters,
zero's own (zero.partitioned_init, zero.gathered)."""
from ..gathered import GatheredParameters
from ..partitioned_init import Init

__all__ = ["GatheredParameters", "Init"]
