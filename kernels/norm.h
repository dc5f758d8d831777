// Squared L2 norm of a partition, for gradient clipping.
#pragma once

#include <cstddef>

#include "kernels/isa.h"
#include "zero/base/dtype.h"

namespace zero::kernels {

// Σ x² over `numel` elements (F32, BF16 or F16), accumulated in double. The summation order is
// fixed (blocks of 4096 elements, eight lanes per block, blocks added in index order), so the
// result is bitwise the same for every thread count and ISA. A non-finite element makes it
// inf or NaN. REQUIRES: data naturally aligned (may be null when numel is 0).
double squared_l2_norm_cpu(const void* data, DType dtype, std::size_t numel,
                           const CpuExec& exec = {});

}  // namespace zero::kernels
