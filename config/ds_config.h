// A DeepSpeed ds_config.json as the zero runtime sees it: parsed, validated, defaults filled,
// aliases and deprecated keys mapped, "auto" resolved, the batch-size triad checked.
//
// Behaviour follows DeepSpeed 0.19.6 (SPEC_DEEPSPEED.md §1); where older releases differed the
// key table in config/schema.cpp says so. Every value of the result carries its provenance.
//
// Four kinds of finding besides errors, all kept on the result (never only logged):
//   note        other-subsystem block accepted, "auto" replaced by DeepSpeed's default, a value
//               still to be supplied by the embedding, ...
//   warning     unknown top-level key (DeepSpeed ignores it), deprecated key mapped, ...
//   unsupported a key or value DeepSpeed honours that zero does not honour yet
//   engine_error valid for DeepSpeed's config parser, but DeepSpeed refuses it when it builds the
//               engine (deepspeed.initialize), e.g. optimizer.params.max_grad_norm
// Engine::create refuses a config with any unsupported or engine_error finding, or with values
// still to be supplied (`blockers()`); `zero-config check` reports them without failing.
//
// Thread safety: loading is reentrant; a DsConfig is an immutable value once returned.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zero/base/dtype.h"

namespace zero::config {

// Values the embedding provides: the data-parallel world size and values for keys the config
// leaves to it ("auto", or missing batch sizes). `values` maps a dotted key path
// ("optimizer.params.lr", "train_micro_batch_size_per_gpu") to a JSON value. A supplied value
// fills a key that is missing or "auto"; one that contradicts a concrete value in the config is
// an error (the embedding and the config disagree).
struct Supplied {
  std::optional<std::int64_t> world_size;
  std::map<std::string, nlohmann::json> values;
};

enum class Severity { Note, Warning, Unsupported, EngineError };
std::string_view severity_name(Severity s);  // "note", "warning", "unsupported", "engine_error"

struct Finding {
  Severity severity;
  std::string path;  // dotted key path; empty for the document as a whole
  std::string message;
};

// Where a resolved value came from.
enum class Source {
  Config,                // written in the config under its current name
  Default,               // absent: DeepSpeed's default
  DeepSpeedAutoDefault,  // "auto" inside a block DeepSpeed validates: DeepSpeed drops it → default
  Supplied,              // from Supplied::values / world_size
  AliasOf,               // written under the other accepted spelling (detail: that spelling)
  DeprecatedMapped,      // written under a deprecated key (detail: that key)
  Derived,               // computed from other values (detail: how)
};
std::string_view source_name(Source s);  // "config", "default", "deepspeed-auto-default", ...

struct Provenance {
  Source source = Source::Default;
  std::string detail;
};

enum class OffloadDevice { None, Cpu, Nvme };

struct OffloadParam {
  OffloadDevice device = OffloadDevice::None;
  std::string nvme_path;  // empty when not given
  std::int64_t buffer_count = 5;
  std::int64_t buffer_size_elems = 100'000'000;
  std::int64_t max_in_cpu_elems = 1'000'000'000;
  bool pin_memory = true;
};

struct OffloadOptimizer {
  OffloadDevice device = OffloadDevice::None;
  std::string nvme_path;
  std::int64_t buffer_count = 4;
  bool pin_memory = true;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  double ratio = 1.0;
  bool super_offload = false;
  double cpuadam_cores_perc = 0.8;
};

struct ZeroOptimization {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  std::int64_t reduce_bucket_elems = 500'000'000;
  bool use_multi_rank_bucket_allreduce = true;
  bool allgather_partitions = true;
  std::int64_t allgather_bucket_elems = 500'000'000;
  bool overlap_comm = false;  // resolved: config value, else stage == 3
  bool load_from_fp32_weights = true;
  bool elastic_checkpoint = false;
  std::optional<OffloadParam> offload_param;          // present when the block was given
  std::optional<OffloadOptimizer> offload_optimizer;  // (device may still be None)
  std::int64_t sub_group_elems = 1'000'000'000;
  std::int64_t prefetch_bucket_elems = 50'000'000;
  std::int64_t param_persistence_threshold_elems = 100'000;
  std::int64_t model_persistence_threshold_elems = INT64_MAX;
  std::int64_t max_live_parameters_elems = 1'000'000'000;
  std::int64_t max_reuse_distance_elems = 1'000'000'000;
  bool gather_16bit_weights_on_model_save = false;
  std::int64_t module_granularity_threshold = 0;
  bool use_all_reduce_for_fetch_params = false;
  bool allgather_sequential = false;
  bool ignore_unused_parameters = true;
  bool round_robin_gradients = false;
  std::int64_t zero_hpz_partition_size = 1;
  bool zero_quantized_weights = false;
  bool zero_quantized_nontrainable_weights = false;
  bool zero_quantized_gradients = false;
  std::int64_t mics_shard_size = -1;
};

struct Fp16 {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0;  // 0: dynamic
  std::int64_t initial_scale_power = 16;
  std::int64_t loss_scale_window = 1000;
  std::int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
  bool fp16_master_weights_and_grads = false;
  bool dynamic_loss_scale() const { return loss_scale == 0; }
};

struct Bf16 {
  bool enabled = false;
  bool immediate_grad_update = false;
  bool check_grad_overflow = true;
  bool bf16_master_weights_and_grads = false;
  bool bf16_optimizer_states = false;
};

enum class OptimizerKind {
  Adam,  // "Adam"/"AdamW": see Optimizer::adam_w_mode for the weight-decay rule
  AdamW,
  Adagrad,
  Lion,
  Sgd,  // torch.optim.SGD
  Lamb,
  OneBitAdam,
  ZeroOneAdam,
  OneBitLamb,
  MuAdam,
  MuAdamW,
  MuSgd,
  Muon,
  TorchOther,  // any other torch.optim.<type>
};

struct Optimizer {
  std::string type;  // as DeepSpeed resolves it: lower-cased for its own names, else verbatim
  OptimizerKind kind = OptimizerKind::Adam;
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool bias_correction = true;
  // Decoupled (AdamW) weight decay: type "adamw", or "adam" unless adam_w_mode is false
  // (SPEC §1.7, §10.1). Meaningful for Adam/AdamW only.
  bool adam_w_mode = true;
  bool torch_adam = false;
  bool fp32_optimizer_states = true;
  double momentum = 0;  // SGD
  bool nesterov = false;
  nlohmann::json params = nlohmann::json::object();  // every param, resolved, for the kernels
};

enum class SchedulerKind { WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest, TorchOther };

struct Scheduler {
  std::string type;
  SchedulerKind kind = SchedulerKind::WarmupLR;
  nlohmann::json params = nlohmann::json::object();  // every param of the type, defaults filled
};

struct Aio {
  std::int64_t block_size_bytes = 1'048'576;
  std::int64_t queue_depth = 8;
  std::int64_t intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
};

enum class TagValidation { Ignore, Warn, Fail };

struct Checkpoint {
  TagValidation tag_validation = TagValidation::Warn;
  bool load_universal = false;
  bool use_node_local_storage = false;
};

struct DataTypes {
  std::optional<DType> grad_accum_dtype;  // nullopt: the model dtype
};

struct Loader;

struct DsConfig {
  // Batch triad (SPEC §1.4); nullopt while a value is still to be supplied.
  std::optional<std::int64_t> train_batch_size;
  std::optional<std::int64_t> train_micro_batch_size_per_gpu;
  std::optional<std::int64_t> gradient_accumulation_steps;
  // Data-parallel world size: supplied, or the only one the three batch values admit.
  std::optional<std::int64_t> world_size;

