#include "zero/comm/reduce_math.h"

#include <algorithm>
#include <cstring>

#include "kernels/cast.h"
#include "kernels/reduce.h"
#include "zero/base/error.h"
#include "zero/base/stream_copy.h"

namespace zero::comm_detail {

namespace {

// fp64 (which the kernels do not cover) in L1-sized blocks: the whole block is read from every
// source into the accumulator before any of it is written, which makes dst == srcs[k] safe.
void reduce_f64(void* dst_v, const void* const* srcs_v, int nsrc, std::size_t elems, ReduceOp op,
                int avg_divisor) {
  constexpr std::size_t kBlock = 1024;
  double acc[kBlock];
  auto* dst = static_cast<double*>(dst_v);
  for (std::size_t b = 0; b < elems; b += kBlock) {
    const std::size_t n = std::min(kBlock, elems - b);
    const double* first = static_cast<const double*>(srcs_v[0]) + b;
    for (std::size_t i = 0; i < n; ++i) acc[i] = first[i];
    for (int k = 1; k < nsrc; ++k) {
      const double* s = static_cast<const double*>(srcs_v[k]) + b;
      if (op == ReduceOp::Max) {
        for (std::size_t i = 0; i < n; ++i)
          acc[i] = (s[i] > acc[i] || s[i] != s[i]) ? s[i] : acc[i];
      } else {
        for (std::size_t i = 0; i < n; ++i) acc[i] += s[i];
      }
    }
    if (op == ReduceOp::Avg) {
      for (std::size_t i = 0; i < n; ++i) acc[i] /= static_cast<double>(avg_divisor);
    }
    std::copy_n(acc, n, dst + b);
  }
}

}  // namespace

void reduce_elements(void* dst, const void* const* srcs, int nsrc, std::size_t elems, DType dtype,
                     ReduceOp op, int avg_divisor, std::size_t whole_bytes) {
  ZERO_ASSERT(nsrc >= 1);
  if (dtype == DType::F64) return reduce_f64(dst, srcs, nsrc, elems, op, avg_divisor);
  // The float types through the vectorised kernel: the same arithmetic, the same bits.
  const kernels::ReduceKind kind =
      op == ReduceOp::Max ? kernels::ReduceKind::Max : kernels::ReduceKind::Sum;
  const float divisor = op == ReduceOp::Avg ? static_cast<float>(avg_divisor) : 0.0f;
  const std::size_t bytes = elems * dtype_size(dtype);
  const kernels::Stores stores = std::max(whole_bytes, bytes) >= kStreamingMinBytes
                                     ? kernels::Stores::Streaming
                                     : kernels::Stores::Cached;
  kernels::reduce_cpu(dst, srcs, nsrc, elems, dtype, kind, divisor, kernels::Isa::Auto, stores);
}

void widen_to_f32(const void* src, float* dst, std::size_t elems, DType dtype) {
  ZERO_ASSERT(dtype == DType::BF16 || dtype == DType::F16);
  kernels::cast_cpu(src, dtype, dst, DType::F32, elems, {1});
}

void narrow_from_f32(const float* src, void* dst, std::size_t elems, DType dtype, float divisor) {
  ZERO_ASSERT(dtype == DType::BF16 || dtype == DType::F16);
  if (divisor == 1.0f) {
    kernels::cast_cpu(src, DType::F32, dst, dtype, elems, {1});
    return;
  }
  // Divided in L1-sized blocks, then rounded once: round(src[i] / divisor).
  constexpr std::size_t kBlock = 2048;
  float block[kBlock];
  auto* out = static_cast<std::uint16_t*>(dst);
  for (std::size_t b = 0; b < elems; b += kBlock) {
    const std::size_t n = std::min(kBlock, elems - b);
    for (std::size_t i = 0; i < n; ++i) block[i] = src[b + i] / divisor;
    kernels::cast_cpu(block, DType::F32, out + b, dtype, n, {1});
  }
}

void finish_reduction(const void* src, void* dst, std::size_t elems, DType dtype, DType work,
                      int divisor) {
  if (dtype != work) {
    narrow_from_f32(static_cast<const float*>(src), dst, elems, dtype,
                                 static_cast<float>(divisor));
    return;
  }
  if (divisor == 1) {
    if (src != dst) std::memmove(dst, src, elems * dtype_size(dtype));
    return;
  }
  if (dtype == DType::F64) {
    const auto* s = static_cast<const double*>(src);
    auto* d = static_cast<double*>(dst);
    for (std::size_t i = 0; i < elems; ++i) d[i] = s[i] / static_cast<double>(divisor);
  } else {
    ZERO_ASSERT(dtype == DType::F32);
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<float*>(dst);
    for (std::size_t i = 0; i < elems; ++i) d[i] = s[i] / static_cast<float>(divisor);
  }
}

}  // namespace zero::comm_detail
