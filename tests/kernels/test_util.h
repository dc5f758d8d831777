// Helpers shared by the kernel tests: seeded random arrays, 16-bit float rounding written
// independently of kernels/cast_math.h, and the ISAs this machine can run.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/isa.h"

namespace zero::kernels::test {

inline std::vector<Isa> runnable_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline double bf16_value(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even by comparing the two bf16 neighbours as doubles.
inline std::uint16_t reference_bf16(float x) {
  if (std::isnan(x)) return 0x7fc0;
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  const auto below = static_cast<std::uint16_t>(u >> 16);
  if ((u & 0xffffu) == 0) return below;
  const auto above = static_cast<std::uint16_t>(below + 1);
  const double lo = bf16_value(below);
  double hi = bf16_value(above);
  // Past the largest finite bf16 the upper neighbour is infinity, one (virtual) ulp = 2^120 up.
  if (std::isinf(hi)) hi = lo + std::copysign(std::ldexp(1.0, 120), lo);
  const double dlo = std::fabs(static_cast<double>(x) - lo), dhi = std::fabs(hi - static_cast<double>(x));
  if (dlo < dhi) return below;
  if (dhi < dlo) return above;
  return (below & 1u) ? above : below;
}

inline std::vector<std::uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = reference_bf16(v[i]);
  return out;
}

// fp16 value of a bit pattern, from its definition.
inline double f16_value(std::uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0x1f) return mantissa ? NAN : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

}  // namespace zero::kernels::test
