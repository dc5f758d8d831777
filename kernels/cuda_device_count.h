// GPU presence, safe to call anywhere zero_kernels_cuda is linked.
#pragma once

namespace zero::kernels {

// Number of CUDA devices; 0 when there is no GPU, no driver, or the runtime fails. Never throws.
int cuda_device_count() noexcept;

// What the CUDA runtime says about this machine, for an error that explains why there is no GPU.
struct CudaRuntimeProbe {
  int device_count = 0;
  int driver_version = 0;   // cudaDriverGetVersion: 0 when no driver is installed
  int runtime_version = 0;  // cudaRuntimeGetVersion: the toolkit this build links
  // The error cudaGetDeviceCount returned (static strings), or null when it succeeded.
  const char* error_name = nullptr;
  const char* error_text = nullptr;
};
CudaRuntimeProbe probe_cuda_runtime() noexcept;

}  // namespace zero::kernels
