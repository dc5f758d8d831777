// One model copy for every process (EngineImpl's shared model): engines over ShmComm processes,
// through the C ABI, train with the bits of private copies (ZERO_SHARED_MODEL=0: at stages 1/2
// copies the step pushes into, at stage 3 units gathered per use), every rank reads every slice of
// the one copy, and destroying the engines (a barrier) leaves nothing behind.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/zero/comm/forked_ranks.h"
#include "zero/zero_c.h"

namespace {

constexpr int kWorld = 2;
constexpr int kSteps = 5;
// 80 KiB of fp32 weights: the model copy lies in rank 0's shared arena (blocks of 64 KiB and
// more), so the processes can share it.
constexpr std::int64_t kShapeW[] = {160, 128};
constexpr std::int64_t kShapeB[] = {128};
constexpr std::size_t kNumel[] = {160 * 128, 128};
constexpr std::size_t kTotal = kNumel[0] + kNumel[1];
// Per rank: the final master weights, then what zero_engine_param showed after the last step,
// then shared_model_bytes, pushed_bytes and gathers.
constexpr std::size_t kSlot = 2 * kTotal + 3;

const zero_param_spec kSpecs[] = {
    {"w", kShapeW, 2, ZERO_DTYPE_F32, 0, 0, 1, nullptr, 0},
    {"b", kShapeB, 1, ZERO_DTYPE_F32, 0, 1, 1, nullptr, 0},
};

float initial(std::size_t p, std::size_t e) {
  return 0.25f * std::cos(0.001f * static_cast<float>(e + 3 * p));
}

int init_values(void*, std::size_t index, float* out, std::size_t numel) {
  for (std::size_t e = 0; e < numel; ++e) out[e] = initial(index, e);
  return 0;
}

// At stage 3 no unit is persistent by the thresholds: a private copy is gathered per use.
std::string config_text(int stage) {
  return R"({"train_batch_size": )" + std::to_string(kWorld) +
         R"(, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
  "zero_optimization": {"stage3_param_persistence_threshold": 0, "stage": )" +
         std::to_string(stage) + "}}";
}

void require_ok(int status) {
  if (status != ZERO_OK) throw std::runtime_error(zero_last_error());
}

// One rank: each gradient depends on the weights it reads (the peer's slices included) and on
// the rank, so a slice missing from the copy changes the result.
void train_rank(zero_comm* comm, int rank, int stage, float* slot) {
  const std::string config = config_text(stage);
  zero_engine* e = nullptr;
  require_ok(zero_engine_create(config.c_str(), comm, kSpecs, 2, nullptr, init_values, nullptr,
                                &e));
  // Each parameter is a unit of its own (kSpecs): at stage 3 gathered around its use.
  auto gather = [&](std::size_t p) {
    if (stage == 3) require_ok(zero_engine_gather(e, static_cast<int>(p)));
  };
  auto release = [&](std::size_t p) {
    if (stage == 3) require_ok(zero_engine_release(e, static_cast<int>(p)));
  };
  for (int step = 0; step < kSteps; ++step) {
    for (std::size_t p = 2; p-- > 0;) {
      gather(p);
      const void* data = nullptr;
      std::size_t bytes = 0;
      require_ok(zero_engine_param(e, p, &data, &bytes));
      const auto* w = static_cast<const float*>(data);
      void* g = nullptr;
      require_ok(zero_engine_grad(e, p, &g, &bytes));
      auto* grad = static_cast<float*>(g);
      for (std::size_t i = 0; i < kNumel[p]; ++i) {
        const float target = std::sin(0.01f * static_cast<float>(i) + static_cast<float>(rank));
        grad[i] = w[i] - target + w[(i * 7 + 1) % kNumel[p]];
      }
      require_ok(zero_engine_grad_ready(e, p));
      release(p);
    }
    require_ok(zero_engine_step(e, nullptr));
  }
  require_ok(zero_engine_gather_master(e, 0, slot, kNumel[0]));
  require_ok(zero_engine_gather_master(e, 1, slot + kNumel[0], kNumel[1]));
  for (std::size_t p = 0, at = kTotal; p < 2; at += kNumel[p], ++p) {
    gather(p);
    const void* data = nullptr;
    std::size_t bytes = 0;
    require_ok(zero_engine_param(e, p, &data, &bytes));
    std::memcpy(slot + at, data, bytes);
    release(p);
  }
  char* text = nullptr;
  require_ok(zero_engine_timings_json(e, &text));
  const nlohmann::json timings = nlohmann::json::parse(text);
  zero_free(text);
  slot[2 * kTotal] = timings.at("shared_model_bytes").get<float>();
  slot[2 * kTotal + 1] = timings.at("pushed_bytes").get<float>();
  slot[2 * kTotal + 2] = timings.at("gathers").get<float>();
  zero_engine_destroy(e);
}

// Every rank's slot after a launch of kWorld processes, with ZERO_SHARED_MODEL as given (null:
// unset, the default).
std::vector<std::vector<float>> launch(int stage, const char* shared_model) {
  zero::test::SharedRegion region(kWorld * kSlot * sizeof(float));
  const std::string name = zero::test::unique_shm_name("shared-model");
  zero::test::ForkedRanks ranks(kWorld, [&](int r) {
    if (shared_model != nullptr) ::setenv("ZERO_SHARED_MODEL", shared_model, 1);
    zero_comm* c = nullptr;
    require_ok(zero_comm_create_shm(name.c_str(), r, kWorld, 20000, &c));
    train_rank(c, r, stage, reinterpret_cast<float*>(region.data()) + r * kSlot);
    zero_comm_destroy(c);
  });
  const auto outcomes = ranks.wait();
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    INFO("rank " << r << ": " << outcomes[r].error);
    REQUIRE(outcomes[r].exit_code == 0);
  }
  std::vector<std::vector<float>> slots;
  for (int r = 0; r < kWorld; ++r) {
    const float* base = reinterpret_cast<const float*>(region.data()) + r * kSlot;
    slots.emplace_back(base, base + kSlot);
  }
  return slots;
}

