// Elementwise moves between gradient buffers of different dtypes: packing a bucket, accumulating
// across micro-steps, taking a reduced bucket back into the partition.
#pragma once

#include <cstddef>

#include "kernels/isa.h"
#include "zero/base/dtype.h"

namespace zero::engine_detail {

// dst[i] ← src[i]·scale (accumulate: dst[i] ← dst[i] + src[i]·scale), computed in fp32 and
// rounded once to dst_dtype (nearest even). F32, BF16 and F16 only. With scale 1 and no
// accumulation this is an exact copy or a plain cast (cast_cpu).
// REQUIRES: the ranges do not overlap; both naturally aligned.
void combine(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::size_t numel,
             float scale, bool accumulate, const kernels::CpuExec& exec);

// dst[i] ← 0 for numel elements of `dtype`.
void fill_zero(void* dst, DType dtype, std::size_t numel);

}  // namespace zero::engine_detail
