// Which device backend a rank uses, decided before any memory is allocated, with an error that
// says what was asked, by whom, and what the machine has. Pure logic: make_device() feeds it the
// environment and the CUDA runtime's answers, tests feed it any machine.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace zero {

// What this process knows about CUDA (kernels/cuda_device_count.h, in a build with CUDA).
struct CudaAvailability {
  bool built = false;       // this build has CUDA (ZERO_HAVE_CUDA)
  int device_count = 0;     // visible devices
  int driver_version = 0;   // 1000·major + 10·minor as CUDA encodes it; 0: no driver installed
  int runtime_version = 0;  // the toolkit the build links, same encoding
  std::string error;        // why cudaGetDeviceCount failed, empty if it did not
  std::string visible_devices;  // CUDA_VISIBLE_DEVICES, "<unset>" when not set
};

struct DeviceChoice {
  std::string kind;    // "cpu" or "cuda"
  std::string reason;  // "requested", "ZERO_DEVICE=cuda", "auto: 2 CUDA devices visible", ...
};

// `requested` is "cpu", "cuda" or "auto". An explicit "cpu" or "cuda" is taken as asked; "auto"
// takes ZERO_DEVICE (`zero_device_env`, null when unset: "cpu", "cuda" or "auto"), and otherwise
// (or for ZERO_DEVICE=auto) CUDA when the build has it and a device is visible, else the CPU.
// Throws zero::Error, naming who asked ("ZERO_DEVICE=cuda", "the caller") and what was found,
// for an unknown name, for CUDA in a build without it, with no visible device, with no driver,
// and with a driver older than the toolkit.
DeviceChoice choose_device(std::string_view requested, const char* zero_device_env,
                           const CudaAvailability& cuda);

struct CudaMemoryInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

// The check CudaDevice's constructor makes before anything is allocated: throws zero::Error when
// a device budget is set and exceeds the GPU's free memory, naming both and the GPU.
void check_device_budget(int ordinal, std::optional<std::size_t> budget_bytes,
                         const CudaMemoryInfo& info);

// "13.0" for 13000.
std::string cuda_version_string(int version);

}  // namespace zero
