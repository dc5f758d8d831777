// The one place that chooses a Device implementation by build configuration (DESIGN.md §2).
#include <string>

#include "zero/base/error.h"
#include "zero/device/cpu_device.h"
#include "zero/device/device.h"

namespace zero {

std::unique_ptr<Device> make_device(std::string_view kind, int rank, const DeviceOptions& options) {
  ZERO_CHECK(rank >= 0, "make_device: rank must be non-negative, got {}", rank);
  if (kind == "cpu") return std::make_unique<CpuDevice>(rank, options);
  if (kind == "cuda") {
#if ZERO_WITH_CUDA
    throw Error("make_device: this build has CUDA, but CudaDevice is not implemented yet");
#else
    throw Error(
        "make_device: \"cuda\" was requested but this build has no CUDA support (nvcc was not "
        "found at configure time, or ZERO_WITH_CUDA=OFF); use \"cpu\"");
#endif
  }
  throw Error("make_device: unknown device kind \"" + std::string(kind) +
              "\"; expected \"cpu\" or \"cuda\"");
}

}  // namespace zero
