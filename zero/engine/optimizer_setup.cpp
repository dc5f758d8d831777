#include "zero/engine/optimizer_setup.h"

#include "zero/base/error.h"

namespace zero::engine_detail {
namespace {

using kernels::OptimizerKind;

double param_or(const nlohmann::json& params, const char* key, double fallback) {
  auto it = params.find(key);
  return it != params.end() && it->is_number() ? it->get<double>() : fallback;
}

kernels::OptimizerHyper base_hyper(const config::Optimizer& opt) {
  kernels::OptimizerHyper h;
  h.beta1 = opt.betas[0];
  h.beta2 = opt.betas[1];
  h.eps = opt.eps;
  h.weight_decay = opt.weight_decay;
  h.bias_correction = opt.bias_correction;
  switch (opt.kind) {
    case config::OptimizerKind::Adam:
      h.kind = opt.adam_w_mode ? OptimizerKind::AdamW : OptimizerKind::Adam;
      break;
    case config::OptimizerKind::AdamW: h.kind = OptimizerKind::AdamW; break;
    case config::OptimizerKind::Adagrad:
      h.kind = OptimizerKind::Adagrad;
      h.lr_decay = param_or(opt.params, "lr_decay", 0.0);
      h.initial_accumulator_value = param_or(opt.params, "initial_accumulator_value", 0.0);
      break;
    case config::OptimizerKind::Lion: h.kind = OptimizerKind::Lion; break;
    case config::OptimizerKind::Sgd:
      h.kind = OptimizerKind::Sgd;
      h.momentum = opt.momentum;
      h.nesterov = opt.nesterov;
      h.dampening = param_or(opt.params, "dampening", 0.0);
      break;
    default:
      throw ConfigError("optimizer.type",
                        fmt::format("'{}' is not supported yet (zero implements Adam, AdamW, "
                                    "Adagrad, Lion and SGD)",
                                    opt.type));
  }
  return h;
}

}  // namespace

std::vector<GroupOptimizer> group_optimizers(const config::DsConfig& cfg,
                                             const std::vector<GroupOverrides>& groups) {
  if (!cfg.optimizer) {
    throw ConfigError("optimizer",
                      "missing: zero runs the optimizer itself, so the config must name one "
                      "(e.g. \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}})");
  }
  const kernels::OptimizerHyper base = base_hyper(*cfg.optimizer);
  std::vector<GroupOptimizer> out(std::max<std::size_t>(groups.size(), 1));
  for (std::size_t g = 0; g < out.size(); ++g) {
    out[g].hyper = base;
    out[g].base_lr = cfg.optimizer->lr;
    if (g < groups.size()) {
      if (groups[g].lr) out[g].base_lr = *groups[g].lr;
      if (groups[g].weight_decay) out[g].hyper.weight_decay = *groups[g].weight_decay;
    }
    try {
      kernels::validate_hyper(out[g].hyper);
      kernels::validate_step({.lr = out[g].base_lr, .step = 1, .grad_scale = 1.0});
    } catch (const Error& e) {
      throw Error(fmt::format("param group {}: {}", g, e.what()));
    }
  }
  return out;
}

}  // namespace zero::engine_detail
