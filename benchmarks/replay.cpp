// zero-bench replay: runs our optimizer kernels over the gradients of a golden trajectory file
// (tests/golden/*.safetensors: p0 [n], grads [steps, n], metadata optimizer + hyper) and writes
// params [steps, n] and the final state.* tensors in the same layout, for st_compare.py.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "benchmarks/commands.h"
#include "cli/flags.h"
#include "kernels/isa.h"
#include "kernels/optimizer.h"
#include "zero/base/error.h"
#include "zero/io/safetensors.h"

namespace zero::bench {

namespace {

using kernels::OptimizerHyper;
using kernels::OptimizerKind;

struct ReplayArgs {
  std::string golden;
  std::string out;
  kernels::Isa isa = kernels::Isa::Auto;
};

ReplayArgs parse_args(std::span<const std::string> args) {
  ReplayArgs r;
  for (std::size_t i = 0; i < args.size(); ++i) {
    cli::FlagArg arg(args, i);
    const std::string& a = arg.name();
    if (a == "--out" && arg.has_value()) {
      r.out = arg.value("an output path");
    } else if (a == "--isa" && arg.has_value()) {
      const std::string text = arg.value("an ISA");
      const auto isa = kernels::parse_isa(text);
      ZERO_CHECK(isa.has_value(), "--isa {}: expected auto, scalar, avx2 or avx512", text);
      r.isa = *isa;
    } else if (!a.starts_with("--") && r.golden.empty()) {
      r.golden = a;
    } else {
      ZERO_CHECK(false, "unexpected argument '{}'", args[i]);
    }
  }
  ZERO_CHECK(!r.golden.empty() && !r.out.empty(),
             "usage: zero-bench replay GOLDEN.safetensors --out OUT.safetensors [--isa I]");
  return r;
}

// torch.optim's argument names and defaults; anything we do not implement is an error rather
// than silently ignored.
OptimizerHyper parse_hyper(const std::string& optimizer, const std::string& hyper_json,
                           double& lr) {
  const auto kind = kernels::parse_optimizer_kind(optimizer);
  ZERO_CHECK(kind.has_value(), "metadata optimizer '{}' is not adam, adamw, adagrad, lion or sgd",
             optimizer);
  OptimizerHyper h;
  h.kind = *kind;
  lr = 1e-3;
  if (h.kind == OptimizerKind::Adagrad) {
    lr = 1e-2;
    h.eps = 1e-10;
  }
  if (h.kind == OptimizerKind::Lion) {
    lr = 1e-4;
    h.beta2 = 0.99;
  }
  const auto j = nlohmann::json::parse(hyper_json);
  ZERO_CHECK(j.is_object(), "metadata hyper is not a JSON object: {}", hyper_json);
  const std::set<std::string> inert = {"foreach", "capturable", "differentiable", "fused"};
  for (const auto& [key, value] : j.items()) {
    if (key == "lr") {
      lr = value.get<double>();
    } else if (key == "betas") {
      ZERO_CHECK(value.is_array() && value.size() == 2,
                 "hyper betas must be [beta1, beta2], got {}", value.dump());
      h.beta1 = value[0].get<double>();
      h.beta2 = value[1].get<double>();
    } else if (key == "eps") {
      h.eps = value.get<double>();
    } else if (key == "weight_decay") {
      h.weight_decay = value.get<double>();
    } else if (key == "momentum") {
      h.momentum = value.get<double>();
    } else if (key == "dampening") {
      h.dampening = value.get<double>();
    } else if (key == "nesterov") {
      h.nesterov = value.get<bool>();
    } else if (key == "lr_decay") {
      h.lr_decay = value.get<double>();
    } else if (key == "initial_accumulator_value") {
      h.initial_accumulator_value = value.get<double>();
    } else if (key == "bias_correction") {
      h.bias_correction = value.get<bool>();
    } else if ((key == "amsgrad" || key == "maximize") && value == false) {
    } else if (inert.count(key) == 0) {
      ZERO_CHECK(false, "hyper-parameter {}={} is not supported", key, value.dump());
    }
  }
  kernels::validate_hyper(h);
  return h;
}

std::vector<std::string> state_names(const OptimizerHyper& h) {
  switch (h.kind) {
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW: return {"state.exp_avg", "state.exp_avg_sq"};
    case OptimizerKind::Adagrad: return {"state.sum"};
    case OptimizerKind::Lion: return {"state.exp_avg"};
    case OptimizerKind::Sgd:
      if (h.momentum != 0.0) return {"state.momentum_buffer"};
      return {};
  }
  return {};
}

}  // namespace

int run_replay(std::span<const std::string> argv) {
  const ReplayArgs args = parse_args(argv);
  const auto golden = io::SafetensorsReader::open(args.golden);
  const auto& meta = golden.metadata();
  ZERO_CHECK(meta.count("optimizer") && meta.count("hyper"),
             "{}: __metadata__ needs 'optimizer' and 'hyper'", args.golden);
  double lr = 0.0;
  const OptimizerHyper hyper = parse_hyper(meta.at("optimizer"), meta.at("hyper"), lr);

  const auto& p0_info = golden.at("p0");
  const auto& grads_info = golden.at("grads");
  ZERO_CHECK(p0_info.shape.size() == 1 && grads_info.shape.size() == 2 &&
                 grads_info.shape[1] == p0_info.shape[0],
             "{}: expected p0 [n] and grads [steps, n]", args.golden);
  const auto n = static_cast<std::size_t>(p0_info.shape[0]);
  const auto steps = static_cast<std::size_t>(grads_info.shape[0]);

  std::vector<float> master = golden.read_f32("p0");
  const std::vector<float> grads = golden.read_f32("grads");
  const int state_count = kernels::optimizer_state_count(hyper);
  std::vector<std::vector<float>> states;
  for (int s = 0; s < state_count; ++s) {
    states.emplace_back(n, kernels::optimizer_state_initial_value(hyper, s));
  }
  std::vector<float> params(steps * n);
  const kernels::CpuExec exec{0, args.isa};
  for (std::size_t t = 0; t < steps; ++t) {
    kernels::OptimizerTensors tensors;
    tensors.master = master.data();
    tensors.grad = grads.data() + t * n;
    tensors.state0 = state_count > 0 ? states[0].data() : nullptr;
    tensors.state1 = state_count > 1 ? states[1].data() : nullptr;
    tensors.numel = n;
    kernels::optimizer_step_cpu(hyper, {lr, static_cast<std::int64_t>(t + 1), 1.0}, tensors, exec);
    std::copy(master.begin(), master.end(), params.begin() + static_cast<std::ptrdiff_t>(t * n));
  }

  io::SafetensorsWriter out;
  for (const auto& [key, value] : meta) out.set_metadata(key, value);
  out.set_metadata("replayed_by", fmt::format("zero-bench replay --isa {}",
                                              kernels::isa_name(kernels::resolve_isa(args.isa))));
  out.add_f32("params", {static_cast<std::int64_t>(steps), static_cast<std::int64_t>(n)}, params);
  const auto names = state_names(hyper);
  for (std::size_t s = 0; s < names.size(); ++s) {
    out.add_f32(names[s], {static_cast<std::int64_t>(n)}, states[s]);
  }
  out.write(args.out);
  std::printf("replayed %s: %s, %zu steps of %zu params on %s -> %s\n", args.golden.c_str(),
              meta.at("optimizer").c_str(), steps, n,
              std::string(kernels::isa_name(kernels::resolve_isa(args.isa))).c_str(),
              args.out.c_str());
  return 0;
}

}  // namespace zero::bench
