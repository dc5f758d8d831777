#include "zero/engine/elementwise.h"

#include <cstdint>
#include <cstring>

#include "kernels/cast.h"
#include "zero/base/error.h"
#include "zero/base/half.h"

namespace zero::engine_detail {
namespace {

float load(const void* p, DType t, std::size_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return half::bf16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::F16: return half::f16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::F64: break;
  }
  ZERO_ASSERT(false);
  return 0;
}

void store(void* p, DType t, std::size_t i, float v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = v; return;
    case DType::BF16: static_cast<std::uint16_t*>(p)[i] = half::float_to_bf16(v); return;
    case DType::F16: static_cast<std::uint16_t*>(p)[i] = half::float_to_f16(v); return;
    case DType::F64: break;
  }
  ZERO_ASSERT(false);
}

}  // namespace

void combine(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::size_t numel,
             float scale, bool accumulate, const kernels::CpuExec& exec) {
  ZERO_ASSERT(dst_dtype != DType::F64 && src_dtype != DType::F64);
  if (numel == 0) return;
  if (!accumulate && scale == 1.0f) {
    if (dst_dtype == src_dtype) {
      std::memcpy(dst, src, numel * dtype_size(dst_dtype));
    } else if (dst_dtype == DType::F32 || src_dtype == DType::F32) {
      kernels::cast_cpu(src, src_dtype, dst, dst_dtype, numel, exec);
    } else {
      for (std::size_t i = 0; i < numel; ++i) store(dst, dst_dtype, i, load(src, src_dtype, i));
    }
    return;
  }
  if (dst_dtype == DType::F32 && src_dtype == DType::F32) {
    float* d = static_cast<float*>(dst);
    const float* s = static_cast<const float*>(src);
    if (accumulate) {
      for (std::size_t i = 0; i < numel; ++i) d[i] = d[i] + s[i] * scale;
    } else {
      for (std::size_t i = 0; i < numel; ++i) d[i] = s[i] * scale;
    }
    return;
  }
  for (std::size_t i = 0; i < numel; ++i) {
    float v = load(src, src_dtype, i) * scale;
    if (accumulate) v = load(dst, dst_dtype, i) + v;
    store(dst, dst_dtype, i, v);
  }
}

void fill_zero(void* dst, DType dtype, std::size_t numel) {
  if (numel != 0) std::memset(dst, 0, numel * dtype_size(dtype));
}

}  // namespace zero::engine_detail
