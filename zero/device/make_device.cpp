// The one place that chooses a Device implementation by build configuration (DESIGN.md §2).
#include <cstdlib>
#include <string>

#include "zero/base/error.h"
#include "zero/base/log.h"
#include "zero/device/cpu_device.h"
#include "zero/device/device.h"
#include "zero/device/device_choice.h"

#if ZERO_WITH_CUDA
#include "kernels/cuda_device_count.h"
#include "zero/device/cuda_device.h"
#endif

namespace zero {

namespace {

CudaAvailability cuda_availability() {
  CudaAvailability cuda;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  cuda.visible_devices = visible == nullptr ? "<unset>" : visible;
#if ZERO_WITH_CUDA
  const kernels::CudaRuntimeProbe probe = kernels::probe_cuda_runtime();
  cuda.built = true;
  cuda.device_count = probe.device_count;
  cuda.driver_version = probe.driver_version;
  cuda.runtime_version = probe.runtime_version;
  if (probe.error_name != nullptr) {
    cuda.error = std::string(probe.error_name) + " (" + probe.error_text + ")";
  }
#endif
  return cuda;
}

}  // namespace

int visible_gpu_count() {
  return cuda_availability().device_count;
}

std::unique_ptr<Device> make_device(std::string_view kind, int rank, const DeviceOptions& options) {
  ZERO_CHECK(rank >= 0, "make_device: rank must be non-negative, got {}", rank);
  if (kind == "cpu") return std::make_unique<CpuDevice>(rank, options);
  const CudaAvailability cuda = cuda_availability();
  const DeviceChoice choice = choose_device(kind, std::getenv("ZERO_DEVICE"), cuda);
  log::debug("make_device rank {}: {} ({})", rank, choice.kind, choice.reason);
  if (choice.kind == "cpu") return std::make_unique<CpuDevice>(rank, options);
#if ZERO_WITH_CUDA
  const int ordinal = options.cuda_ordinal >= 0 ? options.cuda_ordinal : rank % cuda.device_count;
  ZERO_CHECK(ordinal < cuda.device_count,
             "make_device: cuda_ordinal {} is out of range: {} CUDA device(s) visible "
             "(CUDA_VISIBLE_DEVICES={})",
             ordinal, cuda.device_count, cuda.visible_devices);
  return std::make_unique<CudaDevice>(rank, ordinal, options);
#else
  ZERO_ASSERT(false);  // choose_device never picks CUDA in a build without it
  return nullptr;
#endif
}

}  // namespace zero
