#include "zero/estimate/from_config.h"

namespace zero {
namespace {

OffloadTier tier(config::OffloadDevice d) {
  switch (d) {
    case config::OffloadDevice::Cpu: return OffloadTier::Cpu;
    case config::OffloadDevice::Nvme: return OffloadTier::Nvme;
    case config::OffloadDevice::None: break;
  }
  return OffloadTier::None;
}

}  // namespace

bool apply_config_to_estimate(const config::DsConfig& config, EstimateInput& in) {
  in.stage = config.zero_optimization.stage;
  switch (config.model_dtype) {
    case DType::F16: in.precision = Precision::Fp16; break;
    case DType::BF16: in.precision = Precision::Bf16; break;
    default: in.precision = Precision::Fp32; break;
  }
  const auto& z = config.zero_optimization;
  if (z.offload_optimizer) in.offload_optimizer = tier(z.offload_optimizer->device);
  if (z.offload_param) in.offload_param = tier(z.offload_param->device);
  if (z.mics_shard_size > 0) in.mics_shard_size = static_cast<std::uint64_t>(z.mics_shard_size);
  if (z.zero_hpz_partition_size > 1) {
    in.hpz_partition_size = static_cast<std::uint64_t>(z.zero_hpz_partition_size);
  }
  using config::OptimizerKind;
  switch (config.optimizer ? config.optimizer->kind : OptimizerKind::Adam) {
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW: in.optimizer = EstimateOptimizer::Adam; return true;
    case OptimizerKind::Adagrad: in.optimizer = EstimateOptimizer::Adagrad; return true;
    case OptimizerKind::Lion: in.optimizer = EstimateOptimizer::Lion; return true;
    case OptimizerKind::Sgd:
      in.optimizer =
          config.optimizer->momentum != 0 ? EstimateOptimizer::SgdMomentum : EstimateOptimizer::Sgd;
      return true;
    default: return false;
  }
}

}  // namespace zero
