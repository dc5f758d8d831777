#include "zero/estimate/estimate.h"

#include "zero/base/error.h"

namespace zero {

namespace {

double state_bytes_per_param(EstimateOptimizer o) {
  switch (o) {
    case EstimateOptimizer::Adam: return 8;         // exp_avg, exp_avg_sq
    case EstimateOptimizer::Adagrad: return 4;      // sum of squares
    case EstimateOptimizer::Lion: return 4;         // exp_avg
    case EstimateOptimizer::SgdMomentum: return 4;  // momentum buffer
    case EstimateOptimizer::Sgd: return 0;
  }
  return 0;
}

// Adds `bytes` to the tier named by `tier` (None means the device).
void place(TierBytes& into, OffloadTier tier, double bytes) {
  switch (tier) {
    case OffloadTier::None: into.device += bytes; break;
    case OffloadTier::Cpu: into.host += bytes; break;
    case OffloadTier::Nvme: into.nvme += bytes; break;
  }
}

}  // namespace

TierBytes EstimateResult::total() const {
  TierBytes t;
  for (const TierBytes* c :
       {&lp_params, &gradients, &fp32_master, &optimizer_states, &working_set,
        &secondary_params}) {
    t.device += c->device;
    t.host += c->host;
    t.nvme += c->nvme;
  }
  return t;
}

EstimateResult estimate_model_states(const EstimateInput& in) {
  ZERO_CHECK(in.world_size >= 1, "estimate: world size must be at least 1, got {}", in.world_size);
  ZERO_CHECK(in.stage >= 0 && in.stage <= 3, "estimate: ZeRO stage must be 0, 1, 2 or 3, got {}",
             in.stage);
  ZERO_CHECK(in.largest_param <= in.params,
             "estimate: largest parameter ({}) cannot exceed the total parameters ({})",
             in.largest_param, in.params);
  ZERO_CHECK(in.gpus_per_node >= 1, "estimate: ranks per node must be at least 1, got {}",
             in.gpus_per_node);

  const double psi = static_cast<double>(in.params);
  // MiCS partitions inside its shard groups.
  const bool mics = in.stage == 3 && in.mics_shard_size > 0 && in.mics_shard_size < in.world_size;
  const double n = static_cast<double>(mics ? in.mics_shard_size : in.world_size);
  const double lp = in.precision == Precision::Fp32 ? 4.0 : 2.0;
  const double k_states = state_bytes_per_param(in.optimizer);

  EstimateResult r;
  r.optimizer_state_bytes_per_param = k_states;

  // Which share of each category a rank keeps (DESIGN.md §3 table).
  const double params_share = in.stage >= 3 ? psi / n : psi;
  const double grads_share = in.stage >= 2 ? psi / n : psi;
  const double optim_share = in.stage >= 1 ? psi / n : psi;

  const OffloadTier param_tier = in.stage == 3 ? in.offload_param : OffloadTier::None;
  place(r.lp_params, param_tier, lp * params_share);

  // An fp32 model's master weights are its model copy wherever both stay on the device (zero's
  // engine keeps no second fp32 copy then; DeepSpeed does).
  const bool master_in_model = in.precision == Precision::Fp32 &&
                               in.offload_optimizer == OffloadTier::None &&
                               param_tier == OffloadTier::None;
  if (!master_in_model) place(r.fp32_master, in.offload_optimizer, 4.0 * optim_share);
  place(r.optimizer_states, in.offload_optimizer, k_states * optim_share);

  place(r.gradients, OffloadTier::None, lp * grads_share);
  if (in.offload_optimizer != OffloadTier::None) {
    // The optimizer runs on the host over an fp32 copy of the rank's gradient partition.
    r.gradients.host += 4.0 * optim_share;
  }

  if (in.stage == 3) {
    // A gathered parameter and its full gradient exist on the device while its unit runs.
    r.working_set.device = 2.0 * lp * static_cast<double>(in.largest_param);
    if (in.hpz_partition_size > 1 && in.hpz_partition_size < in.world_size) {
      r.secondary_params.device = lp * psi / static_cast<double>(in.hpz_partition_size);
    }
  }
  return r;
}

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::Fp16: return "fp16";
    case Precision::Bf16: return "bf16";
    case Precision::Fp32: return "fp32";
  }
  return "?";
}

std::string_view offload_tier_name(OffloadTier t) {
  switch (t) {
    case OffloadTier::None: return "none";
    case OffloadTier::Cpu: return "cpu";
    case OffloadTier::Nvme: return "nvme";
  }
  return "?";
}

std::string_view estimate_optimizer_name(EstimateOptimizer o) {
  switch (o) {
    case EstimateOptimizer::Adam: return "adam";
    case EstimateOptimizer::Adagrad: return "adagrad";
    case EstimateOptimizer::Lion: return "lion";
    case EstimateOptimizer::Sgd: return "sgd";
    case EstimateOptimizer::SgdMomentum: return "sgd-momentum";
  }
  return "?";
}

}  // namespace zero
