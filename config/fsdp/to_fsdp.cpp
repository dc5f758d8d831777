// ds_config -> Accelerate FSDP config (config/fsdp/convert.h).
#include <fmt/format.h>

#include <set>
#include <string_view>

#include "config/fsdp/convert.h"
#include "zero/base/error.h"

namespace zero::config::fsdp {

namespace {

// The ds_config keys the mapping reads; every other key the config gives gets a note.
const std::set<std::string, std::less<>> kMappedKeys = {
    "zero_optimization.stage",
    "zero_optimization.offload_param.device",
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.zero_hpz_partition_size",
    "bf16.enabled",
    "bf16.bf16_master_weights_and_grads",
    "fp16.enabled",
    "fp16.fp16_master_weights_and_grads"};

// Why a given ds_config key has no Accelerate FSDP equivalent.
std::string_view why_no_equivalent(std::string_view key) {
  if (key == "optimizer")
    return "no Accelerate config key: under FSDP the training script builds the optimizer";
  if (key == "scheduler")
    return "no Accelerate config key: the training script builds the learning-rate schedule";
  if (key == "train_batch_size" || key == "train_micro_batch_size_per_gpu" ||
      key == "gradient_accumulation_steps")
    return "no Accelerate config key: the training script sets it (its DataLoader, "
           "Accelerator(gradient_accumulation_steps=...))";
  if (key == "gradient_clipping")
    return "no Accelerate config key: the training script clips (accelerator.clip_grad_norm_)";
  if (key.starts_with("fp16."))
    return "no Accelerate config key: Accelerate's fp16 scales the loss with torch.amp's dynamic "
           "GradScaler";
  if (key.starts_with("bf16.")) return "no Accelerate config key: FSDP's bf16 has no such setting";
  if (key.starts_with("zero_optimization.offload_"))
    return "no equivalent: FSDP's CPU offload is on or off, with no further settings";
  if (key == "zero_optimization.stage3_prefetch_bucket_size") return "applies at stage 3 only";
  if (key.starts_with("zero_optimization.")) return "no FSDP equivalent of this ZeRO setting";
  return "no Accelerate FSDP equivalent";
}

// The key a note names: blocks FSDP has no counterpart of at all are named once as a whole.
std::string note_key(const std::string& path) {
  for (std::string_view detailed : {"zero_optimization.", "fp16.", "bf16."}) {
    if (path.starts_with(detailed)) return path;
  }
  return path.substr(0, path.find('.'));
}

struct Builder {
  const DsConfig& ds;
  int version;
  AccelerateFsdpConfig a;
  std::vector<Note> notes;

  void note(std::string key, std::string message) {
    notes.push_back({std::move(key), std::move(message)});
  }
  void chosen(std::string_view fsdp_key, std::string why) {
    note("fsdp_config." + std::string(fsdp_key), std::move(why));
  }

  void sharding() {
    const ZeroOptimization& z = ds.zero_optimization;
    const bool hybrid = z.stage == 3 && z.zero_hpz_partition_size > 1;
    ShardingStrategy s = ShardingStrategy::FullShard;
    switch (z.stage) {
      case 0: s = ShardingStrategy::NoShard; break;
      case 1:
        s = ShardingStrategy::ShardGradOp;
        note("zero_optimization.stage",
             "stage 1 has no FSDP equivalent (FSDP cannot shard optimizer states alone); "
             "SHARD_GRAD_OP, the nearest, also shards gradients (stage 2)");
        break;
      case 2: s = ShardingStrategy::ShardGradOp; break;
      default: s = hybrid ? ShardingStrategy::HybridShard : ShardingStrategy::FullShard; break;
    }
    if (z.zero_hpz_partition_size > 1 && z.stage != 3) {
      note("zero_optimization.zero_hpz_partition_size",
           "applies at stage 3 only (DeepSpeed ignores it here)");
    }
    if (version == 1) {
      a.sharding_strategy = s;
      return;
    }
    a.reshard_after_forward =
        s == ShardingStrategy::FullShard || s == ShardingStrategy::HybridShard;
    if (s == ShardingStrategy::NoShard) {
      note("zero_optimization.stage",
           "stage 0 has no FSDP2 equivalent (FSDP2 always shards); written as "
           "fsdp_reshard_after_forward: false, the nearest; --fsdp-version 1 writes NO_SHARD");
    } else if (hybrid) {
      note(
          "zero_optimization.zero_hpz_partition_size",
          "FSDP2 hybrid sharding needs a 2-D device mesh from the training script, not a config "
          "key; written as fsdp_reshard_after_forward: true; --fsdp-version 1 writes HYBRID_SHARD");
    }
  }

