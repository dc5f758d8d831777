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

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
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

// zero_optimization.offload_param (stage 3): where 16-bit parameter partitions live between uses.
struct OffloadParam {
  OffloadDevice device = OffloadDevice::None;  // none, cpu or nvme; DeepSpeed default "none"
  // nvme_path: NVMe swap folder(s), needed for nvme; default null (empty here). A list stripes
  // the swap files over several folders (zero's extension; DeepSpeed takes one path).
  std::vector<std::string> nvme_paths;
  std::int64_t buffer_count = 5;  // pinned parameter swap buffers; default 5
  // buffer_size: elements per swap buffer, each NVMe partition must fit one; default 1e8
  std::int64_t buffer_size_elems = 100'000'000;
  // max_in_cpu: with nvme, partition elements that may stay in CPU memory; default 1e9
  std::int64_t max_in_cpu_elems = 1'000'000'000;
  bool pin_memory = true;  // pinned CPU partitions; default true (false before 0.19.5)
};

// zero_optimization.offload_optimizer (stages 1-3): where the optimizer state and step live.
struct OffloadOptimizer {
  OffloadDevice device = OffloadDevice::None;  // none, cpu or nvme (cpu for stage 1/2); "none"
  std::vector<std::string> nvme_paths;  // nvme_path: folder(s), as offload_param's
  std::int64_t buffer_count = 4;  // pinned swap buffers for optimizer tensors; default 4
  bool pin_memory = true;      // pinned fp32 master/gradient buffers; default true (false < 0.19.5)
  bool pipeline_read = false;  // stage 3 nvme: read the next sub-group ahead; default false
  bool pipeline_write = false;  // stage 3 nvme: write the last sub-group back async; default false
  bool fast_init = false;  // stage 3 nvme: swap files straight from fp16 partitions; default false
  double ratio = 1.0;      // stage 3: share of sub-groups stepped on the CPU; default 1.0
  bool super_offload = false;       // SuperOffload stage-3 optimizer for superchips; default false
  double cpuadam_cores_perc = 0.8;  // with super_offload: share of CPU cores; default 0.8
};

