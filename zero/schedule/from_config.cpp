#include "zero/schedule/from_config.h"

#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zero/base/error.h"

namespace zero {

namespace {

using config::DsConfig;
using nlohmann::json;

// The message for a value still to be supplied, or empty when `path` is resolved.
std::string unresolved_reason(const DsConfig& cfg, const std::string& path) {
  for (const config::Finding& f : cfg.unresolved) {
    if (f.path == path) return f.message.empty() ? "still to be supplied" : f.message;
  }
  return {};
}

// Reads the values of one resolved block, collecting a problem for each unusable one (and
// returning a harmless fallback for it) so that all of them are reported at once.
class BlockReader {
 public:
  BlockReader(const DsConfig& cfg, const json& block, std::string path)
      : cfg_(cfg), block_(block), path_(std::move(path)) {}

  double number(const char* key) {
    const json* v = usable(key);
    if (v == nullptr) return 0;
    if (!v->is_number()) return problem(key, fmt::format("expected a number, got {}", v->dump()));
    return v->get<double>();
  }

  std::int64_t integer(const char* key) {
    const json* v = usable(key);
    if (v == nullptr) return 0;
    if (v->is_number_integer()) return v->get<std::int64_t>();
    if (v->is_number_float() && std::trunc(v->get<double>()) == v->get<double>()) {
      return static_cast<std::int64_t>(v->get<double>());
    }
    problem(key, fmt::format("expected an integer, got {}", v->dump()));
    return 0;
  }

  // A number, or one number per param group.
  std::vector<double> numbers(const char* key) {
    const json* v = usable(key);
    if (v == nullptr) return {0.0};
    if (v->is_number()) return {v->get<double>()};
    std::vector<double> out;
    if (v->is_array()) {
      for (const json& e : *v) {
        if (!e.is_number()) break;
        out.push_back(e.get<double>());
      }
    }
    if (out.empty() || out.size() != v->size()) {
      problem(key, fmt::format("expected a number or a list of numbers, got {}", v->dump()));
      return {0.0};
    }
    return out;
  }

  // A value that holds for every param group: a number or a one-element list.
  double single(const char* key, std::string_view schedule) {
    const std::vector<double> values = numbers(key);
    if (values.size() == 1) return values[0];
    return problem(key,
                   fmt::format("{} takes one value for every param group in zero, got {} values",
                               schedule, values.size()));
  }

  std::optional<double> optional_number(const char* key) {
    const json* v = find(key);
    if (v == nullptr || v->is_null()) return std::nullopt;
    return number(key);
  }

  std::optional<std::int64_t> optional_integer(const char* key) {
    const json* v = find(key);
    if (v == nullptr || v->is_null()) return std::nullopt;
    return integer(key);
  }

  bool boolean(const char* key) {
    const json* v = usable(key);
    if (v == nullptr) return false;
    if (!v->is_boolean()) {
      problem(key, fmt::format("expected true or false, got {}", v->dump()));
      return false;
    }
    return v->get<bool>();
  }

  std::string string(const char* key) {
    const json* v = usable(key);
    if (v == nullptr) return {};
    if (!v->is_string()) {
      problem(key, fmt::format("expected a string, got {}", v->dump()));
      return {};
    }
    return v->get<std::string>();
  }

  void throw_if_problems() const {
    if (!problems_.empty()) throw ConfigError(problems_);
  }

  // Records a problem with `key`; returns 0 so a reader can hand it back as its value.
  double problem(const char* key, std::string message) {
    problems_.push_back({path_ + "." + key, std::move(message)});
    return 0;
  }

 private:
  const json* find(const char* key) const {
    if (!block_.is_object()) return nullptr;
    const auto it = block_.find(key);
    return it == block_.end() ? nullptr : &*it;
  }

  // The value of `key`, or nullptr (with a problem recorded) when it is missing or unresolved.
  const json* usable(const char* key) {
    const std::string reason = unresolved_reason(cfg_, path_ + "." + key);
    const json* v = find(key);
    if (!reason.empty() || (v != nullptr && v->is_string() && v->get<std::string>() == "auto")) {
      problem(key, reason.empty() ? "\"auto\": still to be supplied" : reason);
      return nullptr;
    }
    if (v == nullptr || v->is_null()) {
      problem(key, "no value");
      return nullptr;
    }
    return v;
  }

