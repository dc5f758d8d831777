#include "kernels/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu_parallel.h"
#include "kernels/isa.h"
#include "zero/base/error.h"
#include "zero/base/half.h"

namespace zero::kernels {
namespace {

constexpr std::size_t kTileBlocks = 64;  // blocks per OpenMP tile

int qmax_of(int bits) { return bits == 8 ? 127 : 7; }

std::size_t code_bytes(std::size_t n, int bits) {
  const std::size_t raw = bits == 8 ? n : (n + 1) / 2;
  return (raw + 3) / 4 * 4;
}

float load(const void* src, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(src)[i];
    case DType::BF16: return half::bf16_to_float(static_cast<const std::uint16_t*>(src)[i]);
    case DType::F16: return half::f16_to_float(static_cast<const std::uint16_t*>(src)[i]);
    case DType::F64: return static_cast<float>(static_cast<const double*>(src)[i]);
  }
  return 0;
}

void store(void* dst, DType dtype, std::size_t i, float v) {
  switch (dtype) {
    case DType::F32: static_cast<float*>(dst)[i] = v; return;
    case DType::BF16: static_cast<std::uint16_t*>(dst)[i] = half::float_to_bf16(v); return;
    case DType::F16: static_cast<std::uint16_t*>(dst)[i] = half::float_to_f16(v); return;
    case DType::F64: static_cast<double*>(dst)[i] = v; return;
  }
}

int code_at(const std::uint8_t* codes, std::size_t i, int bits) {
  if (bits == 8) return static_cast<std::int8_t>(codes[i]);
  const int nibble = (codes[i / 2] >> (4 * (i % 2))) & 0xf;
  return nibble >= 8 ? nibble - 16 : nibble;
}

void check_bits(int bits, const char* what) {
  ZERO_CHECK(bits == 8 || bits == 4, "{}: {} bits; expected 8 or 4", what, bits);
}

// fn(i, value) for every element of the dequantized `in`, block by block over OpenMP tiles.
template <typename Fn>
void for_each_dequantized(const void* in, std::size_t n, int bits, const CpuExec& exec, Fn&& fn) {
  const auto* codes = static_cast<const std::uint8_t*>(in);
  const auto* scales = reinterpret_cast<const float*>(codes + code_bytes(n, bits));
  detail::for_each_tile(n, kTileBlocks * kQuantBlock, resolve_threads(exec.threads),
                        [&](std::size_t begin, std::size_t end) {
                          for (std::size_t i = begin; i < end; ++i) {
                            const float scale = scales[i / kQuantBlock];
                            fn(i, static_cast<float>(code_at(codes, i, bits)) * scale);
                          }
                        });
}

}  // namespace

std::size_t quantized_bytes(std::size_t n, int bits) {
  check_bits(bits, "quantized_bytes");
  return code_bytes(n, bits) + (n + kQuantBlock - 1) / kQuantBlock * sizeof(float);
}

void quantize_cpu(const void* src, DType dtype, std::size_t n, int bits, void* out,
                  const CpuExec& exec) {
  check_bits(bits, "quantize");
  auto* codes = static_cast<std::uint8_t*>(out);
  std::memset(codes, 0, code_bytes(n, bits));
  auto* scales = reinterpret_cast<float*>(codes + code_bytes(n, bits));
  const int qmax = qmax_of(bits);
  // Tiles are whole blocks, and in 4 bits whole bytes (kQuantBlock is even).
  detail::for_each_tile(n, kTileBlocks * kQuantBlock, resolve_threads(exec.threads),
                        [&](std::size_t begin, std::size_t end) {
    for (std::size_t b = begin; b < end; b += kQuantBlock) {
      const std::size_t e = std::min(end, b + kQuantBlock);
      float amax = 0;
      bool finite = true;
      for (std::size_t i = b; i < e; ++i) {
        const float x = load(src, dtype, i);
        finite = finite && std::isfinite(x);
        amax = std::max(amax, std::fabs(x));
      }
      const float scale = !finite ? std::numeric_limits<float>::quiet_NaN()
                                  : amax / static_cast<float>(qmax);
      scales[b / kQuantBlock] = scale;
      if (!finite || scale == 0) continue;  // codes stay 0
      for (std::size_t i = b; i < e; ++i) {
        const float q = std::nearbyint(load(src, dtype, i) / scale);  // half to even
        const int c = static_cast<int>(std::clamp(q, -static_cast<float>(qmax),
                                                  static_cast<float>(qmax)));
        if (bits == 8) {
          codes[i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(c));
        } else {
          codes[i / 2] |= static_cast<std::uint8_t>((c & 0xf) << (4 * (i % 2)));
        }
      }
    }
  });
}

void dequantize_cpu(const void* in, std::size_t n, int bits, void* dst, DType dtype,
                    const CpuExec& exec) {
  check_bits(bits, "dequantize");
  for_each_dequantized(in, n, bits, exec, [&](std::size_t i, float v) { store(dst, dtype, i, v); });
}

void dequantize_add_cpu(const void* in, std::size_t n, int bits, float* acc,
                        const CpuExec& exec) {
  check_bits(bits, "dequantize_add");
  for_each_dequantized(in, n, bits, exec, [&](std::size_t i, float v) { acc[i] += v; });
}

}  // namespace zero::kernels
