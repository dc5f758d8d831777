// One model copy for every rank at stages 1/2 over ShmComm processes (EngineImpl's shared model,
// engine_impl.h): rank 0's block, which the peers map and write their slices into.
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "zero/base/log.h"
#include "zero/engine/engine_impl.h"

namespace zero::engine_detail {

bool EngineImpl::may_share_model() const {
  if (!gathers_model() || num_domains() != 1 || !host_memory_ || host_step_) return false;
  // In-process ranks would free rank 0's block under the peers' feet when rank 0's engine goes
  // first (a process's arena stays mapped in its peers until they close their communicator).
  if (comm_.shares_address_space()) return false;
  if (optimizer_->store().nvme_count() > 0) return false;  // a failed step restores its own copy
  const char* env = std::getenv("ZERO_SHARED_MODEL");
  return env == nullptr || std::string_view(env) != "0";
}

std::byte* EngineImpl::share_model_pool(std::size_t elems) {
  // Rank 0 allocates its copy whatever the outcome. Every rank asks; one that may not (or cannot
  // map rank 0's block) keeps a copy of its own, and then every rank does.
  const bool wanted = may_share_model();
  if (rank_ == 0) model_pool_ = alloc(elems, model_dtype_, MemoryTag::LowPrecisionParams);
  // Rank 0's address, as a 64-bit word an fp64 broadcast copies bit for bit.
  static_assert(sizeof(void*) == sizeof(double));
  void* owner = model_pool_.data();
  comm_.broadcast(&owner, 1, DType::F64, 0).wait();
  void* mine = !wanted ? nullptr
               : rank_ == 0 ? owner
                            : comm_.peer_memory(0, owner, elems * dtype_size(model_dtype_));
  float cannot = mine != nullptr ? 0.0f : 1.0f;
  comm_.all_reduce(&cannot, &cannot, 1, DType::F32, ReduceOp::Max).wait();
  shared_model_ = cannot == 0.0f;
  return static_cast<std::byte*>(shared_model_ ? mine : model_pool_.data());
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
