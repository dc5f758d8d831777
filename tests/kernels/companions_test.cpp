// Unscale with overflow detection, deterministic squared norm, and casts on every ISA.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cast.h"
#include "kernels/compute.h"
#include "kernels/norm.h"
#include "kernels/unscale.h"
#include "tests/kernels/test_util.h"
#include "zero/base/error.h"
#include "zero/base/half.h"

namespace zk = zero::kernels;
using zero::DType;

namespace {

constexpr std::size_t kNumel = 5 * 4096 + 16384 + 21;

std::vector<std::byte> encode(const std::vector<float>& v, DType dtype) {
  std::vector<std::byte> out(v.size() * zero::dtype_size(dtype));
  zk::cast_cpu(v.data(), DType::F32, out.data(), dtype, v.size(), {1, zk::Isa::Scalar});
  return out;
}

std::vector<float> decode(const std::vector<std::byte>& b, DType dtype) {
  std::vector<float> out(b.size() / zero::dtype_size(dtype));
  zk::cast_cpu(b.data(), dtype, out.data(), DType::F32, out.size(), {1, zk::Isa::Scalar});
  return out;
}

}  // namespace

TEST_CASE("unscale multiplies in place and flags an inf or NaN anywhere, on every ISA and dtype") {
  const auto values = zk::test::random_floats(kNumel, 1, -100.0f, 100.0f);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (zk::Isa isa : zk::test::runnable_isas()) {
      INFO(zero::dtype_name(dtype) << " on " << zk::isa_name(isa));
      auto data = encode(values, dtype);
      const auto before = decode(data, dtype);
      REQUIRE_FALSE(zk::unscale_and_check_cpu(data.data(), dtype, kNumel, 0.25f, {2, isa}));
      const auto after = decode(data, dtype);
      for (std::size_t i = 0; i < kNumel; ++i) REQUIRE(after[i] == before[i] * 0.25f);
      for (std::size_t where : {std::size_t{0}, kNumel / 2, kNumel - 1}) {
        for (float bad : {INFINITY, -INFINITY, NAN}) {
          auto poisoned = values;
          poisoned[where] = bad;
          auto b = encode(poisoned, dtype);
          INFO("bad value " << bad << " at " << where);
          REQUIRE(zk::unscale_and_check_cpu(b.data(), dtype, kNumel, 0.5f, {3, isa}));
        }
      }
    }
  }
  // Overflow produced by the scaling itself counts too.
  std::vector<float> big = {3e38f, 1.0f};
  REQUIRE(zk::unscale_and_check_cpu(big.data(), DType::F32, 2, 4.0f));
  REQUIRE_FALSE(zk::unscale_and_check_cpu(nullptr, DType::F32, 0, 1.0f));
  REQUIRE_THROWS_WITH(zk::unscale_and_check_cpu(big.data(), DType::F32, 2, NAN),
                      Catch::Contains("scale"));
}

TEST_CASE("squared norm is accurate and bitwise independent of ISA and thread count") {
  const auto values = zk::test::random_floats(kNumel, 2, -3.0f, 3.0f);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    const auto data = encode(values, dtype);
    const auto exact_values = decode(data, dtype);
    long double exact = 0;
    for (float x : exact_values) exact += static_cast<long double>(x) * x;
    const double reference =
        zk::squared_l2_norm_cpu(data.data(), dtype, kNumel, {1, zk::Isa::Scalar});
    INFO(zero::dtype_name(dtype));
    REQUIRE(reference > 1000.0);
    REQUIRE(std::fabs(reference - static_cast<double>(exact)) <=
            1e-12 * static_cast<double>(exact));
    for (zk::Isa isa : zk::test::runnable_isas()) {
      for (int threads : {1, 2, 3, 5}) {
        const double got = zk::squared_l2_norm_cpu(data.data(), dtype, kNumel, {threads, isa});
        INFO(zk::isa_name(isa) << " threads " << threads);
        REQUIRE(std::memcmp(&got, &reference, sizeof got) == 0);
      }
    }
  }
  std::vector<float> with_inf(100, 1.0f);
  with_inf[57] = INFINITY;
  REQUIRE(std::isinf(zk::squared_l2_norm_cpu(with_inf.data(), DType::F32, with_inf.size())));
  REQUIRE(zk::squared_l2_norm_cpu(nullptr, DType::F32, 0) == 0.0);
}

