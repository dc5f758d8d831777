#include "config/schema.h"

#include <algorithm>

#include "config/schema_keys.h"

namespace zero::config {

namespace {

using nlohmann::json;

// Every key rule, block by block (schema_keys.h).
std::vector<KeyRule> make_key_rules() {
  std::vector<KeyRule> rules = schema_detail::training_key_rules();
  for (auto part : {&schema_detail::zero_key_rules, &schema_detail::optimizer_key_rules,
                    &schema_detail::io_key_rules}) {
    const std::vector<KeyRule> more = part();
    rules.insert(rules.end(), more.begin(), more.end());
  }
  return rules;
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
    {"zero_optimization", "cpu_offload", ValueType::Bool, "offload_optimizer",
     DeprecationKind::OffloadToCpu, "deprecated: use offload_optimizer {\"device\": \"cpu\"}"},
    {"zero_optimization", "cpu_offload_param", ValueType::Bool, "offload_param",
     DeprecationKind::OffloadToCpu, "deprecated: use offload_param {\"device\": \"cpu\"}"},
    {"zero_optimization", "cpu_offload_use_pin_memory", ValueType::Bool, "",
     DeprecationKind::Ignored,
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

bool is_true(const json& v) {
  return v.is_boolean() && v.get<bool>();
}
bool not_null(const json& v) {
  return !v.is_null();
}
bool above_one(const json& v) {
  return v.is_number() && v.get<double>() > 1;
}
bool above_zero(const json& v) {
  return v.is_number() && v.get<double>() > 0;
}
bool is_false(const json& v) {
  return v.is_boolean() && !v.get<bool>();
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
    {"zero_optimization.zenflow", not_null, "ZenFlow"},
    {"zero_optimization.stage3_module_granularity_threshold", above_zero,
     "module-granularity leaf fetch units (the embedding defines units instead)"},
    {"zero_optimization.stage3_use_all_reduce_for_fetch_params", is_true,
     "fetching parameters by all-reduce"},
    {"zero_optimization.stage3_allgather_sequential", is_true,
     "sequential per-parameter all-gathers"},
    {"zero_optimization.round_robin_gradients", is_true, "round-robin gradient partitioning"},
    {"zero_optimization.pipeline_loading_checkpoint", is_true, "serial checkpoint loading"},
    {"zero_optimization.offload_optimizer.super_offload", is_true, "SuperOffload"},
    {"zero_optimization.offload_optimizer.fast_init", is_true, "NVMe fast init"},
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

// deepspeed/runtime/config.py DEEPSPEED_OPTIMIZERS, spelt as DeepSpeed's documentation does.
const std::vector<std::string_view> kOptimizerNames = {
    "Adam",    "AdamW", "Lamb",   "OneBitAdam", "ZeroOneAdam", "OneBitLamb",
    "Adagrad", "Lion",  "MuAdam", "MuAdamW",    "MuSGD",       "Muon"};
const std::vector<std::string_view> kSchedulerNames = {"LRRangeTest", "OneCycle", "WarmupLR",
                                                       "WarmupDecayLR", "WarmupCosineLR"};
// The optimizer classes of torch.optim (torch 2.x; Muon from 2.9) that DeepSpeed can build by
// name; the base class Optimizer is not one.
const std::vector<std::string_view> kTorchOptimizerNames = {
    "Adadelta", "Adafactor", "Adagrad", "Adam",    "AdamW", "SparseAdam", "Adamax", "ASGD",
    "LBFGS",    "NAdam",     "RAdam",   "RMSprop", "Rprop", "SGD",        "Muon"};
// The classes of torch.optim.lr_scheduler (torch 2.x).
const std::vector<std::string_view> kTorchSchedulerNames = {"LambdaLR",
                                                            "MultiplicativeLR",
                                                            "StepLR",
                                                            "MultiStepLR",
                                                            "ConstantLR",
                                                            "LinearLR",
                                                            "ExponentialLR",
                                                            "SequentialLR",
                                                            "CosineAnnealingLR",
                                                            "ChainedScheduler",
                                                            "ReduceLROnPlateau",
                                                            "CyclicLR",
                                                            "CosineAnnealingWarmRestarts",
                                                            "OneCycleLR",
                                                            "PolynomialLR",
                                                            "LRScheduler"};

}  // namespace

std::span<const BlockRule> block_rules() {
  return kBlocks;
}

std::span<const KeyRule> key_rules() {
  static const std::vector<KeyRule> rules = make_key_rules();
  return rules;
}

std::span<const DeprecatedRule> deprecated_rules() {
  return kDeprecated;
}
std::span<const UnsupportedRule> unsupported_rules() {
  return kUnsupported;
}
std::span<const SubsystemBlock> subsystem_blocks() {
  return kSubsystems;
}

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

std::span<const std::string_view> deepspeed_optimizer_names() {
  return kOptimizerNames;
}
std::span<const std::string_view> deepspeed_scheduler_names() {
  return kSchedulerNames;
}
std::span<const std::string_view> torch_optimizer_names() {
  return kTorchOptimizerNames;
}
std::span<const std::string_view> torch_scheduler_names() {
  return kTorchSchedulerNames;
}

std::string_view optimizer_variant(std::string_view resolved_type) {
  if (resolved_type == "adam" || resolved_type == "adamw") return "adam";
  if (resolved_type == "adagrad") return "adagrad";
  if (resolved_type == "lion") return "lion";
  if (resolved_type == "SGD") return "sgd";
  return {};
}

}  // namespace zero::config
