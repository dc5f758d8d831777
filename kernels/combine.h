// Elementwise moves between gradient buffers of different dtypes: packing a bucket in the
// communication dtype, accumulating micro-steps, taking a reduced bucket into the partition,
// widening a master tile. The engine reaches it through the compute table (kernels/compute.h).
#pragma once

#include <cstddef>

#include "kernels/isa.h"
#include "zero/base/dtype.h"

namespace zero::kernels {

// dst[i] ← src[i]·scale, or with `accumulate` dst[i] ← dst[i] + src[i]·scale, computed in fp32
// (one multiply, one add, never fused) and rounded once to dst_dtype (nearest even, the rule of
// cast_cpu). F32, BF16 and F16 on either side. With scale 1 and no accumulation this is an exact
// copy or a plain cast. OpenMP tiles as every CPU kernel (kernels/cpu_parallel.h); results do not
// depend on the thread count.
// REQUIRES: the ranges do not overlap; both naturally aligned (may be null when numel is 0).
void combine_cpu(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::size_t numel,
                 float scale, bool accumulate, const CpuExec& exec = {});

// dst[i] ← 0 (all bits zero, +0.0) for numel elements of `dtype`.
void fill_zero_cpu(void* dst, DType dtype, std::size_t numel, const CpuExec& exec = {});

}  // namespace zero::kernels
