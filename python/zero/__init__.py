"""zero: a ZeRO optimizer runtime with DeepSpeed's Python interface.

    import zero
    engine, optimizer, _, scheduler = zero.initialize(model=model,
        model_parameters=model.parameters(), config="ds_config.json")
    loss = loss_fn(engine(x), y); engine.backward(loss); engine.step()

Launch on N processes with `torchrun --nproc-per-node N train.py` or `mpirun -np N python
train.py`: ranks on one host talk through shared memory.
"""
from ._lib import ZeroError, lib as _libzero
from .engine import ZeroConfigWarning, ZeroEngine
from .gathered import GatheredParameters
from .initialize import initialize
from .partitioned_init import Init
from . import utils

__version__ = _libzero.zero_version().decode()

__all__ = ["initialize", "Init", "ZeroEngine", "ZeroConfigWarning", "GatheredParameters", "ZeroError", "utils",
           "__version__"]
