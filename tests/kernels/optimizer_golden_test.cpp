// Our kernels replay PyTorch's trajectories (tests/golden, produced by torch.optim) on every ISA.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/optimizer.h"
#include "tests/kernels/test_util.h"
#include "zero/io/safetensors.h"

namespace zk = zero::kernels;

namespace {

// A correct fp32 implementation stays within ~2.4e-7 of these trajectories; 1e-5 is the
// acceptance bound, applied as |ours − torch| <= atol + rtol·|torch|.
constexpr double kGoldenAtol = 1e-5;
constexpr double kGoldenRtol = 1e-5;
// The trajectories must move the parameters at least this much for the comparison to mean anything.
constexpr double kMinMovement = 1e-5;

struct Golden {
  zk::OptimizerHyper hyper;
  double lr = 0;
  std::vector<float> p0, grads, params;
  std::vector<std::pair<std::string, std::vector<float>>> final_states;
  std::size_t n = 0, steps = 0;
};

Golden load(const std::string& path) {
  const auto r = zero::io::SafetensorsReader::open(path);
  Golden g;
  const auto kind = zk::parse_optimizer_kind(r.metadata().at("optimizer"));
  REQUIRE(kind.has_value());
  g.hyper.kind = *kind;
  const auto h = nlohmann::json::parse(r.metadata().at("hyper"));
  g.lr = h.at("lr").get<double>();
  if (h.contains("betas")) {
    g.hyper.beta1 = h["betas"][0].get<double>();
    g.hyper.beta2 = h["betas"][1].get<double>();
  }
  if (h.contains("eps")) g.hyper.eps = h["eps"].get<double>();
  g.hyper.weight_decay = h.value("weight_decay", 0.0);
  g.hyper.momentum = h.value("momentum", 0.0);
  g.hyper.dampening = h.value("dampening", 0.0);
  g.hyper.nesterov = h.value("nesterov", false);
  g.hyper.lr_decay = h.value("lr_decay", 0.0);
  g.hyper.initial_accumulator_value = h.value("initial_accumulator_value", 0.0);
  g.p0 = r.read_f32("p0");
  g.grads = r.read_f32("grads");
  g.params = r.read_f32("params");
  g.n = g.p0.size();
  g.steps = g.grads.size() / g.n;
  for (const auto& t : r.tensors()) {
    if (t.name.rfind("state.", 0) == 0) g.final_states.emplace_back(t.name, r.read_f32(t.name));
  }
  return g;
}

std::vector<std::string> golden_files() {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(ZERO_TEST_GOLDEN_DIR)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string state_name(zk::OptimizerKind kind, int index) {
  switch (kind) {
    case zk::OptimizerKind::Adam:
    case zk::OptimizerKind::AdamW: return index == 0 ? "state.exp_avg" : "state.exp_avg_sq";
    case zk::OptimizerKind::Adagrad: return "state.sum";
    case zk::OptimizerKind::Lion: return "state.exp_avg";
    case zk::OptimizerKind::Sgd: return "state.momentum_buffer";
  }
  return "";
}

bool close(double ours, double torch) {
  return std::fabs(ours - torch) <= kGoldenAtol + kGoldenRtol * std::fabs(torch);
}

}  // namespace

TEST_CASE("every ISA path follows torch.optim's golden trajectories within 1e-5 at every step") {
  const auto files = golden_files();
  REQUIRE(files.size() == 8);
  for (const auto& file : files) {
    const Golden g = load(file);
    double movement = 0;
    for (std::size_t i = 0; i < g.n; ++i) {
      movement = std::max(movement, std::fabs(double(g.params[(g.steps - 1) * g.n + i]) - g.p0[i]));
    }
    REQUIRE(movement > kMinMovement);
    for (zk::Isa isa : zk::test::runnable_isas()) {
      INFO(file << " optimizer " << zk::optimizer_name(g.hyper.kind) << " isa " << zk::isa_name(isa)
                << " lr " << g.lr << " wd " << g.hyper.weight_decay);
      std::vector<float> master = g.p0;
      const int state_count = zk::optimizer_state_count(g.hyper);
      std::vector<std::vector<float>> states;
      for (int s = 0; s < state_count; ++s) {
        states.emplace_back(g.n, zk::optimizer_state_initial_value(g.hyper, s));
      }
      for (std::size_t t = 0; t < g.steps; ++t) {
        zk::OptimizerTensors tensors;
        tensors.master = master.data();
        tensors.grad = g.grads.data() + t * g.n;
        tensors.state0 = state_count > 0 ? states[0].data() : nullptr;
        tensors.state1 = state_count > 1 ? states[1].data() : nullptr;
        tensors.numel = g.n;
        zk::optimizer_step_cpu(g.hyper, {g.lr, static_cast<std::int64_t>(t + 1), 1.0}, tensors,
                               {2, isa});
        std::size_t bad = 0;
        for (std::size_t i = 0; i < g.n; ++i)
          bad += close(master[i], g.params[t * g.n + i]) ? 0 : 1;
        INFO("step " << t + 1);
        REQUIRE(bad == 0);
      }
      REQUIRE(static_cast<int>(g.final_states.size()) == state_count);
      for (int s = 0; s < state_count; ++s) {
        const std::string name = state_name(g.hyper.kind, s);
        INFO(name);
        const auto it = std::find_if(g.final_states.begin(), g.final_states.end(),
                                     [&](const auto& e) { return e.first == name; });
        REQUIRE(it != g.final_states.end());
        std::size_t bad = 0;
        for (std::size_t i = 0; i < g.n; ++i) bad += close(states[s][i], it->second[i]) ? 0 : 1;
        REQUIRE(bad == 0);
      }
    }
  }
}
