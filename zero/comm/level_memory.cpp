#include "zero/comm/level_memory.h"

#include <cstring>

#include "kernels/compute.h"
#include "kernels/quantize.h"
#include "zero/base/error.h"
#include "zero/comm/reduce_math.h"

namespace zero::comm_detail {

namespace {
// One thread: the caller is a communication thread. On a GPU the legacy default stream, which the
// table synchronizes before returning.
const kernels::CpuExec kSerial{.threads = 1};
}  // namespace

void LevelMemory::bind_thread() const {
  if (device_ != nullptr) device_->bind_thread();
}

std::byte* LevelMemory::scratch(int slot, std::size_t bytes) {
  const auto s = static_cast<std::size_t>(slot);
  if (device_ == nullptr) {
    if (host_[s].size() < bytes) host_[s].resize(bytes);
    return host_[s].data();
  }
  Buffer& b = device_buffers_[s];
  if (b.size_bytes() < bytes) {
    b.reset();
    b = device_->allocate(bytes, MemoryKind::Device, MemoryTag::Staging);
  }
  return static_cast<std::byte*>(b.data());
}

std::size_t LevelMemory::scratch_bytes(int slot) const {
  const auto s = static_cast<std::size_t>(slot);
  return device_ == nullptr ? host_[s].size() : device_buffers_[s].size_bytes();
}

void LevelMemory::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (device_ == nullptr) {
    std::memcpy(dst, src, bytes);
  } else {
    device_->copy(dst, src, bytes);
  }
}

void LevelMemory::to_work(const void* src, void* dst, std::size_t elems, DType dtype,
                          DType work) {
  if (dtype == work) {
    copy(dst, src, elems * dtype_size(dtype));
  } else if (device_ == nullptr) {
    widen_to_f32(src, static_cast<float*>(dst), elems, dtype);
  } else {
    device_->compute().combine(dst, work, src, dtype, elems, 1.0f, false, kSerial);
  }
}

void LevelMemory::fill_zero(void* dst, std::size_t elems, DType dtype) {
  if (elems == 0) return;
  if (device_ == nullptr) {
    std::memset(dst, 0, elems * dtype_size(dtype));
  } else {
    device_->compute().fill_zero(dst, dtype, elems, kSerial);
  }
}

void LevelMemory::finish(void* src, void* dst, std::size_t elems, DType dtype, DType work,
                         int divisor) {
  if (device_ == nullptr) {
    finish_reduction(src, dst, elems, dtype, work, divisor);
    return;
  }
  if (elems == 0) return;
  if (dtype == work && divisor == 1) {
    copy(dst, src, elems * dtype_size(dtype));
    return;
  }
  if (work == DType::F64) {
    throw CommError(
        "a two-level average of fp64 on device memory: the device kernels divide fp32, bf16 "
        "and fp16 only");
  }
  const kernels::ComputeKernels& k = device_->compute();
  // src / divisor in the work dtype, as finish_reduction divides (IEEE division), then rounded
  // once to the element type.
  if (divisor != 1) {
    const void* one[] = {src};
    k.reduce(src, one, 1, elems, work, kernels::ReduceKind::Sum, static_cast<float>(divisor),
             kSerial);
  }
  if (dtype == work) {
    copy(dst, src, elems * dtype_size(dtype));
  } else {
    k.combine(dst, dtype, src, work, elems, 1.0f, false, kSerial);
  }
}

void LevelMemory::quantize(const void* src, DType dtype, std::size_t n, int bits, void* out) {
  if (device_ == nullptr) {
    kernels::quantize_cpu(src, dtype, n, bits, out, kSerial);
  } else {
    device_->compute().quantize(src, dtype, n, bits, out, kSerial);
  }
}

void LevelMemory::dequantize_add(const void* in, std::size_t n, int bits, float* acc) {
  if (device_ == nullptr) {
    kernels::dequantize_add_cpu(in, n, bits, acc, kSerial);
  } else {
    device_->compute().dequantize_add(in, n, bits, acc, kSerial);
  }
}

}  // namespace zero::comm_detail
