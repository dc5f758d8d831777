"""Tensors over memory the engine owns (no copy): the model copy at stages 0-2, gathered units at
stage 3, gradient slots."""
import ctypes

import torch


def tensor_at(ptr, nbytes, dtype, shape):
    """A tensor of `dtype` and `shape` over nbytes at address ptr. The caller keeps the memory
    alive for the tensor's life."""
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    buf = (ctypes.c_char * nbytes).from_address(ptr)
    return torch.frombuffer(buf, dtype=dtype).view(shape)
