// The updated model copy to the peers without an all-gather, at stages 1/2 and for stage 3's
// persistent units (EngineImpl::ModelPush in engine_impl.h): each rank writes its new slices into
// every peer's copy as the optimizer step writes them. At stage 0 the same push shares the step
// out: each rank steps only its own partition and pushes it.
#include <cstdlib>
#include <string_view>

#include "zero/base/stream_copy.h"
#include "zero/engine/engine_impl.h"

namespace zero::engine_detail {

bool EngineImpl::may_push_model() const {
  // Stage 0's choice holds for good: its other domains' states are not stepped once it shares
  // the step out.
  if (stage_ == 0 && push_.set_up) return push_.pushed_units > 0;
  // (Not where the ranks share one copy: the step writes it in place.)
  const bool persistent_units =
      stage_ == 3 && world_ > 1 && fetcher_ && !param_store_ && !mics_ && !shared_model_;
  const bool own_slices = (gathers_model() || persistent_units) && num_domains() == 1;
  // Stage 0: the model copy is the master, so what the push writes keeps every rank's master
  // whole (gather_master reads it); the other domains' states are read by no one but the step.
  const bool shared_step = stage_ == 0 && world_ > 1 && optimizer_->master_in_model();
  if (!(own_slices || shared_step) || !host_memory_ || host_step_) return false;
  if (optimizer_->store().nvme_count() > 0) return false;
  const char* env = std::getenv("ZERO_MODEL_PUSH");
  return env == nullptr || std::string_view(env) != "0";
}

void EngineImpl::set_up_model_push() {
  if (push_.set_up) return;
  push_.set_up = true;
  // Every rank's model copies' addresses (in its own process), rank-major: 64-bit words, which
  // an fp64 all-gather copies bit for bit (comm_ works on host memory here).
  static_assert(sizeof(void*) == sizeof(double));
  std::vector<void*> all(layout_units_ * static_cast<std::size_t>(world_));
  for (std::size_t u = 0; u < layout_units_; ++u) {
    all[static_cast<std::size_t>(rank_) * layout_units_ + u] = pushed_copy(u);
  }
  if (!all.empty()) comm_.all_gather_in_place(all.data(), layout_units_, DType::F64).wait();
  push_.peers.assign(all.size(), nullptr);
  push_.pushed.assign(layout_units_, 0);
  const std::size_t msize = dtype_size(model_dtype_);
  for (std::size_t u = 0; u < layout_units_; ++u) {
    const std::size_t bytes = layout_->unit(static_cast<int>(u)).padded_elems * msize;
    if (bytes == 0) continue;
    bool every_peer = true;
    for (int q = 0; q < world_; ++q) {
      const std::size_t at = static_cast<std::size_t>(q) * layout_units_ + u;
      if (all[at] == nullptr) {  // stage 3: not a persistent unit
        every_peer = false;
      } else if (q == rank_) {
        if (stage_ == 3) push_.peers[at] = static_cast<std::byte*>(all[at]);
      } else {
        push_.peers[at] = static_cast<std::byte*>(comm_.peer_memory(q, all[at], bytes));
        every_peer = every_peer && push_.peers[at] != nullptr;
      }
    }
    push_.pushed[u] = every_peer ? 1 : 0;
  }
  // Every rank must push (and skip the all-gather of) the same units: a unit is pushed only where
  // every rank can write every peer's copy of it.
  std::vector<float> cannot(layout_units_);
  for (std::size_t u = 0; u < layout_units_; ++u) cannot[u] = push_.pushed[u] ? 0.0f : 1.0f;
  if (!cannot.empty()) {
    comm_.all_reduce(cannot.data(), cannot.data(), cannot.size(), DType::F32, ReduceOp::Max).wait();
  }
  for (std::size_t u = 0; u < layout_units_; ++u) {
    push_.pushed[u] = cannot[u] == 0.0f && push_.pushed[u] ? 1 : 0;
    push_.pushed_units += push_.pushed[u];
  }
  if (stage_ != 0) return;
  // Stage 0 shares the step out only where every unit with elements is pushed (a unit nobody
  // pushed would need every domain stepped), and then for good.
  for (std::size_t u = 0; u < layout_units_; ++u) {
    if (layout_->unit(static_cast<int>(u)).padded_elems > 0 && !push_.pushed[u]) {
      push_.pushed.assign(layout_units_, 0);
      push_.pushed_units = 0;
      return;
    }
  }
  if (push_.pushed_units > 0) optimizer_->step_own_domain_only();
}

void EngineImpl::model_written(int domain, int unit, std::size_t slice_offset, std::size_t count) {
  const auto u = static_cast<std::size_t>(unit);
  if (!push_.active || domain_rank(domain) != rank_ || !push_.pushed[u] || count == 0) return;
  const std::size_t msize = dtype_size(model_dtype_);
  const std::size_t slice = layout_->unit(unit).slice_elems;
  const std::size_t at = (static_cast<std::size_t>(rank_) * slice + slice_offset) * msize;
  // The stretch the step just wrote: into the model copy at stages 1/2, the partition at stage 3.
  const std::byte* mine = stage_ == 3
                              ? own_slice(unit, slice_offset)
                              : units_[u].model + at;
  for (int q = 0; q < world_; ++q) {
    std::byte* copy = push_.peers[static_cast<std::size_t>(q) * layout_units_ + u];
    if (copy == nullptr) continue;  // this rank's model copy at stages 1/2: written already
    // Streamed: this core will not read the copy before the next forward, and the stores need
    // not read its lines. Fenced once the push ends (end_push()), not after every tile.
    copy_streaming_unfenced(copy + at, mine, count * msize);
    if (q != rank_) timings_.pushed_bytes += static_cast<std::int64_t>(count * msize);
  }
}

void EngineImpl::end_push() {
  if (!push_.active) return;
  push_.active = false;
  streaming_fence();  // model_written()'s stores, before whatever tells a peer they are there
}

std::byte* EngineImpl::pushed_copy(std::size_t unit) {
  if (stage_ == 3) return fetcher_ ? fetcher_->persistent_copy(static_cast<int>(unit)) : nullptr;
  return units_[unit].model;
}

}  // namespace zero::engine_detail
