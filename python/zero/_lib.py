"""ctypes bindings of libzero.so (the C ABI in zero/zero_c.h).

Every call goes through `call`, which turns a non-zero status into a ZeroError carrying the
library's message. The library is found, in order, at $ZERO_LIBRARY, next to this file (where
`pip install` puts it), or wherever the dynamic loader finds libzero.so.0 (a `cmake --install`
prefix on the loader's path).
"""
import ctypes
import ctypes.util
import os
from pathlib import Path

# torch first: a libzero.so built with the CUDA toolkit needs libnccl.so.2 and libcudart.so, and
# whichever copy is loaded first serves the whole process. Loaded before torch, the toolkit's
# older NCCL would shadow the one torch's wheel ships (torch then fails to import: "undefined
# symbol: ncclCommResume"); loaded after, libzero.so binds to torch's newer, compatible copies.
import torch  # noqa: F401

ABI_VERSION = 6

F32, F16, BF16, F64 = 0, 1, 2, 3
STATUS_NAMES = {1: "invalid argument", 2: "config", 3: "I/O", 4: "communication",
                5: "out of memory", 6: "CUDA", 7: "runtime", 8: "callback"}


class ZeroError(RuntimeError):
    """Every error the zero package raises. `status` is the C ABI's ZERO_ERR_* code (0 when the
    Python side found the problem)."""

    def __init__(self, message, status=0):
        super().__init__(message)
        self.status = status


c_int64_p = ctypes.POINTER(ctypes.c_int64)


class ParamSpec(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("shape", c_int64_p), ("ndim", ctypes.c_size_t),
                ("dtype", ctypes.c_int), ("group", ctypes.c_int), ("unit", ctypes.c_int),
                ("trainable", ctypes.c_int), ("tied_names", ctypes.POINTER(ctypes.c_char_p)),
                ("n_tied", ctypes.c_size_t)]


class GroupOptions(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_double), ("weight_decay", ctypes.c_double)]


class EngineOptions(ctypes.Structure):
    _fields_ = [("groups", ctypes.POINTER(GroupOptions)), ("n_groups", ctypes.c_size_t),
                ("kernel_threads", ctypes.c_int), ("kernel_isa", ctypes.c_char_p),
                ("device", ctypes.c_char_p)]


class StepResult(ctypes.Structure):
    _fields_ = [("boundary", ctypes.c_int), ("skipped", ctypes.c_int),
                ("global_steps", ctypes.c_int64), ("skipped_steps", ctypes.c_int64),
                ("lr", ctypes.c_double), ("grad_norm", ctypes.c_double),
                ("loss_scale", ctypes.c_double)]


class EngineInfo(ctypes.Structure):
    _fields_ = [("stage", ctypes.c_int), ("rank", ctypes.c_int), ("world_size", ctypes.c_int),
                ("dtype", ctypes.c_int), ("train_batch_size", ctypes.c_int64),
                ("train_micro_batch_size_per_gpu", ctypes.c_int64),
                ("gradient_accumulation_steps", ctypes.c_int64), ("num_params", ctypes.c_size_t),
                ("num_units", ctypes.c_size_t), ("num_groups", ctypes.c_size_t),
                ("gradient_clipping", ctypes.c_double)]


INIT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.POINTER(ctypes.c_float), ctypes.c_size_t)

