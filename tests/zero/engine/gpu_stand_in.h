// A CpuDevice that says it is not the host: the engine then treats its memory as a GPU's (moves
// every value between host code and engine memory with Device::copy, steps an offloaded partition
// on the host through a mirror) while the kernels still run on the CPU, so those paths can be
// checked bitwise against the CPU engine on a machine without a GPU. Its kernel table is the CPU's
// marked as a GPU's is (waits_per_call), so the engine gathers work into the `_many` entries as it
// does on a GPU, and its quantizer entries count their calls (stand_in_quantizer_calls), so a test
// can tell the device's table did the work. Counts the copies made through it when given a
// counter.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string_view>

#include "kernels/compute.h"
#include "tests/zero/engine/engine_test_util.h"
#include "zero/device/cpu_device.h"

namespace zero::test {

// Calls of any stand-in's quantize, dequantize and dequantize_add entries, in every test so far.
inline std::atomic<std::size_t> stand_in_quantizer_calls{0};

class GpuStandIn final : public CpuDevice {
 public:
  GpuStandIn(int rank, const DeviceOptions& options, std::atomic<std::size_t>* copies = nullptr)
      : CpuDevice(rank, options), copies_(copies) {}
  std::string_view name() const override { return "gpu-stand-in"; }
  const kernels::ComputeKernels& compute() const override {
    static const kernels::ComputeKernels table = [] {
      kernels::ComputeKernels t = kernels::cpu_compute_kernels();
      t.waits_per_call = true;
      t.optimizer_step_norm = nullptr;  // as the CUDA table: the norm in a launch of its own
      t.quantize = [](const void* src, DType dtype, std::size_t n, int bits, void* out,
                      const kernels::CpuExec& exec) {
        ++stand_in_quantizer_calls;
        kernels::cpu_compute_kernels().quantize(src, dtype, n, bits, out, exec);
      };
      t.dequantize = [](const void* in, std::size_t n, int bits, void* dst, DType dtype,
                        const kernels::CpuExec& exec) {
        ++stand_in_quantizer_calls;
        kernels::cpu_compute_kernels().dequantize(in, n, bits, dst, dtype, exec);
      };
      t.dequantize_add = [](const void* in, std::size_t n, int bits, float* acc,
                            const kernels::CpuExec& exec) {
        ++stand_in_quantizer_calls;
        kernels::cpu_compute_kernels().dequantize_add(in, n, bits, acc, exec);
      };
      return t;
    }();
    return table;
  }

 protected:
  void copy_impl(void* dst, const void* src, std::size_t bytes) override {
    if (copies_ != nullptr) ++*copies_;
    CpuDevice::copy_impl(dst, src, bytes);
  }

 private:
  std::atomic<std::size_t>* copies_;
};

// A TrainSpec of `cfg` on `world` ranks for `steps` optimizer steps: the CPU engine when `copies`
// is null, else GpuStandIn devices counting their copies into `copies`.
inline TrainSpec stand_in_spec(const nlohmann::json& cfg, int world, int steps,
                               std::atomic<std::size_t>* copies) {
  TrainSpec spec;
  spec.config = cfg;
  spec.world = world;
  spec.steps = steps;
  if (copies != nullptr) {
    spec.device_factory = [copies](int rank, const DeviceOptions& o) {
      return std::make_unique<GpuStandIn>(rank, o, copies);
    };
  }
  return spec;
}

}  // namespace zero::test
