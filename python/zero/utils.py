"""Reading checkpoints in Python, as DeepSpeed's deepspeed.utils.zero_to_fp32 does."""
import collections
import ctypes
import os

import torch

from ._lib import call


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None):
    """{name: fp32 tensor} of a zero or DeepSpeed checkpoint (checkpoint_dir/tag; tag None: what
    checkpoint_dir/latest names), consolidated from every rank's partitions, tied names included.
    Reads no pickle and needs no engine or process group."""
    h = ctypes.c_void_p()
    call("zero_checkpoint_open", os.fspath(checkpoint_dir).encode(),
         None if tag is None else str(tag).encode(), ctypes.byref(h))
    try:
        n = ctypes.c_size_t()
        call("zero_checkpoint_num_tensors", h, ctypes.byref(n))
        out = collections.OrderedDict()
        for i in range(n.value):
            name, ndim = ctypes.c_char_p(), ctypes.c_size_t()
            shape = (ctypes.c_int64 * 16)()
            call("zero_checkpoint_tensor", h, i, ctypes.byref(name), shape, 16, ctypes.byref(ndim))
            dims = tuple(shape[d] for d in range(ndim.value))
            t = torch.empty(dims, dtype=torch.float32)
            call("zero_checkpoint_read_fp32", h, i, ctypes.c_void_p(t.data_ptr()), t.numel())
            out[name.value.decode()] = t
        return out
    finally:
        call("zero_checkpoint_close", h)
