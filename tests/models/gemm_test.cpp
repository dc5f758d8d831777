#include "models/gemm.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "zero/base/error.h"
#include "zero/base/half.h"

namespace zm = zero::models;

namespace {

// fp32 sums of up to ~300 products of N(0, 1) values against a double reference, relative to the
// largest |reference| element.
constexpr double kTolerance = 1e-5;
// The same for sums of 520 products.
constexpr double kToleranceLongSums = 2e-5;

std::vector<float> random_matrix(std::size_t elems, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(elems);
  for (float& x : v) x = normal(gen);
  return v;
}

// op(A) · op(B) in double, row-major, as models::Gemm describes its operands, for fp32 operands
// a and b (or the values bf16 operands hold).
std::vector<double> reference(const zm::Gemm& g, const std::vector<float>& a,
                              const std::vector<float>& b) {
  std::vector<double> c(g.m * g.n, 0.0);
  for (std::size_t i = 0; i < g.m; ++i) {
    for (std::size_t j = 0; j < g.n; ++j) {
      double acc = 0;
      for (std::size_t p = 0; p < g.k; ++p) {
        const double x = g.a_transposed ? a[p * g.m + i] : a[i * g.k + p];
        const double y = g.b_transposed ? b[j * g.k + p] : b[p * g.n + j];
        acc += x * y;
      }
      c[i * g.n + j] = acc;
    }
  }
  return c;
}

std::vector<double> reference(const zm::Gemm& g) {
  const auto* a = static_cast<const float*>(g.a);
  const auto* b = static_cast<const float*>(g.b);
  return reference(g, {a, a + g.m * g.k}, {b, b + g.k * g.n});
}

// Largest |c - expected| relative to the largest |expected|; requires a non-zero expectation.
double relative_error(const std::vector<float>& c, const std::vector<double>& expected) {
  REQUIRE(c.size() == expected.size());
  double max_ref = 0, max_err = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(expected[i]));
    max_err = std::max(max_err, std::abs(c[i] - expected[i]));
  }
  REQUIRE(max_ref > 0);
  return max_err / max_ref;
}

}  // namespace

// An m x k by k x n fp32 product with every transposition of A and B, on `threads` threads,
// against the double-precision reference within `tolerance`.
static void check_every_transposition(std::size_t m, std::size_t n, std::size_t k,
                                      std::uint32_t seed, int threads, double tolerance) {
  const std::vector<float> a = random_matrix(m * k, seed), b = random_matrix(k * n, seed + 1);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      INFO("A transposed " << ta << ", B transposed " << tb);
      std::vector<float> c(m * n, std::numeric_limits<float>::quiet_NaN());  // beta 0 ignores it
      const zm::Gemm g{.m = m,
                       .n = n,
                       .k = k,
                       .a = a.data(),
                       .a_transposed = ta,
                       .b = b.data(),
                       .b_transposed = tb,
                       .c = c.data()};
      zm::gemm(g, threads);
      CHECK(relative_error(c, reference(g)) < tolerance);
    }
  }
}

TEST_CASE("every transposition of A and B matches a double-precision reference") {
  check_every_transposition(19, 37, 300, 1, 1, kTolerance);
}

