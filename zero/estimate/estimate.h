// Per-rank model-state memory from the ZeRO paper's formulas (Rajbhandari et al. 2020, §5 and
// Figure 1): with Ψ parameters, N ranks and K bytes of fp32 master plus optimizer state per
// parameter (K = 12 for mixed-precision Adam), a rank holds
//   stage 0: (2 + 2 + K)·Ψ       stage 1: 2Ψ + 2Ψ + K·Ψ/N
//   stage 2: 2Ψ + (2 + K)·Ψ/N    stage 3: (2 + 2 + K)·Ψ/N
// bytes, where the 2s are the low-precision parameters and gradients. zero's engine keeps the same
// categories (DESIGN.md §3), so this is also what its memory ledger is checked against. One
// difference from the paper: in fp32 with nothing offloaded the model copy (4 bytes a parameter)
// holds the master weights itself, so the fp32 master row is 0.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zero {

enum class Precision { Fp16, Bf16, Fp32 };
enum class OffloadTier { None, Cpu, Nvme };
enum class EstimateOptimizer { Adam, Adagrad, Lion, Sgd, SgdMomentum };

struct EstimateInput {
  std::uint64_t params = 0;         // Ψ, total trainable parameters
  std::uint64_t largest_param = 0;  // elements of the largest parameter (stage-3 working set)
  std::uint64_t world_size = 1;     // N, data-parallel ranks
  std::uint64_t gpus_per_node = 1;  // ranks sharing one host's memory
  int stage = 0;                    // ZeRO stage 0..3
  Precision precision = Precision::Fp16;
  EstimateOptimizer optimizer = EstimateOptimizer::Adam;
  OffloadTier offload_optimizer = OffloadTier::None;
  OffloadTier offload_param = OffloadTier::None;  // honoured at stage 3 only, as in DeepSpeed
  // Stage 3 only. MiCS: the model states are partitioned over shard groups of this many ranks
  // (0: over the whole world). hpZ: each rank also holds 1/hpz of the low-precision model as its
  // block of a secondary partition while a step runs (1: none).
  std::uint64_t mics_shard_size = 0;
  std::uint64_t hpz_partition_size = 1;
};

struct TierBytes {
  double device = 0;
  double host = 0;
  double nvme = 0;
};

struct EstimateResult {
  TierBytes lp_params;         // the model copy in its training dtype
  TierBytes gradients;         // gradients (low precision; fp32 partition when offloaded)
  TierBytes fp32_master;       // fp32 master weights
  TierBytes optimizer_states;  // Adam moments etc., fp32
  TierBytes working_set;       // stage 3: the largest parameter gathered, with its gradient
  TierBytes secondary_params;  // stage 3 with hpZ: the secondary partition's block
  double optimizer_state_bytes_per_param = 0;  // K - 4
  TierBytes total() const;
};

// REQUIRES: world_size >= 1, stage in 0..3, largest_param <= params. Throws zero::Error otherwise.
EstimateResult estimate_model_states(const EstimateInput& in);

std::string_view precision_name(Precision p);
std::string_view offload_tier_name(OffloadTier t);
std::string_view estimate_optimizer_name(EstimateOptimizer o);

}  // namespace zero