TEST_CASE("the compute table's _many entries equal the single calls, array by array") {
  const zk::ComputeKernels& cpu = zk::cpu_compute_kernels();
  // Sizes across the norm block (4096), an empty array, and more blocks than threads.
  const std::vector<std::size_t> sizes = {7, 0, 4096, 3 * 4096 + 5, 1, kNumel};
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (int threads : {1, 3}) {
      INFO(zero::dtype_name(dtype) << " threads " << threads);
      std::vector<std::vector<std::byte>> arrays;
      std::vector<zk::ArrayRef> refs;
      double expected = 0.0;
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        arrays.push_back(encode(
            zk::test::random_floats(sizes[k], static_cast<std::uint32_t>(11 + k), -3.0f, 3.0f),
            dtype));
        expected += cpu.squared_l2_norm(arrays[k].data(), dtype, sizes[k], {threads});
      }
      for (std::size_t k = 0; k < sizes.size(); ++k)
        refs.push_back({arrays[k].data(), dtype, sizes[k]});
      REQUIRE(expected > 0.0);  // not vacuous
      const double got = cpu.squared_l2_norm_many(refs, {threads});
      REQUIRE(std::memcmp(&got, &expected, sizeof got) == 0);
      REQUIRE(cpu.squared_l2_norm_many({}, {threads}) == 0.0);

      REQUIRE_FALSE(cpu.unscale_and_check_many(refs, 1.0f, {threads}));
      const float inf = std::numeric_limits<float>::infinity();
      cpu.combine(arrays[3].data() + 9 * zero::dtype_size(dtype), dtype, &inf, DType::F32, 1, 1.0f,
                  false, {});
      REQUIRE(cpu.unscale_and_check_many(refs, 1.0f, {threads}));
      // Every array is scaled, the ones after an overflowing one too.
      const std::vector<std::byte> last_before = arrays.back();
      REQUIRE(cpu.unscale_and_check_many(refs, 0.5f, {threads}));
      REQUIRE(decode(arrays.back(), dtype)[5] == decode(last_before, dtype)[5] * 0.5f);

      // combine_many: each pair as its own combine call, into fp32 and into `dtype`, accumulating.
      for (DType dst_dtype : {DType::F32, dtype}) {
        std::vector<std::vector<std::byte>> want(sizes.size()), have(sizes.size());
        std::vector<zk::CombineRef> pairs;
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          want[k] = encode(
              zk::test::random_floats(sizes[k], static_cast<std::uint32_t>(40 + k), -1.0f, 1.0f),
              dst_dtype);
          have[k] = want[k];
          cpu.combine(want[k].data(), dst_dtype, arrays[k].data(), dtype, sizes[k], 0.75f, true,
                      {threads});
          pairs.push_back({have[k].data(), dst_dtype, arrays[k].data(), dtype, sizes[k]});
        }
        REQUIRE(want.back() != have.back());  // the call has something to do
        cpu.combine_many(pairs, 0.75f, true, {threads});
        REQUIRE(have == want);
      }
    }
  }
}

TEST_CASE(
    "casts between fp32 and bf16/fp16 agree bitwise on every ISA with the scalar conversions") {
  auto values = zk::test::random_floats(kNumel, 3, -70000.0f, 70000.0f);
  values[5] = NAN;
  values[6] = -INFINITY;
  values[7] = 1e-7f;
  values[8] = -0.0f;
  for (DType dtype : {DType::BF16, DType::F16}) {
    std::vector<std::uint16_t> expected(kNumel);
    for (std::size_t i = 0; i < kNumel; ++i) {
      expected[i] = dtype == DType::BF16 ? zk::test::reference_bf16(values[i])
                                         : zk::test::reference_f16(values[i]);
    }
    for (zk::Isa isa : zk::test::runnable_isas()) {
      INFO(zero::dtype_name(dtype) << " on " << zk::isa_name(isa));
      std::vector<std::uint16_t> narrow(kNumel);
      zk::cast_cpu(values.data(), DType::F32, narrow.data(), dtype, kNumel, {2, isa});
      REQUIRE(narrow == expected);
      std::vector<float> wide(kNumel);
      zk::cast_cpu(narrow.data(), dtype, wide.data(), DType::F32, kNumel, {2, isa});
      for (std::size_t i = 0; i < kNumel; ++i) {
        const float want = dtype == DType::BF16 ? zero::half::bf16_to_float(narrow[i])
                                                : zero::half::f16_to_float(narrow[i]);
        REQUIRE(std::memcmp(&wide[i], &want, 4) == 0);
      }
    }
  }
  std::vector<float> a(8), b(8);
  REQUIRE_THROWS_WITH(zk::cast_cpu(a.data(), DType::BF16, b.data(), DType::F16, 8),
                      Catch::Contains("fp32"));
  REQUIRE_THROWS_WITH(zk::cast_cpu(a.data(), DType::F32, a.data() + 1, DType::F32, 4),
                      Catch::Contains("overlap"));
  REQUIRE_THROWS_WITH(zk::cast_cpu(nullptr, DType::F32, b.data(), DType::BF16, 8),
                      Catch::Contains("src is null"));
}
