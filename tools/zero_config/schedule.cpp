// zero-config schedule: what the engine does at each optimizer step of a ds_config — the lr and
// betas (or momentum) in effect, the loss scale, and whether the step is skipped — given which
// steps overflow.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/flags.h"
#include "tools/zero_config/commands.h"
#include "zero/base/error.h"
#include "zero/schedule/from_config.h"
#include "zero/schedule/loss_scaler.h"
#include "zero/schedule/lr_schedule.h"

namespace zero::tools {

namespace {

constexpr const char* kScheduleUsage =
    R"(usage: zero-config schedule FILE [--steps N] [--overflows BITS] [--json]
                            [--world-size N] [--set key=value]...

Show what the engine does at each optimizer step t (0-based) with the ds_config FILE:
  lr, betas    in effect for step t in param group 0 (betas as OneCycle cycles them; SGD shows
               its momentum instead, Adagrad neither)
  loss_scale   the scale the loss of step t is multiplied by (fp16; 1 for bf16 and fp32)
  skipped      whether step t is skipped because its gradients overflowed (inf/NaN)
The LR schedule advances only on steps that are applied (DeepSpeed steps its scheduler only on
boundaries without overflow, from last_batch_iteration -1); the loss scaler is updated on every
step (SPEC_DEEPSPEED.md §1.8, §7.2).

