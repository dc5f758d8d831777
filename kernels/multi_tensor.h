// Multi-tensor apply, host side: how a list of tensors is cut into chunks and the chunks packed
// into CUDA launches (one block per chunk), with no CUDA dependency so a CPU test can check it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace zero::kernels {

struct MultiTensorLimits {
  std::size_t chunk_elems = 65536;  // elements one block handles
  int max_tensors = 24;             // tensors whose pointers fit in one launch's argument struct
  int max_blocks = 320;             // chunks per launch
};

struct MultiTensorBlock {
  std::int32_t slot;   // index into MultiTensorLaunch::tensors
  std::int32_t chunk;  // the block covers [chunk·chunk_elems, min((chunk+1)·chunk_elems, numel))
};

struct MultiTensorLaunch {
  std::vector<std::size_t> tensors;      // indices into the caller's list, at most max_tensors
  std::vector<MultiTensorBlock> blocks;  // at most max_blocks
};

// Every chunk of every tensor appears in exactly one block of one launch, in tensor order. A
// tensor cut across launches appears in each of them. Empty tensors get no blocks. Throws
// zero::Error for limits < 1 or a tensor with more than 2^31 − 1 chunks.
std::vector<MultiTensorLaunch> plan_multi_tensor_launches(std::span<const std::size_t> numels,
                                                          const MultiTensorLimits& limits = {});

}  // namespace zero::kernels