  const DsConfig& cfg_;
  const json& block_;
  std::string path_;
  std::vector<ConfigError::Problem> problems_;
};

WarmupType warmup_type_of(BlockReader& r) {
  // The loader already mapped an unknown warmup_type to "log", as DeepSpeed does.
  return r.string("warmup_type") == "linear" ? WarmupType::Linear : WarmupType::Log;
}

}  // namespace

LrScheduleParams lr_schedule_from_config(const DsConfig& cfg) {
  LrScheduleParams p;
  if (!cfg.scheduler) return p;
  const config::Scheduler& s = *cfg.scheduler;
  if (s.kind == config::SchedulerKind::TorchOther) {
    throw ConfigError(
        "scheduler.type",
        fmt::format("\"{}\" is a torch.optim.lr_scheduler schedule; zero implements "
                    "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle and LRRangeTest",
                    s.type));
  }
  BlockReader r(cfg, s.params, "scheduler.params");
  if (const auto start = r.optional_integer("last_batch_iteration"); start && *start != -1) {
    r.problem("last_batch_iteration",
              fmt::format("only -1 (a schedule starting at its beginning) is supported, got {}; a "
                          "resumed run takes the position from its checkpoint",
                          *start));
  }
  switch (s.kind) {
    case config::SchedulerKind::WarmupLR:
    case config::SchedulerKind::WarmupDecayLR:
      p.kind = s.kind == config::SchedulerKind::WarmupLR ? LrScheduleKind::WarmupLR
                                                         : LrScheduleKind::WarmupDecayLR;
      p.warmup_min_lr = r.numbers("warmup_min_lr");
      p.warmup_max_lr = r.numbers("warmup_max_lr");
      p.warmup_num_steps = r.integer("warmup_num_steps");
      p.warmup_type = warmup_type_of(r);
      if (p.kind == LrScheduleKind::WarmupDecayLR) p.total_num_steps = r.integer("total_num_steps");
      break;
    case config::SchedulerKind::WarmupCosineLR:
      p.kind = LrScheduleKind::WarmupCosineLR;
      p.total_num_steps = r.integer("total_num_steps");
      p.warmup_min_ratio = r.number("warmup_min_ratio");
      p.warmup_num_steps = r.integer("warmup_num_steps");
      p.cos_min_ratio = r.number("cos_min_ratio");
      p.warmup_type = warmup_type_of(r);
      break;
    case config::SchedulerKind::OneCycle:
      p.kind = LrScheduleKind::OneCycle;
      p.cycle_min_lr = r.single("cycle_min_lr", "OneCycle");
      p.cycle_max_lr = r.single("cycle_max_lr", "OneCycle");
      p.decay_lr_rate = r.number("decay_lr_rate");
      p.cycle_first_step_size = r.number("cycle_first_step_size");
      p.cycle_second_step_size = r.optional_number("cycle_second_step_size");
      p.cycle_first_stair_count = r.integer("cycle_first_stair_count");
      p.cycle_second_stair_count = r.optional_integer("cycle_second_stair_count");
      p.decay_step_size = r.number("decay_step_size");
      p.cycle_momentum = r.boolean("cycle_momentum");
      p.cycle_min_mom = r.single("cycle_min_mom", "OneCycle");
      p.cycle_max_mom = r.single("cycle_max_mom", "OneCycle");
      p.decay_mom_rate = r.number("decay_mom_rate");
      break;
    case config::SchedulerKind::LRRangeTest:
      p.kind = LrScheduleKind::LRRangeTest;
      p.lr_range_test_min_lr = r.numbers("lr_range_test_min_lr");
      p.lr_range_test_step_size = r.number("lr_range_test_step_size");
      p.lr_range_test_step_rate = r.number("lr_range_test_step_rate");
      p.lr_range_test_staircase = r.boolean("lr_range_test_staircase");
      break;
    case config::SchedulerKind::TorchOther: break;
  }
  r.throw_if_problems();
  // The schedule's own checks (step sizes, warmup_num_steps) name the parameter; running them
  // here reports a bad value when the config is read rather than at the first step.
  try {
    scheduled_values(p, GroupBase{}, 0, -1);
  } catch (const Error& e) {
    throw ConfigError("scheduler.params", e.what());
  }
  return p;
}

LossScalerParams loss_scaler_from_config(const DsConfig& cfg) {
  LossScalerParams p;  // static 1: bf16 and fp32 never scale (SPEC §7.1)
  if (!cfg.fp16.enabled) return p;
  const config::Fp16& h = cfg.fp16;
  std::vector<ConfigError::Problem> problems;
  for (const char* key : {"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                          "consecutive_hysteresis", "min_loss_scale"}) {
    const std::string path = std::string("fp16.") + key;
    if (std::string reason = unresolved_reason(cfg, path); !reason.empty()) {
      problems.push_back({path, std::move(reason)});
    }
  }
  if (!problems.empty()) throw ConfigError(problems);
  if (!h.dynamic_loss_scale()) {
    p.static_scale = h.loss_scale;
    return p;
  }
  p.dynamic = true;
  // 2^power must be a normal double, as the scale is halved and doubled from there.
  if (h.initial_scale_power < -1022 || h.initial_scale_power > 1023) {
    throw ConfigError("fp16.initial_scale_power",
                      fmt::format("2^{} is out of the range of a double", h.initial_scale_power));
  }
  p.initial_scale = std::ldexp(1.0, static_cast<int>(h.initial_scale_power));
  p.scale_window = h.loss_scale_window;
  p.min_scale = h.min_loss_scale;
  p.hysteresis = h.hysteresis;
  p.consecutive_hysteresis = h.consecutive_hysteresis;
  return p;
}

GroupBase group_base_from_config(const DsConfig& cfg) {
  if (!cfg.optimizer) {
    throw ConfigError("optimizer",
                      "the config has no optimizer block: the embedding's optimizer sets the lr");
  }
  const config::Optimizer& o = *cfg.optimizer;
  const bool has_betas = o.kind == config::OptimizerKind::Adam ||
                         o.kind == config::OptimizerKind::AdamW ||
                         o.kind == config::OptimizerKind::Lion;
  BlockReader r(cfg, o.params, "optimizer.params");
  GroupBase base;
  base.lr = r.number("lr");
  if (has_betas) {
    // The loader has checked the shape ([beta1, beta2]); only "auto" can remain.
    if (std::string reason = unresolved_reason(cfg, "optimizer.params.betas"); !reason.empty()) {
      r.problem("betas", std::move(reason));
    }
    base.betas = o.betas;
  }
  r.throw_if_problems();
  return base;
}

}  // namespace zero
