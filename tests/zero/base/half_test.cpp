// zero/base/half.h against an independent oracle (half_test_util.h), GCC's _Float16 and, where
// the CPU has F16C, the hardware conversions (VCVTPH2PS / VCVTPS2PH).
#include "zero/base/half.h"

#include <immintrin.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "tests/zero/base/half_test_util.h"

namespace ht = zero::half_test;
using ht::bits_of;
using ht::float_of;

namespace {

__attribute__((target("f16c"))) std::uint16_t hardware_f16(float x) {
  return static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("f16c"))) float hardware_f32(std::uint16_t h) {
  return _cvtsh_ss(h);
}

bool have_f16c() {
  return __builtin_cpu_supports("f16c");
}

// GCC's soft-float (libgcc) or hardware conversions, a second implementation for finite values.
float gcc_f16_to_float(std::uint16_t h) {
  return static_cast<float>(std::bit_cast<_Float16>(h));
}
std::uint16_t gcc_float_to_f16(float x) {
  return std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));
}

bool is_quiet_f16_nan(std::uint16_t h) {
  return (h & 0x7c00u) == 0x7c00u && (h & 0x0200u) != 0;
}

constexpr int kF16NanPatterns = 2 * 1023;  // exponent all ones, fraction ≠ 0, either sign
constexpr int kBF16NanPatterns = 2 * 127;

}  // namespace

TEST_CASE("every bf16 pattern widens to its exact value and narrows back to the same bits") {
  int exact = 0, nans = 0;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    INFO("bf16 0x" << std::hex << b);
    const float wide = zero::half::bf16_to_float(h);
    // Widening is the pattern shifted up, NaN payloads and signaling bit included.
    REQUIRE(bits_of(wide) == b << 16);
    const double value = ht::bf16_value(h);
    if (std::isnan(value)) {
      REQUIRE(std::isnan(wide));
      REQUIRE(zero::half::float_to_bf16(wide) == 0x7fc0);
      ++nans;
      continue;
    }
    REQUIRE(static_cast<double>(wide) == value);
    REQUIRE(std::signbit(wide) == static_cast<bool>(b & 0x8000u));
    REQUIRE(zero::half::float_to_bf16(wide) == h);
    ++exact;
  }
  REQUIRE(nans == kBF16NanPatterns);
  REQUIRE(exact == 0x10000 - kBF16NanPatterns);
}

TEST_CASE("every fp16 pattern widens exactly as _Float16 and VCVTPH2PS do and narrows back") {
  if (!have_f16c()) WARN("no F16C on this CPU: the hardware comparison is skipped");
  int exact = 0, nans = 0;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    INFO("fp16 0x" << std::hex << b);
    const float wide = zero::half::f16_to_float(h);
    if (have_f16c()) REQUIRE(bits_of(wide) == bits_of(hardware_f32(h)));
    const double value = ht::f16_value(h);
    if (std::isnan(value)) {
      // Sign and payload kept, quiet bit set.
      const std::uint32_t want = ((b & 0x8000u) << 16) | 0x7fc00000u | ((b & 0x3ffu) << 13);
      REQUIRE(bits_of(wide) == want);
      const std::uint16_t back = zero::half::float_to_f16(wide);
      REQUIRE(is_quiet_f16_nan(back));
      REQUIRE(back == (h | 0x0200u));
      ++nans;
      continue;
    }
    REQUIRE(static_cast<double>(wide) == value);
    REQUIRE(bits_of(wide) == bits_of(gcc_f16_to_float(h)));
    REQUIRE(std::signbit(wide) == static_cast<bool>(b & 0x8000u));
    REQUIRE(zero::half::float_to_f16(wide) == h);
    ++exact;
  }
  REQUIRE(nans == kF16NanPatterns);
  REQUIRE(exact == 0x10000 - kF16NanPatterns);
}

