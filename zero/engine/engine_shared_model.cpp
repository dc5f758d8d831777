// One model copy for every rank over ShmComm processes at stages 1/2, and at stage 3 (EngineImpl's
// shared model, engine_impl.h): rank 0's block, which the peers map and write their slices into.
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "zero/base/log.h"
#include "zero/engine/engine_impl.h"

namespace zero::engine_detail {

bool EngineImpl::may_share_model() const {
  if (num_domains() != 1 || !host_memory_ || host_step_) return false;
  if (stage_ == 3) {
    const auto& z = cfg_.zero_optimization;
    if (world_ < 2 || param_store_ || params_offloaded_ || mics_ || z.zero_hpz_partition_size > 1 ||
        z.zero_quantized_weights || z.zero_quantized_nontrainable_weights)
      return false;
    // The one copy takes no more than the ranks may hold gathered anyway.
    std::size_t elems = 0;
    for (std::size_t u = 0; u < layout_units_; ++u)
      elems += layout_->unit(static_cast<int>(u)).padded_elems;
    if (elems / static_cast<std::size_t>(world_) > parts_.fetch.max_live_elems) return false;
  } else if (!gathers_model()) {
    return false;
  }
  // In-process ranks would free rank 0's block under the peers' feet when rank 0's engine goes
  // first (a process's arena stays mapped in its peers until they close their communicator).
  if (comm_.shares_address_space()) return false;
  if (optimizer_->store().nvme_count() > 0) return false;  // a failed step restores its own copy
  const char* env = std::getenv("ZERO_SHARED_MODEL");
  return env == nullptr || std::string_view(env) != "0";
}

std::byte* EngineImpl::share_host_block(bool wanted, std::size_t bytes, MemoryTag tag,
                                        Buffer& owner) {
  // Every rank asks; where one may not (or cannot map rank 0's block), none shares.
  if (rank_ == 0) owner = device_.allocate(bytes, MemoryKind::Device, tag);
  // Rank 0's address, as a 64-bit word an fp64 broadcast copies bit for bit.
  static_assert(sizeof(void*) == sizeof(double));
  void* at = owner.data();
  comm_.broadcast(&at, 1, DType::F64, 0).wait();
  void* mine = !wanted ? nullptr : rank_ == 0 ? at : comm_.peer_memory(0, at, bytes);
  float cannot = mine != nullptr ? 0.0f : 1.0f;
  comm_.all_reduce(&cannot, &cannot, 1, DType::F32, ReduceOp::Max).wait();
  shared_model_ = cannot == 0.0f;
  if (!shared_model_) owner.reset();
  return shared_model_ ? static_cast<std::byte*>(mine) : nullptr;
}

void EngineImpl::release_shared_model() noexcept {
  if (!shared_model_) return;
  // Rank 0 frees the block below: every rank must have stopped reading it (the Python package
  // copies the parameters out before it destroys the engine).
  try {
    comm_.barrier().wait();
  } catch (const std::exception& e) {
    log::note("zero: rank {} destroyed its engine without meeting its peers ({}); a peer still "
              "reading the shared model copy may see rank 0's freed memory",
              rank_, e.what());
  }
}

}  // namespace zero::engine_detail
