"""The process's communicator, as the launcher's environment describes it (torchrun, mpirun, a
DeepSpeed launcher), or none: one rank."""
import ctypes
import os

from . import _lib
from ._lib import ZeroError, call

# The environment variables a launcher sets; any of them present means "launched".
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE",
                      "PMI_RANK")


def comm_timeout_ms():
    value = os.environ.get("ZERO_COMM_TIMEOUT_S", "300")
    try:
        seconds = float(value)
    except ValueError:
        raise ZeroError(f"ZERO_COMM_TIMEOUT_S={value!r} is not a number of seconds") from None
    if seconds <= 0:
        raise ZeroError(f"ZERO_COMM_TIMEOUT_S={value!r}: expected a positive number of seconds")
    return int(seconds * 1000)


class Comm:
    """The process's communicator: what the launcher's environment says, or one rank."""

    def __init__(self):
        self.handle = None
        if any(v in os.environ for v in LAUNCHER_VARIABLES):
            h = ctypes.c_void_p()
            call("zero_comm_create_env", comm_timeout_ms(), ctypes.byref(h))
            self.handle = h

    def destroy(self):
        """DeepSpeed's name for close()."""
        self.close()

    def close(self):
        if self.handle is not None:
            _lib.lib.zero_comm_destroy(self.handle)
            self.handle = None
