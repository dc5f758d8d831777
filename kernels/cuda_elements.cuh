// Internal to the CUDA kernels: element loads and stores of fp32, bf16 and fp16 arrays through
// zero/base/half.h, the conversions every backend shares, so a GPU kernel reads and rounds
// exactly as the CPU kernels do.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "zero/base/dtype.h"
#include "zero/base/half.h"

namespace zero::kernels::detail {

// dtype is uniform across the launch, so these switches never diverge within a warp.
__device__ __forceinline__ float load_elem(const void* base, DType dtype, long long i) {
  if (dtype == DType::F32) return static_cast<const float*>(base)[i];
  const std::uint16_t bits = static_cast<const std::uint16_t*>(base)[i];
  return dtype == DType::BF16 ? half::bf16_to_float(bits) : half::f16_to_float(bits);
}

__device__ __forceinline__ void store_elem(void* base, DType dtype, long long i, float x) {
  if (dtype == DType::F32) {
    static_cast<float*>(base)[i] = x;
  } else {
    static_cast<std::uint16_t*>(base)[i] =
        dtype == DType::BF16 ? half::float_to_bf16(x) : half::float_to_f16(x);
  }
}

// i is a multiple of 4 and base is 16-byte aligned.
__device__ __forceinline__ void load4(const void* base, DType dtype, long long i, float (&x)[4]) {
  if (dtype == DType::F32) {
    const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
    x[0] = v.x;
    x[1] = v.y;
    x[2] = v.z;
    x[3] = v.w;
    return;
  }
  const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const std::uint16_t*>(base) + i);
  const std::uint16_t bits[4] = {
      static_cast<std::uint16_t>(v.x & 0xffffu), static_cast<std::uint16_t>(v.x >> 16),
      static_cast<std::uint16_t>(v.y & 0xffffu), static_cast<std::uint16_t>(v.y >> 16)};
  for (int k = 0; k < 4; ++k) {
    x[k] = dtype == DType::BF16 ? half::bf16_to_float(bits[k]) : half::f16_to_float(bits[k]);
  }
}

__device__ __forceinline__ void store4(void* base, DType dtype, long long i, const float (&x)[4]) {
  if (dtype == DType::F32) {
    *reinterpret_cast<float4*>(static_cast<float*>(base) + i) = make_float4(x[0], x[1], x[2], x[3]);
    return;
  }
  std::uint32_t bits[4];
  for (int k = 0; k < 4; ++k) {
    bits[k] = dtype == DType::BF16 ? half::float_to_bf16(x[k]) : half::float_to_f16(x[k]);
  }
  *reinterpret_cast<uint2*>(static_cast<std::uint16_t*>(base) + i) =
      make_uint2(bits[0] | (bits[1] << 16), bits[2] | (bits[3] << 16));
}

}  // namespace zero::kernels::detail
