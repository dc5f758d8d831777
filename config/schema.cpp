#include "config/schema.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace zero::config {

namespace {

using nlohmann::json;
using VT = ValueType;

constexpr std::string_view kZero = "zero_optimization";
constexpr std::string_view kOffParam = "zero_optimization.offload_param";
constexpr std::string_view kOffOpt = "zero_optimization.offload_optimizer";
constexpr std::string_view kOptParams = "optimizer.params";
constexpr std::string_view kSchedParams = "scheduler.params";

// Where a value still differs between DeepSpeed releases, `older` records it (SPEC §0.1); zero
// always uses the 0.19.6 value. Deltas without a key of their own: loss-scale growth timing and
// the pre-0.17.1 dynamic-scaler defaults live in zero/schedule; aio.thread_count and the
// fp16-style keys in bf16 are in kDeprecated below.
std::vector<KeyRule> make_key_rules() {
  const std::vector<std::string_view> kCommDtypes = {"fp32", "fp16", "bf16"};
  const std::vector<std::string_view> kDevices = {"none", "cpu", "nvme"};
  const std::vector<std::string_view> kWarmupTypes = {"log", "linear"};
  const std::int64_t kMaxSize = std::numeric_limits<std::int64_t>::max();
  return {
      // Top level (SPEC §1.3).
      {.block = "", .name = "train_batch_size", .type = VT::Int, .nullable = true, .min = 1,
       .doc = "global batch = micro batch × accumulation × DP world size"},
      {.block = "", .name = "train_micro_batch_size_per_gpu", .type = VT::Int, .nullable = true, .min = 1},
      {.block = "", .name = "gradient_accumulation_steps", .type = VT::Int, .nullable = true, .min = 1},
      {.block = "", .name = "managed_gradient_accumulation", .type = VT::Bool, .default_value = true,
       .older = "absent before 0.19.3"},
      {.block = "", .name = "gradient_clipping", .type = VT::Float, .default_value = 1.0,
       .older = "0.0 (off) before 0.19.3"},
      {.block = "", .name = "prescale_gradients", .type = VT::Bool, .default_value = false},
      {.block = "", .name = "gradient_predivide_factor", .type = VT::Float, .default_value = 1.0},
      {.block = "", .name = "gradient_allreduce_op", .type = VT::Enum, .default_value = "mean",
       .choices = {"mean", "sum"}, .case_insensitive = true, .older = "absent before 0.19.6"},
      {.block = "", .name = "communication_data_type", .type = VT::Enum, .nullable = true,
       .choices = kCommDtypes, .case_insensitive = true,
       .doc = "null: fp16 if fp16 is enabled, bf16 if bf16 is, else fp32"},
      {.block = "", .name = "seq_parallel_communication_data_type", .type = VT::Enum, .default_value = "fp32",
       .choices = kCommDtypes, .case_insensitive = true},
      {.block = "", .name = "steps_per_print", .type = VT::Int, .nullable = true, .min = 1,
       .older = "10 before 0.15.2"},
      {.block = "", .name = "wall_clock_breakdown", .type = VT::Bool, .default_value = false},
      {.block = "", .name = "memory_breakdown", .type = VT::Bool, .default_value = false},
      {.block = "", .name = "dump_state", .type = VT::Bool, .default_value = false},
      {.block = "", .name = "sparse_gradients", .type = VT::Bool, .default_value = false},
      {.block = "", .name = "zero_allow_untested_optimizer", .type = VT::Bool, .default_value = false},
      {.block = "", .name = "zero_force_ds_cpu_optimizer", .type = VT::Bool, .default_value = true},
      {.block = "", .name = "vocabulary_size", .type = VT::Int, .nullable = true, .min = 1},
      {.block = "", .name = "dataloader_drop_last", .type = VT::Bool, .default_value = false},
      {.block = "", .name = "sequence_parallel_size", .type = VT::Int, .default_value = 1, .min = 1},
      {.block = "", .name = "log_level", .type = VT::String, .nullable = true},
      {.block = "", .name = "allgather_size", .type = VT::Int, .default_value = 500'000'000, .min = 0,
       .doc = "only read with the legacy form \"zero_optimization\": true"},

      // fp16 (SPEC §1.5; pydantic since 0.17.1).
      {.block = "fp16", .name = "enabled", .type = VT::Bool, .default_value = false},
      {.block = "fp16", .name = "auto_cast", .type = VT::Bool, .default_value = false},
      {.block = "fp16", .name = "loss_scale", .type = VT::Float, .default_value = 0.0, .min = 0,
       .doc = "0: dynamic loss scaling"},
      {.block = "fp16", .name = "initial_scale_power", .type = VT::Int, .default_value = 16,
       .older = "a minimal fp16 block gave ZeRO 2^32 before 0.17.1"},
      {.block = "fp16", .name = "loss_scale_window", .type = VT::Int, .default_value = 1000},
      {.block = "fp16", .name = "hysteresis", .type = VT::Int, .default_value = 2,
       .older = "a minimal fp16 block gave ZeRO 1 before 0.17.1"},
      {.block = "fp16", .name = "consecutive_hysteresis", .type = VT::Bool, .default_value = false},
      // DeepSpeed 0.19.6 types this int; real configs give 0.0 and 1e-7, which zero accepts as a
      // float floor with a warning (see the min_loss_scale check in ds_config.cpp).
      {.block = "fp16", .name = "min_loss_scale", .type = VT::Float, .default_value = 1, .min = 0,
       .older = "any number before 0.17.1"},
      {.block = "fp16", .name = "fp16_master_weights_and_grads", .type = VT::Bool, .default_value = false,
       .older = "ZeRO-2 only before ~0.18"},

      // bf16 (legacy block name "bfloat16", read only when "bf16" is absent).
      {.block = "bf16", .name = "enabled", .type = VT::Bool, .default_value = false},
      {.block = "bf16", .name = "immediate_grad_update", .type = VT::Bool, .default_value = false},
      {.block = "bf16", .name = "check_grad_overflow", .type = VT::Bool, .default_value = true,
       .older = "false 0.17.1-0.19.2, absent before"},
      {.block = "bf16", .name = "bf16_master_weights_and_grads", .type = VT::Bool, .default_value = false},
      {.block = "bf16", .name = "bf16_optimizer_states", .type = VT::Bool, .default_value = false},

      // zero_optimization (SPEC §1.6, every row).
      {.block = kZero, .name = "stage", .type = VT::Int, .default_value = 0, .min = 0, .max = 3},
      {.block = kZero, .name = "contiguous_gradients", .type = VT::Bool, .default_value = true},
      {.block = kZero, .name = "reduce_scatter", .type = VT::Bool, .default_value = true},
      {.block = kZero, .name = "reduce_bucket_size", .type = VT::Int, .default_value = 500'000'000, .min = 0},
      {.block = kZero, .name = "use_multi_rank_bucket_allreduce", .type = VT::Bool, .default_value = true},
      {.block = kZero, .name = "allgather_partitions", .type = VT::Bool, .default_value = true},
      {.block = kZero, .name = "allgather_bucket_size", .type = VT::Int, .default_value = 500'000'000, .min = 0},
      {.block = kZero, .name = "overlap_comm", .type = VT::Bool, .nullable = true,
       .doc = "null: true for stage 3, false otherwise"},
      {.block = kZero, .name = "load_from_fp32_weights", .type = VT::Bool, .default_value = true},
      {.block = kZero, .name = "elastic_checkpoint", .type = VT::Bool, .default_value = false},
      {.block = kZero, .name = "offload_param", .type = VT::Object, .nullable = true},
      {.block = kZero, .name = "offload_optimizer", .type = VT::Object, .nullable = true},
      {.block = kZero, .name = "zenflow", .type = VT::Object, .nullable = true},
      {.block = kZero, .name = "sub_group_size", .type = VT::Int, .default_value = 1'000'000'000, .min = 0},
      {.block = kZero, .name = "stage3_prefetch_bucket_size", .type = VT::Int, .default_value = 50'000'000,
       .alias = "prefetch_bucket_size", .min = 0},
      {.block = kZero, .name = "stage3_param_persistence_threshold", .type = VT::Int, .default_value = 100'000,
       .alias = "param_persistence_threshold", .min = 0},
      {.block = kZero, .name = "stage3_model_persistence_threshold", .type = VT::Int, .default_value = kMaxSize,
       .alias = "model_persistence_threshold", .min = 0},
      {.block = kZero, .name = "stage3_max_live_parameters", .type = VT::Int, .default_value = 1'000'000'000,
       .alias = "max_live_parameters", .min = 0},
      {.block = kZero, .name = "stage3_max_reuse_distance", .type = VT::Int, .default_value = 1'000'000'000,
       .alias = "max_reuse_distance", .min = 0},
      {.block = kZero, .name = "stage3_gather_16bit_weights_on_model_save", .type = VT::Bool,
       .default_value = false, .alias = "gather_16bit_weights_on_model_save"},
      {.block = kZero, .name = "stage3_module_granularity_threshold", .type = VT::Int, .default_value = 0,
       .alias = "module_granularity_threshold"},
      {.block = kZero, .name = "stage3_use_all_reduce_for_fetch_params", .type = VT::Bool,
       .default_value = false, .alias = "use_all_reduce_for_fetch_params"},
      {.block = kZero, .name = "stage3_allgather_sequential", .type = VT::Bool, .default_value = false,
       .alias = "allgather_sequential", .older = "absent before 0.18.5"},
      {.block = kZero, .name = "ignore_unused_parameters", .type = VT::Bool, .default_value = true},
      {.block = kZero, .name = "legacy_stage1", .type = VT::Bool, .default_value = false},
      {.block = kZero, .name = "round_robin_gradients", .type = VT::Bool, .default_value = false},
      {.block = kZero, .name = "zero_hpz_partition_size", .type = VT::Int, .default_value = 1, .min = 0},
      {.block = kZero, .name = "zero_quantized_weights", .type = VT::Bool, .default_value = false},
      {.block = kZero, .name = "zero_quantized_nontrainable_weights", .type = VT::Bool, .default_value = false},
      {.block = kZero, .name = "zero_quantized_gradients", .type = VT::Bool, .default_value = false},
      {.block = kZero, .name = "zeropp_loco_param", .type = VT::Any, .nullable = true},
      {.block = kZero, .name = "mics_shard_size", .type = VT::Int, .default_value = -1},
      {.block = kZero, .name = "mics_hierarchical_params_gather", .type = VT::Bool, .default_value = false},
      {.block = kZero, .name = "memory_efficient_linear", .type = VT::Bool, .default_value = true},
      {.block = kZero, .name = "pipeline_loading_checkpoint", .type = VT::Bool, .default_value = false},
      {.block = kZero, .name = "override_module_apply", .type = VT::Bool, .default_value = true},
      {.block = kZero, .name = "log_trace_cache_warnings", .type = VT::Bool, .default_value = false},
      {.block = kZero, .name = "enable_sanity_checks", .type = VT::Bool, .default_value = false},
      {.block = kZero, .name = "save_muon_momentum_buffer_in_memory", .type = VT::Bool, .default_value = false},
      {.block = kZero, .name = "leaf_module", .type = VT::Any, .nullable = true},

      // zero_optimization.offload_param (SPEC §1.6.1).
      {.block = kOffParam, .name = "device", .type = VT::Enum, .default_value = "none", .choices = kDevices},
      {.block = kOffParam, .name = "nvme_path", .type = VT::String, .nullable = true},
      {.block = kOffParam, .name = "buffer_count", .type = VT::Int, .default_value = 5, .min = 0},
      {.block = kOffParam, .name = "buffer_size", .type = VT::Int, .default_value = 100'000'000, .min = 0},
      {.block = kOffParam, .name = "max_in_cpu", .type = VT::Int, .default_value = 1'000'000'000, .min = 0},
      {.block = kOffParam, .name = "pin_memory", .type = VT::Bool, .default_value = true,
       .older = "false before 0.19.5"},

      // zero_optimization.offload_optimizer (SPEC §1.6.2).
      {.block = kOffOpt, .name = "device", .type = VT::Enum, .default_value = "none", .choices = kDevices},
      {.block = kOffOpt, .name = "nvme_path", .type = VT::String, .nullable = true},
      {.block = kOffOpt, .name = "buffer_count", .type = VT::Int, .default_value = 4, .min = 0},
      {.block = kOffOpt, .name = "pin_memory", .type = VT::Bool, .default_value = true,
       .older = "false before 0.19.5"},
      {.block = kOffOpt, .name = "pipeline_read", .type = VT::Bool, .default_value = false},
      {.block = kOffOpt, .name = "pipeline_write", .type = VT::Bool, .default_value = false},
      {.block = kOffOpt, .name = "fast_init", .type = VT::Bool, .default_value = false},
      {.block = kOffOpt, .name = "ratio", .type = VT::Float, .default_value = 1.0, .min = 0, .max = 1},
      {.block = kOffOpt, .name = "super_offload", .type = VT::Bool, .default_value = false},
      {.block = kOffOpt, .name = "cpuadam_cores_perc", .type = VT::Float, .default_value = 0.8, .min = 0, .max = 1},

      // optimizer (SPEC §1.7).
      {.block = "optimizer", .name = "type", .type = VT::String, .required = true},
      {.block = "optimizer", .name = "params", .type = VT::Object, .default_value = json::object()},
      {.block = "optimizer", .name = "legacy_fusion", .type = VT::Bool, .default_value = false},
      {.block = kOptParams, .variant = "adam", .name = "lr", .type = VT::Float, .default_value = 1e-3, .min = 0},
      {.block = kOptParams, .variant = "adam", .name = "betas", .type = VT::Betas, .default_value = {0.9, 0.999}},
      {.block = kOptParams, .variant = "adam", .name = "eps", .type = VT::Float, .default_value = 1e-8, .min = 0},
      {.block = kOptParams, .variant = "adam", .name = "weight_decay", .type = VT::Float, .default_value = 0.0},
      {.block = kOptParams, .variant = "adam", .name = "bias_correction", .type = VT::Bool, .default_value = true},
      {.block = kOptParams, .variant = "adam", .name = "amsgrad", .type = VT::Bool, .default_value = false},
      {.block = kOptParams, .variant = "adam", .name = "adam_w_mode", .type = VT::Bool, .default_value = true,
       .doc = "effective decoupled decay = type adamw OR adam_w_mode"},
      {.block = kOptParams, .variant = "adam", .name = "torch_adam", .type = VT::Bool, .default_value = false},
      {.block = kOptParams, .variant = "adam", .name = "fp32_optimizer_states", .type = VT::Bool, .default_value = true},
      {.block = kOptParams, .variant = "adagrad", .name = "lr", .type = VT::Float, .default_value = 1e-2, .min = 0},
      {.block = kOptParams, .variant = "adagrad", .name = "eps", .type = VT::Float, .default_value = 1e-10, .min = 0},
      {.block = kOptParams, .variant = "adagrad", .name = "weight_decay", .type = VT::Float, .default_value = 0.0},
      {.block = kOptParams, .variant = "lion", .name = "lr", .type = VT::Float, .default_value = 1e-3, .min = 0},
      {.block = kOptParams, .variant = "lion", .name = "betas", .type = VT::Betas, .default_value = {0.9, 0.999}},
      {.block = kOptParams, .variant = "lion", .name = "weight_decay", .type = VT::Float, .default_value = 0.0},
      {.block = kOptParams, .variant = "sgd", .name = "lr", .type = VT::Float, .default_value = 1e-3, .min = 0},
      {.block = kOptParams, .variant = "sgd", .name = "momentum", .type = VT::Float, .default_value = 0.0, .min = 0},
      {.block = kOptParams, .variant = "sgd", .name = "dampening", .type = VT::Float, .default_value = 0.0},
      {.block = kOptParams, .variant = "sgd", .name = "weight_decay", .type = VT::Float, .default_value = 0.0},
      {.block = kOptParams, .variant = "sgd", .name = "nesterov", .type = VT::Bool, .default_value = false},
      {.block = kOptParams, .variant = "sgd", .name = "maximize", .type = VT::Bool, .default_value = false},

      // scheduler (SPEC §1.8); lr values may be one per param group.
      {.block = "scheduler", .name = "type", .type = VT::String, .required = true},
      {.block = "scheduler", .name = "params", .type = VT::Object, .default_value = json::object()},
      {.block = kSchedParams, .variant = "WarmupLR", .name = "warmup_min_lr", .type = VT::FloatOrList, .default_value = 0.0},
      {.block = kSchedParams, .variant = "WarmupLR", .name = "warmup_max_lr", .type = VT::FloatOrList,
       .nullable = true, .older = "0.001 before; now null = the optimizer's lr",
       .doc = "null: the optimizer's lr"},
      {.block = kSchedParams, .variant = "WarmupLR", .name = "warmup_num_steps", .type = VT::Int,
       .default_value = 1000, .min = 0},
      {.block = kSchedParams, .variant = "WarmupLR", .name = "warmup_type", .type = VT::String, .default_value = "log"},
      {.block = kSchedParams, .variant = "WarmupLR", .name = "last_batch_iteration", .type = VT::Int, .default_value = -1},
      {.block = kSchedParams, .variant = "WarmupDecayLR", .name = "total_num_steps", .type = VT::Int,
       .min = 0, .required = true},
      {.block = kSchedParams, .variant = "WarmupDecayLR", .name = "warmup_min_lr", .type = VT::FloatOrList, .default_value = 0.0},
      {.block = kSchedParams, .variant = "WarmupDecayLR", .name = "warmup_max_lr", .type = VT::FloatOrList, .default_value = 0.001},
      {.block = kSchedParams, .variant = "WarmupDecayLR", .name = "warmup_num_steps", .type = VT::Int,
       .default_value = 1000, .min = 0},
      {.block = kSchedParams, .variant = "WarmupDecayLR", .name = "warmup_type", .type = VT::String, .default_value = "log"},
      {.block = kSchedParams, .variant = "WarmupDecayLR", .name = "last_batch_iteration", .type = VT::Int, .default_value = -1},
      {.block = kSchedParams, .variant = "WarmupCosineLR", .name = "total_num_steps", .type = VT::Int,
       .min = 0, .required = true},
      {.block = kSchedParams, .variant = "WarmupCosineLR", .name = "warmup_min_ratio", .type = VT::Float, .default_value = 0.0},
      {.block = kSchedParams, .variant = "WarmupCosineLR", .name = "warmup_num_steps", .type = VT::Int,
       .default_value = 1000, .min = 0},
      {.block = kSchedParams, .variant = "WarmupCosineLR", .name = "cos_min_ratio", .type = VT::Float, .default_value = 1e-4},
      {.block = kSchedParams, .variant = "WarmupCosineLR", .name = "warmup_type", .type = VT::String, .default_value = "log"},
      {.block = kSchedParams, .variant = "WarmupCosineLR", .name = "last_batch_iteration", .type = VT::Int, .default_value = -1},
      {.block = kSchedParams, .variant = "OneCycle", .name = "cycle_min_lr", .type = VT::FloatOrList, .required = true},
      {.block = kSchedParams, .variant = "OneCycle", .name = "cycle_max_lr", .type = VT::FloatOrList, .required = true},
      {.block = kSchedParams, .variant = "OneCycle", .name = "decay_lr_rate", .type = VT::Float, .default_value = 0.0},
      {.block = kSchedParams, .variant = "OneCycle", .name = "cycle_first_step_size", .type = VT::Float,
       .default_value = 2000, .min = 1},
      {.block = kSchedParams, .variant = "OneCycle", .name = "cycle_second_step_size", .type = VT::Float,
       .nullable = true, .min = 1, .doc = "null: cycle_first_step_size"},
      {.block = kSchedParams, .variant = "OneCycle", .name = "cycle_first_stair_count", .type = VT::Int, .default_value = 0},
      {.block = kSchedParams, .variant = "OneCycle", .name = "cycle_second_stair_count", .type = VT::Int,
       .nullable = true, .doc = "null: cycle_first_stair_count"},
      {.block = kSchedParams, .variant = "OneCycle", .name = "decay_step_size", .type = VT::Float, .default_value = 0.0},
      {.block = kSchedParams, .variant = "OneCycle", .name = "cycle_momentum", .type = VT::Bool, .default_value = true},
      {.block = kSchedParams, .variant = "OneCycle", .name = "cycle_min_mom", .type = VT::FloatOrList, .default_value = 0.8},
      {.block = kSchedParams, .variant = "OneCycle", .name = "cycle_max_mom", .type = VT::FloatOrList, .default_value = 0.9},
      {.block = kSchedParams, .variant = "OneCycle", .name = "decay_mom_rate", .type = VT::Float, .default_value = 0.0},
      {.block = kSchedParams, .variant = "OneCycle", .name = "last_batch_iteration", .type = VT::Int, .default_value = -1},
      {.block = kSchedParams, .variant = "LRRangeTest", .name = "lr_range_test_min_lr", .type = VT::FloatOrList,
       .default_value = 1e-3},
      {.block = kSchedParams, .variant = "LRRangeTest", .name = "lr_range_test_step_size", .type = VT::Float,
       .default_value = 2000, .min = 1},
      {.block = kSchedParams, .variant = "LRRangeTest", .name = "lr_range_test_step_rate", .type = VT::Float, .default_value = 1.0},
      {.block = kSchedParams, .variant = "LRRangeTest", .name = "lr_range_test_staircase", .type = VT::Bool, .default_value = false},
      {.block = kSchedParams, .variant = "LRRangeTest", .name = "last_batch_iteration", .type = VT::Int, .default_value = -1},

      // aio (SPEC §1.9).
      {.block = "aio", .name = "block_size", .type = VT::Int, .default_value = 1'048'576, .min = 1},
      {.block = "aio", .name = "queue_depth", .type = VT::Int, .default_value = 8, .min = 1},
      {.block = "aio", .name = "intra_op_parallelism", .type = VT::Int, .default_value = 1, .min = 1,
       .older = "called thread_count before 0.16.4"},
      {.block = "aio", .name = "single_submit", .type = VT::Bool, .default_value = false},
      {.block = "aio", .name = "overlap_events", .type = VT::Bool, .default_value = true},
      {.block = "aio", .name = "use_gds", .type = VT::Bool, .default_value = false},

      // checkpoint, data_types (SPEC §1.10).
      {.block = "checkpoint", .name = "tag_validation", .type = VT::Enum, .default_value = "Warn",
       .choices = {"Warn", "Ignore", "Fail"}, .case_insensitive = true},
      {.block = "checkpoint", .name = "load_universal", .type = VT::Bool, .default_value = false},
      {.block = "checkpoint", .name = "use_node_local_storage", .type = VT::Bool, .default_value = false},
      {.block = "checkpoint", .name = "parallel_write", .type = VT::Any, .nullable = true},
      {.block = "checkpoint", .name = "checkpoint_serialization", .type = VT::Bool, .default_value = true},
      {.block = "checkpoint", .name = "writer", .type = VT::Any, .nullable = true},
      {.block = "data_types", .name = "grad_accum_dtype", .type = VT::Dtype, .nullable = true,
       .doc = "null: the model dtype"},
      {.block = "data_types", .name = "param_dtype", .type = VT::Dtype, .nullable = true},
      {.block = "data_types", .name = "buffer_dtype", .type = VT::Dtype, .nullable = true},

      // torch_autocast: read so an enabled autocast is reported, never silently dropped.
      {.block = "torch_autocast", .name = "enabled", .type = VT::Bool, .default_value = false},
      {.block = "torch_autocast", .name = "dtype", .type = VT::String, .nullable = true},
      {.block = "torch_autocast", .name = "lower_precision_safe_modules", .type = VT::Any, .nullable = true},
  };
}

const std::vector<BlockRule> kBlocks = {
    {"", BlockPolicy::Dict},
    {"fp16", BlockPolicy::Pydantic},
    {"bf16", BlockPolicy::Pydantic},
    {"zero_optimization", BlockPolicy::Pydantic},
    {"zero_optimization.offload_param", BlockPolicy::Pydantic},
    {"zero_optimization.offload_optimizer", BlockPolicy::Pydantic},
    {"optimizer", BlockPolicy::Dict},
    {"optimizer.params", BlockPolicy::Kwargs},
    {"scheduler", BlockPolicy::Dict},
    {"scheduler.params", BlockPolicy::Kwargs},
    {"aio", BlockPolicy::Dict},
    {"checkpoint", BlockPolicy::Dict},
    {"data_types", BlockPolicy::Dict},
    {"torch_autocast", BlockPolicy::Pydantic},
};

const std::vector<DeprecatedRule> kDeprecated = {
    {"zero_optimization", "cpu_offload", ValueType::Bool, "offload_optimizer", DeprecationKind::OffloadToCpu,
     "deprecated: use offload_optimizer {\"device\": \"cpu\"}"},
    {"zero_optimization", "cpu_offload_param", ValueType::Bool, "offload_param", DeprecationKind::OffloadToCpu,
     "deprecated: use offload_param {\"device\": \"cpu\"}"},
    {"zero_optimization", "cpu_offload_use_pin_memory", ValueType::Bool, "", DeprecationKind::Ignored,
     "deprecated and ignored (as DeepSpeed does): use offload_param/offload_optimizer pin_memory"},
    {"zero_optimization", "stage3_gather_fp16_weights_on_model_save", ValueType::Bool,
     "stage3_gather_16bit_weights_on_model_save", DeprecationKind::Rename,
     "deprecated: use stage3_gather_16bit_weights_on_model_save"},
    {"aio", "thread_count", ValueType::Int, "", DeprecationKind::Ignored,
     "renamed intra_op_parallelism in DeepSpeed 0.16.4, which ignores thread_count: value ignored, "
     "set intra_op_parallelism"},
    {"", "seq_parallel_comm_data_type", ValueType::Any, "", DeprecationKind::Ignored,
     "older spelling that DeepSpeed 0.19.6 ignores: use seq_parallel_communication_data_type"},
    // DeepSpeed <= 0.17.0 read bf16 with dict.get and ignored these; 0.17.1+ refuses them. They
    // are meaningless for bf16 (no loss scaling), so zero ignores them with a warning instead of
    // refusing configs that DeepSpeed's own tests still carry.
    {"bf16", "loss_scale", ValueType::Any, "", DeprecationKind::Ignored,
     "ignored: bf16 uses no loss scaling (DeepSpeed >= 0.17.1 refuses this key in bf16)"},
    {"bf16", "initial_scale_power", ValueType::Any, "", DeprecationKind::Ignored,
     "ignored: bf16 uses no loss scaling (DeepSpeed >= 0.17.1 refuses this key in bf16)"},
    {"bf16", "loss_scale_window", ValueType::Any, "", DeprecationKind::Ignored,
     "ignored: bf16 uses no loss scaling (DeepSpeed >= 0.17.1 refuses this key in bf16)"},
    {"bf16", "hysteresis", ValueType::Any, "", DeprecationKind::Ignored,
     "ignored: bf16 uses no loss scaling (DeepSpeed >= 0.17.1 refuses this key in bf16)"},
    {"bf16", "consecutive_hysteresis", ValueType::Any, "", DeprecationKind::Ignored,
     "ignored: bf16 uses no loss scaling (DeepSpeed >= 0.17.1 refuses this key in bf16)"},
    {"bf16", "min_loss_scale", ValueType::Any, "", DeprecationKind::Ignored,
     "ignored: bf16 uses no loss scaling (DeepSpeed >= 0.17.1 refuses this key in bf16)"},
};

bool is_true(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool not_null(const json& v) { return !v.is_null(); }
bool above_one(const json& v) { return v.is_number() && v.get<double>() > 1; }
bool above_zero(const json& v) { return v.is_number() && v.get<double>() > 0; }
bool below_one(const json& v) { return v.is_number() && v.get<double>() < 1; }
bool is_false(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool is_nvme(const json& v) { return v.is_string() && v.get<std::string>() == "nvme"; }
bool stage_3(const json& root) {
  const auto z = root.find("zero_optimization");
  if (z == root.end() || !z->is_object()) return false;
  const auto s = z->find("stage");
  return s != z->end() && s->is_number() && s->get<double>() == 3;
}

bool unsupported_optimizer(const json& type) {
  return type.is_string() && optimizer_variant(type.get<std::string>()).empty();
}
bool unsupported_scheduler(const json& type) {
  if (!type.is_string()) return false;
  const auto names = deepspeed_scheduler_names();
  return std::find(names.begin(), names.end(), type.get<std::string>()) == names.end();
}

// The one list of what zero accepts but does not honour yet. Engine::create refuses these;
// `zero-config check` reports them ("not supported yet") and fails only with --strict.
const std::vector<UnsupportedRule> kUnsupported = {
    {"optimizer.type", unsupported_optimizer,
     "this optimizer (zero implements Adam, AdamW, Adagrad, Lion and SGD)"},
    {"optimizer.params.amsgrad", is_true, "AMSGrad"},
    {"optimizer.params.dampening", above_zero, "SGD dampening"},
    {"optimizer.params.maximize", is_true, "SGD maximize"},
    {"scheduler.type", unsupported_scheduler,
     "torch.optim.lr_scheduler schedules (zero implements WarmupLR, WarmupDecayLR, WarmupCosineLR, "
     "OneCycle and LRRangeTest)"},
    {"sparse_gradients", is_true, "sparse embedding gradients"},
    {"managed_gradient_accumulation", is_false, "unmanaged gradient accumulation"},
    {"sequence_parallel_size", above_one, "sequence parallelism"},
    {"fp16.fp16_master_weights_and_grads", is_true, "fp16 master weights and gradients"},
    {"zero_optimization.zero_quantized_weights", is_true, "ZeRO++ quantized weights (qwZ)"},
    {"zero_optimization.zero_quantized_nontrainable_weights", is_true, "ZeRO++ quantized frozen weights"},
    {"zero_optimization.zero_quantized_gradients", is_true, "ZeRO++ quantized gradients (qgZ)"},
    {"zero_optimization.zeropp_loco_param", not_null, "ZeRO++ LoCo error feedback"},
    {"zero_optimization.zero_hpz_partition_size", above_one, "ZeRO++ hierarchical partitions (hpZ)"},
    {"zero_optimization.mics_shard_size", above_zero, "MiCS sharding"},
    {"zero_optimization.mics_hierarchical_params_gather", is_true, "MiCS hierarchical gather"},
    {"zero_optimization.zenflow", not_null, "ZenFlow"},
    {"zero_optimization.stage3_module_granularity_threshold", above_zero,
     "module-granularity leaf fetch units (the embedding defines units instead)"},
    {"zero_optimization.stage3_use_all_reduce_for_fetch_params", is_true, "fetching parameters by all-reduce"},
    {"zero_optimization.stage3_allgather_sequential", is_true, "sequential per-parameter all-gathers"},
    {"zero_optimization.round_robin_gradients", is_true, "round-robin gradient partitioning"},
    {"zero_optimization.pipeline_loading_checkpoint", is_true, "serial checkpoint loading"},
    {"zero_optimization.offload_optimizer.super_offload", is_true, "SuperOffload"},
    {"zero_optimization.offload_optimizer.ratio", below_one, "partial optimizer offload (ratio < 1)"},
    {"zero_optimization.offload_optimizer.fast_init", is_true, "NVMe fast init"},
    {"zero_optimization.offload_optimizer.device", is_nvme,
     "NVMe optimizer-state offload at stage 3 (\"cpu\" works; stages 1 and 2 treat \"nvme\" as \"cpu\")",
     stage_3},
    {"zero_optimization.offload_param.device", is_nvme, "NVMe parameter offload (\"cpu\" works)",
     stage_3},
    {"torch_autocast.enabled", is_true, "torch.autocast mixed precision"},
    {"amp.enabled", is_true, "Apex AMP"},
    {"elasticity.enabled", is_true, "elastic training"},
    {"aio.use_gds", is_true, "GPUDirect Storage"},
    {"checkpoint.load_universal", is_true, "loading universal checkpoints"},
    {"checkpoint.writer", not_null, "DeepSpeed's checkpoint writers (zero writes its own format)"},
};

const std::vector<SubsystemBlock> kSubsystems = {
    {"activation_checkpointing", "activation checkpointing"},
    {"flops_profiler", "FLOPs profiler"},
    {"comms_logger", "communication logger"},
    {"monitor_config", "monitors"},
    {"tensorboard", "TensorBoard monitor"},
    {"wandb", "Weights & Biases monitor"},
    {"csv_monitor", "CSV monitor"},
    {"comet", "Comet monitor"},
    {"autotuning", "autotuning"},
    {"compression_training", "compression training"},
    {"quantize_training", "quantization-aware training"},
    {"data_efficiency", "data efficiency"},
    {"curriculum_learning", "curriculum learning"},
    {"progressive_layer_drop", "progressive layer drop"},
    {"eigenvalue", "eigenvalue computation"},
    {"pipeline", "pipeline parallelism"},
    {"sparse_attention", "sparse attention"},
    {"hybrid_engine", "hybrid engine"},
    {"tensor_parallel", "tensor parallelism"},
    {"expert_parallel", "expert parallelism"},
    {"compile", "torch.compile / DeepCompile"},
    {"nebula", "Nebula checkpointing"},
    {"datastates", "DataStates checkpointing"},
    {"timers", "timers"},
    {"weight_quantization", "weight quantization"},
    {"use_data_before_expert_parallelism", "expert parallelism"},
    {"dynamic_train", "random-LTD data routing"},
    {"amp", "Apex AMP"},
    {"elasticity", "elastic training"},
};

const std::vector<std::string_view> kOptimizerNames = {
    "adam", "adamw", "lamb", "onebitadam", "zerooneadam", "onebitlamb",
    "adagrad", "lion", "muadam", "muadamw", "musgd", "muon"};
const std::vector<std::string_view> kSchedulerNames = {
    "LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};

}  // namespace

std::span<const BlockRule> block_rules() { return kBlocks; }

std::span<const KeyRule> key_rules() {
  static const std::vector<KeyRule> rules = make_key_rules();
  return rules;
}

std::span<const DeprecatedRule> deprecated_rules() { return kDeprecated; }
std::span<const UnsupportedRule> unsupported_rules() { return kUnsupported; }
std::span<const SubsystemBlock> subsystem_blocks() { return kSubsystems; }

const BlockRule* find_block(std::string_view path) {
  for (const BlockRule& b : kBlocks) {
    if (b.path == path) return &b;
  }
  return nullptr;
}

std::vector<const KeyRule*> rules_of(std::string_view block, std::string_view variant) {
  std::vector<const KeyRule*> out;
  for (const KeyRule& r : key_rules()) {
    if (r.block == block && (r.variant.empty() || r.variant == variant)) out.push_back(&r);
  }
  return out;
}

std::span<const std::string_view> deepspeed_optimizer_names() { return kOptimizerNames; }
std::span<const std::string_view> deepspeed_scheduler_names() { return kSchedulerNames; }

std::string_view optimizer_variant(std::string_view resolved_type) {
  if (resolved_type == "adam" || resolved_type == "adamw") return "adam";
  if (resolved_type == "adagrad") return "adagrad";
  if (resolved_type == "lion") return "lion";
  if (resolved_type == "SGD") return "sgd";
  return {};
}

}  // namespace zero::config
