// Launch geometry of the CUDA companion kernels (unscale, squared norm, combine), as plain C++ so
// a CPU test checks it: which grid covers how many elements, and how the squared norm's fixed
// blocks (kernels/cpu_kernels.h, kNormBlockElems) map onto threads.
#pragma once

#include <algorithm>
#include <cstddef>

namespace zero::kernels::detail {

inline constexpr int kCudaElementwiseThreads = 256;
// Grid-stride loops: more blocks than this only add scheduling, not bandwidth.
inline constexpr std::size_t kCudaElementwiseMaxBlocks = 4096;

// Blocks for an element-wise kernel over `numel` elements, one element per thread per pass of
// a grid-stride loop. 0 for numel 0.
constexpr std::size_t elementwise_blocks(std::size_t numel) {
  const std::size_t wanted = (numel + kCudaElementwiseThreads - 1) / kCudaElementwiseThreads;
  return std::min(wanted, kCudaElementwiseMaxBlocks);
}

// The squared norm: one CUDA block per norm block. Its kCudaNormThreads threads stage the block's
// elements in shared memory with coalesced loads, kNormBlockElems / kCudaNormThreads each in
// flight; then threads 0..7 sum elements lane, lane + 8, ... of it in double (the CPU's lane
// k % 8) and the eight lanes are added in the CPU's tree by warp shuffles. (Eight threads per norm
// block reading straight from memory left too few loads in flight: the H200 summed an 8M-element
// bf16 array at about a twentieth of its bandwidth.)
inline constexpr int kCudaNormLanes = 8;
inline constexpr int kCudaNormThreads = 128;
static_assert(32 % kCudaNormLanes == 0, "a norm block's lanes must lie in one warp");

struct NormGeometry {
  std::size_t norm_blocks = 0;  // partial sums the kernel writes, added on the host in order
  std::size_t cuda_blocks = 0;
};

constexpr NormGeometry norm_geometry(std::size_t numel, std::size_t norm_block_elems) {
  NormGeometry g;
  g.norm_blocks = (numel + norm_block_elems - 1) / norm_block_elems;
  g.cuda_blocks = g.norm_blocks;
  return g;
}

}  // namespace zero::kernels::detail