  void offload() {
    const ZeroOptimization& z = ds.zero_optimization;
    auto device = [](const auto& block) { return block ? block->device : OffloadDevice::None; };
    const OffloadDevice param = device(z.offload_param);
    const OffloadDevice optimizer = device(z.offload_optimizer);
    a.offload_params = param != OffloadDevice::None || optimizer != OffloadDevice::None;
    if (!*a.offload_params) return;
    if (z.stage == 3 && (param == OffloadDevice::None) != (optimizer == OffloadDevice::None)) {
      note(param == OffloadDevice::None ? "zero_optimization.offload_optimizer"
                                        : "zero_optimization.offload_param",
           "FSDP offloads parameters, gradients and optimizer states together (all or nothing); "
           "this config offloads only one of them: fsdp_offload_params: true");
    }
    for (const auto& [key, d] :
         {std::pair{"zero_optimization.offload_param.device", param},
          std::pair{"zero_optimization.offload_optimizer.device", optimizer}}) {
      if (d == OffloadDevice::Nvme)
        note(key, "FSDP offloads to CPU memory only, not to NVMe: fsdp_offload_params: true");
    }
  }

  void prefetch() {
    if (ds.zero_optimization.stage != 3) return;
    const bool off = ds.zero_optimization.prefetch_bucket_elems == 0;
    if (version == 1) {
      a.backward_prefetch = off ? BackwardPrefetch::NoPrefetch : BackwardPrefetch::BackwardPre;
    } else if (off) {
      note("zero_optimization.stage3_prefetch_bucket_size",
           "0 (no prefetching) has no FSDP2 equivalent: FSDP2 always prefetches in backward");
    }
  }

  void precision() {
    a.state_dict_type = ds.zero_optimization.gather_16bit_weights_on_model_save
                            ? StateDictType::FullStateDict
                            : StateDictType::ShardedStateDict;
    a.mixed_precision = MixedPrecision::No;
    if (ds.bf16.enabled) {
      a.mixed_precision = MixedPrecision::Bf16;
      if (ds.bf16.bf16_master_weights_and_grads) {
        a.mixed_precision = MixedPrecision::No;
        note("bf16.bf16_master_weights_and_grads",
             "bf16 master weights: FSDP's equivalent is no mixed precision with the model loaded "
             "in bf16 (Accelerate's guide), written as mixed_precision: 'no'; load the model with "
             "torch_dtype=torch.bfloat16");
      }
    } else if (ds.fp16.enabled) {
      a.mixed_precision = MixedPrecision::Fp16;
      if (ds.fp16.fp16_master_weights_and_grads) {
        note("fp16.fp16_master_weights_and_grads",
             "no equivalent: FSDP's fp16 mixed precision keeps fp32 master weights");
      }
    }
  }

  // Settings FSDP needs and DeepSpeed does not have, set as Accelerate's guide recommends.
  void choices() {
    a.auto_wrap_policy = AutoWrapPolicy::TransformerBasedWrap;
    chosen("fsdp_auto_wrap_policy",
           "TRANSFORMER_BASED_WRAP, as Accelerate's guide recommends: DeepSpeed needs no wrap "
           "policy (set fsdp_transformer_layer_cls_to_wrap if Accelerate cannot find the layers)");
    a.cpu_ram_efficient_loading = ds.zero_optimization.stage == 3;
    chosen("fsdp_cpu_ram_efficient_loading",
           fmt::format("{}: the counterpart of zero.Init, which transformers uses at stage 3 only",
                       ds.zero_optimization.stage == 3 ? "true" : "false"));
    a.activation_checkpointing = false;
    chosen("fsdp_activation_checkpointing",
           "false: a ds_config does not checkpoint activations for the model");
    if (version == 1) {
      a.sync_module_states = *a.cpu_ram_efficient_loading;
      chosen("fsdp_sync_module_states",
             "as fsdp_cpu_ram_efficient_loading, which needs it with FSDP1 (Accelerate sets it)");
      a.use_orig_params = true;
      chosen("fsdp_use_orig_params",
             "true: DeepSpeed trains the original parameters, and torch.compile needs it");
    }
  }

  void given_keys_without_equivalent() {
    std::set<std::string> done;
    for (const auto& [path, p] : ds.provenance) {
      if (p.source == Source::Default || p.source == Source::Derived) continue;
      if (kMappedKeys.count(path) != 0 &&
          !(path.ends_with("stage3_prefetch_bucket_size") && ds.zero_optimization.stage != 3))
        continue;
      const std::string key = note_key(path);
      if (done.insert(key).second) note(key, std::string(why_no_equivalent(key)));
    }
  }

  ToFsdp run() {
    ZERO_CHECK(version == 1 || version == 2,
               "fsdp_from_ds_config: fsdp_version must be 1 or 2, "
               "got {}",
               version);
    a.fsdp_version = version;
    sharding();
    offload();
    prefetch();
    precision();
    choices();
    if (ds.world_size) a.num_processes = *ds.world_size;
    given_keys_without_equivalent();
    return {std::move(a), std::move(notes)};
  }
};

}  // namespace

ToFsdp fsdp_from_ds_config(const DsConfig& ds, int fsdp_version) {
  return Builder{ds, fsdp_version, {}, {}}.run();
}

}  // namespace zero::config::fsdp
