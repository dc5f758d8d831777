"""deepspeed.ops: optimizer names that callers construct and pass to initialize."""
from . import adam  # noqa: F401
