// The oracle for the 16-bit float conversions (zero/base/half.h), written independently of them:
// values come from the formats' definitions (sign × significand × 2^exponent in double), and
// rounding searches the representable values for the nearest one instead of manipulating bits.
// Also the fp32 inputs worth probing. Used by tests/zero/base/half_test.cpp and the kernels'
// tests (tests/kernels/), which compare against it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace zero::half_test {

inline std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

inline float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// A 16-bit float format: 1 sign bit, `exponent_bits`, then the rest for the fraction.
struct Format {
  int exponent_bits;
  int fraction_bits() const { return 15 - exponent_bits; }
  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  std::uint16_t max_exponent_field() const {
    return static_cast<std::uint16_t>((1 << exponent_bits) - 1);
  }
  // The largest finite magnitude's pattern (0x7bff for fp16, 0x7f7f for bf16).
  std::uint16_t max_finite() const {
    return static_cast<std::uint16_t>((max_exponent_field() << fraction_bits()) - 1);
  }
  std::uint16_t infinity() const {
    return static_cast<std::uint16_t>(max_exponent_field() << fraction_bits());
  }
};

inline constexpr Format kF16{5};
inline constexpr Format kBF16{8};

// The value of a pattern from the definition; NaN for NaN patterns.
inline double value_of(Format f, std::uint16_t h) {
  const int exponent = (h & 0x7fff) >> f.fraction_bits();
  const int fraction = h & ((1 << f.fraction_bits()) - 1);
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == f.max_exponent_field()) return fraction ? NAN : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(fraction, 1 - f.bias() - f.fraction_bits());
  return sign *
         std::ldexp((1 << f.fraction_bits()) + fraction, exponent - f.bias() - f.fraction_bits());
}

inline double f16_value(std::uint16_t h) {
  return value_of(kF16, h);
}
inline double bf16_value(std::uint16_t h) {
  return value_of(kBF16, h);
}

// Round to nearest, ties to the even pattern, of a non-NaN x: binary search for the largest
// magnitude pattern not above |x|, then pick the nearer of it and the next one. Past the largest
// finite value the next one is infinity, placed one ulp further as IEEE 754 §4.3.1 prescribes
// for overflow (so |x| ≥ max + ulp/2 becomes infinity).
inline std::uint16_t round_nearest_even(Format f, float x) {
  const double magnitude = std::fabs(static_cast<double>(x));
  const auto sign = static_cast<std::uint16_t>(std::signbit(x) ? 0x8000 : 0);
  if (std::isinf(x)) return static_cast<std::uint16_t>(sign | f.infinity());
  std::uint16_t lo = 0, hi = f.max_finite();
  if (magnitude >= value_of(f, hi)) {
    lo = hi;
  } else {
    while (hi - lo > 1) {  // value_of(lo) <= magnitude < value_of(hi)
      const auto mid = static_cast<std::uint16_t>((lo + hi) / 2);
      if (value_of(f, mid) <= magnitude) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
  }
  const double below = value_of(f, lo);
  if (below == magnitude) return static_cast<std::uint16_t>(sign | lo);
  const auto up = static_cast<std::uint16_t>(lo + 1);
  const double above = up == f.infinity()
                           ? below + (below - value_of(f, static_cast<std::uint16_t>(lo - 1)))
                           : value_of(f, up);
  // Near a tie both differences are exact in double (multiples of x's ulp, below 2^26 of them);
  // one rounds only when x is far nearer one side, which rounding cannot reverse.
  const double to_below = magnitude - below, to_above = above - magnitude;
  std::uint16_t nearest = up;
  if (to_below < to_above || (to_below == to_above && (lo & 1) == 0)) nearest = lo;
  return static_cast<std::uint16_t>(sign | nearest);
}

// The documented NaN rule, stated once here as the oracle's own: bf16 → 0x7fc0; fp16 → the sign
// and the top 10 fraction bits, with the quiet bit set.
inline std::uint16_t reference_f16(float x) {
  const std::uint32_t u = bits_of(x);
  if (std::isnan(x)) {
    return static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu));
  }
  return round_nearest_even(kF16, x);
}

