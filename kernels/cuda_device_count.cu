// cuda_device_count (cuda_device_count.h): a probe of the CUDA runtime, nothing more.
#include <cuda_runtime.h>

#include "kernels/cuda_device_count.h"

namespace zero::kernels {

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return count;
}

}  // namespace zero::kernels