TEST_CASE("bf16 operands accumulate in fp32; a bf16 result is that sum rounded once") {
  const std::size_t m = 16, n = 40, k = 300;
  const std::vector<float> a = random_matrix(m * k, 11), b = random_matrix(n * k, 12);
  std::vector<std::uint16_t> a16(a.size()), b16(b.size());
  std::vector<float> a_held(a.size()), b_held(b.size());  // the values the bf16 operands hold
  for (std::size_t i = 0; i < a.size(); ++i) {
    a16[i] = zero::half::float_to_bf16(a[i]);
    a_held[i] = zero::half::bf16_to_float(a16[i]);
  }
  for (std::size_t i = 0; i < b.size(); ++i) {
    b16[i] = zero::half::float_to_bf16(b[i]);
    b_held[i] = zero::half::bf16_to_float(b16[i]);
  }
  REQUIRE(a_held != a);  // the rounding is real, so the reference below is of the rounded values
  zm::Gemm g{.m = m,
             .n = n,
             .k = k,
             .a = a16.data(),
             .b = b16.data(),
             .b_transposed = true,
             .inputs = zero::DType::BF16};
  const std::vector<double> expected = reference(g, a_held, b_held);

  std::vector<float> c(m * n, std::numeric_limits<float>::quiet_NaN());
  g.c = c.data();
  zm::gemm(g);
  // Exact products of bf16 values summed in fp32: as close as the fp32 case.
  CHECK(relative_error(c, expected) < kTolerance);

  std::vector<std::uint16_t> c16(m * n, 0x7fc0);
  g.c = c16.data();
  g.output = zero::DType::BF16;
  zm::gemm(g);
  std::vector<float> widened(c16.size());
  for (std::size_t i = 0; i < c16.size(); ++i) widened[i] = zero::half::bf16_to_float(c16[i]);
  // One rounding to bf16 (8 significant bits): within 2^-8 of each element, relative.
  for (std::size_t i = 0; i < widened.size(); ++i) {
    INFO("element " << i << ": " << widened[i] << " vs " << expected[i]);
    CHECK(std::abs(widened[i] - expected[i]) <= std::abs(expected[i]) * 0x1p-8 + 1e-6);
  }
}

TEST_CASE("products of several tiles in every direction match the reference") {
  // Beyond one tile of the portable build (64 rows, 256 columns, 256 deep) in m, n and k, with
  // partial tiles at every edge.
  check_every_transposition(70, 300, 520, 21, 3, kToleranceLongSums);
}

#if !ZERO_TEST_HAVE_ONEDNN
TEST_CASE("the portable build's products do not depend on threads or on the grouping of rows") {
  const std::size_t m = 130, n = 520, k = 40;
  const std::vector<float> a = random_matrix(m * k, 31), b = random_matrix(n * k, 32);
  zm::Gemm g{.m = m, .n = n, .k = k, .a = a.data(), .b = b.data(), .b_transposed = true};
  std::vector<float> one_thread(m * n), many(m * n), by_rows(m * n);
  g.c = one_thread.data();
  zm::gemm(g, 1);
  g.c = many.data();
  zm::gemm(g, 7);
  CHECK(many == one_thread);
  for (std::size_t row = 0; row < m; row += 16) {  // 16 rows at a time, as the teacher asks
    zm::Gemm part = g;
    part.m = std::min<std::size_t>(16, m - row);
    part.a = a.data() + row * k;
    part.c = by_rows.data() + row * n;
    zm::gemm(part, 2);
  }
  CHECK(by_rows == one_thread);
}
#endif

TEST_CASE("beta 1 adds the product to C") {
  const std::size_t m = 8, n = 5, k = 16;
  const std::vector<float> a = random_matrix(m * k, 3), b = random_matrix(k * n, 4);
  std::vector<float> c = random_matrix(m * n, 5);
  const std::vector<float> before = c;
  const zm::Gemm g{.m = m, .n = n, .k = k, .a = a.data(), .b = b.data(), .c = c.data(), .beta = 1};
  std::vector<double> expected = reference(g);
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] += before[i];
  zm::gemm(g);
  CHECK(relative_error(c, expected) < kTolerance);
}

TEST_CASE("a product split among threads matches the reference and repeats bitwise") {
  const std::size_t m = 33, n = 64, k = 96;
  const std::vector<float> a = random_matrix(m * k, 6), b = random_matrix(n * k, 7);
  for (int threads : {1, 2, 3, 40}) {
    INFO(threads << " threads");
    std::vector<float> c1(m * n), c2(m * n);
    zm::Gemm g{.m = m, .n = n, .k = k, .a = a.data(), .b = b.data(), .b_transposed = true};
    g.c = c1.data();
    zm::gemm(g, threads);
    g.c = c2.data();
    zm::gemm(g, threads);
    CHECK(relative_error(c1, reference(g)) < kTolerance);
    CHECK(c1 == c2);
  }
}

