// The companion kernels on the GPU, asynchronous: unscale with the overflow check, the squared
// norm's block sums, combine (scale, cast, accumulate), fill and the communicators' reduction.
// Each has the contract of its CPU twin (unscale.h, norm.h, combine.h, reduce.h) and gives the
// same bits: the same element conversions
// (zero/base/half.h), one multiply and one add never fused (--fmad=false), and the norm's fixed
// blocks and lanes summed in the CPU's order.
//
// Each call enqueues on `stream` (a cudaStream_t; null = the legacy default stream) and returns;
// arrays are device memory that stays valid, and unwritten by others, until the stream passes
// this point. Throws zero::Error for bad arguments (before anything is enqueued) and
// zero::CudaError, naming the kernel, when a launch fails. The synchronous forms the engine calls
// are the CUDA compute table's entries (compute.h: cuda_compute_kernels()).
#pragma once

#include <cstddef>
#include <span>

#include "kernels/compute.h"
#include "kernels/reduce.h"
#include "zero/base/dtype.h"

namespace zero::kernels {

// data[i] ← data[i]·scale; sets *nonfinite_flag (a device int) to 1 when a product is ±inf or
// NaN, and leaves it alone otherwise (the caller zeroes it first).
void unscale_and_check_cuda_async(void* data, DType dtype, std::size_t numel, float scale,
                                  int* nonfinite_flag, void* stream);

// block_sums[b] ← the sum of squares of norm block b (kNormBlockElems elements, eight lanes in
// double, the CPU's tree), for b < squared_norm_cuda_block_count(numel). The norm is the sum of
// block_sums in index order, starting from 0.0 (what squared_l2_norm_cpu adds).
void squared_norm_blocks_cuda_async(const void* data, DType dtype, std::size_t numel,
                                    double* block_sums, void* stream);
std::size_t squared_norm_cuda_block_count(std::size_t numel);

// squared_norm_blocks_cuda_async of every array at once: array a's block sums start at
// block_sums + the block counts of the arrays before it. The small and middle-sized arrays share
// launches (up to kCudaNormTableArrays a launch; cuda_geometry.h), so a model's slices take a few
// launches, not one each; the sums are bitwise the single calls'.
void squared_norm_blocks_many_cuda_async(std::span<const ArrayRef> arrays, double* block_sums,
                                         void* stream);

// combine_cpu on the GPU: dst ← src·scale (+ dst), rounded once to dst's dtype.
void combine_cuda_async(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                        std::size_t numel, float scale, bool accumulate, void* stream);

// The most sources reduce_cuda_async takes: they travel by value in the kernel's arguments.
inline constexpr int kCudaReduceMaxSources = 32;

// reduce_cpu on the GPU: dst[i] ← srcs[0][i] ⊕ … ⊕ srcs[nsrc-1][i] left to right in fp32,
// divided by `divisor` unless it is 0 (IEEE division, as the CPU's), rounded once. `srcs` is a
// host array, read before the call returns; dst may alias a source exactly.
// REQUIRES (checked): 1 <= nsrc <= kCudaReduceMaxSources.
void reduce_cuda_async(void* dst, const void* const* srcs, int nsrc, std::size_t numel, DType dtype,
                       ReduceKind kind, float divisor, void* stream);

// dst ← +0.0 for numel elements.
void fill_zero_cuda_async(void* dst, DType dtype, std::size_t numel, void* stream);

}  // namespace zero::kernels
