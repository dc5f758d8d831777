// The one definition of the scalar conversions between fp32 and the 16-bit float formats (bf16,
// IEEE fp16). Every layer uses these: the CPU kernels (scalar path and the tail of every SIMD
// path), the CUDA kernels, the communicators' 16-bit reductions, safetensors and DeepSpeed
// checkpoint reading. The SIMD paths (kernels/cpu_simd.h) use hardware instructions that give
// the same bits, tested on all 65,536 patterns (tests/kernels/cast_test.cpp).
//
// The rule, for both formats:
//   - Narrowing (fp32 → 16 bits) rounds to nearest, ties to even.
//   - ±inf stays ±inf; a finite value that rounds past the largest finite value becomes ±inf.
//   - Subnormal results are produced and subnormal inputs read; nothing is flushed to zero.
//   - A NaN stays a NaN and comes out quiet:
//       bf16: every NaN becomes the canonical quiet NaN 0x7fc0, as torch (c10/util/BFloat16.h)
//             and DeepSpeed's cpu_adam do;
//       fp16: the sign and the top 10 fraction bits are kept and the quiet bit (the top one)
//             is set, as VCVTPS2PH does; a NaN whose payload lies only in the dropped 13 bits
//             becomes sign | 0x7e00.
//   - Widening (16 bits → fp32) is exact. bf16 is the bit pattern shifted up (a signaling NaN
//     stays signaling, as torch's and the SIMD shift do); an fp16 NaN keeps sign and payload and
//     is made quiet, as VCVTPH2PS does.
//
// ZERO_HD: callable from CUDA device code. The inline namespace keeps each kernels/ ISA unit's
// copy apart (zero/base/hd.h).
#pragma once

#include <cstdint>
#include <cstring>

#include "zero/base/hd.h"

namespace zero::half {
inline namespace ZERO_KERNELS_ABI {

// The bits of a float and back (std::bit_cast is not callable from device code).
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

ZERO_HD inline float bf16_to_float(std::uint16_t h) {
  return bits_float(std::uint32_t{h} << 16);
}

ZERO_HD inline std::uint16_t float_to_bf16(float x) {
  const std::uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  // Adding 0x7fff plus the kept lsb carries into the kept half exactly when the dropped half is
  // above the midpoint, or at it with an odd kept half; a carry out of the largest finite value
  // lands on infinity's pattern.
  const std::uint32_t lsb = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16);
}

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
    // The result is subnormal (below 2^-14): the significand shifted to units of 2^-24.
    const std::uint32_t exponent = magnitude >> 23;
    if (exponent < 102) return static_cast<std::uint16_t>(sign);  // below half of 2^-24
    const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exponent;
    std::uint32_t q = significand >> shift;
    const std::uint32_t rest = significand & ((1u << shift) - 1u);
    const std::uint32_t midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  const std::uint32_t rebased = magnitude - 0x38000000u;
  std::uint32_t q = rebased >> 13;
  const std::uint32_t rest = rebased & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (q & 1u))) ++q;
  return static_cast<std::uint16_t>(sign | q);
}

}  // namespace ZERO_KERNELS_ABI
}  // namespace zero::half
