#include <cstdint>
#include <cstring>

#include "kernels/cast.h"
#include "kernels/combine.h"
#include "kernels/cpu_kernels.h"
#include "kernels/cpu_parallel.h"
#include "zero/base/error.h"
#include "zero/base/half.h"
#include "zero/base/stream_copy.h"

namespace zero::kernels {
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

// One tile [begin, end) of combine_cpu. The fp32 loops are plain enough for the compiler to
// vectorise; -ffp-contract=off keeps the multiply and the add separate roundings.
void combine_range(void* dst, DType dst_dtype, const void* src, DType src_dtype, float scale,
                   bool accumulate, std::size_t begin, std::size_t end) {
  if (dst_dtype == DType::F32 && src_dtype == DType::F32) {
    float* d = static_cast<float*>(dst);
    const float* s = static_cast<const float*>(src);
    if (accumulate) {
      for (std::size_t i = begin; i < end; ++i) d[i] = d[i] + s[i] * scale;
    } else {
      for (std::size_t i = begin; i < end; ++i) d[i] = s[i] * scale;
    }
    return;
  }
  for (std::size_t i = begin; i < end; ++i) {
    float v = load(src, src_dtype, i) * scale;
    if (accumulate) v = load(dst, dst_dtype, i) + v;
    store(dst, dst_dtype, i, v);
  }
}

}  // namespace

void combine_cpu(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::size_t numel,
                 float scale, bool accumulate, const CpuExec& exec) {
  ZERO_ASSERT(dst_dtype != DType::F64 && src_dtype != DType::F64);
  if (numel == 0) return;
  if (!accumulate && scale == 1.0f && (dst_dtype == DType::F32 || src_dtype == DType::F32) &&
      dst_dtype != src_dtype) {
    cast_cpu(src, src_dtype, dst, dst_dtype, numel, exec);
    return;
  }
  const int threads = resolve_threads(exec.threads);
  if (!accumulate && scale == 1.0f && dst_dtype == src_dtype) {
    const std::size_t elem = dtype_size(dst_dtype);
    detail::for_each_tile(numel, detail::kTileElems, threads,
                          [&](std::size_t begin, std::size_t end) {
                            copy_large(static_cast<std::byte*>(dst) + begin * elem,
                                       static_cast<const std::byte*>(src) + begin * elem,
                                       (end - begin) * elem, numel * elem);
                          });
    return;
  }
  detail::for_each_tile(
      numel, detail::kTileElems, threads, [&](std::size_t begin, std::size_t end) {
        combine_range(dst, dst_dtype, src, src_dtype, scale, accumulate, begin, end);
      });
}

void fill_zero_cpu(void* dst, DType dtype, std::size_t numel, const CpuExec& exec) {
  if (numel == 0) return;
  const std::size_t elem = dtype_size(dtype);
  detail::for_each_tile(numel, detail::kTileElems, resolve_threads(exec.threads),
                        [&](std::size_t begin, std::size_t end) {
                          std::memset(static_cast<std::byte*>(dst) + begin * elem, 0,
                                      (end - begin) * elem);
                        });
}

}  // namespace zero::kernels
