#include <cuda_runtime.h>

#include "kernels/cuda_device.h"

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
