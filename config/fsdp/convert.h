// Converting between an Accelerate FSDP config (config/fsdp/accelerate_config.h) and a ds_config,
// following Accelerate's own mapping: its "FSDP vs DeepSpeed" concept guide and its FSDP guide's
// "Mapping between FSDP sharding strategies and DeepSpeed ZeRO stages".
//
//   FULL_SHARD, or fsdp_reshard_after_forward: true  <-> zero_optimization.stage 3
//   SHARD_GRAD_OP, or fsdp_reshard_after_forward: false <-> stage 2
//   NO_SHARD                                          <-> stage 0
//   HYBRID_SHARD                    <-> stage 3, zero_hpz_partition_size = GPUs per node (ZeRO++)
//   fsdp_offload_params: true       <-> offload_param and offload_optimizer on "cpu" (stage 3;
//                                       stages 1-2 offload the optimizer only)
//   fsdp_backward_prefetch NO_PREFETCH <-> stage3_prefetch_bucket_size 0; BACKWARD_PRE <->
//                                       DeepSpeed's default bucket
//   fsdp_state_dict_type FULL_STATE_DICT <-> stage3_gather_16bit_weights_on_model_save: true;
//                        SHARDED_STATE_DICT <-> false
//   mixed_precision bf16 / fp16     <-> bf16 / fp16 enabled, fp32 master weights (Accelerate's
//                                       FSDP upcasts the flat parameters to fp32 under mixed
//                                       precision, as DeepSpeed keeps fp32 masters)
//
// Every setting without an equivalent comes back as a Note naming its key and why; nothing is
// dropped silently. Where a mapping exists, converting one way and back gives the same setting.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/ds_config.h"
#include "config/fsdp/accelerate_config.h"

namespace zero::config::fsdp {

// A setting that did not carry over, or a value the converter chose. `key` is the setting's path
// in the input ("fsdp_config.fsdp_forward_prefetch", "zero_optimization.sub_group_size") or, for
// a value chosen for the output, its path there.
struct Note {
  std::string key;
  std::string message;
};

struct FromFsdp {
  nlohmann::json ds_config;
  std::vector<Note> notes;
};

// The ds_config for an Accelerate FSDP config. It has no optimizer block (the training script's
// optimizer is used) and leaves the batch sizes and gradient_clipping "auto" for Accelerate to
// fill from the training script, as Accelerate's guide advises; load_config_json accepts it.
FromFsdp ds_config_from_fsdp(const AccelerateFsdpConfig& accelerate);

struct ToFsdp {
  AccelerateFsdpConfig accelerate;
  std::vector<Note> notes;
};

// The Accelerate FSDP config for a loaded ds_config, written with FSDP1 keys (fsdp_version 1,
// every sharding strategy) or FSDP2 keys (fsdp_version 2, which has no NO_SHARD and no
// HYBRID_SHARD key: the nearest setting is written and a note says so).
// REQUIRES: fsdp_version is 1 or 2.
ToFsdp fsdp_from_ds_config(const DsConfig& ds, int fsdp_version);

}  // namespace zero::config::fsdp
