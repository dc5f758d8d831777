// Squared L2 norm of a partition, for gradient clipping.
#pragma once

#include <cstddef>
#include <span>

#include "kernels/isa.h"
#include "zero/base/dtype.h"

namespace zero::kernels {

// The norm's fixed blocks: elements [k·4096, (k+1)·4096) of an array, the last one partial.
inline constexpr std::size_t kNormBlockElems = 4096;

// Σ x² over `numel` elements (F32, BF16 or F16), accumulated in double. The summation order is
// fixed (blocks of 4096 elements, eight lanes per block, blocks added in index order), so the
// result is bitwise the same for every thread count and ISA. A non-finite element makes it
// inf or NaN. REQUIRES: data naturally aligned (may be null when numel is 0).
double squared_l2_norm_cpu(const void* data, DType dtype, std::size_t numel,
                           const CpuExec& exec = {});

// Several arrays' norms at once (the compute table's squared_l2_norm_many): their norm blocks
// numbered array after array, first[a] the index of array a's first block (first has one entry
// more than there are arrays, the last the count of all blocks), and the per-block sums added as
// squared_l2_norm_cpu adds them, array by array, each array's sum to the total in array order.
double sum_norm_blocks(std::span<const double> block_sums, std::span<const std::size_t> first);

}  // namespace zero::kernels
