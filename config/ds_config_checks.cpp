// Checks across fields and blocks, and the values DeepSpeed honours that zero does not.
#include <fmt/format.h>

#include <cmath>

#include "config/ds_config_impl.h"
#include "config/schema.h"

namespace zero::config {

using namespace detail;

// SPEC §1.11 and the asserts DeepSpeed runs when it builds the ZeRO optimizer (§1.3, §1.6).
void Loader::check_cross_fields(const DsConfig& c, json& out) {
  const ZeroOptimization& z = c.zero_optimization;
  const int stage = z.stage;
  if (c.fp16.enabled && c.bf16.enabled)
    error("bf16.enabled", "fp16 and bf16 cannot both be enabled");
  if (c.fp16.fp16_master_weights_and_grads && stage == 0) {
    error("fp16.fp16_master_weights_and_grads",
          "needs ZeRO stage 1, 2 or 3 (zero_optimization.stage is 0)");
  }
  if (c.bf16.bf16_master_weights_and_grads && stage == 0) {
    error("bf16.bf16_master_weights_and_grads",
          "needs ZeRO stage 1, 2 or 3 (zero_optimization.stage is 0)");
  }
  if (c.fp16.fp16_master_weights_and_grads && c.bf16.bf16_master_weights_and_grads) {
    error("bf16.bf16_master_weights_and_grads",
          "cannot be combined with fp16.fp16_master_weights_and_grads");
  }
  if (c.bf16.bf16_optimizer_states && !c.bf16.bf16_master_weights_and_grads) {
    error("bf16.bf16_optimizer_states", "needs bf16.bf16_master_weights_and_grads: true");
  }
  if (c.gradient_allreduce_sum && stage == 3) {
    error("gradient_allreduce_op",
          "\"sum\" is not allowed with ZeRO stage 3 (DeepSpeed raises ValueError)");
  }
  if ((stage == 2 || stage == 3) && z.reduce_scatter) {
    if (c.prescale_gradients) {
      error("prescale_gradients",
            fmt::format("must be false with ZeRO stage {} and zero_optimization.reduce_scatter "
                        "(DeepSpeed asserts)",
                        stage));
    }
    if (c.gradient_predivide_factor != 1.0) {
      error("gradient_predivide_factor",
            fmt::format("must be 1.0 with ZeRO stage {} and zero_optimization.reduce_scatter "
                        "(DeepSpeed asserts), got {}",
                        stage, c.gradient_predivide_factor));
    }
  }
  if ((stage == 1 || stage == 2) && z.allgather_bucket_elems % 2 != 0) {
    error("zero_optimization.allgather_bucket_size",
          fmt::format("must be a multiple of 2 (DeepSpeed asserts), got {}",
                      z.allgather_bucket_elems));
  }
  if (provenance["gradient_clipping"].source == Source::Default) {
    provenance["gradient_clipping"].detail = "DeepSpeed 0.19.3 and later: 1.0 (on)";
    add(Severity::Note, "gradient_clipping",
        "not set, so gradients are not clipped, as in DeepSpeed before 0.19.3 and in plain "
        "PyTorch; DeepSpeed 0.19.3 and later clip at 1.0 when the key is absent: write "
        "\"gradient_clipping\": 1.0 for that");
  }
  if (z.offload_optimizer && z.offload_optimizer->ratio < 1.0 && (stage == 1 || stage == 2)) {
    add(Severity::Note, "zero_optimization.offload_optimizer.ratio",
        "DeepSpeed honours a partial offload only at stage 3; zero offloads that share of the "
        "sub-groups at every stage");
  }
  const std::pair<const char*, bool> nvme_blocks[] = {
      {"zero_optimization.offload_param", z.offload_param &&
                                              z.offload_param->device == OffloadDevice::Nvme &&
                                              z.offload_param->nvme_paths.empty()},
      {"zero_optimization.offload_optimizer",
       z.offload_optimizer && z.offload_optimizer->device == OffloadDevice::Nvme &&
           z.offload_optimizer->nvme_paths.empty()}};
  for (const auto& [block, missing] : nvme_blocks) {
    if (missing) error(std::string(block) + ".nvme_path", "required when device is \"nvme\"");
  }

  if (c.fp16.dynamic_loss_scale()) {
    if (c.fp16.loss_scale_window <= 0) {
      error("fp16.loss_scale_window",
            fmt::format("must be > 0 with dynamic loss scaling (fp16.loss_scale 0), got {}",
                        c.fp16.loss_scale_window));
    }
    // DeepSpeed 0.19.6 refuses a non-positive or fractional floor; configs written for older
    // releases use 0.0 and 1e-7, so zero keeps the value and says so.
    if (provenance["fp16.min_loss_scale"].source == Source::Config) {
      const double m = c.fp16.min_loss_scale;
      if (m <= 0) {
        add(Severity::Warning, "fp16.min_loss_scale",
            fmt::format("{} gives dynamic loss scaling no floor; DeepSpeed >= 0.17.1 refuses it "
                        "(older releases "
                        "accepted it)",
                        m));
      } else if (m != std::trunc(m)) {
        add(Severity::Warning, "fp16.min_loss_scale",
            fmt::format(
                "{} is not an integer; DeepSpeed >= 0.17.1 refuses it, zero uses it as given", m));
      }
    }
  }
  if (c.fp16.auto_cast) {
    add(Severity::Note, "fp16.auto_cast",
        "casting forward inputs is the trainer's job; the runtime does not run forward");
  }

  if (const json* dt = lookup(out, "data_types.param_dtype"); dt && dt->is_string()) {
    if (dt->get<std::string>() != dtype_name(c.model_dtype)) {
      error("data_types.param_dtype", fmt::format("{} differs from the enabled precision {}",
                                                  show(*dt), dtype_name(c.model_dtype)));
    }
  }

  if (z.offload_param && z.offload_param->device != OffloadDevice::None && stage < 3) {
    add(Severity::Warning, "zero_optimization.offload_param",
        fmt::format("ignored below ZeRO stage 3 (stage is {}), as DeepSpeed does", stage));
  }
  if (z.offload_optimizer && z.offload_optimizer->device != OffloadDevice::None && stage == 0) {
    add(Severity::Warning, "zero_optimization.offload_optimizer",
        "ignored at ZeRO stage 0, as DeepSpeed does");
  }
  if (z.offload_optimizer && z.offload_optimizer->device == OffloadDevice::Nvme &&
      (stage == 1 || stage == 2)) {
    add(Severity::Note, "zero_optimization.offload_optimizer.device",
        "DeepSpeed keeps optimizer states in CPU memory for \"nvme\" at stages 1 and 2; zero "
        "swaps them to nvme_path at every stage");
  }
  // ZeRO++ and MiCS are stage 3 features; DeepSpeed ignores their keys below it without a word.
  for (const char* key : {"zero_hpz_partition_size", "zero_quantized_weights",
                          "zero_quantized_nontrainable_weights", "zero_quantized_gradients",
                          "zeropp_loco_param", "mics_shard_size", "mics_hierarchical_params_gather"}) {
    const json* v = lookup(out, std::string("zero_optimization.") + key);
    const bool set = v != nullptr && !v->is_null() &&
                     !(v->is_boolean() && !v->get<bool>()) &&
                     !(v->is_number_integer() && v->get<std::int64_t>() <= (key[0] == 'm' ? 0 : 1));
    if (set && stage < 3) {
      add(Severity::Warning, std::string("zero_optimization.") + key,
          fmt::format("ignored below ZeRO stage 3 (stage is {}), as DeepSpeed does", stage));
    }
  }
  check_loco(lookup(out, "zero_optimization.zeropp_loco_param"), stage,
             z.zero_quantized_gradients);
  if (stage == 3 && z.elastic_checkpoint) {
    add(Severity::Warning, "zero_optimization.elastic_checkpoint",
        "DeepSpeed does not support elastic checkpoints with stage 3; zero checkpoints reshard at "
        "any stage");
  }
  if (const json* v = lookup(out, "zero_optimization.leaf_module"); v && !v->is_null()) {
    add(Severity::Note, "zero_optimization.leaf_module",
        "stage-3 fetch units are the units the embedding registers; leaf_module has no effect");
  }
  if (const json* v = lookup(out, "vocabulary_size");
      v && v->is_number_integer() && v->get<std::int64_t>() % 8 != 0) {
    add(Severity::Warning, "vocabulary_size",
        fmt::format("{} is not a multiple of 8, which slows fp16/bf16 kernels",
                    v->get<std::int64_t>()));
  }

  // What DeepSpeed refuses only when it builds the engine (deepspeed.initialize).
  if (c.optimizer && stage > 0) {
    const OptimizerKind k = c.optimizer->kind;
    if (k == OptimizerKind::OneBitAdam || k == OptimizerKind::ZeroOneAdam ||
        k == OptimizerKind::OneBitLamb) {
      add(Severity::EngineError, "optimizer.type",
          fmt::format("DeepSpeed refuses {} with ZeRO (stage {}): 1-bit optimizers are not "
                      "compatible with ZeRO",
                      c.optimizer->type, stage));
    } else if (k != OptimizerKind::Adam && k != OptimizerKind::AdamW &&
               k != OptimizerKind::Adagrad && k != OptimizerKind::Lion &&
               k != OptimizerKind::Muon && !c.zero_allow_untested_optimizer) {
      add(Severity::EngineError, "optimizer.type",
          fmt::format("DeepSpeed refuses ZeRO with the untested optimizer {} unless "
                      "zero_allow_untested_optimizer "
                      "is true",
                      c.optimizer->type));
    }
  }
  if (c.optimizer &&
      (c.optimizer->kind == OptimizerKind::Lamb ||
       c.optimizer->kind == OptimizerKind::OneBitLamb) &&
      c.fp16.enabled && !c.fp16.dynamic_loss_scale()) {
    add(Severity::EngineError, "fp16.loss_scale",
        fmt::format("DeepSpeed's {} needs dynamic loss scaling (fp16.loss_scale 0)",
                    c.optimizer->type));
  }
  if (bool_at(out, "zero_optimization.legacy_stage1", false)) {
    add(Severity::EngineError, "zero_optimization.legacy_stage1",
        "DeepSpeed removed the legacy stage 1 implementation and raises when it is requested");
  }
  if (bool_at(out, "amp.enabled", false) && stage > 0) {
    add(Severity::EngineError, "amp.enabled", "DeepSpeed refuses Apex AMP together with ZeRO");
  }

  if (const json* v = lookup(out, "zero_optimization.overlap_comm"); v && v->is_null()) {
    out["zero_optimization"]["overlap_comm"] = stage == 3;
    provenance["zero_optimization.overlap_comm"] = {Source::Derived,
                                                    "null: true for stage 3, false otherwise"};
  }
  if (const json* v = lookup(out, "communication_data_type"); v && v->is_null()) {
    out["communication_data_type"] = std::string(dtype_name(c.communication_data_type));
    provenance["communication_data_type"] = {Source::Derived, "null: the model dtype"};
  }
}

// zeropp_loco_param: an object with exactly err_beta in [0, 1) and an integer reset_T >= 1
// (DeepSpeed's own code reads both without defaults); it works through qgZ only.
void Loader::check_loco(const json* v, int stage, bool qgz) {
  if (v == nullptr || v->is_null() || stage < 3) return;
  const std::string key = "zero_optimization.zeropp_loco_param";
  const std::string example = R"(for example {"err_beta": 0.8, "reset_T": 1024})";
  if (!v->is_object()) {
    error(key, fmt::format("{} is not an object; give err_beta and reset_T, {}", show(*v),
                           example));
    return;
  }
  for (const auto& [name, value] : v->items()) {
    if (name != "err_beta" && name != "reset_T") {
      error(key + "." + name, "unknown LoCo parameter; zeropp_loco_param takes err_beta and reset_T");
    }
  }
  const json* beta = lookup(*v, "err_beta");
  if (beta == nullptr || !beta->is_number() || beta->get<double>() < 0.0 ||
      beta->get<double>() >= 1.0) {
    error(key + ".err_beta",
          fmt::format("{}: needs a number in [0, 1), the share of the previous error kept ({})",
                      beta ? show(*beta) : "missing", example));
  }
  const json* reset = lookup(*v, "reset_T");
  if (reset == nullptr || !reset->is_number_integer() || reset->get<std::int64_t>() < 1) {
    error(key + ".reset_T",
          fmt::format("{}: needs an integer >= 1, the optimizer steps between resets of the "
                      "errors ({})",
                      reset ? show(*reset) : "missing", example));
  }
  if (!qgz) {
    add(Severity::Warning, key,
        "LoCo corrects qgZ's quantized gradients, and zero_quantized_gradients is false: it has "
        "no effect");
  }
}

void Loader::check_unsupported(const json& out) {
  for (const UnsupportedRule& u : unsupported_rules()) {
    const json* v = lookup(out, u.path);
    if (v == nullptr || is_auto(*v) || !u.applies(*v) || (u.when && !u.when(out))) continue;
    add(Severity::Unsupported, std::string(u.path),
        fmt::format("{}; the config sets {}", u.what, show(*v)));
  }
}

}  // namespace zero::config
