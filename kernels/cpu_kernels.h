// Internal: the table of range functions one CPU ISA translation unit provides. The drivers
// (optimizer_cpu.cpp, companions_cpu.cpp) validate arguments, split the work into tiles and call
// these on [begin, end) element ranges; the range functions assume valid arguments.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels/isa.h"
#include "kernels/norm.h"
#include "kernels/optimizer.h"
#include "zero/base/dtype.h"

namespace zero::kernels::detail {

// Norm blocks have a fixed size so the sum does not depend on the thread count.
inline constexpr std::size_t kNormBlockElems = kernels::kNormBlockElems;
// Whole norm blocks squared_norm_blocks sums side by side.
inline constexpr std::size_t kNormBlocksAtOnce = 4;
// Optimizer tiles: a tile's arrays (≤ 30 B/element) stay well inside a core's L2.
inline constexpr std::size_t kTileElems = 16384;

struct CpuKernels {
  void (*optimizer)(const math::StepCoeffs& coeffs, const OptimizerTensors& t, std::size_t begin,
                    std::size_t end);
  // Same loads and stores as `optimizer` for `state_count` states, no optimizer arithmetic.
  void (*traffic_probe)(const OptimizerTensors& t, int state_count, std::size_t begin,
                        std::size_t end);
  // data[i] *= scale in place; true when any result is ±inf or NaN.
  bool (*unscale)(void* data, DType dtype, float scale, std::size_t begin, std::size_t end);
  // Sum of squares of one norm block [begin, end), begin a multiple of kNormBlockElems, in double
  // with eight lanes (element k of the block goes to lane k % 8) added in a fixed tree.
  double (*squared_norm_block)(const void* data, DType dtype, std::size_t begin, std::size_t end);
  // sums[j] ← squared_norm_block of block j of the kNormBlocksAtOnce whole blocks from `begin`
  // (bitwise the same; faster: their add chains run side by side).
  void (*squared_norm_blocks)(const void* data, DType dtype, std::size_t begin, double* sums);
  void (*cast)(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t begin,
               std::size_t end);
  // dst[i] = srcs[0][i] + srcs[1][i] + ... left to right in fp32 (max: max_nan instead), divided
  // by `divisor` unless it is 0, rounded once to `dtype` (see reduce.h); `streaming`: dst's whole
  // 64-byte lines stored non-temporally, not fenced (the same bits).
  void (*reduce)(void* dst, const void* const* srcs, int nsrc, DType dtype, bool max,
                 float divisor, std::size_t begin, std::size_t end, bool streaming);
  // `optimizer` with the gradient summed from `sources` element by element (begin a multiple of
  // kNormBlockElems); with block_sums, also block_sums[k] ← the summed gradient's
  // squared_norm_block of block begin / kNormBlockElems + k, for the blocks [begin, end) covers.
  void (*optimizer_summed)(const math::StepCoeffs& coeffs, const OptimizerTensors& t,
                           const GradSources& sources, std::size_t begin, std::size_t end,
                           double* block_sums);
  // optimizer_summed's block_sums alone (no step): the norm's blocks of the gradient `sources`
  // sum, of `dtype`.
  void (*norm_summed)(const GradSources& sources, DType dtype, std::size_t begin, std::size_t end,
                      double* block_sums);
};

const CpuKernels& cpu_kernels_scalar();
const CpuKernels& cpu_kernels_avx2();
const CpuKernels& cpu_kernels_avx512();

// The table for an ISA already resolved by resolve_isa().
const CpuKernels& cpu_kernels(Isa resolved);

// sums[0, count) ← the sums of norm blocks [first, first + count) of an array of numel elements:
// runs of kNormBlocksAtOnce whole blocks side by side, the others one by one (the same bits).
inline void norm_block_sums(const CpuKernels& kernels, const void* data, DType dtype,
                            std::size_t numel, std::size_t first, std::size_t count,
                            double* sums) {
  std::size_t b = first;
  const std::size_t end = first + count;
  for (; b + kNormBlocksAtOnce <= end && (b + kNormBlocksAtOnce) * kNormBlockElems <= numel;
       b += kNormBlocksAtOnce) {
    kernels.squared_norm_blocks(data, dtype, b * kNormBlockElems, sums + (b - first));
  }
  for (; b < end; ++b) {
    sums[b - first] = kernels.squared_norm_block(data, dtype, b * kNormBlockElems,
                                                 std::min(numel, (b + 1) * kNormBlockElems));
  }
}

}  // namespace zero::kernels::detail
