// The AVX2 form of one whole block's quantization and dequantization (kernels/quantize.h): the
// same IEEE operations as the portable loops of quantize_cpu.cpp, so the same bytes. Compiled with
// AVX2/FMA/F16C flags (kernels/CMakeLists.txt) and entered only where isa_supported() said yes.
#include "kernels/quantize_blocks.h"

#include <cstring>
#include <limits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace zero::kernels::detail {

#if defined(__AVX2__)
namespace {

// Elements [i, i + 8) of a block in fp32 (exact widening).
inline __m256 load8(const void* src, DType dtype, std::size_t i) {
  if (dtype == DType::F32) return _mm256_loadu_ps(static_cast<const float*>(src) + i);
  const auto* h = reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(src) + i);
  if (dtype == DType::F16) return _mm256_cvtph_ps(_mm_loadu_si128(h));
  // bf16: its bits are the top half of the fp32's.
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h)), 16));
}

// The rounded, clamped codes of elements [i, i + 8) as int32 lanes.
inline __m256i codes8(const void* src, DType dtype, std::size_t i, __m256 scale, __m256 qmax) {
  const __m256 r = _mm256_round_ps(_mm256_div_ps(load8(src, dtype, i), scale),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 c = _mm256_min_ps(_mm256_max_ps(r, _mm256_sub_ps(_mm256_setzero_ps(), qmax)), qmax);
  return _mm256_cvtps_epi32(c);  // exact: small integers
}

}  // namespace

float quantize_block_avx2(const void* src, DType dtype, int bits, float qmax_s,
                          std::uint8_t* codes) {
  // max |x| on the bits, as the portable loop takes it (inf and NaN compare largest).
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i top = _mm256_setzero_si256();
  for (std::size_t i = 0; i < kQuantBlock; i += 8) {
    const __m256i u = _mm256_and_si256(_mm256_castps_si256(load8(src, dtype, i)), abs_mask);
    top = _mm256_max_epu32(top, u);
  }
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), top);
  std::uint32_t t = 0;
  for (std::uint32_t lane : lanes) t = lane > t ? lane : t;
  const std::size_t code_bytes = bits == 8 ? kQuantBlock : kQuantBlock / 2;
  if (t >= 0x7f800000u) {  // an inf or a NaN
    std::memset(codes, 0, code_bytes);
    return std::numeric_limits<float>::quiet_NaN();
  }
  float amax;
  std::memcpy(&amax, &t, sizeof amax);
  const float scale_s = amax / qmax_s;
  if (scale_s == 0) {
    std::memset(codes, 0, code_bytes);
    return scale_s;
  }
  const __m256 scale = _mm256_set1_ps(scale_s);
  const __m256 qmax = _mm256_set1_ps(qmax_s);
  // Dword order after the two saturating packs of four vectors a, b, c, d (each 128-bit lane
  // packs on its own): a0-3 b0-3 c0-3 d0-3 a4-7 b4-7 c4-7 d4-7; this puts them back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (std::size_t i = 0; i < kQuantBlock; i += 32) {
    const __m256i ab = _mm256_packs_epi32(codes8(src, dtype, i, scale, qmax),
                                          codes8(src, dtype, i + 8, scale, qmax));
    const __m256i cd = _mm256_packs_epi32(codes8(src, dtype, i + 16, scale, qmax),
                                          codes8(src, dtype, i + 24, scale, qmax));
    const __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
    if (bits == 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), q);
      continue;
    }
    // Two codes a byte, element 2j in the low nibble: in 16-bit lanes w = c[2j] | c[2j+1] << 8,
    // the byte is (w & 0x0f) | ((w >> 4) & 0xf0).
    const __m256i packed =
        _mm256_or_si256(_mm256_and_si256(q, _mm256_set1_epi16(0x000f)),
                        _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi16(0x00f0)));
    // Narrow the 16 words to bytes (per lane), then gather the two lanes' low halves.
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(packed, packed), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i / 2), _mm256_castsi256_si128(bytes));
  }
  return scale_s;
}

void dequantize_block_avx2(const std::uint8_t* codes, float scale_s, int bits, float* out,
                           bool accumulate) {
  const __m256 scale = _mm256_set1_ps(scale_s);
  auto put = [&](std::size_t i, __m256i c32) {
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(c32), scale);
    if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
    _mm256_storeu_ps(out + i, v);
  };
  if (bits == 8) {
    for (std::size_t i = 0; i < kQuantBlock; i += 8) {
      std::int64_t eight;
      std::memcpy(&eight, codes + i, sizeof eight);
      put(i, _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(eight)));
    }
    return;
  }
  // 4 bytes hold 8 codes: byte j's low nibble is element 2j, its high nibble 2j + 1. Each byte
  // goes to two 32-bit lanes, shifted so the wanted nibble is on top, then shifted back with sign.
  const __m256i spread = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
  const __m256i to_top = _mm256_setr_epi32(28, 24, 28, 24, 28, 24, 28, 24);
  for (std::size_t i = 0; i < kQuantBlock; i += 8) {
    std::int32_t four;
    std::memcpy(&four, codes + i / 2, sizeof four);
    const __m256i b = _mm256_permutevar8x32_epi32(
        _mm256_cvtepu8_epi32(_mm_cvtsi32_si128(four)), spread);
    put(i, _mm256_srai_epi32(_mm256_sllv_epi32(b, to_top), 28));
  }
}

#else  // not an x86-64 build: isa_supported() never selects these

float quantize_block_avx2(const void*, DType, int, float, std::uint8_t*) {
  return std::numeric_limits<float>::quiet_NaN();
}
void dequantize_block_avx2(const std::uint8_t*, float, int, float*, bool) {}

#endif

}  // namespace zero::kernels::detail
