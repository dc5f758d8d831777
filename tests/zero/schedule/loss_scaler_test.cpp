#include "zero/schedule/loss_scaler.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "zero/base/error.h"

TEST_CASE("the dynamic loss scaler reproduces DeepSpeed 0.19.6's scale sequences") {
  std::ifstream in(std::string(ZERO_TEST_GOLDEN_DIR) + "/deepspeed/loss_scale.json");
  REQUIRE(in.good());
  const auto golden = nlohmann::json::parse(in);
  REQUIRE(golden.at("cases").size() >= 3);
  for (const auto& c : golden.at("cases")) {
    const auto& p = c.at("params");
    INFO("params " << p.dump());
    zero::LossScalerParams params;
    params.dynamic = true;
    params.initial_scale = p.at("init_scale").get<double>();
    params.scale_window = p.at("scale_window").get<std::int64_t>();
    params.min_scale = p.at("min_scale").get<double>();
    params.hysteresis = p.at("delayed_shift").get<std::int64_t>();
    params.consecutive_hysteresis = p.at("consecutive_hysteresis").get<bool>();
    zero::LossScaler scaler(params);
    bool scale_changed = false;
    const auto& seq = c.at("sequence");
    for (std::size_t t = 0; t < seq.size(); ++t) {
      INFO("step " << t);
      CHECK(scaler.scale() == seq[t].at("scale_before").get<double>());
      scaler.update(seq[t].at("overflow").get<bool>());
      CHECK(scaler.scale() == seq[t].at("scale_after").get<double>());
      if (seq[t].at("scale_before") != seq[t].at("scale_after")) scale_changed = true;
    }
    CHECK(scale_changed);
  }
}

TEST_CASE("an overflow at min_loss_scale stops training and leaves the scaler unchanged") {
  zero::LossScalerParams params;
  params.dynamic = true;
  params.initial_scale = 4;
  params.min_scale = 2;
  params.hysteresis = 1;
  zero::LossScaler scaler(params);
  scaler.update(true);
  REQUIRE(scaler.scale() == 2);
  const auto before = scaler.state();
  REQUIRE_THROWS_WITH(scaler.update(true), Catch::Contains("min_loss_scale (2)"));
  CHECK(scaler.state().iteration == before.iteration);
  CHECK(scaler.scale() == 2);
}

TEST_CASE("a static loss scale never changes, even on overflow") {
  zero::LossScalerParams params;
  params.static_scale = 4096;
  zero::LossScaler scaler(params);
  scaler.update(true);
  scaler.update(false);
  CHECK(scaler.scale() == 4096);
  CHECK_FALSE(scaler.dynamic());
}

TEST_CASE("the first doubling comes on the (window + 1)-th clean step, as since DeepSpeed 0.17.1") {
  zero::LossScalerParams params;
  params.dynamic = true;
  params.initial_scale = 8;
  params.scale_window = 3;
  zero::LossScaler scaler(params);
  for (int i = 0; i < 3; ++i) scaler.update(false);
  CHECK(scaler.scale() == 8);
  scaler.update(false);
  CHECK(scaler.scale() == 16);
}
