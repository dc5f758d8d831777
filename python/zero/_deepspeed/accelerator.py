"""deepspeed.accelerator: get_accelerator(), the device the engine runs on (the current CUDA
device when torch sees one, else the CPU)."""
import torch


class _Accelerator:
    def _cuda(self):
        return torch.cuda.is_available()

    def device_name(self, device_index=None):
        if not self._cuda():
            return "cpu"
        return "cuda" if device_index is None else f"cuda:{device_index}"

    def current_device(self):
        return torch.cuda.current_device() if self._cuda() else 0

    def current_device_name(self):
        return f"cuda:{torch.cuda.current_device()}" if self._cuda() else "cpu"

    def device_count(self):
        return torch.cuda.device_count() if self._cuda() else 1

    def communication_backend_name(self):
        return "nccl" if self._cuda() else "gloo"

    def is_bf16_supported(self):
        return True

    def is_fp16_supported(self):
        return True

    def synchronize(self, device_index=None):
        if self._cuda():
            torch.cuda.synchronize(device_index)

    def empty_cache(self):
        if self._cuda():
            torch.cuda.empty_cache()


_accelerator = _Accelerator()


def get_accelerator():
    return _accelerator
