// The typed DsConfig, read from the resolved JSON (every key present, defaults filled).
#include "config/ds_config_impl.h"

namespace zero::config {

using namespace detail;

namespace {

OffloadDevice device_of(const std::string& s) {
  if (s == "cpu") return OffloadDevice::Cpu;
  if (s == "nvme") return OffloadDevice::Nvme;
  return OffloadDevice::None;
}

OptimizerKind optimizer_kind(const std::string& type) {
  static const std::vector<std::pair<std::string_view, OptimizerKind>> kKinds = {
      {"adam", OptimizerKind::Adam},
      {"adamw", OptimizerKind::AdamW},
      {"adagrad", OptimizerKind::Adagrad},
      {"lion", OptimizerKind::Lion},
      {"SGD", OptimizerKind::Sgd},
      {"lamb", OptimizerKind::Lamb},
      {"onebitadam", OptimizerKind::OneBitAdam},
      {"zerooneadam", OptimizerKind::ZeroOneAdam},
      {"onebitlamb", OptimizerKind::OneBitLamb},
      {"muadam", OptimizerKind::MuAdam},
      {"muadamw", OptimizerKind::MuAdamW},
      {"musgd", OptimizerKind::MuSgd},
      {"muon", OptimizerKind::Muon}};
  for (const auto& [name, kind] : kKinds) {
    if (type == name) return kind;
  }
  return OptimizerKind::TorchOther;
}

SchedulerKind scheduler_kind(const std::string& type) {
  if (type == "WarmupLR") return SchedulerKind::WarmupLR;
  if (type == "WarmupDecayLR") return SchedulerKind::WarmupDecayLR;
  if (type == "WarmupCosineLR") return SchedulerKind::WarmupCosineLR;
  if (type == "OneCycle") return SchedulerKind::OneCycle;
  if (type == "LRRangeTest") return SchedulerKind::LRRangeTest;
  return SchedulerKind::TorchOther;
}

}  // namespace

DsConfig Loader::build(const json& out) const {
  DsConfig c;
  auto opt_int = [&](const char* key) -> std::optional<std::int64_t> {
    const json* v = lookup(out, key);
    if (v && v->is_number_integer()) return v->get<std::int64_t>();
    return std::nullopt;
  };
  c.train_batch_size = opt_int("train_batch_size");
  c.train_micro_batch_size_per_gpu = opt_int("train_micro_batch_size_per_gpu");
  c.gradient_accumulation_steps = opt_int("gradient_accumulation_steps");
  c.gradient_clipping = number_at(out, "gradient_clipping", 0.0);
  c.prescale_gradients = bool_at(out, "prescale_gradients", false);
  c.gradient_predivide_factor = number_at(out, "gradient_predivide_factor", 1.0);
  c.gradient_allreduce_sum = string_at(out, "gradient_allreduce_op") == "sum";
  c.steps_per_print = opt_int("steps_per_print");
  c.wall_clock_breakdown = bool_at(out, "wall_clock_breakdown", false);
  c.memory_breakdown = bool_at(out, "memory_breakdown", false);
  c.zero_allow_untested_optimizer = bool_at(out, "zero_allow_untested_optimizer", false);
  c.zero_force_ds_cpu_optimizer = bool_at(out, "zero_force_ds_cpu_optimizer", true);

  Fp16& h = c.fp16;
  h.enabled = bool_at(out, "fp16.enabled", false);
  h.auto_cast = bool_at(out, "fp16.auto_cast", false);
  h.loss_scale = number_at(out, "fp16.loss_scale", 0);
  h.initial_scale_power = int_at(out, "fp16.initial_scale_power", 16);
  h.loss_scale_window = int_at(out, "fp16.loss_scale_window", 1000);
  h.hysteresis = int_at(out, "fp16.hysteresis", 2);
  h.consecutive_hysteresis = bool_at(out, "fp16.consecutive_hysteresis", false);
  h.min_loss_scale = number_at(out, "fp16.min_loss_scale", 1);
  h.fp16_master_weights_and_grads = bool_at(out, "fp16.fp16_master_weights_and_grads", false);

  Bf16& b = c.bf16;
  b.enabled = bool_at(out, "bf16.enabled", false);
  b.immediate_grad_update = bool_at(out, "bf16.immediate_grad_update", false);
  b.check_grad_overflow = bool_at(out, "bf16.check_grad_overflow", true);
  b.bf16_master_weights_and_grads = bool_at(out, "bf16.bf16_master_weights_and_grads", false);
  b.bf16_optimizer_states = bool_at(out, "bf16.bf16_optimizer_states", false);
  c.model_dtype = h.enabled ? DType::F16 : b.enabled ? DType::BF16 : DType::F32;
  const std::string comm = string_at(out, "communication_data_type");
  c.communication_data_type =
      comm.empty() ? c.model_dtype : parse_dtype(comm).value_or(c.model_dtype);

  ZeroOptimization& z = c.zero_optimization;
  const std::string zp = "zero_optimization.";
  auto zi = [&](const char* k, std::int64_t d) { return int_at(out, zp + k, d); };
  auto zb = [&](const char* k, bool d) { return bool_at(out, zp + k, d); };
  z.stage = static_cast<int>(zi("stage", 0));
  z.contiguous_gradients = zb("contiguous_gradients", true);
  z.reduce_scatter = zb("reduce_scatter", true);
  z.reduce_bucket_elems = zi("reduce_bucket_size", z.reduce_bucket_elems);
  z.use_multi_rank_bucket_allreduce = zb("use_multi_rank_bucket_allreduce", true);
  z.allgather_partitions = zb("allgather_partitions", true);
  z.allgather_bucket_elems = zi("allgather_bucket_size", z.allgather_bucket_elems);
  z.overlap_comm = zb("overlap_comm", z.stage == 3);
  z.load_from_fp32_weights = zb("load_from_fp32_weights", true);
  z.elastic_checkpoint = zb("elastic_checkpoint", false);
  z.sub_group_elems = zi("sub_group_size", z.sub_group_elems);
  z.prefetch_bucket_elems = zi("stage3_prefetch_bucket_size", z.prefetch_bucket_elems);
  z.param_persistence_threshold_elems =
      zi("stage3_param_persistence_threshold", z.param_persistence_threshold_elems);
  z.model_persistence_threshold_elems =
      zi("stage3_model_persistence_threshold", z.model_persistence_threshold_elems);
  z.max_live_parameters_elems = zi("stage3_max_live_parameters", z.max_live_parameters_elems);
  z.max_reuse_distance_elems = zi("stage3_max_reuse_distance", z.max_reuse_distance_elems);
  z.gather_16bit_weights_on_model_save = zb("stage3_gather_16bit_weights_on_model_save", false);
  z.module_granularity_threshold = zi("stage3_module_granularity_threshold", 0);
  z.use_all_reduce_for_fetch_params = zb("stage3_use_all_reduce_for_fetch_params", false);
  z.allgather_sequential = zb("stage3_allgather_sequential", false);
  z.ignore_unused_parameters = zb("ignore_unused_parameters", true);
  z.round_robin_gradients = zb("round_robin_gradients", false);
  z.zero_hpz_partition_size = zi("zero_hpz_partition_size", 1);
  z.zero_quantized_weights = zb("zero_quantized_weights", false);
  z.zero_quantized_nontrainable_weights = zb("zero_quantized_nontrainable_weights", false);
  z.zero_quantized_gradients = zb("zero_quantized_gradients", false);
  if (const json* l = lookup(out, "zero_optimization.zeropp_loco_param"); l && l->is_object()) {
    ZeroOptimization::Loco loco;
    loco.err_beta = number_at(*l, "err_beta", loco.err_beta);
    loco.reset_T = int_at(*l, "reset_T", loco.reset_T);
    z.zeropp_loco_param = loco;
  }
  z.mics_shard_size = zi("mics_shard_size", -1);
  if (const json* p = lookup(out, "zero_optimization.offload_param"); p && p->is_object()) {
    OffloadParam o;
    o.device = device_of(string_at(*p, "device"));
    o.nvme_paths = paths_at(*p, "nvme_path");
    o.buffer_count = int_at(*p, "buffer_count", o.buffer_count);
    o.buffer_size_elems = int_at(*p, "buffer_size", o.buffer_size_elems);
    o.max_in_cpu_elems = int_at(*p, "max_in_cpu", o.max_in_cpu_elems);
    o.pin_memory = bool_at(*p, "pin_memory", true);
    z.offload_param = o;
  }
  if (const json* p = lookup(out, "zero_optimization.offload_optimizer"); p && p->is_object()) {
    OffloadOptimizer o;
    o.device = device_of(string_at(*p, "device"));
    o.nvme_paths = paths_at(*p, "nvme_path");
    o.buffer_count = int_at(*p, "buffer_count", o.buffer_count);
    o.pin_memory = bool_at(*p, "pin_memory", true);
    o.pipeline_read = bool_at(*p, "pipeline_read", false);
    o.pipeline_write = bool_at(*p, "pipeline_write", false);
    o.fast_init = bool_at(*p, "fast_init", false);
    o.ratio = number_at(*p, "ratio", 1.0);
    o.super_offload = bool_at(*p, "super_offload", false);
    o.cpuadam_cores_perc = number_at(*p, "cpuadam_cores_perc", 0.8);
    z.offload_optimizer = o;
  }

  if (const json* o = lookup(out, "optimizer"); o && o->is_object() && (*o)["type"].is_string()) {
    Optimizer opt;
    opt.type = (*o)["type"].get<std::string>();
    opt.kind = optimizer_kind(opt.type);
    const json& p = (*o)["params"];
    opt.params = p;
    opt.lr = number_at(p, "lr", opt.lr);
    if (const json* betas = lookup(p, "betas"); betas && betas->is_array() && betas->size() == 2 &&
                                                (*betas)[0].is_number() &&
                                                (*betas)[1].is_number()) {
      opt.betas = {(*betas)[0].get<double>(), (*betas)[1].get<double>()};
    }
    opt.eps = number_at(p, "eps", opt.eps);
    opt.weight_decay = number_at(p, "weight_decay", 0);
    opt.bias_correction = bool_at(p, "bias_correction", true);
    opt.adam_w_mode = opt.kind == OptimizerKind::AdamW || bool_at(p, "adam_w_mode", true);
    opt.torch_adam = bool_at(p, "torch_adam", false);
    opt.fp32_optimizer_states = bool_at(p, "fp32_optimizer_states", true);
    opt.momentum = number_at(p, "momentum", 0);
    opt.nesterov = bool_at(p, "nesterov", false);
    c.optimizer = opt;
  }
  if (const json* s = lookup(out, "scheduler"); s && s->is_object() && (*s)["type"].is_string()) {
    Scheduler sched;
    sched.type = (*s)["type"].get<std::string>();
    sched.kind = scheduler_kind(sched.type);
    sched.params = (*s)["params"];
    c.scheduler = sched;
  }

  c.aio.block_size_bytes = int_at(out, "aio.block_size", c.aio.block_size_bytes);
  c.aio.queue_depth = int_at(out, "aio.queue_depth", c.aio.queue_depth);
  c.aio.intra_op_parallelism = int_at(out, "aio.intra_op_parallelism", 1);
  c.aio.single_submit = bool_at(out, "aio.single_submit", false);
  c.aio.overlap_events = bool_at(out, "aio.overlap_events", true);
  c.aio.use_gds = bool_at(out, "aio.use_gds", false);
  const std::string tag = lower(string_at(out, "checkpoint.tag_validation"));
  c.checkpoint.tag_validation = tag == "ignore" ? TagValidation::Ignore
                                : tag == "fail" ? TagValidation::Fail
                                                : TagValidation::Warn;
  c.checkpoint.load_universal = bool_at(out, "checkpoint.load_universal", false);
  c.checkpoint.use_node_local_storage = bool_at(out, "checkpoint.use_node_local_storage", false);
  const std::string accum = string_at(out, "data_types.grad_accum_dtype");
  if (!accum.empty()) c.data_types.grad_accum_dtype = parse_dtype(accum);
  return c;
}

}  // namespace zero::config
