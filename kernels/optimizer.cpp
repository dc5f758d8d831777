#include "kernels/optimizer.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "zero/base/error.h"

namespace zero::kernels {

namespace {

void check_non_negative(OptimizerKind kind, const char* name, double value) {
  ZERO_CHECK(std::isfinite(value) && value >= 0.0, "{}: {} must be finite and >= 0, got {}",
             optimizer_name(kind), name, value);
}

void check_beta(OptimizerKind kind, const char* name, double value) {
  ZERO_CHECK(std::isfinite(value) && value >= 0.0 && value < 1.0,
             "{}: {} must be in [0, 1), got {}", optimizer_name(kind), name, value);
}

bool is_adam(OptimizerKind kind) {
  return kind == OptimizerKind::Adam || kind == OptimizerKind::AdamW;
}

void check_array(OptimizerKind kind, const char* name, const void* pointer, DType dtype) {
  ZERO_CHECK(pointer != nullptr, "{}: {} is null", optimizer_name(kind), name);
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  ZERO_CHECK(address % dtype_size(dtype) == 0, "{}: {} at {} is not aligned to its {} elements",
             optimizer_name(kind), name, pointer, dtype_name(dtype));
}

}  // namespace

std::string_view optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::Adam: return "adam";
    case OptimizerKind::AdamW: return "adamw";
    case OptimizerKind::Adagrad: return "adagrad";
    case OptimizerKind::Lion: return "lion";
    case OptimizerKind::Sgd: return "sgd";
  }
  return "?";
}

std::optional<OptimizerKind> parse_optimizer_kind(std::string_view name) {
  for (auto kind : {OptimizerKind::Adam, OptimizerKind::AdamW, OptimizerKind::Adagrad,
                    OptimizerKind::Lion, OptimizerKind::Sgd}) {
    if (name == optimizer_name(kind)) return kind;
  }
  return std::nullopt;
}

int optimizer_state_count(const OptimizerHyper& hyper) {
  return math::optimizer_state_count(hyper.kind, hyper.momentum != 0.0);
}

float optimizer_state_initial_value(const OptimizerHyper& hyper, int index) {
  if (hyper.kind == OptimizerKind::Adagrad && index == 0) {
    return static_cast<float>(hyper.initial_accumulator_value);
  }
  return 0.0f;
}

void validate_hyper(const OptimizerHyper& h) {
  const OptimizerKind kind = h.kind;
  check_non_negative(kind, "weight_decay", h.weight_decay);
  if (is_adam(kind) || kind == OptimizerKind::Lion) {
    check_beta(kind, "beta1", h.beta1);
    check_beta(kind, "beta2", h.beta2);
  }
  if (is_adam(kind) || kind == OptimizerKind::Adagrad) check_non_negative(kind, "eps", h.eps);
  if (kind == OptimizerKind::Adagrad) {
    check_non_negative(kind, "lr_decay", h.lr_decay);
    check_non_negative(kind, "initial_accumulator_value", h.initial_accumulator_value);
  }
  if (kind == OptimizerKind::Sgd) {
    check_non_negative(kind, "momentum", h.momentum);
    ZERO_CHECK(std::isfinite(h.dampening), "sgd: dampening must be finite, got {}", h.dampening);
    ZERO_CHECK(!h.nesterov || (h.momentum > 0.0 && h.dampening == 0.0),
               "sgd: nesterov needs momentum > 0 and dampening 0, got momentum {} dampening {}",
               h.momentum, h.dampening);
  }
}

void validate_step(const StepScalars& s) {
  ZERO_CHECK(std::isfinite(s.lr) && s.lr >= 0.0, "lr must be finite and >= 0, got {}", s.lr);
  ZERO_CHECK(s.step >= 1, "step must be >= 1 (the 1-based number of this step), got {}", s.step);
  ZERO_CHECK(std::isfinite(s.grad_scale) && s.grad_scale > 0.0,
             "grad_scale must be finite and > 0, got {}", s.grad_scale);
}

