// An installed zero used from C++ (zero/engine.h, static libraries): trains two parameters for two
// steps on one in-process rank and checks that every element moved. Exits 0 on success.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <span>
#include <vector>

#include "config/ds_config.h"
#include "zero/comm/inproc_comm.h"
#include "zero/device/device.h"
#include "zero/engine.h"

namespace {

constexpr char kConfig[] = R"({
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "Adam", "params": {"lr": 0.1}},
  "zero_optimization": {"stage": 1}
})";
constexpr int kSteps = 2;

std::vector<float> values(const zero::Engine& engine, std::size_t param) {
  const auto bytes = engine.param(param);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

int run() {
  const zero::config::Supplied supplied{.world_size = 1, .values = {}};
  const zero::config::DsConfig config = zero::config::load_config_string(kConfig, supplied);
  zero::InProcWorld world(1);
  const auto comm = world.comm(0);
  const auto device = zero::make_device("cpu", comm->rank());
  std::vector<zero::ParamSpec> specs(2);
  specs[0].name = "layer.weight";
  specs[0].shape = {2, 3};
  specs[1].name = "layer.bias";
  specs[1].shape = {3};
  specs[1].unit = 1;
  const zero::InitFn init = [](std::size_t index, std::span<float> out) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = 1.0f + 0.25f * float(i + index);
  };
  const auto engine = zero::Engine::create(config, *comm, *device, specs, init);

  std::vector<std::vector<float>> before;
  for (std::size_t p = 0; p < specs.size(); ++p) before.push_back(values(*engine, p));
  for (int step = 0; step < kSteps; ++step) {
    for (int unit = 0; unit < 2; ++unit) engine->gather(unit);
    const double scale = engine->backward_scale();
    for (std::size_t p = 0; p < specs.size(); ++p) {
      const std::span<std::byte> slot = engine->grad(p);
      std::vector<float> grad(before[p]);
      for (float& g : grad) g = static_cast<float>(g * scale);  // d/dw of 0.5 w^2
      std::memcpy(slot.data(), grad.data(), slot.size());
      engine->grad_ready(p);
      engine->release(static_cast<int>(p));
    }
    const zero::StepResult result = engine->step();
    std::printf("step %d: boundary %d, lr %g, grad_norm %g\n", step, int(result.boundary),
                result.lr, result.grad_norm);
    if (!result.boundary) {
      std::fprintf(stderr, "cpp_consumer: step %d was not an optimizer step\n", step);
      return 1;
    }
  }
  for (std::size_t p = 0; p < specs.size(); ++p) {
    const std::vector<float> after = values(*engine, p);
    for (std::size_t i = 0; i < after.size(); ++i) {
      if (!(std::fabs(after[i] - before[p][i]) > 0.0f) || !std::isfinite(after[i])) {
        std::fprintf(stderr, "cpp_consumer: %s[%zu] did not move: %g -> %g\n",
                     specs[p].name.c_str(), i, before[p][i], after[i]);
        return 1;
      }
    }
  }
  std::printf("%s[0]: %g -> %g\ncpp_consumer: ok\n", specs[0].name.c_str(), before[0][0],
              values(*engine, 0)[0]);
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpp_consumer: %s\n", e.what());
    return 1;
  }
}
