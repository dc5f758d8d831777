#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu_parallel.h"
#include "kernels/isa.h"
#include "kernels/quantize.h"
#include "kernels/quantize_blocks.h"
#include "zero/base/error.h"
#include "zero/base/half.h"

namespace zero::kernels {
namespace {

constexpr std::size_t kTileBlocks = 64;  // blocks per OpenMP tile

int qmax_of(int bits) {
  return bits == 8 ? 127 : 7;
}

std::size_t code_bytes(std::size_t n, int bits) {
  const std::size_t raw = bits == 8 ? n : (n + 1) / 2;
  return (raw + 3) / 4 * 4;
}

// tile[0, n) = src[begin, begin + n) in fp32 (exact widening).
void widen(const void* src, DType dtype, std::size_t begin, std::size_t n, float* tile) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(tile, static_cast<const float*>(src) + begin, n * sizeof(float));
      return;
    case DType::BF16: {
      const auto* h = static_cast<const std::uint16_t*>(src) + begin;
      for (std::size_t i = 0; i < n; ++i) tile[i] = half::bf16_to_float(h[i]);
      return;
    }
    case DType::F16: {
      const auto* h = static_cast<const std::uint16_t*>(src) + begin;
      for (std::size_t i = 0; i < n; ++i) tile[i] = half::f16_to_float(h[i]);
      return;
    }
    case DType::F64: {
      const auto* d = static_cast<const double*>(src) + begin;
      for (std::size_t i = 0; i < n; ++i) tile[i] = static_cast<float>(d[i]);
      return;
    }
  }
}

// dst[begin, begin + n) = tile[0, n), rounded once to `dtype`.
void narrow(const float* tile, std::size_t begin, std::size_t n, void* dst, DType dtype) {
  switch (dtype) {
    case DType::F32: std::memcpy(static_cast<float*>(dst) + begin, tile, n * sizeof(float)); return;
    case DType::BF16: {
      auto* h = static_cast<std::uint16_t*>(dst) + begin;
      for (std::size_t i = 0; i < n; ++i) h[i] = half::float_to_bf16(tile[i]);
      return;
    }
    case DType::F16: {
      auto* h = static_cast<std::uint16_t*>(dst) + begin;
      for (std::size_t i = 0; i < n; ++i) h[i] = half::float_to_f16(tile[i]);
      return;
    }
    case DType::F64: {
      auto* d = static_cast<double*>(dst) + begin;
      for (std::size_t i = 0; i < n; ++i) d[i] = tile[i];
      return;
    }
  }
}

// Rounds half to even for |x| < 2^22 with adds only (the default rounding mode does it), so the
// loops vectorize on any x86-64 without a rounding instruction.
inline float round_half_even(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 · 2^23
  return (x + kMagic) - kMagic;
}

// Whole blocks take the AVX2 forms (quantize_avx2.cpp, the same bytes) where the ISA resolved for
// the call has them; the last, shorter block and fp64 the portable loops below.
bool use_avx2(const CpuExec& exec) {
  return resolve_isa(exec.isa) != Isa::Scalar;
}

void check_bits(int bits, const char* what) {
  ZERO_CHECK(bits == 8 || bits == 4, "{}: {} bits; expected 8 or 4", what, bits);
}

// tile[0, n) = the dequantized elements [b, b + n) of block b / kQuantBlock (b block-aligned).
// Cloned for AVX2 as quantize_tile is.
__attribute__((target_clones("avx2", "default"))) void dequantize_block(const std::uint8_t* codes,
                                                                        const float* scales,
                                                                        std::size_t b,
                                                                        std::size_t n, int bits,
                                                                        float* tile) {
  const float scale = scales[b / kQuantBlock];
  if (bits == 8) {
    const auto* c = reinterpret_cast<const std::int8_t*>(codes) + b;
    for (std::size_t i = 0; i < n; ++i) tile[i] = static_cast<float>(c[i]) * scale;
    return;
  }
  // Two codes a byte; a nibble is sign-extended by moving it to the top of a byte and
  // arithmetic-shifting it back.
  const std::uint8_t* c = codes + b / 2;
  for (std::size_t j = 0; j < n / 2; ++j) {
    tile[2 * j] = static_cast<float>(static_cast<std::int8_t>(c[j] << 4) >> 4) * scale;
    tile[2 * j + 1] = static_cast<float>(static_cast<std::int8_t>(c[j]) >> 4) * scale;
  }
  if (n % 2 == 1) {
    tile[n - 1] = static_cast<float>(static_cast<std::int8_t>(c[n / 2] << 4) >> 4) * scale;
  }
}

