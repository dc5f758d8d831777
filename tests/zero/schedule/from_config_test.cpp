#include "zero/schedule/from_config.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "config/ds_config.h"
#include "zero/base/error.h"

namespace {

using nlohmann::json;

zero::config::DsConfig load(const json& doc, const zero::config::Supplied& supplied = {}) {
  INFO("config " << doc.dump());
  return zero::config::load_config_json(doc, supplied);
}

// The problem paths a ConfigError thrown by `read` names.
template <typename Read>
std::vector<std::string> problem_paths(Read read) {
  try {
    read();
  } catch (const zero::ConfigError& e) {
    std::vector<std::string> paths;
    for (const auto& p : e.problems()) paths.push_back(p.path);
    return paths;
  }
  FAIL("expected a ConfigError");
  return {};
}

}  // namespace

TEST_CASE("a config without a scheduler block has a constant schedule at the optimizer's lr") {
  const auto cfg = load({{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-4}}}}}});
  CHECK(zero::lr_schedule_from_config(cfg).kind == zero::LrScheduleKind::Constant);
  const zero::GroupBase base = zero::group_base_from_config(cfg);
  CHECK(base.lr == 3e-4);
  REQUIRE(base.betas.has_value());
  CHECK((*base.betas)[1] == 0.999);
}

TEST_CASE("betas are taken only for optimizers that have them") {
  for (const char* type : {"SGD", "Adagrad"}) {
    INFO(type);
    const auto cfg = load({{"optimizer", {{"type", type}, {"params", {{"lr", 0.1}}}}}});
    const zero::GroupBase base = zero::group_base_from_config(cfg);
    CHECK(base.lr == 0.1);
    CHECK_FALSE(base.betas.has_value());
  }
  const auto lion =
      load({{"optimizer", {{"type", "Lion"}, {"params", {{"betas", {0.95, 0.98}}}}}}});
  REQUIRE(zero::group_base_from_config(lion).betas.has_value());
  CHECK((*zero::group_base_from_config(lion).betas)[0] == 0.95);
}

TEST_CASE("WarmupLR without warmup_max_lr warms up to the optimizer's lr") {
  const auto cfg = load(
      {{"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.02}}}}},
       {"scheduler",
        {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 4}, {"warmup_type", "linear"}}}}}});
  const auto p = zero::lr_schedule_from_config(cfg);
  CHECK(p.kind == zero::LrScheduleKind::WarmupLR);
  CHECK(p.warmup_type == zero::WarmupType::Linear);
  CHECK(p.warmup_num_steps == 4);
  const zero::GroupBase base = zero::group_base_from_config(cfg);
  CHECK(zero::scheduled_values(p, base, 0, 10).lr == Approx(0.02));
  CHECK(zero::scheduled_values(p, base, 0, 1).lr == Approx(0.005));
}

TEST_CASE("schedule values still \"auto\" are refused, every one named with its path") {
  const json doc = {
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}, {"betas", "auto"}}}}},
      {"scheduler",
       {{"type", "WarmupDecayLR"},
        {"params", {{"total_num_steps", "auto"}, {"warmup_max_lr", "auto"}}}}}};
  const auto cfg = load(doc);
  CHECK(problem_paths([&] { zero::lr_schedule_from_config(cfg); }) ==
        std::vector<std::string>{"scheduler.params.warmup_max_lr",
                                 "scheduler.params.total_num_steps"});
  CHECK(problem_paths([&] { zero::group_base_from_config(cfg); }) ==
        std::vector<std::string>{"optimizer.params.lr", "optimizer.params.betas"});

  zero::config::Supplied supplied;
  supplied.values["optimizer.params.lr"] = 1e-3;
  supplied.values["optimizer.params.betas"] = {0.9, 0.95};
  supplied.values["scheduler.params.total_num_steps"] = 100;
  supplied.values["scheduler.params.warmup_max_lr"] = 1e-3;
  const auto filled = load(doc, supplied);
  CHECK(zero::lr_schedule_from_config(filled).total_num_steps == 100);
  CHECK((*zero::group_base_from_config(filled).betas)[1] == 0.95);
}

TEST_CASE("schedules zero cannot represent are refused naming the key") {
  const json opt = {{"type", "Adam"}, {"params", {{"lr", 1e-3}}}};
  CHECK(problem_paths([&] {
          zero::lr_schedule_from_config(
              load({{"optimizer", opt},
                    {"scheduler", {{"type", "StepLR"}, {"params", {{"step_size", 10}}}}}}));
        }) == std::vector<std::string>{"scheduler.type"});
  CHECK(problem_paths([&] {
          zero::lr_schedule_from_config(
              load({{"optimizer", opt},
                    {"scheduler",
                     {{"type", "OneCycle"},
                      {"params", {{"cycle_min_lr", {1e-4, 2e-4}}, {"cycle_max_lr", 1e-3}}}}}}));
        }) == std::vector<std::string>{"scheduler.params.cycle_min_lr"});
  CHECK(problem_paths([&] {
          zero::lr_schedule_from_config(load(
              {{"optimizer", opt},
               {"scheduler", {{"type", "WarmupLR"}, {"params", {{"last_batch_iteration", 7}}}}}}));
        }) == std::vector<std::string>{"scheduler.params.last_batch_iteration"});
  CHECK(problem_paths([&] { zero::group_base_from_config(load(json::object())); }) ==
        std::vector<std::string>{"optimizer"});
}

TEST_CASE("fp16 gives a dynamic or static scaler, bf16 and fp32 a static scale of 1") {
  const auto dynamic = zero::loss_scaler_from_config(load({{"fp16",
                                                            {{"enabled", true},
                                                             {"initial_scale_power", 12},
                                                             {"loss_scale_window", 50},
                                                             {"hysteresis", 3},
                                                             {"consecutive_hysteresis", true},
                                                             {"min_loss_scale", 4}}}}));
  CHECK(dynamic.dynamic);
  CHECK(dynamic.initial_scale == 4096);
  CHECK(dynamic.scale_window == 50);
  CHECK(dynamic.hysteresis == 3);
  CHECK(dynamic.consecutive_hysteresis);
  CHECK(dynamic.min_scale == 4);

  const auto fixed =
      zero::loss_scaler_from_config(load({{"fp16", {{"enabled", true}, {"loss_scale", 128}}}}));
  CHECK_FALSE(fixed.dynamic);
  CHECK(fixed.static_scale == 128);

  for (const json& doc : {json{{"bf16", {{"enabled", true}}}}, json::object()}) {
    const auto none = zero::loss_scaler_from_config(load(doc));
    CHECK_FALSE(none.dynamic);
    CHECK(none.static_scale == 1);
  }
}
