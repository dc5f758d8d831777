#include "zero/comm/reduce_math.h"

#include <algorithm>

#include "zero/base/error.h"
#include "zero/base/half.h"

namespace zero::comm_detail {

namespace {

template <typename A>
inline A max_nan(A acc, A x) {
  return (x > acc || x != x) ? x : acc;
}

struct F32 {
  using T = float;
  using A = float;
  static A load(T v) { return v; }
  static T store(A v) { return v; }
};
struct F64 {
  using T = double;
  using A = double;
  static A load(T v) { return v; }
  static T store(A v) { return v; }
};
struct BF16 {
  using T = std::uint16_t;
  using A = float;
  static A load(T v) { return half::bf16_to_float(v); }
  static T store(A v) { return half::float_to_bf16(v); }
};
struct F16 {
  using T = std::uint16_t;
  using A = float;
  static A load(T v) { return half::f16_to_float(v); }
  static T store(A v) { return half::float_to_f16(v); }
};

// Works through L1-sized blocks: the whole block is read from every source into the
// accumulator before any of it is written, which is what makes dst == srcs[k] safe.
template <typename E>
void reduce_typed(void* dst_v, const void* const* srcs_v, int nsrc, std::size_t elems, ReduceOp op,
                  int avg_divisor) {
  using T = typename E::T;
  using A = typename E::A;
  constexpr std::size_t kBlock = 1024;
  A acc[kBlock];
  auto* dst = static_cast<T*>(dst_v);
  for (std::size_t b = 0; b < elems; b += kBlock) {
    const std::size_t n = std::min(kBlock, elems - b);
    const T* first = static_cast<const T*>(srcs_v[0]) + b;
    for (std::size_t i = 0; i < n; ++i) acc[i] = E::load(first[i]);
    for (int k = 1; k < nsrc; ++k) {
      const T* s = static_cast<const T*>(srcs_v[k]) + b;
      if (op == ReduceOp::Max) {
        for (std::size_t i = 0; i < n; ++i) acc[i] = max_nan(acc[i], E::load(s[i]));
      } else {
        for (std::size_t i = 0; i < n; ++i) acc[i] += E::load(s[i]);
      }
    }
    if (op == ReduceOp::Avg) {
      const A divisor = static_cast<A>(avg_divisor);
      for (std::size_t i = 0; i < n; ++i) acc[i] /= divisor;
    }
    T* out = dst + b;
    for (std::size_t i = 0; i < n; ++i) out[i] = E::store(acc[i]);
  }
}

}  // namespace

void reduce_elements(void* dst, const void* const* srcs, int nsrc, std::size_t elems, DType dtype,
                     ReduceOp op, int avg_divisor) {
  ZERO_ASSERT(nsrc >= 1);
  switch (dtype) {
    case DType::F32: return reduce_typed<F32>(dst, srcs, nsrc, elems, op, avg_divisor);
    case DType::F64: return reduce_typed<F64>(dst, srcs, nsrc, elems, op, avg_divisor);
    case DType::BF16: return reduce_typed<BF16>(dst, srcs, nsrc, elems, op, avg_divisor);
    case DType::F16: return reduce_typed<F16>(dst, srcs, nsrc, elems, op, avg_divisor);
  }
}

void widen_to_f32(const void* src, float* dst, std::size_t elems, DType dtype) {
  const auto* s = static_cast<const std::uint16_t*>(src);
  ZERO_ASSERT(dtype == DType::BF16 || dtype == DType::F16);
  if (dtype == DType::BF16) {
    for (std::size_t i = 0; i < elems; ++i) dst[i] = half::bf16_to_float(s[i]);
  } else {
    for (std::size_t i = 0; i < elems; ++i) dst[i] = half::f16_to_float(s[i]);
  }
}

void narrow_from_f32(const float* src, void* dst, std::size_t elems, DType dtype, float divisor) {
  auto* d = static_cast<std::uint16_t*>(dst);
  ZERO_ASSERT(dtype == DType::BF16 || dtype == DType::F16);
  if (dtype == DType::BF16) {
    for (std::size_t i = 0; i < elems; ++i) d[i] = half::float_to_bf16(src[i] / divisor);
  } else {
    for (std::size_t i = 0; i < elems; ++i) d[i] = half::float_to_f16(src[i] / divisor);
  }
}

void divide_in_place(void* data, std::size_t elems, DType dtype, int divisor) {
  if (dtype == DType::F32) {
    auto* x = static_cast<float*>(data);
    const auto d = static_cast<float>(divisor);
    for (std::size_t i = 0; i < elems; ++i) x[i] /= d;
  } else {
    ZERO_ASSERT(dtype == DType::F64);
    auto* x = static_cast<double*>(data);
    const auto d = static_cast<double>(divisor);
    for (std::size_t i = 0; i < elems; ++i) x[i] /= d;
  }
}

}  // namespace zero::comm_detail
