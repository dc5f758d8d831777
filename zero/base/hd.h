// ZERO_HD marks a function that host code (plain C++ and the SIMD paths) and CUDA device code
// both call, so that one definition serves both (STYLE.md, Kernels). ZERO_KERNELS_ABI names the
// inline namespace such functions live in.
#pragma once

#if defined(__CUDACC__)
#define ZERO_HD __host__ __device__
#else
#define ZERO_HD
#endif

// ZERO_INLINE marks an element function that the vector loops must inline. GCC left some
// instantiations as calls (adam_update<Vec16> among them): every call then passed its vectors
// through the stack, and the AVX-512 AdamW step of 1.85M fp32 parameters in cache ran at 1.7
// G elements/s instead of 3.0 (zero-bench kernels).
#if defined(__CUDACC__)
#define ZERO_INLINE __forceinline__
#elif defined(__GNUC__)
#define ZERO_INLINE inline __attribute__((always_inline))
#else
#define ZERO_INLINE inline
#endif

// Each CPU ISA translation unit in kernels/ is compiled with its own -m flags and defines
// ZERO_KERNELS_ABI to its name (kernels/CMakeLists.txt). Inline functions declared inside
// `inline namespace ZERO_KERNELS_ABI` then get ISA-specific symbol names, so the linker can never
// merge an AVX-512 instantiation into the scalar path (one-definition-rule merging of inline
// functions would otherwise make the "portable" path use AVX-512 code). Every other translation
// unit gets `generic`. Plain-data structs (coefficients) stay outside it: they must be one type
// across units.
#ifndef ZERO_KERNELS_ABI
#define ZERO_KERNELS_ABI generic
#endif
