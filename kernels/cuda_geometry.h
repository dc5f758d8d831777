// Launch geometry of the CUDA companion kernels (unscale, squared norm, combine), as plain C++ so
// a CPU test checks it: which grid covers how many elements, and how the squared norm's fixed
// blocks (kernels/cpu_kernels.h, kNormBlockElems) map onto threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "zero/base/hd.h"

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

// The squared norm has two kernels, each giving thread-count-independent block sums bitwise the
// CPU's (lane k % 8 of a norm block sums elements k, k + 8, ... in double; the eight lanes are added
// in the CPU's tree by warp shuffles):
// - staged: one CUDA block per norm block. Its kCudaNormThreads threads stage the block's elements
//   in shared memory with coalesced loads, kNormBlockElems / kCudaNormThreads each in flight; then
//   threads 0..7 sum. Its latency is one memory round trip and one 512-add chain, so it suits
//   small and middle-sized arrays; but an SM holds ten such blocks, so 80 chains.
// - lanes: every thread of full kCudaNormLanesThreads-thread blocks is one lane of one norm block
//   (thread t: lane t % 8 of norm block t / 8), reading straight from memory kCudaNormLanesUnroll
//   rows at a time. An SM holds up to 2048 chains, but each waits for a memory round trip per
//   kCudaNormLanesUnroll rows, so only a large array fills the GPU with them.
// Measured on an H200 (benchmarks/probes/cuda_norm_landing_probe.cu): 64M bf16 elements in
// 104 us staged and 68 us lanes; 8M bf16 in 21 us against 25 us; 8M fp16 in 32 us against 92 us;
// 4M bf16 in 14 us against 26 us. Arrays of at least kCudaNormLanesMinBlocks norm blocks (32M
// elements) take the lanes kernel. (Eight-thread blocks reading straight from memory, an earlier
// form, left an SM with a few partly filled warps: an eighth of HBM's bandwidth.)
inline constexpr int kCudaNormLanes = 8;
inline constexpr int kCudaNormThreads = 128;
inline constexpr int kCudaNormLanesThreads = 256;
inline constexpr int kCudaNormLanesUnroll = 16;
inline constexpr std::size_t kCudaNormLanesMinBlocks = 8192;
static_assert(32 % kCudaNormLanes == 0, "a norm block's lanes must lie in one warp");
static_assert(kCudaNormLanesThreads % 32 == 0, "the lanes kernel's blocks are whole warps");

enum class NormKernel { Staged, Lanes };

struct NormGeometry {
  std::size_t norm_blocks = 0;  // partial sums the kernel writes, added on the host in order
  NormKernel kernel = NormKernel::Staged;
  std::size_t cuda_blocks = 0;
  int threads = kCudaNormThreads;
};

// The geometry of `kernel` over numel elements.
constexpr NormGeometry norm_geometry_of(NormKernel kernel, std::size_t numel,
                                        std::size_t norm_block_elems) {
  NormGeometry g;
  g.norm_blocks = (numel + norm_block_elems - 1) / norm_block_elems;
  g.kernel = kernel;
  if (kernel == NormKernel::Staged) {
    g.cuda_blocks = g.norm_blocks;
    g.threads = kCudaNormThreads;
  } else {
    const std::size_t threads = g.norm_blocks * kCudaNormLanes;
    g.cuda_blocks = (threads + kCudaNormLanesThreads - 1) / kCudaNormLanesThreads;
    g.threads = kCudaNormLanesThreads;
  }
  return g;
}

// The geometry the launcher uses: the lanes kernel from kCudaNormLanesMinBlocks norm blocks on.
constexpr NormGeometry norm_geometry(std::size_t numel, std::size_t norm_block_elems) {
  const NormGeometry staged = norm_geometry_of(NormKernel::Staged, numel, norm_block_elems);
  return staged.norm_blocks < kCudaNormLanesMinBlocks
             ? staged
             : norm_geometry_of(NormKernel::Lanes, numel, norm_block_elems);
}

// The staged norm of many arrays in few launches (squared_l2_norm_many: a model's gradient
// slices, most of them small). One launch takes a table of up to kCudaNormTableArrays arrays, each
// of fewer than kCudaNormLanesMinBlocks norm blocks, whose norm blocks follow one another on the
// grid: CUDA block g sums norm block g − first[s] of table entry s = norm_table_slot(first, count,
// g), bitwise what that array's own staged launch gives. The table travels in the kernel's
// arguments (64 entries: about 2.3 KB of the 4 KB every architecture takes). A launch per array,
// as before, made the norm of a model's hundreds of small slices mostly launch latency.
inline constexpr int kCudaNormTableArrays = 64;

// The table entry grid block `block` lies in: the last s < count with first[s] <= block, where
// first[0] = 0 and first is strictly increasing (a table holds no empty array).
ZERO_HD inline int norm_table_slot(const long long* first, int count, long long block) {
  int lo = 0;
  int hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Which arrays share which table launch: the indices of the non-empty arrays that take the staged
// kernel, in order, cut into groups of at most kCudaNormTableArrays. The other arrays (empty, or
// large enough for the lanes kernel) are in no group.
inline std::vector<std::vector<std::size_t>> plan_norm_tables(std::span<const std::size_t> numels,
                                                              std::size_t norm_block_elems) {
  std::vector<std::vector<std::size_t>> tables;
  for (std::size_t a = 0; a < numels.size(); ++a) {
    if (numels[a] == 0 || norm_geometry(numels[a], norm_block_elems).kernel != NormKernel::Staged) {
      continue;
    }
    if (tables.empty() || tables.back().size() == static_cast<std::size_t>(kCudaNormTableArrays)) {
      tables.emplace_back();
    }
    tables.back().push_back(a);
  }
  return tables;
}

}  // namespace zero::kernels::detail
