// Gradient unscaling fused with the overflow check (fp16 loss scaling, SPEC_DEEPSPEED.md §7).
#pragma once

#include <cstddef>

#include "kernels/isa.h"
#include "zero/base/dtype.h"

namespace zero::kernels {

// data[i] ← data[i] · scale in place (F32, BF16 or F16; 16-bit results rounded to nearest even),
// in one pass that also reports whether any result is ±inf or NaN. scale = 1 only checks.
// REQUIRES: data naturally aligned (may be null when numel is 0); scale finite.
// Returns true when a non-finite value was found; the data is scaled regardless.
bool unscale_and_check_cpu(void* data, DType dtype, std::size_t numel, float scale,
                           const CpuExec& exec = {});

}  // namespace zero::kernels
