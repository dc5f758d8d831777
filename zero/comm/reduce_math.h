// Element arithmetic shared by the communicator backends (internal to zero/comm).
//
// The reduction semantics every backend promises (communicator.h): 16-bit floats are reduced in
// fp32 and rounded once; Avg divides the sum by the number of ranks before that rounding; Max
// propagates NaN. Summation order is the order of `srcs`, so callers fix it (rank order).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "zero/base/dtype.h"
#include "zero/comm/communicator.h"

namespace zero::comm_detail {

// dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[nsrc-1][i]) taken left to right, for i < elems;
// Avg divides by `avg_divisor`. A source may alias dst exactly (same address): every element
// is read before it is written. REQUIRES: nsrc >= 1.
//
// `whole_bytes` is the size of the whole output the caller writes, when it hands over one piece
// of it at a time (0: this call's elems). From kStreamingMinBytes on (stream_copy.h) the output
// cannot stay in cache, so it is stored with non-temporal stores (kernels::Stores::Streaming,
// fenced before returning): memory then sees the sources' reads and dst's writes, not also a
// read of every dst line before it is written. The bits do not depend on the stores.
void reduce_elements(void* dst, const void* const* srcs, int nsrc, std::size_t elems, DType dtype,
                     ReduceOp op, int avg_divisor, std::size_t whole_bytes = 0);

// [begin, end) of chunk q when `elems` are split as evenly as possible over `n` ranks (the first
// elems % n chunks are one longer): who reduces which part of an all_reduce.
inline std::pair<std::size_t, std::size_t> chunk_bounds(std::size_t elems, int n, int q) {
  const auto nn = static_cast<std::size_t>(n);
  const auto qq = static_cast<std::size_t>(q);
  const std::size_t base = elems / nn;
  const std::size_t extra = elems % nn;
  const std::size_t begin = qq * base + std::min(qq, extra);
  return {begin, begin + base + (qq < extra ? 1 : 0)};
}

// 16-bit <-> fp32 conversion of whole buffers.
void widen_to_f32(const void* src, float* dst, std::size_t elems, DType dtype);
// dst[i] = round(src[i] / divisor) (divisor 1 for a sum, size() for Avg).
void narrow_from_f32(const float* src, void* dst, std::size_t elems, DType dtype, float divisor);
// The end of a reduction taken in `work` (the element type, or fp32 for 16-bit sums):
// dst (elems of `dtype`) = src / divisor, rounded once to `dtype`. src == dst is allowed when the
// two dtypes are the same.
void finish_reduction(const void* src, void* dst, std::size_t elems, DType dtype, DType work,
                      int divisor);

}  // namespace zero::comm_detail
