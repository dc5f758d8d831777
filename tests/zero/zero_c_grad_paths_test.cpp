// The C ABI's two ways around copies: stage-3 units that stay gathered in place
// (zero_engine_unit_persistent) and gradients reduced where the caller wrote them
// (zero_engine_grad_lend), each checked against the plain path.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/zero/zero_c_problem.h"
#include "zero/zero_c.h"

using namespace zero::test;

TEST_CASE("zero_engine_unit_persistent names the stage-3 units that stay gathered, in place") {
  // The weight (32 elements) is over a persistence threshold of 10, the bias (8) under it.
  std::string text = config_text(3, "fp32");
  text.replace(text.find(R"("stage": 3)"), 10,
               R"("stage": 3, "stage3_param_persistence_threshold": 10)");
  const std::vector<zero_param_spec> specs = specs_of(ZERO_DTYPE_F32);
  int calls = 0;
  zero_engine* e = nullptr;
  REQUIRE(zero_engine_create(text.c_str(), nullptr, specs.data(), specs.size(), nullptr,
                             init_weights, &calls, &e) == ZERO_OK);
  int persistent = -1;
  REQUIRE(zero_engine_unit_persistent(e, 0, &persistent) == ZERO_OK);
  CHECK(persistent == 0);
  REQUIRE(zero_engine_unit_persistent(e, 1, &persistent) == ZERO_OK);
  CHECK(persistent == 1);

  // The persistent unit is readable without a gather, and every step refreshes it where it is.
  const void* before = nullptr;
  std::size_t bytes = 0;
  REQUIRE(zero_engine_param(e, 1, &before, &bytes) == ZERO_OK);
  REQUIRE(bytes == kNumel[1] * sizeof(float));
  const std::vector<float> initial(static_cast<const float*>(before),
                                   static_cast<const float*>(before) + kNumel[1]);
  CHECK(initial[0] == 1.5f + 0.01f);  // init_weights' value for parameter 1, element 0
  zero_step_result r{};
  for (int k = 0; k < 6; ++k) micro_step(e, ZERO_DTYPE_F32, &r);
  REQUIRE(r.global_steps == 3);
  const void* after = nullptr;
  REQUIRE(zero_engine_param(e, 1, &after, &bytes) == ZERO_OK);
  CHECK(after == before);
  std::vector<float> master(kNumel[1]);
  REQUIRE(zero_engine_gather_master(e, 1, master.data(), master.size()) == ZERO_OK);
  for (std::size_t i = 0; i < kNumel[1]; ++i) {
    INFO("element " << i);
    CHECK(static_cast<const float*>(after)[i] == master[i]);  // the refreshed values
    CHECK(master[i] != initial[i]);                            // which the steps moved
  }

  CHECK(zero_engine_unit_persistent(e, 2, &persistent) != ZERO_OK);
  CHECK_THAT(zero_last_error(), Catch::Contains("unit 2"));
  CHECK(zero_engine_unit_persistent(e, 0, nullptr) != ZERO_OK);
  CHECK_THAT(zero_last_error(), Catch::Contains("persistent must not be null"));
  zero_engine_destroy(e);

  // Stages 0-2: no unit is persistent (every parameter keeps its address anyway).
  REQUIRE(zero_engine_create(config_text(2, "fp32").c_str(), nullptr, specs.data(), specs.size(),
                             nullptr, init_weights, &calls, &e) == ZERO_OK);
  persistent = -1;
  REQUIRE(zero_engine_unit_persistent(e, 1, &persistent) == ZERO_OK);
  CHECK(persistent == 0);
  zero_engine_destroy(e);
}

