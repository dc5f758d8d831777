// GPU presence, safe to call anywhere zero_kernels_cuda is linked.
#pragma once

namespace zero::kernels {

// Number of CUDA devices; 0 when there is no GPU, no driver, or the runtime fails. Never throws.
int cuda_device_count() noexcept;

}  // namespace zero::kernels
