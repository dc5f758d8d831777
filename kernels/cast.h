// Conversions between fp32 and the 16-bit float formats.
#pragma once

#include <cstddef>

#include "kernels/isa.h"
#include "zero/base/dtype.h"

namespace zero::kernels {

// dst[i] ← src[i] for F32 → BF16/F16/F32 and BF16/F16 → F32. Narrowing rounds to nearest even;
// ±inf stays ±inf, overflow becomes ±inf; a NaN stays NaN (bf16: the canonical 0x7fc0; fp16:
// sign and top payload bits kept, quiet). Widening is exact.
// REQUIRES: both arrays naturally aligned, not overlapping (may be null when numel is 0).
void cast_cpu(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t numel,
              const CpuExec& exec = {});

}  // namespace zero::kernels
