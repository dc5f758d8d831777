// Where HierarchicalComm's two-level collectives keep and move their values between the levels
// (internal to zero/comm): host memory, with memcpy and the CPU kernels (a CPU engine's
// communicator), or the memory of a Device, with Device::copy and the device's compute table (a
// GPU engine's, whose levels are NCCL or DeviceInProcComm). Both give the same bits: the compute
// table's entries have their CPU twins' contracts (kernels/compute.h).
//
// Pointers passed in are of this memory (the collective's buffers and scratch()), except where a
// method says host. Thread safety: one thread (the communication thread) at a time.
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "zero/base/dtype.h"
#include "zero/device/device.h"

namespace zero::comm_detail {

class LevelMemory {
 public:
  // `device` null: host memory. REQUIRES: the device outlives this.
  explicit LevelMemory(Device* device) : device_(device) {}

  bool on_device() const { return device_ != nullptr; }
  // For a thread that has not used the device yet (Device::bind_thread); nothing on the host.
  void bind_thread() const;

  // Scratch `slot` (0-3) of at least `bytes`, kept and grown between calls. Contents undefined.
  std::byte* scratch(int slot, std::size_t bytes);
  // The bytes scratch `slot` holds now.
  std::size_t scratch_bytes(int slot) const;

  // Within this memory, or between it and host memory (either side).
  void copy(void* dst, const void* src, std::size_t bytes);

  // dst (`work`) = src (`dtype`): a copy, or 16-bit widened exactly to fp32.
  void to_work(const void* src, void* dst, std::size_t elems, DType dtype, DType work);
  void fill_zero(void* dst, std::size_t elems, DType dtype);
  // The end of a reduction taken in `work`: dst (`dtype`) = src / divisor, rounded once
  // (reduce_math.h's finish_reduction). `src` is scratch: it may be overwritten. On a device an
  // fp64 average is refused (CommError; the device kernels do not divide fp64).
  void finish(void* src, void* dst, std::size_t elems, DType dtype, DType work, int divisor);

  // kernels/quantize.h's quantize and dequantize_add.
  void quantize(const void* src, DType dtype, std::size_t n, int bits, void* out);
  void dequantize_add(const void* in, std::size_t n, int bits, float* acc);

 private:
  Device* device_;
  std::array<std::vector<std::byte>, 4> host_;
  std::array<Buffer, 4> device_buffers_;
};

}  // namespace zero::comm_detail
