// Helpers shared by the kernel tests: seeded random arrays, the 16-bit float oracle, and the ISAs
// this machine can run.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/isa.h"
#include "zero/base/dtype.h"
#include "tests/zero/base/half_test_util.h"

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

// The 16-bit float oracle, independent of zero/base/half.h.
using half_test::bf16_value;
using half_test::f16_value;
using half_test::reference_bf16;
using half_test::reference_f16;

// Element i of a buffer of `dtype` (F32, BF16 or F16), the 16-bit ones through the oracle.
inline double element_value(const std::vector<std::byte>& b, DType dtype, std::size_t i) {
  if (dtype == DType::F32) {
    float x;
    std::memcpy(&x, b.data() + 4 * i, 4);
    return x;
  }
  std::uint16_t h;
  std::memcpy(&h, b.data() + 2 * i, 2);
  return dtype == DType::BF16 ? bf16_value(h) : f16_value(h);
}

inline std::vector<std::uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = reference_bf16(v[i]);
  return out;
}

}  // namespace zero::kernels::test
