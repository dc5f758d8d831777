// The reduction fused into the optimizer step (EngineImpl::FusedReduction in engine_impl.h): the
// lone units left unreduced at the end of backward are summed over the ranks by the step itself:
// element by element inside the optimizer kernel, or tile by tile right before it steps a tile.
#include "zero/engine/engine_impl.h"

namespace zero::engine_detail {

bool EngineImpl::may_fuse_reduction() const {
  if (world_ < 2 || fused_.off || fused_.unreadable || !host_memory_ || host_step_ ||
      param_store_ || mics_)
    return false;
  return optimizer_->store().nvme_count() == 0;
}

bool EngineImpl::expects_late_units() const {
  return at_boundary() && may_fuse_reduction();
}

bool EngineImpl::set_up_fused_reduction() {
  const std::span<const GradientReducer::LateUnit> late = reducer_->late_units();
  if (late.empty()) return false;
  const std::size_t rows = late.size();
  const auto W = static_cast<std::size_t>(world_);
  // Every rank's buffers, rank-major: 64-bit words, which an fp64 all-gather copies bit for bit.
  // No rank contributes before its backward is over, so no buffer is read while it is written.
  static_assert(sizeof(void*) == sizeof(double));
  std::vector<const void*> all(rows * W);
  for (std::size_t i = 0; i < rows; ++i) {
    all[static_cast<std::size_t>(rank_) * rows + i] = late[i].gradients;
  }
  comm_.all_gather_in_place_now(all.data(), rows, DType::F64);
  const std::size_t esize = dtype_size(reducer_->comm_dtype());
  fused_.sources.assign(rows * W, nullptr);
  fused_.adds.assign(rows, 0);
  for (std::size_t i = 0; i < rows; ++i) fused_.adds[i] = late[i].accumulate ? 1 : 0;
  std::vector<float> cannot(rows, 0.0f);
  for (std::size_t i = 0; i < rows; ++i) {
    const std::size_t bytes = layout_->unit(late[i].unit).padded_elems * esize;
    for (int q = 0; q < world_; ++q) {
      const void* view = comm_.peer_readable(q, all[static_cast<std::size_t>(q) * rows + i], bytes);
      fused_.sources[i * W + static_cast<std::size_t>(q)] = static_cast<const std::byte*>(view);
      if (view == nullptr) cannot[i] = 1.0f;
    }
    // This rank's own slice may lie only in its own memory (GradientReducer::lend_own_slice).
    fused_.sources[i * W + static_cast<std::size_t>(rank_)] = reducer_->local_view(late[i].unit);
  }
  // Every rank must form (and not reduce) the same units: a unit is formed only where every rank
  // can read every peer's buffer of it.
  comm_.all_reduce_now(cannot.data(), cannot.data(), rows, DType::F32, ReduceOp::Max);
  fused_.late.assign(layout_units_, -1);
  std::vector<int> usual;
  for (std::size_t i = 0; i < rows; ++i) {
    if (cannot[i] != 0.0f) {
      usual.push_back(late[i].unit);
    } else {
      fused_.late[static_cast<std::size_t>(late[i].unit)] = static_cast<int>(i);
      ++timings_.units_fused;
    }
  }
  // Rows stay as they are: reduce_late() drops its units from late_units(), not from `sources`.
  if (!usual.empty()) reducer_->reduce_late(usual);
  fused_.active = usual.size() < rows;
  fused_.unreadable = !fused_.active;
  return fused_.active;
}

void EngineImpl::end_fused_reduction() {
  fused_.active = false;
  fused_.own_formed = false;
  fused_.late.clear();
  fused_.sources.clear();
  fused_.adds.clear();
  reducer_->release_late();
}

bool EngineImpl::gradient_late(int domain, int unit) const {
  if (in_backward_.unit == unit) return true;  // stepped in backward, from the posted buffers
  if (!fused_.active) return false;
  const int row = fused_.late[static_cast<std::size_t>(unit)];
  if (row < 0) return false;
  // The norm's pass formed this rank's own slices in memory, but for those it summed as they are.
  return !(fused_.own_formed && domain == optimizer_->own_domain() &&
           !late_summable(late_adds(unit)));
}

bool EngineImpl::late_summable(bool adds) const {
  return !adds && reducer_->accum_dtype() == reducer_->comm_dtype() &&
         world_ <= kernels::GradSources::kMaxCount && compute_.optimizer_step_summed != nullptr &&
         compute_.squared_norm_summed != nullptr;
}

const std::byte* const* EngineImpl::late_unit_buffers(int unit) const {
  if (in_backward_.unit == unit) return in_backward_.sources.data();
  const auto row = static_cast<std::size_t>(fused_.late[static_cast<std::size_t>(unit)]);
  return fused_.sources.data() + row * static_cast<std::size_t>(world_);
}

bool EngineImpl::late_adds(int unit) const {
  if (in_backward_.unit == unit) return in_backward_.adds;
  return fused_.adds[static_cast<std::size_t>(fused_.late[static_cast<std::size_t>(unit)])] != 0;
}

const void* const* EngineImpl::late_buffers(int domain, int unit, std::size_t slice_offset) {
  const std::byte* const* buffers = late_unit_buffers(unit);
  const auto W = static_cast<std::size_t>(world_);
  const std::size_t S = layout_->unit(unit).slice_elems;
  // Domain d's slice is its rank's: at q·S + offset in each rank's unit-flat buffer.
  const std::size_t at = (static_cast<std::size_t>(domain_rank(domain)) * S + slice_offset) *
                         dtype_size(reducer_->comm_dtype());
  fused_.tile_sources.resize(W);
  for (std::size_t q = 0; q < W; ++q) fused_.tile_sources[q] = buffers[q] + at;
  return fused_.tile_sources.data();
}

float EngineImpl::late_divisor() const {
  return reducer_->op() == ReduceOp::Avg ? static_cast<float>(world_) : 0.0f;
}

bool EngineImpl::late_sources(int domain, int unit, std::size_t slice_offset,
                              kernels::GradSources* out) {
  if (!gradient_late(domain, unit) || !late_summable(late_adds(unit))) return false;
  *out = {late_buffers(domain, unit, slice_offset), world_, late_divisor()};
  return true;
}

void EngineImpl::settle_gradient(int domain, int unit, std::size_t slice_offset,
                                 std::size_t count) {
  if (!gradient_late(domain, unit) || count == 0) return;
  const DType comm = reducer_->comm_dtype();
  const DType accum = reducer_->accum_dtype();
  const bool adds = late_adds(unit);
  if (!adds && accum == comm) {  // a plain copy: the sum goes straight into the target
    compute_.reduce(gradient(domain, unit, slice_offset),
                    late_buffers(domain, unit, slice_offset), world_, count, comm,
                    kernels::ReduceKind::Sum, late_divisor(), exec_);
    return;
  }
  // Else summed into scratch and landed as GradientReducer lands a collective's result.
  if (fused_.scratch.empty()) fused_.scratch = alloc(kSettleElems, comm, MemoryTag::Staging);
  for (std::size_t done = 0; done < count; done += kSettleElems) {
    const std::size_t m = std::min(kSettleElems, count - done);
    compute_.reduce(fused_.scratch.data(), late_buffers(domain, unit, slice_offset + done),
                    world_, m, comm, kernels::ReduceKind::Sum, late_divisor(), exec_);
    compute_.combine(gradient(domain, unit, slice_offset + done), accum, fused_.scratch.data(),
                     comm, m, 1.0f, adds, exec_);
  }
}

}  // namespace zero::engine_detail