// zero_optimization. Bucket, sub-group, threshold and live/reuse sizes count elements, not bytes.
struct ZeroOptimization {
  int stage = 0;  // 0 off, 1 optimizer state, 2 + gradients, 3 + parameters partitioned; default 0
  bool contiguous_gradients = true;  // reduced gradients copied to one buffer; default true
  bool reduce_scatter = true;        // reduce to owners instead of a plain all-reduce; default true
  std::int64_t reduce_bucket_elems = 500'000'000;  // reduce_bucket_size; default 5e8
  // Stage 1/2: all-reduce a whole bucket, owners keep their slices (else one reduce per owner);
  // default true.
  bool use_multi_rank_bucket_allreduce = true;
  bool allgather_partitions = true;  // parsed, unused by DeepSpeed's stage 1/2; default true
  std::int64_t allgather_bucket_elems = 500'000'000;  // allgather_bucket_size; default 5e8
  // Reductions overlap backward on a side stream; default null = (stage == 3).
  bool overlap_comm = false;           // resolved: config value, else stage == 3
  bool load_from_fp32_weights = true;  // load masters from saved fp32 partitions; default true
  bool elastic_checkpoint = false;     // stage 1/2: state loadable at other DP sizes; default false
  std::optional<OffloadParam> offload_param;          // present when the block was given
  std::optional<OffloadOptimizer> offload_optimizer;  // (device may still be None); default null
  std::int64_t sub_group_elems = 1'000'000'000;  // sub_group_size: stage 3 step tile; default 1e9
  // stage3_prefetch_bucket_size: stage 3 elements fetched ahead; default 5e7
  std::int64_t prefetch_bucket_elems = 50'000'000;
  // stage3_param_persistence_threshold: stage 3 keeps params this small gathered; default 1e5
  std::int64_t param_persistence_threshold_elems = 100'000;
  // stage3_model_persistence_threshold: cap on all persistent elements; default sys.maxsize
  std::int64_t model_persistence_threshold_elems = INT64_MAX;
  // stage3_max_live_parameters: cap on gathered elements while prefetching; default 1e9
  std::int64_t max_live_parameters_elems = 1'000'000'000;
  // stage3_max_reuse_distance: keep a param reused within this many elements; default 1e9
  std::int64_t max_reuse_distance_elems = 1'000'000'000;
  // stage3_gather_16bit_weights_on_model_save: save_16bit_model gathers weights; default false
  bool gather_16bit_weights_on_model_save = false;
  // stage3_module_granularity_threshold: > 0 makes small modules one fetch unit; default 0
  std::int64_t module_granularity_threshold = 0;
  // stage3_use_all_reduce_for_fetch_params: fetch by all-reduce, not all-gather; default false
  bool use_all_reduce_for_fetch_params = false;
  bool allgather_sequential = false;         // stage3_*: gather params one by one; default false
  bool ignore_unused_parameters = true;      // stage 1/2 offload allows unused params; default true
  bool round_robin_gradients = false;        // stage 1/2: reorder params per group; default false
  std::int64_t zero_hpz_partition_size = 1;  // ZeRO++ hpZ secondary group size; default 1 (off)
  bool zero_quantized_weights = false;       // ZeRO++ qwZ int8 weight all-gathers; default false
  // ZeRO++: frozen weights stored quantized; default false
  bool zero_quantized_nontrainable_weights = false;
  bool zero_quantized_gradients = false;  // ZeRO++ qgZ quantized gradients; default false
  // zeropp_loco_param {err_beta, reset_T}: LoCo error feedback on qgZ's quantizations (the share
  // of the old error kept, in [0, 1); the optimizer steps between resets of the errors, >= 1);
  // default null (off). Both keys are required.
  struct Loco {
    double err_beta = 0.8;
    std::int64_t reset_T = 1024;
  };
  std::optional<Loco> zeropp_loco_param;
  std::int64_t mics_shard_size = -1;  // > 0: MiCS shard group size; default -1 (off)
};

struct Fp16 {
  bool enabled = false;                   // train in fp16 with loss scaling; default false
  bool auto_cast = false;                 // cast floating forward inputs to fp16; default false
  double loss_scale = 0;                  // 0: dynamic; > 0: this static scale; default 0
  std::int64_t initial_scale_power = 16;  // dynamic scale starts at 2^this; default 16
  std::int64_t loss_scale_window = 1000;  // good steps before the scale grows; default 1000
  std::int64_t hysteresis = 2;            // overflows tolerated before the scale drops; default 2
  bool consecutive_hysteresis = false;    // refill hysteresis after a good step; default false
  double min_loss_scale = 1;              // floor of the dynamic scale; default 1
  bool fp16_master_weights_and_grads = false;  // fp16 masters and gradients; default false
  bool dynamic_loss_scale() const { return loss_scale == 0; }
};

