// Block quantization for ZeRO++'s quantized collectives: qwZ (weights all-gathered in int8) and
// qgZ (gradients reduced in int4).
//
// Symmetric, one fp32 scale per block of kQuantBlock consecutive elements (the last block may be
// shorter). With qmax = 127 (8 bits) or 7 (4 bits):
//   scale = max |x| over the block / qmax          (0 for an all-zero block)
//   q     = x / scale rounded half to even, clamped to [-qmax, qmax]   (0 when scale is 0)
//   x'    = q · scale in fp32, rounded once to the output dtype
// so |x − x'| ≤ scale / 2 = max|x| / (2·qmax) before that last rounding. Inputs are read in their
// true dtype (bf16 and fp16 widened exactly to fp32, never reinterpreted as another dtype's bits).
// A block holding an inf or a NaN gets a NaN scale, so every element of it dequantizes to NaN:
// an overflow stays visible to the engine's overflow check.
// Results are deterministic: the same input gives the same bytes on every rank and thread count.
//
// A quantized buffer of n elements is laid out as the codes (n bytes in 8 bits; ceil(n/2) bytes
// in 4 bits, element 2i in the low nibble and 2i+1 in the high one, two's complement), zero
// padding to a multiple of 4 bytes, then ceil(n / kQuantBlock) fp32 scales: quantized_bytes(n)
// bytes in all, a multiple of 4.
#pragma once

#include <cstddef>

#include "kernels/isa.h"
#include "zero/base/dtype.h"

namespace zero::kernels {

inline constexpr std::size_t kQuantBlock = 256;

// REQUIRES: bits is 8 or 4.
std::size_t quantized_bytes(std::size_t n, int bits);

// `out` (quantized_bytes(n, bits)) = the quantized `src` (n elements of `dtype`).
void quantize_cpu(const void* src, DType dtype, std::size_t n, int bits, void* out,
                  const CpuExec& exec = {});
// `dst` (n elements of `dtype`) = the dequantized `in`.
void dequantize_cpu(const void* in, std::size_t n, int bits, void* dst, DType dtype,
                    const CpuExec& exec = {});
// acc[i] += the dequantized element i of `in`, in fp32 (qgZ's dequantize–sum).
void dequantize_add_cpu(const void* in, std::size_t n, int bits, float* acc,
                        const CpuExec& exec = {});

}  // namespace zero::kernels