namespace {

// A unit big enough to be reduced alone (a slice of at least 2^14 elements on one rank) and a
// small one that goes through a bucket.
constexpr std::int64_t kBigShape[] = {128, 256};
constexpr std::size_t kBigNumel = 128 * 256;

enum class GradPath { Copy, Lend, LendMisaligned };

struct LendRun {
  std::vector<std::vector<float>> params;  // after training
  int lent = 0;                            // calls that kept the caller's memory
};

// Four windows of two micro-steps at `stage`, each gradient handed in along `path`.
LendRun train_handing_in(int stage, GradPath path) {
  const std::vector<zero_param_spec> specs = {
      {"big.weight", kBigShape, 2, ZERO_DTYPE_F32, 0, 0, 1, nullptr, 0},
      {"small.bias", kShape1, 1, ZERO_DTYPE_F32, 0, 1, 1, nullptr, 0}};
  const std::size_t numel[] = {kBigNumel, kNumel[1]};
  int calls = 0;
  zero_engine* e = nullptr;
  REQUIRE(zero_engine_create(config_text(stage, "fp32").c_str(), nullptr, specs.data(),
                             specs.size(), nullptr, init_weights, &calls, &e) == ZERO_OK);
  LendRun run;
  zero_step_result r{};
  for (int micro = 0; micro < 8; ++micro) {
    double scale = 0;
    REQUIRE(zero_engine_backward_scale(e, &scale) == ZERO_OK);
    // Each gradient in memory of its own, 64-byte aligned (+1 element when misaligned on purpose),
    // alive and untouched until step() returns.
    std::vector<std::vector<float>> memory(2);
    for (std::size_t p = 2; p-- > 0;) {
      const void* data = nullptr;
      std::size_t bytes = 0;
      REQUIRE(zero_engine_param(e, p, &data, &bytes) == ZERO_OK);
      const auto* w = static_cast<const float*>(data);
      memory[p].resize(numel[p] + 32);
      float* g = memory[p].data();
      while (reinterpret_cast<std::uintptr_t>(g) % 64 != 0) ++g;
      if (path == GradPath::LendMisaligned) ++g;
      for (std::size_t i = 0; i < numel[p]; ++i) {
        g[i] = static_cast<float>((w[i] - target(p, i)) * scale * (1.0 + 0.1 * micro));
      }
      if (path == GradPath::Copy) {
        REQUIRE(zero_engine_grad_copy(e, p, g, numel[p] * sizeof(float)) == ZERO_OK);
      } else {
        int lent = -1;
        REQUIRE(zero_engine_grad_lend(e, p, g, numel[p] * sizeof(float), &lent) == ZERO_OK);
        CHECK(lent == (path == GradPath::Lend && p == 0 ? 1 : 0));
        run.lent += lent;
      }
    }
    REQUIRE(zero_engine_step(e, &r) == ZERO_OK);
  }
  REQUIRE(r.global_steps == 4);
  for (std::size_t p = 0; p < 2; ++p) {
    const void* data = nullptr;
    std::size_t bytes = 0;
    REQUIRE(zero_engine_param(e, p, &data, &bytes) == ZERO_OK);
    const auto* w = static_cast<const float*>(data);
    run.params.emplace_back(w, w + numel[p]);
  }
  zero_engine_destroy(e);
  return run;
}

}  // namespace

TEST_CASE("zero_engine_grad_lend reduces a lone unit's gradient where it is, bitwise as a copy") {
  const int stage = GENERATE(0, 2, 3);
  INFO("stage " << stage);
  const LendRun copied = train_handing_in(stage, GradPath::Copy);
  const LendRun lent = train_handing_in(stage, GradPath::Lend);
  const LendRun misaligned = train_handing_in(stage, GradPath::LendMisaligned);
  CHECK(lent.lent == 8);  // the big unit's gradient, every micro-step
  CHECK(misaligned.lent == 0);
  for (std::size_t p = 0; p < 2; ++p) {
    INFO("parameter " << p);
    CHECK(lent.params[p] == copied.params[p]);
    CHECK(misaligned.params[p] == copied.params[p]);
    // Not vacuous: training moved every weight away from its initial value.
    for (std::size_t i = 0; i < copied.params[p].size(); i += 997) {
      CHECK(copied.params[p][i] != 1.5f + 0.01f * static_cast<float>(i + p));
    }
  }
}
