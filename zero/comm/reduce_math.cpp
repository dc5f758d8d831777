#include "zero/comm/reduce_math.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "zero/base/error.h"

namespace zero::comm_detail {

float bf16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t float_to_bf16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x40u);  // keep NaN quiet and NaN
  }
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // exact
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

std::uint16_t float_to_fp16(float value) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // inf or NaN
    return static_cast<std::uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  }
  if (x >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // ≥ 65520 → inf
  if (x < 0x38800000u) {
    // Result is subnormal (or zero): adding 0.5 lines the half's subnormal ulp (2^-24) up with
    // the float's last mantissa bit, so the FPU's own round-to-nearest-even does the rounding.
    const float shifted = std::bit_cast<float>(x) + 0.5f;
    return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(shifted) - 0x3f000000u));
  }
  const std::uint32_t odd = (x >> 13) & 1u;
  x += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + odd;  // rebias, round half to even
  return static_cast<std::uint16_t>(sign | (x >> 13));
}

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
  static A load(T v) { return bf16_to_float(v); }
  static T store(A v) { return float_to_bf16(v); }
};
struct F16 {
  using T = std::uint16_t;
  using A = float;
  static A load(T v) { return fp16_to_float(v); }
  static T store(A v) { return float_to_fp16(v); }
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
    for (std::size_t i = 0; i < elems; ++i) dst[i] = bf16_to_float(s[i]);
  } else {
    for (std::size_t i = 0; i < elems; ++i) dst[i] = fp16_to_float(s[i]);
  }
}

void narrow_from_f32(const float* src, void* dst, std::size_t elems, DType dtype, float divisor) {
  auto* d = static_cast<std::uint16_t*>(dst);
  ZERO_ASSERT(dtype == DType::BF16 || dtype == DType::F16);
  if (dtype == DType::BF16) {
    for (std::size_t i = 0; i < elems; ++i) d[i] = float_to_bf16(src[i] / divisor);
  } else {
    for (std::size_t i = 0; i < elems; ++i) d[i] = float_to_fp16(src[i] / divisor);
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
