// An Hugging Face Accelerate config of the FSDP kind: the YAML `accelerate config` writes and
// `accelerate launch --config_file` reads (distributed_type: FSDP, settings under fsdp_config),
// as far as the FSDP <-> ds_config converter (config/fsdp/convert.h) reads and writes it.
//
// Names and values follow Accelerate's FSDP plugin: FSDP1 keys (fsdp_version 1, the default when
// absent) and FSDP2 keys (fsdp_version 2: fsdp_reshard_after_forward replaces the sharding
// strategy). The YAML library stays inside the .cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zero::config::fsdp {

// fsdp_sharding_strategy; older Accelerate writes the numbers 1-5 in this order.
enum class ShardingStrategy { FullShard, ShardGradOp, NoShard, HybridShard, HybridShardZero2 };
enum class BackwardPrefetch { BackwardPre, BackwardPost, NoPrefetch };
enum class StateDictType { FullStateDict, LocalStateDict, ShardedStateDict };
enum class AutoWrapPolicy { TransformerBasedWrap, SizeBasedWrap, NoWrap };
// The top-level mixed_precision of an Accelerate config.
enum class MixedPrecision { No, Fp16, Bf16, Fp8 };

// The spelling Accelerate writes: "FULL_SHARD", "BACKWARD_PRE", "SHARDED_STATE_DICT",
// "TRANSFORMER_BASED_WRAP", "bf16", ...
std::string_view name_of(ShardingStrategy v);
std::string_view name_of(BackwardPrefetch v);
std::string_view name_of(StateDictType v);
std::string_view name_of(AutoWrapPolicy v);
std::string_view name_of(MixedPrecision v);

// The fsdp_config keys the reader knows, for suggestions.
std::span<const std::string_view> fsdp_config_keys();

// Every field is nullopt when its key is absent: Accelerate's plugin default applies then.
struct AccelerateFsdpConfig {
  int fsdp_version = 1;  // fsdp_config.fsdp_version: 1 (default when absent) or 2

  std::optional<ShardingStrategy> sharding_strategy;  // fsdp_sharding_strategy (FSDP1)
  // fsdp_reshard_after_forward (FSDP2). Recent `accelerate config` writes an FSDP1 strategy
  // under that key too ("fsdp_reshard_after_forward: FULL_SHARD"): read as sharding_strategy.
  std::optional<bool> reshard_after_forward;
  std::optional<bool> offload_params;  // fsdp_offload_params
  // fsdp_backward_prefetch (older Accelerate: fsdp_backward_prefetch_policy); FSDP1 only.
  std::optional<BackwardPrefetch> backward_prefetch;
  std::optional<bool> forward_prefetch;                      // fsdp_forward_prefetch
  std::optional<StateDictType> state_dict_type;              // fsdp_state_dict_type
  std::optional<bool> cpu_ram_efficient_loading;             // fsdp_cpu_ram_efficient_loading
  std::optional<bool> sync_module_states;                    // fsdp_sync_module_states
  std::optional<bool> use_orig_params;                       // fsdp_use_orig_params
  std::optional<AutoWrapPolicy> auto_wrap_policy;            // fsdp_auto_wrap_policy
  std::optional<std::string> transformer_layer_cls_to_wrap;  // comma-separated class names
  std::optional<std::int64_t> min_num_params;    // fsdp_min_num_params (SIZE_BASED_WRAP)
  std::optional<bool> activation_checkpointing;  // fsdp_activation_checkpointing
  std::vector<std::string> other_fsdp_keys;      // fsdp_config keys not above, in file order

  std::optional<MixedPrecision> mixed_precision;  // top level
  std::optional<std::int64_t> num_processes;      // top level: ranks in all
  std::optional<std::int64_t> num_machines;       // top level: nodes
  std::vector<std::string> other_keys;            // other top-level keys (launcher settings)
};

// Reads an Accelerate config from YAML text. Throws zero::ConfigError listing every problem: a
// YAML syntax error (one problem, "line L, column C: ..."), a document that is not an Accelerate
// FSDP config (distributed_type other than FSDP, no fsdp_config mapping), and each value of a
// known key that Accelerate would refuse (path "fsdp_config.<key>" or the top-level key; the
// message names the value, what is accepted and the nearest valid value). Enum values are read
// case-insensitively, as Accelerate upper-cases them.
AccelerateFsdpConfig parse_accelerate_config(std::string_view yaml_text);

// The config as YAML that Accelerate reads: compute_environment LOCAL_MACHINE, distributed_type
// FSDP, the set fields, keys sorted as `accelerate config` writes them. other_keys and
// other_fsdp_keys carry no values and are not written.
std::string write_accelerate_config(const AccelerateFsdpConfig& c);

}  // namespace zero::config::fsdp
