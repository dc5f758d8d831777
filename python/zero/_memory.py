"""Tensors over memory the engine owns (no copy): the model copy at stages 0-2, gathered units at
stage 3, gradient slots. On the host through a ctypes buffer; on a GPU through the CUDA array
interface (torch.as_tensor takes it without a copy), or torch's constructor of a storage over
memory it does not own where torch has one."""
import ctypes

import torch

# The CUDA array interface has no bfloat16: 16-bit tensors are made as int16 and viewed.
_CAI_TYPES = {torch.float32: ("<f4", torch.float32), torch.float16: ("<f2", torch.float16),
              torch.bfloat16: ("<i2", torch.int16)}


class _DeviceMemory:
    """Device memory at `ptr` described by __cuda_array_interface__ (version 3)."""

    def __init__(self, ptr, shape, typestr):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (ptr, False), "version": 3, "strides": None,
                                         # The memory is ready: every engine call returns with its
                                         # device work complete, or (a stage-3 gather) ordered
                                         # before torch's current stream's later work.
                                         "stream": None}


def current_stream_getter(device):
    """A function giving torch's current CUDA stream on `device` as a raw cudaStream_t (an int;
    0 is the legacy default stream): torch's internal accessor where it has one (a fraction of a
    microsecond), else torch.cuda.current_stream(device).cuda_stream."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return lambda: raw(index)
    return lambda: torch.cuda.current_stream(index).cuda_stream


# torch's own constructor of a storage over memory it does not own (no deleter), where torch has
# it: a few microseconds, against tens for a tensor through the CUDA array interface.
_storage_at = getattr(torch._C, "_construct_storage_from_data_pointer", None)


def tensor_at(ptr, nbytes, dtype, shape, device=None):
    """A tensor of `dtype` and `shape` over nbytes at address ptr: host memory, or memory of the
    CUDA `device` (a torch.device). The caller keeps the memory alive for the tensor's life."""
    on_gpu = device is not None and device.type == "cuda"
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    if on_gpu and _storage_at is not None:
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        storage = _storage_at(ptr, device, nbytes)
        return torch.empty(0, dtype=dtype, device=device).set_(storage, 0, shape)
    if on_gpu:
        typestr, made_as = _CAI_TYPES[dtype]
        numel = nbytes // torch.empty((), dtype=dtype).element_size()
        flat = torch.as_tensor(_DeviceMemory(ptr, (numel,), typestr), device=device)
        return flat.view(dtype).view(shape) if made_as != dtype else flat.view(shape)
    buf = (ctypes.c_char * nbytes).from_address(ptr)
    return torch.frombuffer(buf, dtype=dtype).view(shape)
