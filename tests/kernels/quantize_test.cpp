// Block quantization (kernels/quantize.h) against a straightforward reference written here, for
// every dtype, both widths and sizes around the block length.
#include "kernels/quantize.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "zero/base/half.h"

using zero::DType;
namespace k = zero::kernels;

namespace {

// Input values stored in `dtype`, and their true values as double.
struct Input {
  std::vector<std::byte> bytes;
  std::vector<double> values;
};

Input make_input(DType dtype, std::size_t n, std::uint32_t seed, double spread) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, spread);
  Input in;
  in.bytes.resize(n * zero::dtype_size(dtype));
  for (std::size_t i = 0; i < n; ++i) {
    // Every 7th block is all zero.
    const double x = (i / k::kQuantBlock) % 7 == 3 ? 0.0 : normal(gen);
    double stored = 0;
    if (dtype == DType::F32) {
      const auto f = static_cast<float>(x);
      std::memcpy(in.bytes.data() + 4 * i, &f, 4);
      stored = f;
    } else {
      const std::uint16_t h = dtype == DType::BF16
                                  ? zero::half::float_to_bf16(static_cast<float>(x))
                                  : zero::half::float_to_f16(static_cast<float>(x));
      std::memcpy(in.bytes.data() + 2 * i, &h, 2);
      stored = dtype == DType::BF16 ? zero::half::bf16_to_float(h) : zero::half::f16_to_float(h);
    }
    in.values.push_back(stored);
  }
  return in;
}

// The reference: per block, scale = max|x| / qmax in fp32, codes by half-to-even rounding.
struct Reference {
  std::vector<int> codes;
  std::vector<float> scales;
};

Reference reference(const std::vector<double>& x, int bits) {
  const int qmax = bits == 8 ? 127 : 7;
  Reference r;
  for (std::size_t b = 0; b < x.size(); b += k::kQuantBlock) {
    const std::size_t e = std::min(x.size(), b + k::kQuantBlock);
    float amax = 0;
    for (std::size_t i = b; i < e; ++i) amax = std::max(amax, static_cast<float>(std::fabs(x[i])));
    const float scale = amax / static_cast<float>(qmax);
    r.scales.push_back(scale);
    for (std::size_t i = b; i < e; ++i) {
      int c = 0;
      if (scale != 0) {
        const float ratio = static_cast<float>(x[i]) / scale;
        const float lower = std::floor(ratio);
        const float frac = ratio - lower;
        float q = frac > 0.5f   ? lower + 1
                  : frac < 0.5f ? lower
                                : (std::fmod(lower, 2.0f) == 0 ? lower : lower + 1);
        c = static_cast<int>(
            std::max(-static_cast<float>(qmax), std::min(static_cast<float>(qmax), q)));
      }
      r.codes.push_back(c);
    }
  }
  return r;
}

