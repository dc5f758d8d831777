#include "kernels/multi_tensor.h"

#include <limits>

#include "zero/base/error.h"

namespace zero::kernels {

std::vector<MultiTensorLaunch> plan_multi_tensor_launches(std::span<const std::size_t> numels,
                                                          const MultiTensorLimits& limits) {
  ZERO_CHECK(limits.chunk_elems >= 1, "multi-tensor: chunk_elems must be >= 1, got {}",
             limits.chunk_elems);
  ZERO_CHECK(limits.max_tensors >= 1, "multi-tensor: max_tensors must be >= 1, got {}",
             limits.max_tensors);
  ZERO_CHECK(limits.max_blocks >= 1, "multi-tensor: max_blocks must be >= 1, got {}",
             limits.max_blocks);
  std::vector<MultiTensorLaunch> launches;
  MultiTensorLaunch current;
  auto flush = [&] {
    if (!current.blocks.empty()) launches.push_back(std::move(current));
    current = {};
  };
  for (std::size_t tensor = 0; tensor < numels.size(); ++tensor) {
    const std::size_t chunks = (numels[tensor] + limits.chunk_elems - 1) / limits.chunk_elems;
    ZERO_CHECK(chunks <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()),
               "multi-tensor: tensor {} has {} elements, more than 2^31 - 1 chunks of {}", tensor,
               numels[tensor], limits.chunk_elems);
    for (std::size_t chunk = 0; chunk < chunks; ++chunk) {
      if (static_cast<int>(current.blocks.size()) == limits.max_blocks) flush();
      if (current.tensors.empty() || current.tensors.back() != tensor) {
        if (static_cast<int>(current.tensors.size()) == limits.max_tensors) flush();
        current.tensors.push_back(tensor);
      }
      current.blocks.push_back({static_cast<std::int32_t>(current.tensors.size() - 1),
                                static_cast<std::int32_t>(chunk)});
    }
  }
  flush();
  return launches;
}

}  // namespace zero::kernels
