// reduce_cpu (the communicators' arithmetic): sum, max and average of several buffers, on every
// ISA and dtype, bitwise against an oracle built on the independent 16-bit conversions, with the
// specials (±inf, NaN, -0, subnormals) and a destination that is one of the sources; with
// ordinary stores and with streaming ones, from a destination on a cache line and off one.
#include "kernels/reduce.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/kernels/test_util.h"
#include "zero/base/error.h"

namespace zk = zero::kernels;
using zero::DType;

namespace {

constexpr std::size_t kElems = 3 * 64 + 13;  // whole vectors of every width, and a tail
constexpr int kSources = 3;

float load(const std::vector<std::byte>& b, DType dtype, std::size_t i) {
  return static_cast<float>(zk::test::element_value(b, dtype, i));
}

void store(std::vector<std::byte>& b, DType dtype, std::size_t i, float x) {
  if (dtype == DType::F32) {
    std::memcpy(b.data() + 4 * i, &x, 4);
    return;
  }
  const std::uint16_t h =
      dtype == DType::BF16 ? zk::test::reference_bf16(x) : zk::test::reference_f16(x);
  std::memcpy(b.data() + 2 * i, &h, 2);
}

// Source k: random values with a special every few elements, stored in `dtype`.
std::vector<std::byte> source(int k, DType dtype) {
  const auto v = zk::test::random_floats(kElems, 40 + static_cast<std::uint32_t>(k), -3.0f, 3.0f);
  const float specials[] = {INFINITY, -INFINITY, NAN, -0.0f, 1e-41f, 6e-8f, 65504.0f, 3e38f};
  std::vector<std::byte> out(kElems * zero::dtype_size(dtype));
  for (std::size_t i = 0; i < kElems; ++i) {
    const bool special = (i + static_cast<std::size_t>(7 * k)) % 11 == 0;
    store(out, dtype, i, special ? specials[(i / 11 + static_cast<std::size_t>(k)) % 8] : v[i]);
  }
  return out;
}

std::vector<std::byte> oracle(const std::vector<std::vector<std::byte>>& srcs, DType dtype,
                              zk::ReduceKind kind, float divisor) {
  std::vector<std::byte> out(srcs[0].size());
  for (std::size_t i = 0; i < kElems; ++i) {
    float acc = load(srcs[0], dtype, i);
    for (std::size_t k = 1; k < srcs.size(); ++k) {
      const float x = load(srcs[k], dtype, i);
      if (kind == zk::ReduceKind::Max) {
        if (x > acc || std::isnan(x)) acc = x;
      } else {
        acc += x;
      }
    }
    if (divisor != 0.0f) acc /= divisor;
    store(out, dtype, i, acc);
  }
  return out;
}

}  // namespace

TEST_CASE("reduce sums, maxes and averages bitwise like the oracle on every ISA and dtype") {
  std::size_t nan_results = 0, finite_results = 0;
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    std::vector<std::vector<std::byte>> srcs;
    for (int k = 0; k < kSources; ++k) srcs.push_back(source(k, dtype));
    std::vector<const void*> ptrs;
    for (const auto& s : srcs) ptrs.push_back(s.data());
    const std::pair<zk::ReduceKind, float> cases[] = {
        {zk::ReduceKind::Sum, 0.0f}, {zk::ReduceKind::Max, 0.0f}, {zk::ReduceKind::Sum, 3.0f}};
    for (const auto& [kind, divisor] : cases) {
      const auto expected = oracle(srcs, dtype, kind, divisor);
      for (std::size_t i = 0; i < kElems; ++i) {
        const float e = load(expected, dtype, i);
        (std::isnan(e) ? nan_results : finite_results) += 1;
      }
      for (zk::Isa isa : zk::test::runnable_isas()) {
        for (zk::Stores stores : {zk::Stores::Cached, zk::Stores::Streaming}) {
          const bool streaming = stores == zk::Stores::Streaming;
          // The destination at a 64-byte line's start and `skew` elements into one, so that
          // streaming's ordinary stores up to the first line run too.
          for (std::size_t skew : {std::size_t{0}, std::size_t{3}}) {
            INFO(zero::dtype_name(dtype)
                 << " " << (kind == zk::ReduceKind::Max ? "max" : "sum") << " / " << divisor
                 << " on " << zk::isa_name(isa) << (streaming ? ", streaming" : ", cached")
                 << ", dst " << skew << " elements past a line");
            const std::size_t esz = zero::dtype_size(dtype);
            std::vector<std::byte> buffer(expected.size() + 64 + skew * esz);
            const auto addr = reinterpret_cast<std::uintptr_t>(buffer.data());
            std::byte* out = buffer.data() + (64 - addr % 64) % 64 + skew * esz;
            zk::reduce_cpu(out, ptrs.data(), kSources, kElems, dtype, kind, divisor, isa, stores);
            REQUIRE(std::memcmp(out, expected.data(), expected.size()) == 0);
          }
          // In place: the destination is source 1.
          auto aliased = srcs;
          std::vector<const void*> aptrs;
          for (const auto& s : aliased) aptrs.push_back(s.data());
          zk::reduce_cpu(aliased[1].data(), aptrs.data(), kSources, kElems, dtype, kind, divisor,
                         isa, stores);
          REQUIRE(std::memcmp(aliased[1].data(), expected.data(), expected.size()) == 0);
        }
      }
    }
  }
  // Guards: the comparisons covered both NaN results and ordinary ones.
  CHECK(nan_results > 0);
  CHECK(finite_results > nan_results);
}

TEST_CASE("reduce refuses no sources and null buffers, naming the argument") {
  float x = 1;
  const void* one[] = {&x};
  REQUIRE_THROWS_WITH(zk::reduce_cpu(&x, one, 0, 1, DType::F32, zk::ReduceKind::Sum, 0.0f),
                      Catch::Contains("at least one source"));
  const void* null_src[] = {nullptr};
  REQUIRE_THROWS_WITH(zk::reduce_cpu(&x, null_src, 1, 1, DType::F32, zk::ReduceKind::Sum, 0.0f),
                      Catch::Contains("source is null"));
}
