// Elementwise reduction of several buffers into one: the arithmetic of the communicators'
// reduce-scatter and all-reduce (zero/comm/reduce_math.h), vectorised like every CPU kernel.
#pragma once

#include <cstddef>

#include "kernels/isa.h"
#include "zero/base/dtype.h"

namespace zero::kernels {

enum class ReduceKind { Sum, Max };

// dst[i] = srcs[0][i] ⊕ srcs[1][i] ⊕ … ⊕ srcs[nsrc-1][i], taken left to right in fp32 (Sum: +;
// Max: x when x > acc or x is NaN, else acc), then divided by `divisor` unless it is 0, and
// rounded once to `dtype` (nearest even, the rule of zero/base/half.h). Every ISA gives the same
// bits. One thread: the caller is a communication thread. A source may alias dst exactly (the
// same address); partial overlaps are not allowed.
// REQUIRES: dtype F32, BF16 or F16; nsrc >= 1; buffers naturally aligned.
//
// Stores::Streaming writes dst's whole cache lines with non-temporal stores, fenced before
// returning: for a dst too large to stay in cache, memory then sees only its writes, not also
// a read of each line before it is written. The same bits as Stores::Cached.
enum class Stores { Cached, Streaming };
void reduce_cpu(void* dst, const void* const* srcs, int nsrc, std::size_t elems, DType dtype,
                ReduceKind kind, float divisor, Isa isa = Isa::Auto,
                Stores stores = Stores::Cached);

}  // namespace zero::kernels