// fn(block_begin, n, tile) for every block of the dequantized `in`, over OpenMP tiles; or, with
// `direct` (fp32 out of place or added, from whole blocks in AVX2), into direct + block_begin
// itself, fn not called for those blocks.
template <typename Fn>
void for_each_dequantized(const void* in, std::size_t n, int bits, const CpuExec& exec,
                          float* direct, bool accumulate, Fn&& fn) {
  const auto* codes = static_cast<const std::uint8_t*>(in);
  const auto* scales = reinterpret_cast<const float*>(codes + code_bytes(n, bits));
  const bool avx2 = use_avx2(exec);
  detail::for_each_tile(
      n, kTileBlocks * kQuantBlock, resolve_threads(exec.threads),
      [&](std::size_t begin, std::size_t end) {
        alignas(64) float tile[kQuantBlock];
        for (std::size_t b = begin; b < end; b += kQuantBlock) {
          const std::size_t m = std::min(end, b + kQuantBlock) - b;
          if (avx2 && m == kQuantBlock) {
            const std::uint8_t* block = codes + (bits == 8 ? b : b / 2);
            const float scale = scales[b / kQuantBlock];
            if (direct != nullptr) {
              detail::dequantize_block_avx2(block, scale, bits, direct + b, accumulate);
              continue;
            }
            detail::dequantize_block_avx2(block, scale, bits, tile, false);
          } else {
            dequantize_block(codes, scales, b, m, bits, tile);
          }
          fn(b, m, tile);
        }
      });
}

// The codes of one block (m elements in `tile`, which it overwrites) into q; returns its scale.
// Cloned for AVX2 (the same IEEE arithmetic, FMA contraction off: the same bits) so its loops
// use 8-wide vectors where the CPU has them.
__attribute__((target_clones("avx2", "default"))) float quantize_tile(float* tile, std::size_t m,
                                                                      float qmax, std::int8_t* q) {
  // max |x| on the bits: without the sign, non-negative floats order as their bit patterns,
  // and inf (0x7f800000) and NaN (above it) are the largest (an integer max vectorizes).
  std::uint32_t top = 0;
  for (std::size_t i = 0; i < m; ++i) {
    std::uint32_t u;
    std::memcpy(&u, tile + i, sizeof u);
    u &= 0x7fffffffu;
    top = u > top ? u : top;
  }
  if (top >= 0x7f800000u) {  // an inf or a NaN
    std::fill(q, q + m, std::int8_t{0});
    return std::numeric_limits<float>::quiet_NaN();
  }
  float amax;
  std::memcpy(&amax, &top, sizeof amax);
  const float scale = amax / qmax;
  if (scale == 0) {
    std::fill(q, q + m, std::int8_t{0});
    return scale;
  }
  // Rounded codes first (fp32, exact small integers), narrowed in a second loop: each loop
  // vectorizes on its own.
  for (std::size_t i = 0; i < m; ++i) {
    const float r = round_half_even(tile[i] / scale);
    tile[i] = r > qmax ? qmax : (r < -qmax ? -qmax : r);
  }
  for (std::size_t i = 0; i < m; ++i) q[i] = static_cast<std::int8_t>(static_cast<int>(tile[i]));
  return scale;
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
  const std::size_t cb = code_bytes(n, bits);
  auto* scales = reinterpret_cast<float*>(codes + cb);
  std::memset(codes + (bits == 8 ? n : (n + 1) / 2), 0, cb - (bits == 8 ? n : (n + 1) / 2));
  const float qmax = static_cast<float>(qmax_of(bits));
  const bool avx2 = use_avx2(exec) && dtype != DType::F64;
  // Tiles are whole blocks, and in 4 bits whole bytes (kQuantBlock is even).
  detail::for_each_tile(
      n, kTileBlocks * kQuantBlock, resolve_threads(exec.threads),
      [&](std::size_t begin, std::size_t end) {
        alignas(64) float tile[kQuantBlock];
        alignas(64) std::int8_t q[kQuantBlock];
        for (std::size_t b = begin; b < end; b += kQuantBlock) {
          const std::size_t m = std::min(end, b + kQuantBlock) - b;
          if (avx2 && m == kQuantBlock) {
            scales[b / kQuantBlock] = detail::quantize_block_avx2(
                static_cast<const std::byte*>(src) + b * dtype_size(dtype), dtype, bits, qmax,
                codes + (bits == 8 ? b : b / 2));
            continue;
          }
          widen(src, dtype, b, m, tile);
          scales[b / kQuantBlock] = quantize_tile(tile, m, qmax, q);
          if (bits == 8) {
            std::memcpy(codes + b, q, m);
          } else {
            std::uint8_t* packed = codes + b / 2;
            for (std::size_t i = 0; i + 1 < m; i += 2) {
              packed[i / 2] = static_cast<std::uint8_t>((q[i] & 0xf) | ((q[i + 1] & 0xf) << 4));
            }
            if (m % 2 == 1) packed[m / 2] = static_cast<std::uint8_t>(q[m - 1] & 0xf);
          }
        }
      });
}

void dequantize_cpu(const void* in, std::size_t n, int bits, void* dst, DType dtype,
                    const CpuExec& exec) {
  check_bits(bits, "dequantize");
  float* direct = dtype == DType::F32 ? static_cast<float*>(dst) : nullptr;
  for_each_dequantized(in, n, bits, exec, direct, false,
                       [&](std::size_t b, std::size_t m, const float* tile) {
                         narrow(tile, b, m, dst, dtype);
                       });
}

void dequantize_add_cpu(const void* in, std::size_t n, int bits, float* acc, const CpuExec& exec) {
  check_bits(bits, "dequantize_add");
  for_each_dequantized(in, n, bits, exec, acc, true,
                       [&](std::size_t b, std::size_t m, const float* tile) {
                         for (std::size_t i = 0; i < m; ++i) acc[b + i] += tile[i];
                       });
}

}  // namespace zero::kernels