void validate_tensors(const OptimizerHyper& hyper, const OptimizerTensors& t) {
  const OptimizerKind kind = hyper.kind;
  ZERO_CHECK(
      t.grad_dtype == DType::F32 || t.grad_dtype == DType::BF16 || t.grad_dtype == DType::F16,
      "{}: grad_dtype must be fp32, bf16 or fp16, got {}", optimizer_name(kind),
      dtype_name(t.grad_dtype));
  ZERO_CHECK(t.state_dtype == DType::F32 || t.state_dtype == DType::BF16,
             "{}: state_dtype must be fp32 or bf16, got {}", optimizer_name(kind),
             dtype_name(t.state_dtype));
  ZERO_CHECK(t.param_out == nullptr || t.param_out_dtype == DType::BF16 ||
                 t.param_out_dtype == DType::F16 || t.param_out_dtype == DType::F32,
             "{}: param_out_dtype must be bf16, fp16 or fp32, got {}", optimizer_name(kind),
             dtype_name(t.param_out_dtype));
  ZERO_CHECK(t.numel <= static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()) / 8,
             "{}: numel {} is too large", optimizer_name(kind), t.numel);
  if (t.numel == 0) return;
  check_array(kind, "master", t.master, DType::F32);
  check_array(kind, "grad", t.grad, t.grad_dtype);
  const int states = optimizer_state_count(hyper);
  if (states > 0) check_array(kind, "state0", t.state0, t.state_dtype);
  if (states > 1) check_array(kind, "state1", t.state1, t.state_dtype);
  if (t.param_out != nullptr) check_array(kind, "param_out", t.param_out, t.param_out_dtype);
}

math::StepCoeffs make_step_coeffs(const OptimizerHyper& h, const StepScalars& s) {
  validate_hyper(h);
  validate_step(s);
  const auto f = [](double x) { return static_cast<float>(x); };
  math::StepCoeffs c{};
  c.kind = h.kind;
  const float grad_scale = f(s.grad_scale);
  const double step = static_cast<double>(s.step);

  const bool correct = h.bias_correction;
  const double bias_correction1 = correct ? 1.0 - std::pow(h.beta1, step) : 1.0;
  const double bias_correction2 = correct ? 1.0 - std::pow(h.beta2, step) : 1.0;
  c.adam.grad_scale = grad_scale;
  c.adam.beta1 = f(h.beta1);
  c.adam.one_minus_beta1 = f(1.0 - h.beta1);
  c.adam.beta2 = f(h.beta2);
  c.adam.one_minus_beta2 = f(1.0 - h.beta2);
  c.adam.eps = f(h.eps);
  c.adam.inv_bias_correction2_sqrt = f(1.0 / std::sqrt(bias_correction2));
  c.adam.neg_step_size = f(-(s.lr / bias_correction1));
  c.adam.l2 = h.kind == OptimizerKind::Adam && h.weight_decay != 0.0;
  c.adam.l2_weight_decay = c.adam.l2 ? f(h.weight_decay) : 0.0f;
  c.adam.decoupled = h.kind == OptimizerKind::AdamW;
  c.adam.decay_factor = c.adam.decoupled ? f(1.0 - s.lr * h.weight_decay) : 1.0f;

  c.adagrad.grad_scale = grad_scale;
  c.adagrad.eps = f(h.eps);
  c.adagrad.neg_clr = f(-(s.lr / (1.0 + (step - 1.0) * h.lr_decay)));
  c.adagrad.l2 = h.weight_decay != 0.0;
  c.adagrad.weight_decay = f(h.weight_decay);

  c.lion.grad_scale = grad_scale;
  c.lion.beta1 = f(h.beta1);
  c.lion.one_minus_beta1 = f(1.0 - h.beta1);
  c.lion.beta2 = f(h.beta2);
  c.lion.one_minus_beta2 = f(1.0 - h.beta2);
  c.lion.neg_lr = f(-s.lr);
  c.lion.decay_factor = f(1.0 - s.lr * h.weight_decay);

  c.sgd.grad_scale = grad_scale;
  c.sgd.weight_decay = f(h.weight_decay);
  c.sgd.momentum = f(h.momentum);
  c.sgd.one_minus_dampening = f(1.0 - h.dampening);
  c.sgd.neg_lr = f(-s.lr);
  c.sgd.l2 = h.weight_decay != 0.0;
  c.sgd.use_momentum = h.momentum != 0.0;
  c.sgd.first_step = s.step == 1;
  c.sgd.nesterov = h.nesterov;
  return c;
}

}  // namespace zero::kernels