std::vector<float> part(const std::vector<float>& slot, std::size_t from) {
  return {slot.begin() + static_cast<std::ptrdiff_t>(from),
          slot.begin() + static_cast<std::ptrdiff_t>(from + kTotal)};
}

}  // namespace

TEST_CASE("processes sharing one model copy train with the bits of private copies",
          "[engine][comm]") {
  const int stage = GENERATE(1, 2, 3);
  INFO("stage " << stage);
  const auto shared = launch(stage, nullptr);
  const auto private_copies = launch(stage, "0");
  const std::vector<float> master = part(shared[0], 0);
  // Guard against a vacuous pass: training moved every weight.
  double moved = 0;
  for (std::size_t e = 0; e < kNumel[0]; ++e) moved += std::abs(master[e] - initial(0, e));
  REQUIRE(moved > 1e-3 * static_cast<double>(kNumel[0]));
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    const auto& s = shared[static_cast<std::size_t>(r)];
    const auto& p = private_copies[static_cast<std::size_t>(r)];
    CHECK(s[2 * kTotal] > 0);       // its steps wrote into the shared copy
    CHECK(s[2 * kTotal + 1] == 0);  // and pushed nothing
    CHECK(s[2 * kTotal + 2] == 0);  // nor gathered anything
    CHECK(p[2 * kTotal] == 0);
    if (stage == 3) {
      CHECK(p[2 * kTotal + 2] > 0);  // each unit gathered per use
    } else {
      CHECK(p[2 * kTotal + 1] > 0);
    }
    CHECK(part(s, 0) == part(p, 0));
    CHECK(part(s, 0) == master);
    // fp32: the model copy is the master weights, every rank's slices of them.
    CHECK(part(s, kTotal) == master);
    CHECK(part(p, kTotal) == master);
  }
}
