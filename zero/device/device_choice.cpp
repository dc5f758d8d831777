#include "zero/device/device_choice.h"

#include <fmt/format.h>

#include "zero/base/error.h"
#include "zero/base/format.h"

namespace zero {

std::string cuda_version_string(int version) {
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

namespace {

// Why CUDA cannot be used here, or empty when it can.
std::string cuda_unusable_reason(const CudaAvailability& cuda) {
  if (!cuda.built) {
    return "this build has no CUDA support (nvcc was not found at configure time, or "
           "ZERO_WITH_CUDA=OFF)";
  }
  if (cuda.driver_version == 0) {
    return fmt::format(
        "no NVIDIA driver is installed (cudaDriverGetVersion reports none; this build's CUDA "
        "runtime is {}); cudaGetDeviceCount: {}",
        cuda_version_string(cuda.runtime_version), cuda.error.empty() ? "no error" : cuda.error);
  }
  if (cuda.driver_version < cuda.runtime_version) {
    return fmt::format(
        "the NVIDIA driver supports CUDA up to {} but this build links the CUDA {} runtime: "
        "update the driver, or build with a toolkit no newer than {}",
        cuda_version_string(cuda.driver_version), cuda_version_string(cuda.runtime_version),
        cuda_version_string(cuda.driver_version));
  }
  if (cuda.device_count == 0) {
    return fmt::format(
        "no CUDA device is visible (cudaGetDeviceCount: {}; CUDA_VISIBLE_DEVICES={})",
        cuda.error.empty() ? "0 devices" : cuda.error, cuda.visible_devices);
  }
  return {};
}

DeviceChoice take_cuda(const CudaAvailability& cuda, std::string reason, std::string_view asker) {
  const std::string problem = cuda_unusable_reason(cuda);
  if (!problem.empty()) {
    throw Error(
        fmt::format("make_device: {} asks for a CUDA device, but {}; use the CPU with "
                    "ZERO_DEVICE=cpu (or device \"cpu\")",
                    asker, problem));
  }
  return {"cuda", std::move(reason)};
}

}  // namespace

DeviceChoice choose_device(std::string_view requested, const char* zero_device_env,
                           const CudaAvailability& cuda) {
  if (requested == "cpu") return {"cpu", "requested"};
  if (requested == "cuda") return take_cuda(cuda, "requested", "the caller");
  ZERO_CHECK(requested == "auto",
             "make_device: unknown device kind \"{}\"; expected \"cpu\", "
             "\"cuda\" or \"auto\"",
             requested);
  const std::string_view env = zero_device_env == nullptr ? "" : zero_device_env;
  if (env == "cpu") return {"cpu", "ZERO_DEVICE=cpu"};
  if (env == "cuda") return take_cuda(cuda, "ZERO_DEVICE=cuda", "ZERO_DEVICE=cuda");
  ZERO_CHECK(env.empty() || env == "auto",
             "make_device: ZERO_DEVICE={} is not a device; expected cpu, cuda or auto", env);
  const std::string problem = cuda_unusable_reason(cuda);
  if (problem.empty()) {
    return {"cuda", fmt::format("auto: {} CUDA device{} visible", cuda.device_count,
                                cuda.device_count == 1 ? "" : "s")};
  }
  return {"cpu", "auto: " + problem};
}

void check_device_budget(int ordinal, std::optional<std::size_t> budget_bytes,
                         const CudaMemoryInfo& info) {
  if (!budget_bytes || *budget_bytes <= info.free_bytes) return;
  throw Error(fmt::format(
      "CudaDevice: the device memory budget is {} but GPU {} has {} free of {}; lower the "
      "budget (and the buckets it was sized for) or free the GPU",
      format_bytes(*budget_bytes), ordinal, format_bytes(info.free_bytes),
      format_bytes(info.total_bytes)));
}

}  // namespace zero
