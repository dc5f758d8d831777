// The scalar 16-bit conversions (kernels/cast_math.h) against hardware and independent rounding.
#include <catch2/catch.hpp>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "kernels/cast_math.h"
#include "tests/kernels/test_util.h"

namespace zm = zero::kernels::math;

namespace {

__attribute__((target("f16c"))) std::uint16_t hardware_f16(float x) {
  return static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("f16c"))) float hardware_f32(std::uint16_t h) { return _cvtsh_ss(h); }

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Interesting fp32 inputs: around every fp16 boundary (subnormal, normal, overflow, midpoints),
// specials, and random bit patterns.
std::vector<float> probe_floats() {
  std::vector<float> v = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, from_bits(0x7f800001u),
                          from_bits(0xffbfffffu), 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e-8f,
                          2.98023224e-08f, 2.98023259e-08f, 5.96046448e-08f, 6.1035156e-05f,
                          6.1032095e-05f, 1.0f, 1.00048828125f, 1.0009765625f, 3.4028235e38f,
                          from_bits(1), from_bits(0x807fffffu)};
  for (std::uint32_t h = 0; h < 0x10000u; h += 7) {
    const float x = static_cast<float>(zero::kernels::test::f16_value(static_cast<std::uint16_t>(h)));
    if (std::isnan(x)) continue;
    const std::uint32_t u = bits(x);
    for (std::uint32_t d : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu, 0x2000u}) {
      v.push_back(from_bits(u + d));
      v.push_back(from_bits(u - d));
    }
  }
  std::mt19937 rng(42);
  for (int i = 0; i < 1000000; ++i) v.push_back(from_bits(rng()));
  return v;
}

}  // namespace

TEST_CASE("fp16 to fp32 is exact for all 65536 patterns and equals VCVTPH2PS") {
  const bool have_f16c = __builtin_cpu_supports("f16c");
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto half = static_cast<std::uint16_t>(h);
    const float ours = zm::f16_to_float(half);
    const double exact = zero::kernels::test::f16_value(half);
    INFO("pattern 0x" << std::hex << h);
    if (std::isnan(exact)) {
      REQUIRE(std::isnan(ours));
    } else {
      REQUIRE(static_cast<double>(ours) == exact);
      REQUIRE(std::signbit(ours) == static_cast<bool>(h & 0x8000u));
    }
    if (have_f16c) REQUIRE(bits(ours) == bits(hardware_f32(half)));
  }
}

TEST_CASE("fp32 to fp16 rounds to nearest even exactly like VCVTPS2PH, NaNs and subnormals included") {
  if (!__builtin_cpu_supports("f16c")) {
    WARN("no F16C on this CPU: checked only by round trip");
  }
  for (float x : probe_floats()) {
    INFO("input 0x" << std::hex << bits(x));
    const std::uint16_t ours = zm::float_to_f16(x);
    if (__builtin_cpu_supports("f16c")) REQUIRE(ours == hardware_f16(x));
    if (!std::isnan(x)) {
      // Nearest: no other fp16 is closer.
      const double err = std::fabs(zero::kernels::test::f16_value(ours) - x);
      if (std::isfinite(zero::kernels::test::f16_value(ours))) {
        const double up = zero::kernels::test::f16_value(static_cast<std::uint16_t>(ours + 1));
        if (std::isfinite(up) && ((ours & 0x7fffu) != 0x7bffu)) REQUIRE(err <= std::fabs(up - x));
      }
    }
  }
}

TEST_CASE("fp32 to bf16 rounds to nearest even and maps every NaN to 0x7fc0") {
  for (float x : probe_floats()) {
    INFO("input 0x" << std::hex << bits(x));
    REQUIRE(zm::float_to_bf16(x) == zero::kernels::test::reference_bf16(x));
  }
  REQUIRE(zm::float_to_bf16(from_bits(0x7f7fffffu)) == 0x7f80);  // rounds up to infinity
  REQUIRE(zm::float_to_bf16(from_bits(0x3f808000u)) == 0x3f80);  // tie to even (down)
  REQUIRE(zm::float_to_bf16(from_bits(0x3f818000u)) == 0x3f82);  // tie to even (up)
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float x = zm::bf16_to_float(b);
    if (!std::isnan(x)) REQUIRE(zm::float_to_bf16(x) == b);
  }
}