  --steps N          number of steps to show (default: the length of --overflows, else 20)
  --overflows BITS   which steps overflow: character t, '0' or '1', is step t; steps past the
                     end of BITS do not overflow
  --json             one JSON object per step and line, e.g.
                     {"step":0,"lr":0.0,"betas":[0.9,0.999],"loss_scale":65536.0,"skipped":false}
                     ("momentum" instead of "betas" for SGD, neither for Adagrad)
  --world-size N     as for 'zero-config check'
  --set key=value    as for 'zero-config check', e.g. --set optimizer.params.lr=3e-4 for an
                     "auto" lr. Batch sizes may stay unset: the schedule does not depend on them

Exit status: 0 shown; 1 invalid config, a value the schedule needs still "auto", or training
stops: an fp16 overflow with the loss scale already at min_loss_scale, where DeepSpeed aborts
(that step is shown, then the reason on stderr); 2 bad usage.
)";

constexpr std::int64_t kDefaultSteps = 20;

struct ScheduleOptions {
  ConfigOptions config;
  std::optional<std::int64_t> steps;
  std::string overflows;
  bool json = false;
};

// Takes the schedule's own flags out of `args`, leaving the config options to
// parse_config_options. Returns an error message for bad usage, empty when the arguments parse.
std::string parse_schedule_options(const Args& args, ScheduleOptions& o) {
  Args rest;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    cli::FlagArg arg(args, i);
    if (a == "--json") {
      o.json = true;
    } else if (arg.name() == "--steps") {
      if (!arg.has_value()) return "--steps needs a value";
      const std::string v = arg.value("a non-negative integer");
      std::size_t used = 0;
      long long n = -1;
      try {
        n = std::stoll(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (v.empty() || used != v.size() || n < 0) {
        return fmt::format("--steps: expected a non-negative integer, got '{}'", v);
      }
      o.steps = n;
    } else if (arg.name() == "--overflows") {
      if (!arg.has_value()) return "--overflows needs a value";
      o.overflows = arg.value("a string of 0 and 1");
      if (o.overflows.find_first_not_of("01") != std::string::npos) {
        return fmt::format("--overflows: expected a string of 0 and 1, got '{}'", o.overflows);
      }
    } else {
      rest.push_back(a);
    }
  }
  if (std::string bad = parse_config_options(rest, /*allow_strict=*/false, o.config);
      !bad.empty()) {
    return bad;
  }
  if (o.config.files.size() != 1) return "give exactly one FILE";
  return {};
}

struct StepRow {
  std::int64_t step = 0;
  ScheduledValues values;
  std::optional<double> momentum;  // SGD
  double loss_scale = 1;
  bool skipped = false;
  std::string stop;  // why training stops at this step; empty when it goes on
};

std::string json_line(const StepRow& r) {
  nlohmann::ordered_json j;
  j["step"] = r.step;
  j["lr"] = r.values.lr;
  if (r.values.betas) j["betas"] = {(*r.values.betas)[0], (*r.values.betas)[1]};
  if (r.momentum) j["momentum"] = *r.momentum;
  j["loss_scale"] = r.loss_scale;
  j["skipped"] = r.skipped;
  if (!r.stop.empty()) j["stopped"] = r.stop;
  return j.dump();
}

void print_table(const std::vector<StepRow>& rows) {
  const bool betas = std::any_of(rows.begin(), rows.end(),
                                 [](const StepRow& r) { return r.values.betas.has_value(); });
  const bool momentum = std::any_of(rows.begin(), rows.end(),
                                    [](const StepRow& r) { return r.momentum.has_value(); });
  std::string third_header;
  if (betas) third_header = "betas";
  if (momentum) third_header = "momentum";
  std::vector<std::array<std::string, 5>> cells;
  cells.push_back({"step", "lr", third_header, "loss_scale", "skipped"});
  for (const StepRow& r : rows) {
    std::string third;
    if (r.values.betas) {
      third = fmt::format("{:.6g}, {:.6g}", (*r.values.betas)[0], (*r.values.betas)[1]);
    }
    if (r.momentum) third = fmt::format("{:.6g}", *r.momentum);
    std::string skipped = r.skipped ? "yes" : "no";
    if (!r.stop.empty()) skipped = "training stops";
    cells.push_back({fmt::format("{}", r.step), fmt::format("{:.6g}", r.values.lr), third,
                     fmt::format("{:.10g}", r.loss_scale), skipped});
  }
  std::array<std::size_t, 5> width{};
  for (const auto& row : cells) {
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : cells) {
    std::string line = fmt::format("{:>{}}  {:<{}}  ", row[0], width[0], row[1], width[1]);
    if (width[2] > 0) line += fmt::format("{:<{}}  ", row[2], width[2]);
    line += fmt::format("{:>{}}  {}", row[3], width[3], row[4]);
    std::printf("%s\n", line.c_str());
  }
}

std::string describe(const config::DsConfig& cfg, const LrScheduleParams& schedule,
                     const GroupBase& base, const LossScalerParams& scaler) {
  std::string scaling = "no loss scaling (scale 1)";
  if (scaler.dynamic) {
    scaling =
        fmt::format("fp16 dynamic loss scale from {:.10g}, window {}, hysteresis {}{}, min {:.10g}",
                    scaler.initial_scale, scaler.scale_window, scaler.hysteresis,
                    scaler.consecutive_hysteresis ? " (consecutive)" : "", scaler.min_scale);
  } else if (cfg.fp16.enabled) {
    scaling = fmt::format("fp16 static loss scale {:.10g}", scaler.static_scale);
  }
  return fmt::format(
      "schedule {}, optimizer {} (lr {:.6g}), {}",
      cfg.scheduler ? cfg.scheduler->type : std::string(lr_schedule_name(schedule.kind)),
      cfg.optimizer->type, base.lr, scaling);
}

}  // namespace

int config_schedule(const Args& args) {
  if (wants_help(args)) {
    std::fputs(kScheduleUsage, stdout);
    return 0;
  }
  ScheduleOptions o;
  if (const std::string bad = parse_schedule_options(args, o); !bad.empty()) {
    std::fprintf(stderr, "zero-config schedule: %s\n\n%s", bad.c_str(), kScheduleUsage);
    return 2;
  }
  const std::string& file = o.config.files.front();
  const auto cfg = load_reporting(file, o.config);
  if (!cfg) return 1;

  LrScheduleParams schedule;
  GroupBase base;
  LossScalerParams scaler_params;
  std::optional<double> momentum;
  std::vector<ConfigError::Problem> problems;
  auto collect = [&](auto read) {
    try {
      read();
    } catch (const ConfigError& e) {
      problems.insert(problems.end(), e.problems().begin(), e.problems().end());
    }
  };
  collect([&] { schedule = lr_schedule_from_config(*cfg); });
  collect([&] { base = group_base_from_config(*cfg); });
  collect([&] { scaler_params = loss_scaler_from_config(*cfg); });
  if (cfg->optimizer && cfg->optimizer->kind == config::OptimizerKind::Sgd) {
    for (const config::Finding& f : cfg->unresolved) {
      if (f.path == "optimizer.params.momentum") problems.push_back({f.path, f.message});
    }
    momentum = cfg->optimizer->momentum;
  }
  if (!problems.empty()) {
    bool to_supply = false;
    for (const auto& p : problems) {
      std::fprintf(stderr, "%s: error: %s: %s\n", file.c_str(), p.path.c_str(), p.message.c_str());
      for (const config::Finding& f : cfg->unresolved) to_supply |= f.path == p.path;
    }
    std::fprintf(stderr,
                 "zero-config schedule: %s: the schedule cannot be shown (%zu problem%s)%s\n",
                 file.c_str(), problems.size(), problems.size() == 1 ? "" : "s",
                 to_supply ? "; give the values still to be supplied with --set key=value" : "");
    return 1;
  }
  LossScaler scaler(scaler_params);

  const std::int64_t steps = o.steps.value_or(
      o.overflows.empty() ? kDefaultSteps : static_cast<std::int64_t>(o.overflows.size()));
  std::vector<StepRow> rows;
  std::int64_t applied_steps = 0;  // the schedule's last_batch_iteration is applied_steps - 1
  for (std::int64_t t = 0; t < steps; ++t) {
    const bool overflow =
        t < static_cast<std::int64_t>(o.overflows.size()) && o.overflows[t] == '1';
    StepRow row;
    row.step = t;
    row.values = scheduled_values(schedule, base, 0, applied_steps - 1);
    row.momentum = momentum;
    row.loss_scale = scaler.scale();
    row.skipped = overflow;
    try {
      scaler.update(overflow);
    } catch (const Error& e) {
      row.stop = e.what();
    }
    rows.push_back(row);
    if (!row.stop.empty()) break;
    if (!overflow) ++applied_steps;
  }

  if (o.json) {
    for (const StepRow& r : rows) std::printf("%s\n", json_line(r).c_str());
  } else {
    std::printf("%s: %s\n", file.c_str(), describe(*cfg, schedule, base, scaler_params).c_str());
    print_table(rows);
  }
  if (!rows.empty() && !rows.back().stop.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "zero-config schedule: %s: training stops at step %lld: %s\n",
                 file.c_str(), static_cast<long long>(rows.back().step), rows.back().stop.c_str());
    return 1;
  }
  return 0;
}

}  // namespace zero::tools
