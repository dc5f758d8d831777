#include "zero/schedule/lr_schedule.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "config/ds_config.h"
#include "zero/base/error.h"
#include "zero/schedule/from_config.h"

namespace {

constexpr double kRelTol = 1e-12;

nlohmann::json load_golden(const std::string& name) {
  std::ifstream in(std::string(ZERO_TEST_GOLDEN_DIR) + "/deepspeed/" + name);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// The config a golden case was produced with: the optimizer's lr and the scheduler block.
zero::config::DsConfig config_of(const nlohmann::json& golden_case) {
  return zero::config::load_config_json(
      {{"train_batch_size", 1},
       {"optimizer",
        {{"type", "Adam"},
         {"params", {{"lr", golden_case.at("optimizer_lr")}, {"betas", {0.9, 0.999}}}}}},
       {"scheduler", golden_case.at("scheduler")}});
}

}  // namespace

TEST_CASE("every DeepSpeed LR schedule reproduces DeepSpeed 0.19.6's own sequence") {
  const auto golden = load_golden("schedules.json");
  REQUIRE(golden.at("cases").size() == 6);
  for (const auto& c : golden.at("cases")) {
    const std::string type = c.at("scheduler").at("type");
    INFO("scheduler " << c.at("scheduler").dump());
    const auto cfg = config_of(c);
    const auto params = zero::lr_schedule_from_config(cfg);
    CHECK(params.kind != zero::LrScheduleKind::Constant);
    const zero::GroupBase base = zero::group_base_from_config(cfg);
    REQUIRE(base.lr == c.at("optimizer_lr").get<double>());
    const auto& steps = c.at("steps");
    REQUIRE(steps.size() >= 40);
    bool lr_varies = false;
    for (std::size_t t = 0; t < steps.size(); ++t) {
      INFO("optimizer step " << t);
      const auto v = zero::scheduled_values(params, base, 0, static_cast<std::int64_t>(t) - 1);
      const double want = steps[t].at("lr").get<double>();
      CHECK(v.lr == Approx(want).epsilon(kRelTol).margin(1e-15));
      if (t > 0 && want != steps[t - 1].at("lr").get<double>()) lr_varies = true;
      REQUIRE(v.betas.has_value());
      CHECK((*v.betas)[0] == Approx(steps[t].at("betas")[0].get<double>()).epsilon(kRelTol));
      CHECK((*v.betas)[1] == Approx(steps[t].at("betas")[1].get<double>()).epsilon(kRelTol));
    }
    CHECK(lr_varies);  // a flat sequence would prove nothing about the formula
  }
}

TEST_CASE("WarmupLR takes per-group lists and the optimizer lr when warmup_max_lr is absent") {
  zero::LrScheduleParams p;
  p.kind = zero::LrScheduleKind::WarmupLR;
  p.warmup_min_lr = {0.0, 1e-4};
  p.warmup_num_steps = 4;
  p.warmup_type = zero::WarmupType::Linear;
  const zero::GroupBase base{0.5, std::nullopt};
  CHECK(zero::scheduled_values(p, base, 0, 2).lr == Approx(0.25));
  CHECK(zero::scheduled_values(p, base, 1, 10).lr == Approx(0.5));
  CHECK(zero::scheduled_values(p, base, 1, -1).lr == Approx(1e-4));
  REQUIRE_THROWS_WITH(zero::scheduled_values(p, base, 2, 0), Catch::Contains("group 2"));
}

TEST_CASE("WarmupCosineLR stays at cos_min_ratio past total_num_steps") {
  zero::LrScheduleParams p;
  p.kind = zero::LrScheduleKind::WarmupCosineLR;
  p.total_num_steps = 20;
  p.warmup_num_steps = 5;
  const zero::GroupBase base{1.0, std::nullopt};
  CHECK(zero::scheduled_values(p, base, 0, 19).lr == Approx(1e-4));
  CHECK(zero::scheduled_values(p, base, 0, 100).lr == Approx(1e-4));
  CHECK(zero::scheduled_values(p, base, 0, 4).lr > 0.5);
}

TEST_CASE(
    "OneCycle staircase holds the rate flat across each stair and leaves SGD momentum alone") {
  zero::LrScheduleParams p;
  p.kind = zero::LrScheduleKind::OneCycle;
  p.cycle_min_lr = 0.0;
  p.cycle_max_lr = 1.0;
  p.cycle_first_step_size = 8;
  p.cycle_first_stair_count = 4;
  const zero::GroupBase sgd{0.1, std::nullopt};
  // Positions 1..8 of the rising half: stairs at 2, 4, 6, 8 steps.
  CHECK(zero::scheduled_values(p, sgd, 0, 0).lr == 0.0);
  CHECK(zero::scheduled_values(p, sgd, 0, 1).lr == 0.25);
  CHECK(zero::scheduled_values(p, sgd, 0, 2).lr == 0.25);
  CHECK(zero::scheduled_values(p, sgd, 0, 7).lr == 1.0);
  CHECK_FALSE(zero::scheduled_values(p, sgd, 0, 3).betas.has_value());
}

TEST_CASE("LR schedules reject parameters DeepSpeed rejects, naming them") {
  zero::LrScheduleParams p;
  p.kind = zero::LrScheduleKind::WarmupLR;
  p.warmup_num_steps = 0;
  REQUIRE_THROWS_WITH(zero::scheduled_values(p, {}, 0, 0), Catch::Contains("warmup_num_steps"));
  p.kind = zero::LrScheduleKind::LRRangeTest;
  p.lr_range_test_step_size = 0;
  REQUIRE_THROWS_WITH(zero::scheduled_values(p, {}, 0, 0),
                      Catch::Contains("lr_range_test_step_size"));
}
