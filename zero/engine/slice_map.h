// How the engine's parts address the buffers they share, by (domain, unit, offset in the slice).
//
// A *domain* is one rank's partition (its slice of every unit, in unit order): a rank steps only
// its own partition (domain 0) at stages 1–3, and every rank's partition (domain r = rank r) at
// stage 0, which keeps the whole model's optimizer state. The engine owns the mapping of a domain
// to memory and hands it to GradientReducer (where reduced gradients land) and to
// PartitionOptimizer (where it reads them and writes the updated low-precision copy).
#pragma once

#include <cstddef>

#include "kernels/optimizer.h"

namespace zero::engine_detail {

// Which partitions a part addresses: its own rank's (domain 0) or, with `every`, every rank's
// (domain d = rank d).
struct Domains {
  int rank = 0;
  int world = 1;
  bool every = false;
  int count() const { return every ? world : 1; }
  int rank_of(int domain) const { return every ? domain : rank; }
  int own() const { return every ? rank : 0; }  // the domain of the rank itself
};

class SliceMap {
 public:
  virtual ~SliceMap() = default;
  // The reduced gradient of `domain`'s slice of `unit` from element `slice_offset` on, in the
  // accumulation dtype; the slice's elements are contiguous.
  virtual std::byte* gradient(int domain, int unit, std::size_t slice_offset) = 0;
  // The low-precision model copy at the same positions, in the model dtype.
  virtual std::byte* model(int domain, int unit, std::size_t slice_offset) = 0;
  // A writer of model() says what it wrote: `count` elements of `domain`'s slice of `unit` from
  // `slice_offset` on (a map whose model() is a host mirror of device memory starts moving them
  // there). model_settled() returns once everything said so far is where the readers of the model
  // copy look (the all-gathers, the stage-3 fetcher). Both are no-ops for memory read in place.
  virtual void model_written(int /*domain*/, int /*unit*/, std::size_t /*slice_offset*/,
                             std::size_t /*count*/) {}
  virtual void model_settled() {}
  // Gradients formed late (the engine's reduction fused into the step): gradient_late() says
  // that `domain`'s slice of `unit` is not formed yet, and settle_gradient() forms `count`
  // elements of it from `slice_offset` on, which a reader asks for right before it reads them
  // (so it reads them back from cache); each stretch at most once (one added to what earlier
  // micro-steps left would be added twice). A map whose gradients are formed already says false
  // and settles nothing.
  virtual bool gradient_late(int /*domain*/, int /*unit*/) const { return false; }
  virtual void settle_gradient(int /*domain*/, int /*unit*/, std::size_t /*slice_offset*/,
                               std::size_t /*count*/) {}
  // Where a late slice's gradient is a plain sum of the ranks' buffers (nothing added to earlier
  // micro-steps, no cast; the same for every stretch of the unit): true, with `out` the buffers
  // at `slice_offset` (the gradient dtype; valid until the next call) for a kernel that sums them
  // as it steps them (kernels::optimizer_step_summed_cpu), gradient() left unformed. False
  // otherwise, and for a slice that is not late.
  virtual bool late_sources(int /*domain*/, int /*unit*/, std::size_t /*slice_offset*/,
                            kernels::GradSources* /*out*/) {
    return false;
  }
};

}  // namespace zero::engine_detail
