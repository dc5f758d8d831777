// Accelerate FSDP config -> ds_config (config/fsdp/convert.h).
#include <fmt/format.h>

#include <string_view>

#include "config/did_you_mean.h"
#include "config/fsdp/convert.h"
#include "config/schema.h"
#include "zero/base/error.h"

namespace zero::config::fsdp {

namespace {

using nlohmann::json;

// DeepSpeed's default prefetch bucket, from the schema table (the one place defaults live).
json default_prefetch_bucket() {
  for (const KeyRule* r : rules_of("zero_optimization")) {
    if (r->name == "stage3_prefetch_bucket_size") return r->default_value;
  }
  ZERO_ASSERT(!"the schema has a stage3_prefetch_bucket_size row");
  return nullptr;
}

struct Builder {
  const AccelerateFsdpConfig& a;
  json ds = json::object();
  json zero = json::object();
  std::vector<Note> notes;
  int stage = 3;

  void note(std::string key, std::string message) {
    notes.push_back({std::move(key), std::move(message)});
  }
  static std::string fsdp_key(std::string_view key) { return "fsdp_config." + std::string(key); }

  void sharding() {
    if (a.reshard_after_forward) {
      stage = *a.reshard_after_forward ? 3 : 2;
      return;
    }
    if (!a.sharding_strategy) {
      note(fsdp_key(a.fsdp_version == 2 ? "fsdp_reshard_after_forward" : "fsdp_sharding_strategy"),
           "absent: Accelerate's default shards parameters, gradients and optimizer states "
           "(FULL_SHARD): stage 3");
    }
    switch (a.sharding_strategy.value_or(ShardingStrategy::FullShard)) {
      case ShardingStrategy::FullShard: stage = 3; break;
      case ShardingStrategy::ShardGradOp: stage = 2; break;
      case ShardingStrategy::NoShard: stage = 0; break;
      case ShardingStrategy::HybridShard: hybrid(); break;
      case ShardingStrategy::HybridShardZero2:
        stage = 2;
        note(fsdp_key("fsdp_sharding_strategy"),
             "HYBRID_SHARD_ZERO2 has no equivalent: DeepSpeed's hierarchical partitioning (hpZ) "
             "is for stage 3 only; written as stage 2 over all ranks, not within each node");
        break;
    }
  }

  // Accelerate's FSDP guide: HYBRID_SHARD is ZeRO++ stage 3 with zero_hpz_partition_size = the
  // GPUs of one node.
  void hybrid() {
    stage = 3;
    const std::int64_t machines = a.num_machines.value_or(1);
    if (machines == 1) {
      note(fsdp_key("fsdp_sharding_strategy"),
           "HYBRID_SHARD on one machine shards like FULL_SHARD: stage 3 (zero_hpz_partition_size "
           "would be every GPU)");
    } else if (a.num_processes && *a.num_processes % machines == 0) {
      zero["zero_hpz_partition_size"] = *a.num_processes / machines;
      note(fsdp_key("fsdp_sharding_strategy"),
           fmt::format("HYBRID_SHARD: stage 3 with zero_hpz_partition_size {} (num_processes / "
                       "num_machines): the primary partition over all ranks, a secondary one "
                       "inside each machine for the backward gathers (ZeRO++ hpZ); FSDP's "
                       "replication across machines is closer to mics_shard_size",
                       *a.num_processes / machines));
    } else {
      note(fsdp_key("fsdp_sharding_strategy"),
           "HYBRID_SHARD: written as stage 3 over all ranks; for DeepSpeed's equivalent set "
           "zero_optimization.zero_hpz_partition_size to the GPUs per node (num_processes is "
           "missing or not a multiple of num_machines)");
    }
  }

  void offload() {
    if (!a.offload_params || !*a.offload_params) return;
    const json cpu = {{"device", "cpu"}};
    if (stage == 3) {
      zero["offload_param"] = cpu;
      zero["offload_optimizer"] = cpu;
    } else if (stage > 0) {
      zero["offload_optimizer"] = cpu;
      note(fsdp_key("fsdp_offload_params"),
           fmt::format("at stage {} DeepSpeed keeps the 16-bit parameters on the device (they are "
                       "not partitioned); the optimizer states, fp32 masters and step go to the "
                       "CPU (offload_optimizer)",
                       stage));
    } else {
      note(fsdp_key("fsdp_offload_params"),
           "no equivalent with NO_SHARD: DeepSpeed offloads only with ZeRO stage 1 or higher");
    }
  }

