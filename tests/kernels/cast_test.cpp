// kernels::cast_cpu on every ISA this machine runs gives the bits of the scalar conversions in
// zero/base/half.h (which tests/zero/base/half_test.cpp checks against an oracle): the SIMD
// loads and stores in kernels/cpu_simd.h must follow the same rule, NaNs included.
#include "kernels/cast.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "tests/kernels/test_util.h"
#include "tests/zero/base/half_test_util.h"
#include "zero/base/half.h"

namespace zk = zero::kernels;
using zero::DType;

namespace {

std::uint16_t scalar_narrow(DType dtype, float x) {
  return dtype == DType::BF16 ? zero::half::float_to_bf16(x) : zero::half::float_to_f16(x);
}

float scalar_widen(DType dtype, std::uint16_t h) {
  return dtype == DType::BF16 ? zero::half::bf16_to_float(h) : zero::half::f16_to_float(h);
}

// Every pattern once, then again shifted by 5 so that each one also lands in a vector tail
// (the tails go through the scalar path, the bodies through the ISA's vectors).
std::vector<std::uint16_t> all_patterns() {
  std::vector<std::uint16_t> v;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) v.push_back(static_cast<std::uint16_t>(b));
  for (std::uint32_t b = 0; b < 0x10000u + 5; ++b) v.push_back(static_cast<std::uint16_t>(b - 5));
  return v;
}

}  // namespace

TEST_CASE("cast_cpu widens all 65,536 bf16 and fp16 patterns to the scalar bits on every ISA") {
  const std::vector<std::uint16_t> patterns = all_patterns();
  const auto isas = zk::test::runnable_isas();
  REQUIRE(!isas.empty());
  std::size_t checked = 0;
  for (DType dtype : {DType::BF16, DType::F16}) {
    for (zk::Isa isa : isas) {
      INFO(zero::dtype_name(dtype) << " on " << zk::isa_name(isa));
      std::vector<float> wide(patterns.size());
      zk::cast_cpu(patterns.data(), dtype, wide.data(), DType::F32, patterns.size(), {2, isa});
      std::size_t mismatches = 0;
      for (std::size_t i = 0; i < patterns.size(); ++i) {
        const std::uint32_t got = zero::half_test::bits_of(wide[i]);
        const std::uint32_t want = zero::half_test::bits_of(scalar_widen(dtype, patterns[i]));
        if (got != want && mismatches++ < 5) {
          UNSCOPED_INFO("pattern 0x" << std::hex << patterns[i] << " gives 0x" << got
                                     << ", scalar 0x" << want);
        }
        ++checked;
      }
      REQUIRE(mismatches == 0);
    }
  }
  REQUIRE(checked == 2 * isas.size() * patterns.size());
}

TEST_CASE(
    "cast_cpu narrows edge floats, NaNs and every 16-bit value's neighbours to the scalar bits "
    "on every ISA") {
  std::vector<float> inputs = zero::half_test::probe_floats();
  // Also the widened value of every pattern, NaN payloads included.
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    inputs.push_back(zero::half::bf16_to_float(static_cast<std::uint16_t>(b)));
    inputs.push_back(zero::half::f16_to_float(static_cast<std::uint16_t>(b)));
  }
  const auto isas = zk::test::runnable_isas();
  REQUIRE(!isas.empty());
  for (DType dtype : {DType::BF16, DType::F16}) {
    std::vector<std::uint16_t> expected(inputs.size());
    std::size_t nans = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      expected[i] = scalar_narrow(dtype, inputs[i]);
      if (inputs[i] != inputs[i]) ++nans;
    }
    REQUIRE(nans > 2000);  // the NaN rule is exercised, not only finite rounding
    for (zk::Isa isa : isas) {
      INFO(zero::dtype_name(dtype)
           << " on " << zk::isa_name(isa) << ", " << inputs.size() << " inputs");
      std::vector<std::uint16_t> narrow(inputs.size());
      zk::cast_cpu(inputs.data(), DType::F32, narrow.data(), dtype, inputs.size(), {2, isa});
      std::size_t mismatches = 0;
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        if (narrow[i] != expected[i] && mismatches++ < 5) {
          UNSCOPED_INFO("input 0x" << std::hex << zero::half_test::bits_of(inputs[i]) << " gives 0x"
                                   << narrow[i] << ", scalar 0x" << expected[i]);
        }
      }
      REQUIRE(mismatches == 0);
    }
  }
}