P = ctypes.c_void_p
_SIGNATURES = {
    "zero_abi_version": ([], ctypes.c_int),
    "zero_version": ([], ctypes.c_char_p),
    "zero_last_error": ([], ctypes.c_char_p),
    "zero_free": ([P], None),
    "zero_comm_create_env": ([ctypes.c_int, ctypes.POINTER(P)], ctypes.c_int),
    "zero_comm_rank": ([P, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
    "zero_comm_size": ([P, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
    "zero_comm_backend": ([P, ctypes.POINTER(ctypes.c_char_p)], ctypes.c_int),
    "zero_comm_all_reduce": ([P, P, P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int], ctypes.c_int),
    "zero_comm_broadcast": ([P, P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int], ctypes.c_int),
    "zero_comm_barrier": ([P], ctypes.c_int),
    "zero_comm_destroy": ([P], ctypes.c_int),
    "zero_engine_create": ([ctypes.c_char_p, P, ctypes.POINTER(ParamSpec), ctypes.c_size_t,
                            ctypes.POINTER(EngineOptions), INIT_FN, P, ctypes.POINTER(P)],
                           ctypes.c_int),
    "zero_engine_destroy": ([P], ctypes.c_int),
    "zero_engine_info_get": ([P, ctypes.POINTER(EngineInfo)], ctypes.c_int),
    "zero_engine_gather": ([P, ctypes.c_int], ctypes.c_int),
    "zero_engine_gather_on_stream": ([P, ctypes.c_int, P], ctypes.c_int),
    "zero_engine_release": ([P, ctypes.c_int], ctypes.c_int),
    "zero_engine_release_kept": ([P, ctypes.c_int, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
    "zero_engine_unit_persistent": ([P, ctypes.c_int, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
    "zero_engine_param": ([P, ctypes.c_size_t, ctypes.POINTER(P), ctypes.POINTER(ctypes.c_size_t)],
                          ctypes.c_int),
    "zero_engine_backward_scale": ([P, ctypes.POINTER(ctypes.c_double)], ctypes.c_int),
    "zero_engine_grad": ([P, ctypes.c_size_t, ctypes.POINTER(P), ctypes.POINTER(ctypes.c_size_t)],
                         ctypes.c_int),
    "zero_engine_grad_ready": ([P, ctypes.c_size_t], ctypes.c_int),
    "zero_engine_grad_copy": ([P, ctypes.c_size_t, P, ctypes.c_size_t], ctypes.c_int),
    "zero_engine_grad_lend": ([P, ctypes.c_size_t, P, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)],
                              ctypes.c_int),
    "zero_engine_grad_copy_on_stream": ([P, ctypes.c_size_t, P, ctypes.c_size_t, P], ctypes.c_int),
    "zero_engine_step": ([P, ctypes.POINTER(StepResult)], ctypes.c_int),
    "zero_engine_gather_master": ([P, ctypes.c_size_t, P, ctypes.c_size_t], ctypes.c_int),
    "zero_engine_set_param": ([P, ctypes.c_size_t, P, ctypes.c_size_t, ctypes.c_int],
                              ctypes.c_int),
    "zero_engine_lr": ([P, ctypes.c_int, ctypes.POINTER(ctypes.c_double)], ctypes.c_int),
    "zero_engine_set_lr": ([P, ctypes.c_int, ctypes.c_double], ctypes.c_int),
    "zero_engine_set_accumulation_boundary": ([P, ctypes.c_int], ctypes.c_int),
    "zero_engine_set_step_in_backward": ([P, ctypes.c_int, ctypes.POINTER(ctypes.c_int)],
                                         ctypes.c_int),
    "zero_engine_global_steps": ([P, ctypes.POINTER(ctypes.c_int64)], ctypes.c_int),
    "zero_engine_loss_scale": ([P, ctypes.POINTER(ctypes.c_double)], ctypes.c_int),
    "zero_engine_save_checkpoint": ([P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p],
                                    ctypes.c_int),
    "zero_engine_load_checkpoint": ([P, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(P),
                                     ctypes.POINTER(P)], ctypes.c_int),
    "zero_engine_memory_json": ([P, ctypes.POINTER(P)], ctypes.c_int),
    "zero_engine_config_warnings_json": ([P, ctypes.POINTER(P)], ctypes.c_int),
    "zero_engine_timings_json": ([P, ctypes.POINTER(P)], ctypes.c_int),
    "zero_engine_reset_timings": ([P], ctypes.c_int),
    "zero_checkpoint_open": ([ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(P)], ctypes.c_int),
    "zero_checkpoint_close": ([P], ctypes.c_int),
    "zero_checkpoint_num_tensors": ([P, ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int),
    "zero_checkpoint_tensor": ([P, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p), c_int64_p,
                                ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int),
    "zero_checkpoint_read_fp32": ([P, ctypes.c_size_t, P, ctypes.c_size_t], ctypes.c_int),
    "zero_checkpoint_tensor_dtype": ([P, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
}


def _candidates():
    env = os.environ.get("ZERO_LIBRARY")
    if env:
        yield env
    here = Path(__file__).resolve().parent
    for name in ("libzero.so.0", "libzero.so"):
        if (here / name).exists():
            yield str(here / name)
    found = ctypes.util.find_library("zero")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path}: {e}")
            continue
        for name, (args, res) in _SIGNATURES.items():
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes, fn.restype = args, res
        version = lib.zero_abi_version()
        if version != ABI_VERSION:
            raise ZeroError(f"{path} has C ABI version {version}, but this package was written "
                            f"for version {ABI_VERSION}: reinstall the package (pip install "
                            f"./python) so the library and the bindings match")
        return lib
    detail = "; ".join(tried) if tried else "no candidate found"
    raise ZeroError("cannot load libzero.so: " + detail + ". Install the package with "
                    "`pip install ./python` from the repository (it builds and bundles the "
                    "library), or set ZERO_LIBRARY to the path of libzero.so.0")


lib = _load()


def bind(fn_name):
    """lib.<fn_name> as a function that raises ZeroError with the library's message on failure
    (looked up once: for calls on a hot path)."""
    fn = getattr(lib, fn_name, None)
    if fn is None:
        raise ZeroError(f"the loaded libzero.so has no {fn_name}: reinstall the package "
                        "(pip install ./python) so the library matches it")

    def bound(*args):
        status = fn(*args)
        if status != 0:
            message = (lib.zero_last_error() or b"").decode(errors="replace")
            raise ZeroError(message or f"{fn_name} failed ({STATUS_NAMES.get(status, status)})",
                            status)
    return bound


def call(fn_name, *args):
    """Calls lib.<fn_name>(*args); raises ZeroError with the library's message on failure."""
    bind(fn_name)(*args)


def take_string(p):
    """The text of a char* the library allocated; frees it."""
    if not p:
        return None
    try:
        return ctypes.string_at(p).decode()
    finally:
        lib.zero_free(p)