  void prefetch() {
    const std::string backward = fsdp_key("fsdp_backward_prefetch");
    if (stage == 3) {
      json bucket = default_prefetch_bucket();
      if (a.fsdp_version == 2 && a.backward_prefetch) {
        note(backward,
             "FSDP2 has no such setting (it always prefetches as BACKWARD_PRE does); "
             "DeepSpeed's default prefetch bucket");
      } else if (a.backward_prefetch == BackwardPrefetch::NoPrefetch) {
        bucket = 0;
      } else if (a.backward_prefetch == BackwardPrefetch::BackwardPost) {
        note(backward,
             "BACKWARD_POST has no equivalent: DeepSpeed prefetches by bucket size, not "
             "by when in the backward pass; DeepSpeed's default prefetch bucket");
      }
      zero["stage3_prefetch_bucket_size"] = bucket;
    } else if (a.backward_prefetch) {
      note(backward, fmt::format("no equivalent at stage {}: parameters are whole on every rank, "
                                 "there is nothing to prefetch",
                                 stage));
    }
    if (a.forward_prefetch) {
      note(fsdp_key("fsdp_forward_prefetch"),
           stage < 3
               ? fmt::format("no equivalent at stage {}: parameters are whole on every rank", stage)
               : std::string("no separate switch: DeepSpeed stage 3 prefetches in forward "
                             "and backward alike, up to stage3_prefetch_bucket_size "
                             "elements (0 stops both)"));
    }
  }

  void checkpointing() {
    if (!a.state_dict_type) return;
    const StateDictType t = *a.state_dict_type;
    zero["stage3_gather_16bit_weights_on_model_save"] = t == StateDictType::FullStateDict;
    if (t == StateDictType::LocalStateDict) {
      note(fsdp_key("fsdp_state_dict_type"),
           "LOCAL_STATE_DICT (each rank's flat shard) has no equivalent; DeepSpeed saves each "
           "rank's partition in its checkpoint, and save_16bit_model does not gather (false)");
    }
  }

  void precision() {
    switch (a.mixed_precision.value_or(MixedPrecision::No)) {
      case MixedPrecision::No: break;
      case MixedPrecision::Bf16: ds["bf16"] = {{"enabled", true}}; break;
      case MixedPrecision::Fp16: ds["fp16"] = {{"enabled", true}}; break;
      case MixedPrecision::Fp8:
        note("mixed_precision",
             "fp8 has no ds_config equivalent in zero (fp32, fp16 or bf16); written without "
             "mixed precision: set bf16.enabled for the nearest");
        break;
    }
  }

  void settings_without_equivalent() {
    auto noted = [&](const auto& v, std::string_view key, std::string_view why) {
      if (v) note(fsdp_key(key), std::string(why));
    };
    noted(a.cpu_ram_efficient_loading, "fsdp_cpu_ram_efficient_loading",
          "no ds_config key: DeepSpeed's counterpart is zero.Init (Accelerate's zero3_init_flag), "
          "which transformers uses by itself at stage 3");
    noted(a.sync_module_states, "fsdp_sync_module_states",
          "no ds_config key: DeepSpeed has no such switch (Accelerate's FSDP-vs-DeepSpeed guide "
          "lists none)");
    noted(a.use_orig_params, "fsdp_use_orig_params",
          "no ds_config key: DeepSpeed trains the original parameters (transparent to the user, "
          "per Accelerate's guide)");
    constexpr std::string_view kNoWrapping =
        "no ds_config key: DeepSpeed needs no wrapping; stage 3 gathers each module's parameters "
        "as the module runs";
    noted(a.auto_wrap_policy, "fsdp_auto_wrap_policy", kNoWrapping);
    noted(a.transformer_layer_cls_to_wrap, "fsdp_transformer_layer_cls_to_wrap", kNoWrapping);
    noted(a.min_num_params, "fsdp_min_num_params", kNoWrapping);
    if (a.activation_checkpointing.value_or(false)) {
      note(fsdp_key("fsdp_activation_checkpointing"),
           "no ds_config key: the model must checkpoint itself (e.g. transformers' "
           "gradient_checkpointing_enable()); a ds_config's activation_checkpointing block only "
           "configures deepspeed.checkpointing for models that call it");
    }
    for (const std::string& key : a.other_fsdp_keys) {
      note(fsdp_key(key), "not an FSDP setting this converter knows, not converted" +
                              did_you_mean(key, fsdp_config_keys()));
    }
    // One line for all of them: they say how to launch, which no ds_config does.
    std::vector<std::string> launcher = a.other_keys;
    if (a.num_machines) launcher.push_back("num_machines");
    if (a.num_processes) launcher.push_back("num_processes");
    if (!launcher.empty()) {
      std::string keys;
      for (const std::string& k : launcher) keys += (keys.empty() ? "" : ", ") + k;
      note(keys, "settings of `accelerate launch`, not part of a ds_config");
    }
  }

  FromFsdp run() {
    sharding();
    zero["stage"] = stage;
    offload();
    prefetch();
    checkpointing();
    precision();
    settings_without_equivalent();
    ds["zero_optimization"] = zero;
    // Accelerate's guide: with DeepSpeed, leave these "auto" so Accelerate (or transformers'
    // Trainer) fills them from the training script.
    for (const char* key : {"train_batch_size", "train_micro_batch_size_per_gpu",
                            "gradient_accumulation_steps", "gradient_clipping"})
      ds[key] = "auto";
    return {std::move(ds), std::move(notes)};
  }
};

}  // namespace

FromFsdp ds_config_from_fsdp(const AccelerateFsdpConfig& accelerate) {
  return Builder{accelerate, {}, {}, {}, 3}.run();
}

}  // namespace zero::config::fsdp