// bf16 (legacy name "bfloat16", read only when "bf16" is absent).
struct Bf16 {
  bool enabled = false;                // train in bf16; default false
  bool immediate_grad_update = false;  // BF16_Optimizer (no ZeRO) only; default false
  // Stage 1/2: skip the step on an inf/NaN gradient; default true (false 0.17.1-0.19.2).
  bool check_grad_overflow = true;
  bool bf16_master_weights_and_grads = false;  // bf16 masters and gradients; default false
  bool bf16_optimizer_states = false;          // bf16 Adam moments (needs the above); default false
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

// optimizer (SPEC §1.7). Defaults are the Adam/AdamW ones; other types have their own (the
// schema's optimizer.params rows), and `params` holds what applies.
struct Optimizer {
  std::string type;  // as DeepSpeed resolves it: lower-cased for its own names, else verbatim
  OptimizerKind kind = OptimizerKind::Adam;
  double lr = 1e-3;                         // learning rate; default 1e-3 (adagrad 1e-2)
  std::array<double, 2> betas{0.9, 0.999};  // Adam/Lion moment decay rates; default [0.9, 0.999]
  double eps = 1e-8;            // added to the denominator; default 1e-8 (adagrad 1e-10)
  double weight_decay = 0;      // default 0
  bool bias_correction = true;  // Adam bias correction; default true
  // Decoupled (AdamW) weight decay: type "adamw", or "adam" unless adam_w_mode is false
  // (SPEC §1.7, §10.1). Meaningful for Adam/AdamW only. DeepSpeed default true.
  bool adam_w_mode = true;
  bool torch_adam = false;  // true: torch.optim.Adam/AdamW instead of DeepSpeed's; default false
  bool fp32_optimizer_states = true;                 // CPU Adam keeps moments in fp32; default true
  double momentum = 0;                               // SGD momentum; default 0
  bool nesterov = false;                             // SGD Nesterov momentum; default false
  nlohmann::json params = nlohmann::json::object();  // every param, resolved, for the kernels
};

enum class SchedulerKind {
  WarmupLR,
  WarmupDecayLR,
  WarmupCosineLR,
  OneCycle,
  LRRangeTest,
  TorchOther
};

// scheduler (SPEC §1.8): no block, no schedule.
struct Scheduler {
  std::string type;  // WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest, or torch
  SchedulerKind kind = SchedulerKind::WarmupLR;
  nlohmann::json params = nlohmann::json::object();  // every param of the type, defaults filled
};

// aio: the asynchronous I/O of NVMe offload (SPEC §1.9).
struct Aio {
  std::int64_t block_size_bytes = 1'048'576;  // bytes per I/O request; default 1 MiB
  std::int64_t queue_depth = 8;               // requests in flight; default 8
  std::int64_t intra_op_parallelism = 1;      // I/O threads per op (was thread_count); default 1
  bool single_submit = false;  // submit requests one at a time, not batched; default false
  bool overlap_events = true;  // keep the queue full instead of lock-step batches; default true
  bool use_gds = false;        // GPUDirect Storage; default false
};

enum class TagValidation { Ignore, Warn, Fail };

// checkpoint (SPEC §1.10).
struct Checkpoint {
  TagValidation tag_validation = TagValidation::Warn;  // tags differing across ranks; "Warn"
  bool load_universal = false;                         // load a universal checkpoint; default false
  bool use_node_local_storage = false;  // every node saves to its own storage; default false
};

struct DataTypes {
  std::optional<DType> grad_accum_dtype;  // gradient accumulation dtype; null: the model dtype
};

struct Loader;

struct DsConfig {
  // Batch triad (SPEC §1.4); nullopt while a value is still to be supplied.
  std::optional<std::int64_t> train_batch_size;
  std::optional<std::int64_t> train_micro_batch_size_per_gpu;
  std::optional<std::int64_t> gradient_accumulation_steps;
  // Data-parallel world size: supplied, or the only one the three batch values admit.
  std::optional<std::int64_t> world_size;

  double gradient_clipping = 0.0;   // global L2-norm clip, <= 0: off; absent: off (1.0 >= 0.19.3)
  bool prescale_gradients = false;  // divide by the world size before reducing; default false
  double gradient_predivide_factor = 1.0;  // plain all-reduce path: divide first; default 1.0
  // gradient_allreduce_op "sum" (no averaging over ranks); default "mean".
  bool gradient_allreduce_sum = false;
  // Gradient reduction dtype; DeepSpeed default null: fp16 or bf16 when enabled, else fp32.
  DType communication_data_type = DType::F32;   // resolved: config, else model dtype
  DType model_dtype = DType::F32;               // fp16 / bf16 / fp32 from the enabled block
  std::optional<std::int64_t> steps_per_print;  // rank 0 logs every N steps; null (10 < 0.15.2)
  bool wall_clock_breakdown = false;            // time the phases of a step; default false
  bool memory_breakdown = false;                // log memory use; default false
  // Let ZeRO wrap an optimizer outside its tested list; default false.
  bool zero_allow_untested_optimizer = false;
  // With optimizer offload, refuse a client optimizer that is not DeepSpeed's CPU one; true.
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
