// cuda_device_count and probe_cuda_runtime (cuda_device_count.h): probes of the CUDA runtime,
// nothing more.
#include <cuda_runtime.h>

#include "kernels/cuda_device_count.h"

namespace zero::kernels {

int cuda_device_count() noexcept {
  return probe_cuda_runtime().device_count;
}

CudaRuntimeProbe probe_cuda_runtime() noexcept {
  CudaRuntimeProbe probe;
  if (cudaDriverGetVersion(&probe.driver_version) != cudaSuccess) probe.driver_version = 0;
  if (cudaRuntimeGetVersion(&probe.runtime_version) != cudaSuccess) probe.runtime_version = 0;
  const cudaError_t status = cudaGetDeviceCount(&probe.device_count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    probe.device_count = 0;
    probe.error_name = cudaGetErrorName(status);
    probe.error_text = cudaGetErrorString(status);
  }
  return probe;
}

}  // namespace zero::kernels
