// PartitionOptimizer's gradient norm (partition_optimizer.h): over the rank's own slices in one
// pass, with late gradients summed from the ranks' buffers or formed on the way, or summed by the
// step in its own walk and finished after it.
#include <algorithm>

#include "kernels/norm.h"
#include "zero/base/error.h"
#include "zero/engine/partition_optimizer.h"

namespace zero::engine_detail {

std::vector<kernels::ArrayRef> PartitionOptimizer::gradient_slices() const {
  std::vector<kernels::ArrayRef> slices;
  slices.reserve(layout_.num_units());
  for (std::size_t u = 0; u < layout_.num_units(); ++u) {
    const std::size_t S = layout_.unit(static_cast<int>(u)).slice_elems;
    if (S > 0) {
      slices.push_back(
          {slices_.gradient(own_domain(), static_cast<int>(u), 0), options_.grad_dtype, S});
    }
  }
  return slices;
}

double PartitionOptimizer::squared_norm() const {
  const int own = own_domain();
  bool late = false;
  for (std::size_t u = 0; u < layout_.num_units() && !late; ++u) {
    late = slices_.gradient_late(own, static_cast<int>(u));
  }
  if (!late) return compute_.squared_l2_norm_many(gradient_slices(), options_.exec);
  // Late gradients are formed here, tile by tile, and each tile's norm blocks summed while it is
  // in cache; every block's sum alone (block_sum), added up as finish_norm() adds them: the bits
  // of the one call above.
  constexpr std::size_t kBlock = kernels::kNormBlockElems;
  std::vector<double> sums(norm_.first.back(), 0.0);
  for (std::size_t u = 0; u < layout_.num_units(); ++u) {
    const int unit = static_cast<int>(u);
    const std::size_t S = layout_.unit(unit).slice_elems;
    kernels::GradSources sources;
    if (S > 0 && sums_in_step(own, unit, 0, &sources)) {  // summed as they are, nothing stored
      compute_.squared_norm_summed(sources, options_.grad_dtype, S, sums.data() + norm_.first[u],
                                   options_.exec);
      continue;
    }
    const bool formed_here = slices_.gradient_late(own, unit);
    for (std::size_t off = 0; off < S; off += kLateTileElems) {
      const std::size_t m = std::min(kLateTileElems, S - off);
      if (formed_here) slices_.settle_gradient(own, unit, off, m);
      for (std::size_t b = off / kBlock; b < (off + m + kBlock - 1) / kBlock; ++b) {
        sums[norm_.first[u] + b] = block_sum(unit, b);
      }
    }
  }
  return kernels::sum_norm_blocks(sums, norm_.first);
}

double* PartitionOptimizer::fused_norm_blocks(const Run& run, std::size_t first, std::size_t last) {
  constexpr std::size_t kBlock = kernels::kNormBlockElems;
  if (!norm_.fusing || run.domain != own_domain() || first % kBlock != 0) return nullptr;
  const std::size_t S = layout_.unit(run.unit).slice_elems;
  // A run that ends inside a block sums only its part of it: that block is summed after the step.
  const std::size_t whole_end = last == S ? (S + kBlock - 1) / kBlock : last / kBlock;
  const std::size_t base = norm_.first[static_cast<std::size_t>(run.unit)];
  for (std::size_t b = first / kBlock; b < whole_end; ++b) norm_.summed[base + b] = 1;
  return norm_.sums.data() + base + first / kBlock;
}

double PartitionOptimizer::block_sum(int unit, std::size_t block) const {
  constexpr std::size_t kBlock = kernels::kNormBlockElems;
  const std::size_t offset = block * kBlock;
  const std::size_t S = layout_.unit(unit).slice_elems;
  // One block alone: squared_l2_norm adds its one block sum to 0.0, which is that sum.
  return compute_.squared_l2_norm(slices_.gradient(own_domain(), unit, offset),
                                  options_.grad_dtype, std::min(kBlock, S - offset),
                                  options_.exec);
}

bool PartitionOptimizer::sums_in_step(int domain, int unit, std::size_t slice_offset,
                                      kernels::GradSources* sources) const {
  if (!slices_.late_sources(domain, unit, slice_offset, sources)) return false;
  ZERO_ASSERT(compute_.optimizer_step_summed != nullptr && compute_.squared_norm_summed != nullptr);
  return true;
}

double PartitionOptimizer::finish_norm() {
  constexpr std::size_t kBlock = kernels::kNormBlockElems;
  for (std::size_t u = 0; u < layout_.num_units(); ++u) {
    const int unit = static_cast<int>(u);
    const std::size_t S = layout_.unit(unit).slice_elems;
    // A unit the step summed as it stepped it has no gradient in memory: a block whose norm the
    // step did not sum is formed here, once.
    kernels::GradSources unused;
    const bool unformed = S > 0 && sums_in_step(own_domain(), unit, 0, &unused);
    for (std::size_t b = norm_.first[u]; b < norm_.first[u + 1]; ++b) {
      if (norm_.summed[b]) continue;
      const std::size_t block = b - norm_.first[u];
      if (unformed) {
        slices_.settle_gradient(own_domain(), unit, block * kBlock,
                                std::min(kBlock, S - block * kBlock));
      }
      norm_.sums[b] = block_sum(unit, block);
    }
  }
  return kernels::sum_norm_blocks(norm_.sums, norm_.first);
}

}  // namespace zero::engine_detail
