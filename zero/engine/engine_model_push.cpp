// The updated model copy to the peers without an all-gather, at stages 1/2 (EngineImpl::ModelPush
// in engine_impl.h): each rank writes its new slices into every peer's copy as the optimizer step
// writes them.
#include <cstdlib>
#include <string_view>

#include "zero/base/stream_copy.h"
#include "zero/engine/engine_impl.h"

namespace zero::engine_detail {

bool EngineImpl::may_push_model() const {
  if (!gathers_model() || num_domains() != 1 || !host_memory_ || host_step_) return false;
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
    all[static_cast<std::size_t>(rank_) * layout_units_ + u] = units_[u].model.data();
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
      if (q == rank_) continue;
      const std::size_t at = static_cast<std::size_t>(q) * layout_units_ + u;
      push_.peers[at] = static_cast<std::byte*>(comm_.peer_memory(q, all[at], bytes));
      every_peer = every_peer && push_.peers[at] != nullptr;
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
}

void EngineImpl::model_written(int domain, int unit, std::size_t slice_offset, std::size_t count) {
  const auto u = static_cast<std::size_t>(unit);
  if (!push_.active || domain_rank(domain) != rank_ || !push_.pushed[u] || count == 0) return;
  const std::size_t msize = dtype_size(model_dtype_);
  const std::size_t slice = layout_->unit(unit).slice_elems;
  const std::size_t at = (static_cast<std::size_t>(rank_) * slice + slice_offset) * msize;
  const std::byte* mine = static_cast<const std::byte*>(units_[u].model.data()) + at;
  for (int q = 0; q < world_; ++q) {
    if (q == rank_) continue;
    std::byte* peer = push_.peers[static_cast<std::size_t>(q) * layout_units_ + u];
    // Streamed: this core will not read the peer's copy, and the stores need not read its lines.
    copy_streaming(peer + at, mine, count * msize);
    timings_.pushed_bytes += static_cast<std::int64_t>(count * msize);
  }
}

}  // namespace zero::engine_detail
