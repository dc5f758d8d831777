// The groups of stage 3's hierarchical partitions: MiCS's shard groups (the communicator the
// engine runs over, and checkpoints saved by one replica, since every replica holds the same
// partitions) and hpZ's secondary groups.
#include <exception>
#include <string>

#include "zero/comm/hierarchical_comm.h"
#include "zero/comm/node_topology.h"
#include "zero/engine/engine_impl.h"

namespace zero::engine_detail {

std::unique_ptr<MicsComm> make_mics_comm(const config::DsConfig& cfg, Communicator& comm) {
  const auto& z = cfg.zero_optimization;
  if (z.stage != 3 || z.mics_shard_size <= 0 || z.mics_shard_size == comm.size()) return nullptr;
  const char* key = "zero_optimization.mics_shard_size";
  if (cfg.prescale_gradients || cfg.gradient_predivide_factor != 1.0 ||
      cfg.gradient_allreduce_sum) {
    throw ConfigError(key,
                      "MiCS averages over the shard group and then over the replicas; it is "
                      "not combined with prescale_gradients, gradient_predivide_factor or "
                      "gradient_allreduce_sum here: drop those");
  }
  if (!z.reduce_scatter) {
    throw ConfigError(key,
                      "MiCS reduces gradients by reduce-scatter; set "
                      "zero_optimization.reduce_scatter to true");
  }
  return MicsComm::create(comm, static_cast<int>(z.mics_shard_size));
}

std::unique_ptr<MicsComm> make_mics_control(const config::DsConfig& cfg, const MicsComm* mics,
                                            const EngineOptions& options) {
  if (mics == nullptr || options.control_comm == nullptr) return nullptr;
  return MicsComm::create(*options.control_comm,
                          static_cast<int>(cfg.zero_optimization.mics_shard_size));
}

int qgz_bits(const config::DsConfig& cfg, Communicator& comm, bool mics,
             std::vector<std::string>& notes) {
  const auto& z = cfg.zero_optimization;
  if (z.stage != 3 || !z.zero_quantized_gradients) return 0;
  const char* key = "zero_optimization.zero_quantized_gradients";
  if (mics) {
    throw ConfigError(key, "qgZ and MiCS are not combined here; drop one of them");
  }
  const auto* nodes = dynamic_cast<const HierarchicalComm*>(&comm);
  if (nodes == nullptr || nodes->topology().nodes() == 1) {
    notes.push_back(
        "zero_quantized_gradients: the ranks are on one node, so there is no slow link to save "
        "bytes on; gradients are reduced exactly (set --ranks-per-node, ZERO_RANKS_PER_NODE or "
        "launch across nodes for qgZ)");
    return 0;
  }
  if (!nodes->two_level()) {
    notes.push_back(
        "zero_quantized_gradients: one rank per node, so there is no reduction inside a node to "
        "quantize in two levels; gradients are reduced exactly");
    return 0;
  }
  return 4;  // int4 blocks, as ZeRO++ (kernels/quantize.h)
}

std::unique_ptr<Communicator> make_hpz_comm(const config::DsConfig& cfg, Communicator& comm,
                                            bool mics) {
  const auto& z = cfg.zero_optimization;
  const std::int64_t h = z.zero_hpz_partition_size;
  const int w = comm.size();
  if (z.stage != 3 || h <= 1) return nullptr;
  const char* key = "zero_optimization.zero_hpz_partition_size";
  if (mics) {
    throw ConfigError(key,
                      "hpZ and MiCS both partition inside groups; use one of them "
                      "(mics_shard_size or zero_hpz_partition_size)");
  }
  if (h == w) return nullptr;  // the primary partition is already inside the group
  if (h > w || w % h != 0) {
    throw ConfigError(key, fmt::format("{} does not divide the world size {}: secondary "
                                       "partitions are groups of consecutive ranks (the ranks of "
                                       "a node); use one of {}",
                                       h, w, divisors_of(w)));
  }
  const int r = comm.rank();
  return comm.split(r / static_cast<int>(h), r % static_cast<int>(h));
}

// With replicas, replica 0 writes the checkpoint; then every replica learns whether it worked.
// Replica 0's ranks leave save_group() only after its rank 0 has put the checkpoint in place (the
// last agreement of a save follows the rename), and the all-reduce across replicas orders the
// other replicas after that, so a load right after a save reads the new checkpoint everywhere.
void EngineImpl::save_checkpoint(const std::string& dir, const std::string& tag,
                                 const nlohmann::json& client_state,
                                 std::optional<bool> model_16bit) {
  check_not_begun_in_backward("save_checkpoint");
  if (!mics_ || mics_->replicas() == 1) {
    save_group(dir, tag, client_state, model_16bit);
    return;
  }
  std::exception_ptr failure;
  if (mics_->replica() == 0) {
    try {
      save_group(dir, tag, client_state, model_16bit);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  float failed = failure ? 1.0f : 0.0f;
  // A host float: the replicas' host communicator (the control one's on a device engine).
  MicsComm& host = mics_control_ ? *mics_control_ : *mics_;
  host.across_replicas().all_reduce(&failed, &failed, 1, DType::F32, ReduceOp::Max).wait();
  if (failure) std::rethrow_exception(failure);
  if (failed > 0) {
    throw IoError(
        fmt::format("save_checkpoint: replica 0 (ranks 0-{}) failed to save {}/{}; "
                    "its ranks report why",
                    comm_.size() - 1, dir, tag));
  }
}

}  // namespace zero::engine_detail
