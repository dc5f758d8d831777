// Bit-exact conversions between fp32 and the 16-bit float formats, shared by every CPU ISA path
// and the CUDA path. The SIMD paths use hardware instructions that produce the same bits (tested).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/hd.h"

namespace zero::kernels::math {
inline namespace ZERO_KERNELS_ABI {

ZERO_HD inline std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

ZERO_HD inline float bits_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

ZERO_HD inline float bf16_to_float(std::uint16_t h) { return bits_float(std::uint32_t{h} << 16); }

// Round to nearest even. Every NaN becomes the canonical quiet NaN 0x7fc0, as torch and
// DeepSpeed's cpu_adam do; infinities and overflow to infinity follow IEEE rounding.
ZERO_HD inline std::uint16_t float_to_bf16(float x) {
  const std::uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  const std::uint32_t lsb = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16);
}

// Exact. A NaN keeps its sign and payload and is made quiet, like VCVTPH2PS.
ZERO_HD inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {
    if (mantissa == 0) return bits_float(sign | 0x7f800000u);
    return bits_float(sign | 0x7fc00000u | (mantissa << 13));
  }
  if (exponent == 0) {
    // Subnormal: mantissa × 2^-24, exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return bits_float(sign | float_bits(magnitude));
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// Round to nearest even, like VCVTPS2PH with _MM_FROUND_TO_NEAREST_INT: a NaN keeps its sign and
// the top of its payload and is made quiet; subnormal results are produced, not flushed.
ZERO_HD inline std::uint16_t float_to_f16(float x) {
  const std::uint32_t u = float_bits(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude & 0x7fffffu) >> 13));
  }
  // 65520 = 0x477ff000 is the midpoint between the largest half (65504) and 2^16; it rounds to
  // the even neighbour, which is infinity.
  if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (magnitude < 0x38800000u) {
    const std::uint32_t exponent = magnitude >> 23;
    if (exponent < 102) return static_cast<std::uint16_t>(sign);  // below half of 2^-24
    const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exponent;
    std::uint32_t q = significand >> shift;
    const std::uint32_t rest = significand & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  const std::uint32_t rebased = magnitude - 0x38000000u;
  std::uint32_t q = rebased >> 13;
  const std::uint32_t rest = rebased & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (q & 1u))) ++q;
  return static_cast<std::uint16_t>(sign | q);
}

}  // namespace ZERO_KERNELS_ABI
}  // namespace zero::kernels::math
