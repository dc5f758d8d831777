"""deepspeed.runtime.zero.partition_parameters: the names Hugging Face transformers touches.

transformers' prevent_arange_dtype_change() swaps zero_wrapper_for_fp_tensor_constructor while
zero.Init is open, to keep torch.arange's dtype; zero.Init changes no tensor constructor, so the
function here is only what it swaps (it returns the constructor unchanged)."""
import torch

from ....partitioned_init import Init, ZeroParamStatus, is_partitioned_param
from ....gathered import GatheredParameters
from ...accelerator import get_accelerator  # noqa: F401

_orig_torch_arange = torch.arange


def zero_wrapper_for_fp_tensor_constructor(fn, target_fp_dtype=None, target_device=None):
    return fn


def is_zero_param(param):
    return is_partitioned_param(param) or hasattr(param, "ds_numel")


__all__ = ["Init", "GatheredParameters", "ZeroParamStatus", "is_zero_param",
           "zero_wrapper_for_fp_tensor_constructor"]