TEST_CASE("ranks' threads may call gemm at once and get what sequential calls give") {
  // Each caller has its own primitives and stream; a shared one would race (an earlier BLAS,
  // Debian's serial OpenBLAS, got a few hundred of 60,000 such products wrong with 3 callers).
  constexpr int kCallers = 8;
  constexpr int kProductsPerCaller = 4000;
  // The MLP's small products: forward (x · Wᵀ), dW (dyᵀ · x) and dx (dy · W) shapes.
  struct Case {
    zm::Gemm gemm;
    std::vector<float> a, b, expected;
  };
  std::vector<Case> cases;
  const std::size_t dims[][3] = {{4, 24, 8}, {24, 8, 4}, {4, 8, 24}, {16, 64, 32}, {64, 32, 16}};
  for (const auto& d : dims) {
    for (int transposes = 0; transposes < 4; ++transposes) {
      Case& c = cases.emplace_back();
      c.a = random_matrix(d[0] * d[2], static_cast<std::uint32_t>(cases.size()));
      c.b = random_matrix(d[2] * d[1], static_cast<std::uint32_t>(cases.size() + 100));
      c.expected.resize(d[0] * d[1]);
      c.gemm = {.m = d[0],
                .n = d[1],
                .k = d[2],
                .a = c.a.data(),
                .a_transposed = (transposes & 1) != 0,
                .b = c.b.data(),
                .b_transposed = (transposes & 2) != 0};
    }
  }
  for (Case& c : cases) {
    zm::Gemm g = c.gemm;
    g.c = c.expected.data();
    zm::gemm(g);
  }
  std::vector<int> mismatches(kCallers, 0);
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      std::vector<float> out(64 * 64);
      for (int r = 0; r < kProductsPerCaller; ++r) {
        const Case& c = cases[static_cast<std::size_t>(r * 7 + t) % cases.size()];
        zm::Gemm g = c.gemm;
        g.c = out.data();
        zm::gemm(g);
        mismatches[t] += !std::equal(c.expected.begin(), c.expected.end(), out.begin());
      }
    });
  }
  for (std::thread& c : callers) c.join();
  INFO(zm::gemm_description());
  for (int t = 0; t < kCallers; ++t) CHECK(mismatches[t] == 0);
    // The build's choice (models/CMakeLists.txt): oneDNN wherever configure found it.
#if ZERO_TEST_HAVE_ONEDNN
  CHECK(zm::gemm_description().find("oneDNN") != std::string::npos);
#else
  CHECK(zm::gemm_description().find("portable") != std::string::npos);
#endif
}

TEST_CASE("empty products leave C alone or zero it, and bad arguments throw") {
  std::vector<float> c(6, 3.0f);
  zm::gemm({.m = 2, .n = 3, .k = 0, .a = nullptr, .b = nullptr, .c = c.data()});
  CHECK(c == std::vector<float>(6, 0.0f));  // an empty sum is 0
  zm::gemm({.m = 0, .n = 3, .k = 4, .c = nullptr});
  const float x = 1.0f;
  REQUIRE_THROWS_WITH(zm::gemm({.m = 1, .n = 1, .k = 1, .a = &x, .b = &x, .c = c.data()}, 0),
                      Catch::Contains("threads = 0"));
  REQUIRE_THROWS_WITH(
      zm::gemm({.m = 1, .n = 1, .k = 1, .a = &x, .b = &x, .c = c.data(), .beta = 0.5f}),
      Catch::Contains("beta"));
  REQUIRE_THROWS_WITH(zm::gemm({.m = 1, .n = 1, .k = 1, .a = nullptr, .b = &x, .c = c.data()}),
                      Catch::Contains("null"));
  REQUIRE_THROWS_WITH(
      zm::gemm(
          {.m = 1, .n = 1, .k = 1, .a = &x, .b = &x, .c = c.data(), .inputs = zero::DType::F16}),
      Catch::Contains("fp16"));
}
