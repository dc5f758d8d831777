"""Reading checkpoints in Python, as DeepSpeed's deepspeed.utils.zero_to_fp32 does."""
import collections
import ctypes
import os

import torch

from ._lib import call


# ZERO_DTYPE_F32 / F16 / BF16 (zero/zero_c.h)
_STORED_DTYPES = {0: torch.float32, 1: torch.float16, 2: torch.bfloat16}


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None):
    """{name: tensor} of a zero or DeepSpeed checkpoint (checkpoint_dir/tag; tag None: what
    checkpoint_dir/latest, or latest_universal, names), consolidated from every rank's partitions,
    tied names included: fp32, but frozen parameters in the dtype they were saved in, as
    DeepSpeed's function returns them. Reads no pickle and needs no engine or process group."""
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
            dtype = ctypes.c_int()
            call("zero_checkpoint_tensor_dtype", h, i, ctypes.byref(dtype))
            out[name.value.decode()] = t.to(_STORED_DTYPES[dtype.value])
        return out
    finally:
        call("zero_checkpoint_close", h)
