"""deepspeed.launcher."""
from . import runner  # noqa: F401
