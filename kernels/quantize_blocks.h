// One whole block (kQuantBlock elements) of kernels/quantize.h's quantization in AVX2, for
// quantize_cpu.cpp's dispatch (internal to zero_kernels). Same bytes as the portable loops.
#pragma once

#include <cstdint>

#include "kernels/quantize.h"
#include "zero/base/dtype.h"

namespace zero::kernels::detail {

// codes (kQuantBlock bytes in 8 bits, kQuantBlock / 2 in 4) = the codes of src's block
// (fp32, bf16 or fp16); returns the block's scale. qmax: 127 for 8 bits, 7 for 4.
// REQUIRES: isa_supported(Isa::Avx2); bits is 8 or 4; dtype is not F64.
float quantize_block_avx2(const void* src, DType dtype, int bits, float qmax, std::uint8_t* codes);

// out[0, kQuantBlock) = (or += when accumulate) code · scale in fp32, for one block's codes.
// REQUIRES: isa_supported(Isa::Avx2); bits is 8 or 4.
void dequantize_block_avx2(const std::uint8_t* codes, float scale, int bits, float* out,
                           bool accumulate);

}  // namespace zero::kernels::detail