// Every ISA this CPU has: each quantizes to the same bytes (whole blocks take the AVX2 form where
// the ISA is not scalar).
std::vector<k::Isa> isas() {
  std::vector<k::Isa> out{k::Isa::Scalar};
  for (k::Isa isa : {k::Isa::Avx2, k::Isa::Avx512}) {
    if (k::isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

int code_of(const std::vector<std::byte>& q, std::size_t i, int bits) {
  const auto* b = reinterpret_cast<const std::uint8_t*>(q.data());
  if (bits == 8) return static_cast<std::int8_t>(b[i]);
  const int nibble = (b[i / 2] >> (4 * (i % 2))) & 0xf;
  return nibble >= 8 ? nibble - 16 : nibble;
}

}  // namespace

TEST_CASE("quantize matches the reference codes and scales for every dtype, width and size") {
  std::size_t checked = 0, nonzero = 0;
  for (k::Isa isa : isas())
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (int bits : {8, 4}) {
      for (std::size_t n :
           {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{255}, std::size_t{256},
            std::size_t{257}, std::size_t{1000}, std::size_t{40001}}) {
        INFO(k::isa_name(isa) << ", " << zero::dtype_name(dtype) << ", " << bits << " bits, " << n
                              << " elements");
        const k::CpuExec exec{.isa = isa};
        const Input in = make_input(dtype, n, static_cast<std::uint32_t>(n + bits), 0.7);
        std::vector<std::byte> q(k::quantized_bytes(n, bits));
        REQUIRE(q.size() % 4 == 0);
        k::quantize_cpu(in.bytes.data(), dtype, n, bits, q.data(), exec);
        const Reference ref = reference(in.values, bits);
        const std::size_t code_bytes = bits == 8 ? n : (n + 1) / 2;
        const std::size_t padded = (code_bytes + 3) / 4 * 4;
        REQUIRE(q.size() == padded + ref.scales.size() * 4);
        for (std::size_t b = 0; b < ref.scales.size(); ++b) {
          float s;
          std::memcpy(&s, q.data() + padded + 4 * b, 4);
          REQUIRE(s == ref.scales[b]);
        }
        for (std::size_t i = 0; i < n; ++i) {
          REQUIRE(code_of(q, i, bits) == ref.codes[i]);
          nonzero += ref.codes[i] != 0;
        }
        checked += n;

        // Dequantized: within half a step of the input, rounded once to the dtype.
        std::vector<std::byte> back(n * zero::dtype_size(dtype));
        k::dequantize_cpu(q.data(), n, bits, back.data(), dtype, exec);
        const Input round_trip = [&] {
          Input r;
          for (std::size_t i = 0; i < n; ++i) {
            double v = 0;
            if (dtype == DType::F32) {
              float f;
              std::memcpy(&f, back.data() + 4 * i, 4);
              v = f;
            } else {
              std::uint16_t h;
              std::memcpy(&h, back.data() + 2 * i, 2);
              v = dtype == DType::BF16 ? zero::half::bf16_to_float(h) : zero::half::f16_to_float(h);
            }
            r.values.push_back(v);
          }
          return r;
        }();
        const double dtype_eps = dtype == DType::F32 ? 1e-7 : dtype == DType::BF16 ? 8e-3 : 1e-3;
        for (std::size_t i = 0; i < n; ++i) {
          const double scale = ref.scales[i / k::kQuantBlock];
          const double exact = static_cast<double>(ref.codes[i]) * scale;
          REQUIRE(std::fabs(round_trip.values[i] - in.values[i]) <=
                  scale / 2 * (1 + 1e-6) + std::fabs(exact) * dtype_eps);
        }
        // dequantize_add adds the same fp32 values.
        std::vector<float> acc(n, 1.0f);
        k::dequantize_add_cpu(q.data(), n, bits, acc.data(), exec);
        for (std::size_t i = 0; i < n; ++i) {
          REQUIRE(acc[i] ==
                  1.0f + static_cast<float>(ref.codes[i]) * ref.scales[i / k::kQuantBlock]);
        }
      }
    }
  }
  REQUIRE(checked > 100000);  // not a vacuous pass
  REQUIRE(nonzero > checked / 2);
}

TEST_CASE("ties round half to even, and the codes reach +-qmax, on every ISA") {
  // Blocks whose max |x| is qmax, so the scale is 1 and x / scale is x: halves are exact ties.
  for (int bits : {8, 4}) {
    const float qmax = bits == 8 ? 127.0f : 7.0f;
    std::vector<float> x(2 * k::kQuantBlock);
    std::vector<int> expected(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float base = static_cast<float>(static_cast<int>(i % 13) - 6);  // -6 .. 6
      const float v = i % 64 == 0 ? qmax : i % 64 == 1 ? -qmax : base + (i % 2 ? 0.5f : -0.5f);
      x[i] = v;
      const float lo = std::floor(v);
      expected[i] = static_cast<int>(v - lo != 0.5f ? std::nearbyint(v)
                                                     : (std::fmod(lo, 2.0f) == 0 ? lo : lo + 1));
    }
    for (k::Isa isa : isas()) {
      INFO(k::isa_name(isa) << ", " << bits << " bits");
      std::vector<std::byte> q(k::quantized_bytes(x.size(), bits));
      k::quantize_cpu(x.data(), DType::F32, x.size(), bits, q.data(), {.isa = isa});
      std::size_t ties = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        INFO(i << ": " << x[i]);
        REQUIRE(code_of(q, i, bits) == expected[i]);
        ties += x[i] - std::floor(x[i]) == 0.5f;
      }
      REQUIRE(ties > x.size() / 2);  // the ties were there to round
    }
  }
}

TEST_CASE("bf16 is quantized from its own values, not from its bits read as fp16") {
  // 1.0 in bf16 is 0x3f80; read as fp16 those bits are 1.875.
  const std::uint16_t one = zero::half::float_to_bf16(1.0f);
  std::vector<std::byte> q(k::quantized_bytes(1, 8));
  k::quantize_cpu(&one, DType::BF16, 1, 8, q.data());
  std::uint16_t back = 0;
  k::dequantize_cpu(q.data(), 1, 8, &back, DType::BF16);
  REQUIRE(zero::half::bf16_to_float(back) == 1.0f);
}

TEST_CASE("a block with an inf or a NaN dequantizes to NaN; its neighbours are untouched") {
  for (k::Isa isa : isas()) {
    for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      INFO(k::isa_name(isa) << ", " << bad);
      std::vector<float> x(3 * k::kQuantBlock, 0.25f);
      x[k::kQuantBlock + 5] = bad;
      std::vector<std::byte> q(k::quantized_bytes(x.size(), 4));
      k::quantize_cpu(x.data(), DType::F32, x.size(), 4, q.data(), {.isa = isa});
      std::vector<float> back(x.size());
      k::dequantize_cpu(q.data(), x.size(), 4, back.data(), DType::F32, {.isa = isa});
      for (std::size_t i = 0; i < x.size(); ++i) {
        const bool in_bad_block = i / k::kQuantBlock == 1;
        INFO(i);
        REQUIRE(std::isnan(back[i]) == in_bad_block);
        if (!in_bad_block) REQUIRE(back[i] == 0.25f);
      }
    }
  }
}

TEST_CASE("quantization is the same with any number of threads") {
  const Input in = make_input(DType::F32, 300000, 5, 3.0);
  std::vector<std::byte> one(k::quantized_bytes(300000, 4)), many(one.size());
  k::quantize_cpu(in.bytes.data(), DType::F32, 300000, 4, one.data(), {.threads = 1});
  k::quantize_cpu(in.bytes.data(), DType::F32, 300000, 4, many.data(), {.threads = 4});
  REQUIRE(one == many);
}
