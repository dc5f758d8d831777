"""What `import deepspeed` gives a script run under zero.as_deepspeed: DeepSpeed's module-level
API on zero's engine. Submodules follow DeepSpeed's layout (deepspeed.comm, deepspeed.utils,
deepspeed.accelerator, deepspeed.runtime.lr_schedules, deepspeed.launcher.runner,
deepspeed.checkpoint.utils, deepspeed.zero) with the names accelerate and transformers use."""
from ..engine import ZeroEngine as DeepSpeedEngine
from ..initialize import initialize as _zero_initialize
from . import accelerator, checkpoint, comm, launcher, ops, runtime, utils, zero  # noqa: F401


def initialize(*args, dist_init_required=None, **kwargs):
    """deepspeed.initialize: zero.initialize, after making torch's default process group as
    DeepSpeed's does (callers such as the Hugging Face Trainer use torch.distributed next)."""
    if dist_init_required is not False:
        comm.init_distributed()
    return _zero_initialize(*args, **kwargs)


initialize.__wrapped__ = _zero_initialize


def _version():
    from ..as_deepspeed import deepspeed_version
    return deepspeed_version()


__version__ = _version()
__version_major__, __version_minor__, __version_patch__ = (
    int(x) for x in __version__.split("+")[0].split("."))
init_distributed = comm.init_distributed

__all__ = ["initialize", "init_distributed", "DeepSpeedEngine", "__version__"]
