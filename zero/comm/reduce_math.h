// Element arithmetic shared by the communicator backends (internal to zero/comm).
//
// The reduction semantics every backend promises (communicator.h): 16-bit floats are reduced in
// fp32 and rounded once; Avg divides the sum by the number of ranks before that rounding; Max
// propagates NaN. Summation order is the order of `srcs`, so callers fix it (rank order).
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/base/dtype.h"
#include "zero/comm/communicator.h"

namespace zero::comm_detail {

// dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[nsrc-1][i]) taken left to right, for i < elems;
// Avg divides by `avg_divisor`. A source may alias dst exactly (same address): every element
// is read before it is written. REQUIRES: nsrc >= 1.
void reduce_elements(void* dst, const void* const* srcs, int nsrc, std::size_t elems, DType dtype,
                     ReduceOp op, int avg_divisor);

// 16-bit <-> fp32 conversion of whole buffers (MpiComm widens 16-bit sums through fp32).
void widen_to_f32(const void* src, float* dst, std::size_t elems, DType dtype);
// dst[i] = round(src[i] / divisor) (divisor 1 for a sum, size() for Avg).
void narrow_from_f32(const float* src, void* dst, std::size_t elems, DType dtype, float divisor);

// x[i] /= divisor, for fp32 and fp64 buffers.
void divide_in_place(void* data, std::size_t elems, DType dtype, int divisor);

}  // namespace zero::comm_detail