TEST_CASE("fp32 edge values narrow to fp16 by round to nearest even, overflow to inf, quiet NaN") {
  const float two_m24 = std::ldexp(1.0f, -24);
  // Known answers, so that the oracle itself is checked too.
  const std::pair<float, std::uint16_t> known[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {INFINITY, 0x7c00},
      {-INFINITY, 0xfc00},
      {FLT_MAX, 0x7c00},
      {-FLT_MAX, 0xfc00},
      {65504.0f, 0x7bff},
      {65519.99f, 0x7bff},
      {65520.0f, 0x7c00},  // the midpoint to 2^16 rounds to the even neighbour, infinity
      {-65520.0f, 0xfc00},
      {two_m24, 0x0001},
      {two_m24 / 2, 0x0000},  // tie: to even, zero
      {-two_m24 / 2, 0x8000},
      {float_of(bits_of(two_m24 / 2) + 1), 0x0001},
      {two_m24 * 1.5f, 0x0002},  // tie between 1 and 2: even
      {two_m24 * 2.5f, 0x0002},  // tie between 2 and 3: even
      {-two_m24 * 3.5f, 0x8004},
      {6.1035156e-05f, 0x0400},  // 2^-14, the smallest normal
      {1.0f, 0x3c00},
      {1.00048828125f, 0x3c00},         // 1 + 2^-11: tie, down to even
      {1.00146484375f, 0x3c02},         // 1 + 3·2^-11: tie, up to even
      {float_of(0x00000001u), 0x0000},  // fp32 denormals underflow to signed zero
      {float_of(0x807fffffu), 0x8000},
      {float_of(0x7fc00000u), 0x7e00},
      {float_of(0xffc00000u), 0xfe00},
      {float_of(0x7f800001u), 0x7e00},  // signaling, payload below the kept bits: quieted
      {float_of(0x7fa00000u), 0x7f00},  // signaling, payload kept and quieted
      {float_of(0xff802000u), 0xfe01},
  };
  for (const auto& [x, want] : known) {
    INFO("input 0x" << std::hex << bits_of(x));
    REQUIRE(ht::reference_f16(x) == want);
    REQUIRE(zero::half::float_to_f16(x) == want);
  }
  // The edge list and the probe set: the oracle, _Float16 for non-NaN inputs, and F16C for all.
  if (!have_f16c()) WARN("no F16C on this CPU: the hardware comparison is skipped");
  std::size_t checked = 0, nans = 0, subnormal_results = 0;
  for (float x : ht::probe_floats()) {
    INFO("input 0x" << std::hex << bits_of(x));
    const std::uint16_t ours = zero::half::float_to_f16(x);
    REQUIRE(ours == ht::reference_f16(x));
    if (have_f16c()) REQUIRE(ours == hardware_f16(x));
    if (std::isnan(x)) {
      REQUIRE(is_quiet_f16_nan(ours));
      ++nans;
    } else {
      REQUIRE(ours == gcc_float_to_f16(x));
      if ((ours & 0x7c00u) == 0 && (ours & 0x3ffu) != 0) ++subnormal_results;
    }
    ++checked;
  }
  INFO(checked << " inputs, " << nans << " NaNs, " << subnormal_results << " subnormal results");
  REQUIRE(checked > 1000000);
  REQUIRE(nans > 100);
  REQUIRE(subnormal_results > 10000);
}

TEST_CASE("fp32 edge values narrow to bf16 by round to nearest even, and every NaN to 0x7fc0") {
  const std::pair<float, std::uint16_t> known[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {INFINITY, 0x7f80},
      {-INFINITY, 0xff80},
      {FLT_MAX, 0x7f80},  // above the midpoint past 0x7f7f: infinity
      {-FLT_MAX, 0xff80},
      {float_of(0x7f7f8000u), 0x7f80},  // the midpoint: 0x7f7f is odd, so up to infinity
      {float_of(0x7f7f7fffu), 0x7f7f},
      {1.0f, 0x3f80},
      {float_of(0x3f808000u), 0x3f80},  // tie, down to even
      {float_of(0x3f818000u), 0x3f82},  // tie, up to even
      {float_of(0x3f808001u), 0x3f81},
      {float_of(0xbf808000u), 0xbf80},
      {65520.0f, 0x4780},
      {float_of(0x00000001u), 0x0000},  // fp32 denormals round like any other value
      {float_of(0x00008000u), 0x0000},  // tie, to even
      {float_of(0x00018000u), 0x0002},  // tie, to even
      {float_of(0x007fffffu), 0x0080},  // rounds up into the smallest normal
      {float_of(0x807fffffu), 0x8080},
      {float_of(0x7fc00000u), 0x7fc0},
      {float_of(0xffc00000u), 0x7fc0},  // sign dropped: the canonical NaN, as torch
      {float_of(0x7f800001u), 0x7fc0},
      {float_of(0xffffffffu), 0x7fc0},
      {float_of(0x7fc01234u), 0x7fc0},
  };
  for (const auto& [x, want] : known) {
    INFO("input 0x" << std::hex << bits_of(x));
    REQUIRE(ht::reference_bf16(x) == want);
    REQUIRE(zero::half::float_to_bf16(x) == want);
  }
  std::size_t checked = 0, ties = 0, subnormal_results = 0;
  for (float x : ht::probe_floats()) {
    INFO("input 0x" << std::hex << bits_of(x));
    const std::uint16_t ours = zero::half::float_to_bf16(x);
    REQUIRE(ours == ht::reference_bf16(x));
    if (!std::isnan(x) && (bits_of(x) & 0xffffu) == 0x8000u) ++ties;
    if ((ours & 0x7f80u) == 0 && (ours & 0x7fu) != 0) ++subnormal_results;
    ++checked;
  }
  INFO(checked << " inputs, " << ties << " ties, " << subnormal_results << " subnormal results");
  REQUIRE(checked > 1000000);
  REQUIRE(ties > 60000);
  REQUIRE(subnormal_results > 100);
}