inline std::uint16_t reference_bf16(float x) {
  if (std::isnan(x)) return 0x7fc0;
  return round_nearest_even(kBF16, x);
}

// fp32 inputs with a known right answer, each chosen for one rule.
inline std::vector<float> edge_floats() {
  const float two_m24 = std::ldexp(1.0f, -24);  // the smallest fp16 subnormal
  return {
      0.0f,
      -0.0f,
      INFINITY,
      -INFINITY,
      // NaNs: quiet and signaling, both signs, payload in the kept and in the dropped bits.
      float_of(0x7fc00000u),
      float_of(0xffc00000u),
      float_of(0x7f800001u),
      float_of(0xff800001u),
      float_of(0x7fa00000u),
      float_of(0x7fbfffffu),
      float_of(0xffffffffu),
      float_of(0x7f802000u),
      float_of(0x7fc01234u),
      float_of(0x7f812345u),
      // The top of each range.
      3.4028235e38f,
      -3.4028235e38f,
      65504.0f,
      -65504.0f,
      65519.99f,
      65520.0f,
      -65520.0f,
      65536.0f,
      1e10f,
      float_of(0x7f7f8000u),
      float_of(0x7f7f7fffu),
      float_of(0x7f7fffffu),
      // fp16 subnormals: the smallest, half of it (a tie to zero), just above half, 1.5× (rounds
      // to 1), 2.5× and 3.5× (ties to even, 2 and 4), the largest, the smallest normal.
      two_m24,
      -two_m24,
      two_m24 / 2,
      float_of(bits_of(two_m24 / 2) + 1),
      two_m24 * 1.5f,
      two_m24 * 2.5f,
      -two_m24 * 3.5f,
      1023 * two_m24,
      6.1035156e-05f,
      6.1032095e-05f,
      1e-8f,
      2.98023224e-08f,
      2.98023259e-08f,
      // fp32 denormals: the smallest and largest of both signs.
      float_of(0x00000001u),
      float_of(0x80000001u),
      float_of(0x007fffffu),
      float_of(0x807fffffu),
      // Ties around 1.0: fp16 (ulp 2^-10) and bf16 (ulp 2^-7), down to even and up to even.
      1.0f,
      1.00048828125f,
      1.00146484375f,
      1.0009765625f,
      -1.00048828125f,
      float_of(0x3f808000u),
      float_of(0x3f818000u),
      float_of(0x3f808001u),
      float_of(0x3f807fffu),
      float_of(0xbf808000u),
      // bf16 subnormal ties.
      float_of(0x00008000u),
      float_of(0x00018000u),
      float_of(0x80008000u),
  };
}

// edge_floats(), every fp16 value and its fp32 neighbours at the distances where fp16 rounding
// changes (1 ulp, around the half-ulp midpoint, a whole fp16 ulp), and random bit patterns.
inline std::vector<float> probe_floats() {
  std::vector<float> v = edge_floats();
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto x = static_cast<float>(f16_value(static_cast<std::uint16_t>(h)));
    if (std::isnan(x)) continue;
    const std::uint32_t u = bits_of(x);
    for (std::uint32_t d : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu, 0x2000u}) {
      v.push_back(float_of(u + d));
      v.push_back(float_of(u - d));
    }
  }
  // Every bf16 value and its midpoints to the next pattern, and just either side of them.
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const std::uint32_t u = b << 16;
    for (std::uint32_t d : {0u, 1u, 0x7fffu, 0x8000u, 0x8001u}) v.push_back(float_of(u + d));
  }
  std::mt19937 rng(42);
  for (int i = 0; i < 200000; ++i) v.push_back(float_of(static_cast<std::uint32_t>(rng())));
  return v;
}

}  // namespace zero::half_test
