// Vector types for the CPU ISA paths. Each has the operators the element functions use (+ − × ÷,
// zero_sqrt, zero_sign) and loads/stores that convert 16-bit floats with the bits of the scalar
// conversions in zero/base/half.h (the rule is stated there).
// Included only by the per-ISA translation units (cpu_scalar.cpp, cpu_avx2.cpp, cpu_avx512.cpp),
// whose -m flags decide which types exist.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#elif defined(__x86_64__)
#include <emmintrin.h>  // SSE2's non-temporal stores, for the scalar ISA's streaming reduce
#endif

#include "kernels/element_math.h"
#include "zero/base/half.h"
#include "zero/base/hd.h"

namespace zero::kernels::math {
inline namespace ZERO_KERNELS_ABI {

// One float at a time: the portable path, and the tail of every vector path.
struct ScalarOps {
  using V = float;
  static constexpr int kWidth = 1;
  static V load_f32(const float* p) { return *p; }
  static V load_bf16(const std::uint16_t* p) { return half::bf16_to_float(*p); }
  static V load_f16(const std::uint16_t* p) { return half::f16_to_float(*p); }
  static void store_f32(float* p, V x) { *p = x; }
  static void store_bf16(std::uint16_t* p, V x) { *p = half::float_to_bf16(x); }
  static void store_f16(std::uint16_t* p, V x) { *p = half::float_to_f16(x); }
  static void store_bf16_truncated(std::uint16_t* p, V x) {
    *p = static_cast<std::uint16_t>(half::float_bits(x) >> 16);
  }
  static bool any_nonfinite(V x) {
    const float d = x - x;  // NaN exactly when x is ±inf or NaN
    return d != d;
  }
  // x when x > acc or x is NaN, else acc: a maximum that propagates NaN (the communicators' Max).
  static V max_nan(V acc, V x) { return (x > acc || x != x) ? x : acc; }
  // Squared-norm lanes: element k of a block adds to lane k % 8.
  static void accumulate_squares(V x, double lanes[8], std::size_t lane) {
    const double d = static_cast<double>(x);
    lanes[lane] = lanes[lane] + d * d;
  }
};

#if defined(__AVX2__)
struct Vec8 {
  __m256 v;
  Vec8() = default;
  explicit Vec8(float s) : v(_mm256_set1_ps(s)) {}
  explicit Vec8(__m256 x) : v(x) {}
};
inline Vec8 operator+(Vec8 a, Vec8 b) {
  return Vec8(_mm256_add_ps(a.v, b.v));
}
inline Vec8 operator-(Vec8 a, Vec8 b) {
  return Vec8(_mm256_sub_ps(a.v, b.v));
}
inline Vec8 operator*(Vec8 a, Vec8 b) {
  return Vec8(_mm256_mul_ps(a.v, b.v));
}
inline Vec8 operator/(Vec8 a, Vec8 b) {
  return Vec8(_mm256_div_ps(a.v, b.v));
}
inline Vec8 zero_sqrt(Vec8 a) {
  return Vec8(_mm256_sqrt_ps(a.v));
}
inline Vec8 zero_sign(Vec8 a) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 r = _mm256_mul_ps(a.v, zero);
  r = _mm256_blendv_ps(r, _mm256_set1_ps(-1.0f), _mm256_cmp_ps(a.v, zero, _CMP_LT_OQ));
  r = _mm256_blendv_ps(r, _mm256_set1_ps(1.0f), _mm256_cmp_ps(a.v, zero, _CMP_GT_OQ));
  return Vec8(r);
}

struct Avx2Ops {
  using V = Vec8;
  static constexpr int kWidth = 8;
  static V load_f32(const float* p) { return V(_mm256_loadu_ps(p)); }
  static V load_bf16(const std::uint16_t* p) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return V(_mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
  static V load_f16(const std::uint16_t* p) {
    return V(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void store_f32(float* p, V x) { _mm256_storeu_ps(p, x.v); }
  static void store_bf16(std::uint16_t* p, V x) {
    const __m256i u = _mm256_castps_si256(x.v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256 nan = _mm256_cmp_ps(x.v, x.v, _CMP_UNORD_Q);
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(nan));
    store_packed(p, r);
  }
  static void store_bf16_truncated(std::uint16_t* p, V x) {
    store_packed(p, _mm256_srli_epi32(_mm256_castps_si256(x.v), 16));
  }
  static void store_f16(std::uint16_t* p, V x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static bool any_nonfinite(V x) {
    const __m256 d = _mm256_sub_ps(x.v, x.v);
    return _mm256_movemask_ps(_mm256_cmp_ps(d, d, _CMP_UNORD_Q)) != 0;
  }
  static V max_nan(V acc, V x) {
    const __m256 take = _mm256_or_ps(_mm256_cmp_ps(x.v, acc.v, _CMP_GT_OQ),
                                     _mm256_cmp_ps(x.v, x.v, _CMP_UNORD_Q));
    return V(_mm256_blendv_ps(acc.v, x.v, take));
  }
  // Lanes 0-3 and 4-7 of the 8 squared-norm lanes.
  struct SquareAcc {
    __m256d low = _mm256_setzero_pd();
    __m256d high = _mm256_setzero_pd();
  };
  static void accumulate_squares(V x, SquareAcc& acc) {
    const __m256d low = _mm256_cvtps_pd(_mm256_castps256_ps128(x.v));
    const __m256d high = _mm256_cvtps_pd(_mm256_extractf128_ps(x.v, 1));
    acc.low = _mm256_add_pd(acc.low, _mm256_mul_pd(low, low));
    acc.high = _mm256_add_pd(acc.high, _mm256_mul_pd(high, high));
  }
  static void spill(const SquareAcc& acc, double lanes[8]) {
    _mm256_storeu_pd(lanes, acc.low);
    _mm256_storeu_pd(lanes + 4, acc.high);
  }

 private:
  static void store_packed(std::uint16_t* p, __m256i r) {
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
};
#endif  // __AVX2__

#if defined(__AVX512F__)
struct Vec16 {
  __m512 v;
  Vec16() = default;
  explicit Vec16(float s) : v(_mm512_set1_ps(s)) {}
  explicit Vec16(__m512 x) : v(x) {}
};
inline Vec16 operator+(Vec16 a, Vec16 b) {
  return Vec16(_mm512_add_ps(a.v, b.v));
}
inline Vec16 operator-(Vec16 a, Vec16 b) {
  return Vec16(_mm512_sub_ps(a.v, b.v));
}
inline Vec16 operator*(Vec16 a, Vec16 b) {
  return Vec16(_mm512_mul_ps(a.v, b.v));
}
inline Vec16 operator/(Vec16 a, Vec16 b) {
  return Vec16(_mm512_div_ps(a.v, b.v));
}
inline Vec16 zero_sqrt(Vec16 a) {
  return Vec16(_mm512_sqrt_ps(a.v));
}
inline Vec16 zero_sign(Vec16 a) {
  const __m512 zero = _mm512_setzero_ps();
  __m512 r = _mm512_mul_ps(a.v, zero);
  r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, zero, _CMP_LT_OQ), r, _mm512_set1_ps(-1.0f));
  r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, zero, _CMP_GT_OQ), r, _mm512_set1_ps(1.0f));
  return Vec16(r);
}

struct Avx512Ops {
  using V = Vec16;
  static constexpr int kWidth = 16;
  static V load_f32(const float* p) { return V(_mm512_loadu_ps(p)); }
  static V load_bf16(const std::uint16_t* p) {
    const __m512i wide =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return V(_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
  }
  static V load_f16(const std::uint16_t* p) {
    return V(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  }
  static void store_f32(float* p, V x) { _mm512_storeu_ps(p, x.v); }
  static void store_bf16(std::uint16_t* p, V x) {
    const __m512i u = _mm512_castps_si512(x.v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x.v, x.v, _CMP_UNORD_Q),
                              _mm512_set1_epi32(0x7fc00000));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), upper_halves(r));
  }
  static void store_bf16_truncated(std::uint16_t* p, V x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), upper_halves(_mm512_castps_si512(x.v)));
  }
  // The upper 16 bits of each 32-bit lane, in order: one vpermw instead of a shift and a vpmovdw,
  // which keeps the bf16 stores from making the step compute-bound.
  static __m256i upper_halves(__m512i u) {
    const __m512i index = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, (31 << 16) | 29, (27 << 16) | 25,
                                           (23 << 16) | 21, (19 << 16) | 17, (15 << 16) | 13,
                                           (11 << 16) | 9, (7 << 16) | 5, (3 << 16) | 1);
    return _mm512_castsi512_si256(_mm512_permutexvar_epi16(index, u));
  }
  static void store_f16(std::uint16_t* p, V x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static bool any_nonfinite(V x) {
    const __m512 d = _mm512_sub_ps(x.v, x.v);
    return _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q) != 0;
  }
  static V max_nan(V acc, V x) {
    const __mmask16 take =
        _mm512_cmp_ps_mask(x.v, acc.v, _CMP_GT_OQ) | _mm512_cmp_ps_mask(x.v, x.v, _CMP_UNORD_Q);
    return V(_mm512_mask_blend_ps(take, acc.v, x.v));
  }
  struct SquareAcc {
    __m512d lanes = _mm512_setzero_pd();
  };
  // Elements 0-7 then 8-15 of the vector: lane k % 8 gets them in index order.
  static void accumulate_squares(V x, SquareAcc& acc) {
    const __m512d low = _mm512_cvtps_pd(_mm512_castps512_ps256(x.v));
    const __m512d high =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x.v), 1)));
    acc.lanes = _mm512_add_pd(acc.lanes, _mm512_mul_pd(low, low));
    acc.lanes = _mm512_add_pd(acc.lanes, _mm512_mul_pd(high, high));
  }
  static void spill(const SquareAcc& acc, double lanes[8]) { _mm512_storeu_pd(lanes, acc.lanes); }
};
#endif  // __AVX512F__

}  // namespace ZERO_KERNELS_ABI
}  // namespace zero::kernels::math
