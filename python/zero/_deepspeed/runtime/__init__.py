"""deepspeed.runtime."""
from . import lr_schedules  # noqa: F401