  double gradient_clipping = 1.0;  // <= 0: off
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  bool gradient_allreduce_sum = false;  // gradient_allreduce_op "sum"
  DType communication_data_type = DType::F32;  // resolved: config, else model dtype
  DType model_dtype = DType::F32;              // fp16 / bf16 / fp32 from the enabled block
  std::optional<std::int64_t> steps_per_print;
  bool wall_clock_breakdown = false;
  bool memory_breakdown = false;
  bool zero_allow_untested_optimizer = false;
  bool zero_force_ds_cpu_optimizer = true;

  Fp16 fp16;
  Bf16 bf16;
  ZeroOptimization zero_optimization;
  std::optional<Optimizer> optimizer;
  std::optional<Scheduler> scheduler;
  Aio aio;
  Checkpoint checkpoint;
  DataTypes data_types;

  std::vector<Finding> findings;
  // Dotted paths whose value the embedding must still supply, with what is missing.
  std::vector<Finding> unresolved;
  std::map<std::string, Provenance> provenance;  // every leaf of to_json()

  // Findings that make Engine::create refuse this config: unsupported, engine_error, and every
  // value still to be supplied.
  std::vector<Finding> blockers() const;

  // The fully resolved config under current key names, every key present, defaults filled;
  // a value still to be supplied is the string "auto".
  const nlohmann::json& to_json() const { return resolved_; }

 private:
  friend struct Loader;
  nlohmann::json resolved_;
};

// Loads and validates a config. Throws zero::ConfigError listing every problem found (a syntax
// error is a single problem "line L, column C: ..." with an empty path); zero::IoError when the
// file cannot be read. `text` is the file's contents (see config/parse.h for what is accepted);
// `document` is an already parsed config (DeepSpeed's in-memory dict path).
DsConfig load_config_file(const std::filesystem::path& path, const Supplied& supplied = {});
DsConfig load_config_string(std::string_view text, const Supplied& supplied = {});
DsConfig load_config_json(const nlohmann::json& document, const Supplied& supplied = {});

}  // namespace zero::config
