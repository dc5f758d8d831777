// ZERO_HD marks an element function that the CPU driver (plain C++ and SIMD) and the CUDA driver
// both call: the math of each optimizer exists once (STYLE.md, Kernels).
#pragma once

#if defined(__CUDACC__)
#define ZERO_HD __host__ __device__
#else
#define ZERO_HD
#endif

// Each CPU ISA translation unit is compiled with its own -m flags and defines ZERO_KERNELS_ABI to
// its name. Inline functions from the math headers then get ISA-specific symbol names, so the
// linker can never merge an AVX-512 instantiation into the scalar path (one-definition-rule
// merging of inline functions would otherwise make the "portable" path use AVX-512 code).
// Plain-data structs (coefficients) stay outside it: they must be one type across units.
#ifndef ZERO_KERNELS_ABI
#define ZERO_KERNELS_ABI generic
#endif

namespace zero::kernels::math {
inline namespace ZERO_KERNELS_ABI {

// Correctly rounded on both sides: nvcc's default -prec-sqrt=true, and the host instruction.
ZERO_HD inline float zero_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return __builtin_sqrtf(x);
#endif
}

// torch.sign: +1, -1, and the input itself (times zero) for ±0 and NaN, so a NaN propagates.
ZERO_HD inline float zero_sign(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x * 0.0f); }

}  // namespace ZERO_KERNELS_ABI
}  // namespace zero::kernels::math
