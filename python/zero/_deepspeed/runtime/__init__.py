"""deepspeed.runtime."""
from . import lr_schedules, zero  # noqa: F401
