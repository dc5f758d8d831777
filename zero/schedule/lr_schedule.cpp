#include "zero/schedule/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "zero/base/error.h"

namespace zero {

namespace {

double per_group(const std::vector<double>& values, std::size_t group, const char* name) {
  ZERO_CHECK(!values.empty(), "lr schedule: {} has no value", name);
  if (values.size() == 1) return values[0];
  ZERO_CHECK(group < values.size(),
             "lr schedule: {} lists {} values, one per param group, but group {} was asked for",
             name, values.size(), group);
  return values[group];
}

// The warmup fraction DeepSpeed's WarmupLR family uses for 0 <= i < N (N = max(2, steps)).
double warmup_gamma(WarmupType type, std::int64_t i, std::int64_t n) {
  if (type == WarmupType::Linear) return static_cast<double>(i) / static_cast<double>(n);
  return (1.0 / std::log(static_cast<double>(n))) * std::log(static_cast<double>(i + 1));
}

ScheduledValues warmup_lr(const LrScheduleParams& p, const GroupBase& base, std::size_t group,
                          std::int64_t i) {
  const double min_lr = per_group(p.warmup_min_lr, group, "warmup_min_lr");
  const double max_lr =
      p.warmup_max_lr.empty() ? base.lr : per_group(p.warmup_max_lr, group, "warmup_max_lr");
  const std::int64_t n = std::max<std::int64_t>(2, p.warmup_num_steps);
  ScheduledValues v{min_lr, base.betas};
  if (i < 0) return v;
  double gamma = 1.0;
  if (i < n) {
    gamma = warmup_gamma(p.warmup_type, i, n);
  } else if (p.kind == LrScheduleKind::WarmupDecayLR) {
    gamma = std::max(0.0, static_cast<double>(p.total_num_steps - i) /
                              std::max(1.0, static_cast<double>(p.total_num_steps - n)));
  }
  v.lr = min_lr + (max_lr - min_lr) * gamma;
  return v;
}

ScheduledValues warmup_cosine_lr(const LrScheduleParams& p, const GroupBase& base, std::int64_t i) {
  ScheduledValues v{0.0, base.betas};
  if (i < 0) return v;
  const std::int64_t n = std::max<std::int64_t>(2, p.warmup_num_steps);
  double ratio = 0;
  if (i < n) {
    ratio = p.warmup_min_ratio + warmup_gamma(p.warmup_type, i, n) * (1.0 - p.warmup_min_ratio);
  } else {
    // Progress is clamped to 1 (since DeepSpeed 0.19) so the rate stays at the floor past the end.
    const double done = static_cast<double>(i - n + 1);
    const double span = std::max<double>(1.0, static_cast<double>(p.total_num_steps - n));
    const double progress = std::min(1.0, done / span);
    const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    ratio = std::max(0.0, p.cos_min_ratio + (1.0 - p.cos_min_ratio) * cosine);
  }
  v.lr = base.lr * ratio;
  return v;
}

// Position in the triangular cycle, 0 at the ends and 1 at the peak.
double one_cycle_scale(const LrScheduleParams& p, std::int64_t i) {
  const double first = p.cycle_first_step_size;
  const double second = p.cycle_second_step_size.value_or(first);
  const double total = first + second;
  const double step_ratio = first / total;
  const double batch = static_cast<double>(i + 1);
  const double cycle = std::floor(1.0 + batch / total);
  const double x = 1.0 + batch / total - cycle;
  double scale = 0;
  std::int64_t stairs = 0;
  if (x <= step_ratio) {
    scale = x / step_ratio;
    stairs = p.cycle_first_stair_count;
  } else {
    scale = (x - 1.0) / (step_ratio - 1.0);
    stairs = p.cycle_second_stair_count.value_or(p.cycle_first_stair_count);
  }
  if (stairs > 0) {
    // Quantised from the integer position in the cycle rather than from `scale`, whose rounding
    // at a half-cycle boundary could drop a whole stair.
    const double in_cycle = std::fmod(batch, total);
    const double position = in_cycle <= first
                                ? in_cycle * static_cast<double>(stairs) / first
                                : (total - in_cycle) * static_cast<double>(stairs) / second;
    scale = std::floor(position) / static_cast<double>(stairs);
  }
  return scale;
}

ScheduledValues one_cycle(const LrScheduleParams& p, const GroupBase& base, std::int64_t i) {
  const double first = p.cycle_first_step_size;
  const double total = first + p.cycle_second_step_size.value_or(first);
  // Momentum cycles only for optimizers that have betas; DeepSpeed then pins beta2 to 0.99.
  const bool cycle_mom = p.cycle_momentum && base.betas.has_value();
  ScheduledValues v{p.cycle_min_lr, base.betas};
  if (cycle_mom) v.betas = std::array<double, 2>{p.cycle_min_mom, 0.99};
  if (i < 0) return v;

  const bool decay_off = p.decay_step_size == 0;
  if (static_cast<double>(i) < total) {
    const double scale = one_cycle_scale(p, i);
    v.lr = p.cycle_min_lr + (p.cycle_max_lr - p.cycle_min_lr) * scale;
    if (cycle_mom) {
      v.betas = std::array<double, 2>{p.cycle_max_mom - (p.cycle_max_mom - p.cycle_min_mom) * scale,
                                      0.99};
    }
    return v;
  }
  const double decay_iteration = static_cast<double>(i) - total + 1.0;
  const double interval = decay_off ? 0.0 : decay_iteration / p.decay_step_size;
  v.lr = (decay_off || p.decay_lr_rate == 0) ? p.cycle_min_lr
                                             : p.cycle_min_lr / (1.0 + p.decay_lr_rate * interval);
  if (cycle_mom) {
    const double mom = (decay_off || p.decay_mom_rate == 0)
                           ? p.cycle_max_mom
                           : p.cycle_max_mom * (1.0 + p.decay_mom_rate * interval);
    v.betas = std::array<double, 2>{mom, 0.99};
  }
  return v;
}

ScheduledValues lr_range_test(const LrScheduleParams& p, const GroupBase& base, std::size_t group,
                              std::int64_t i) {
  const double min_lr = per_group(p.lr_range_test_min_lr, group, "lr_range_test_min_lr");
  ScheduledValues v{min_lr, base.betas};
  if (i < 0) return v;
  double interval = static_cast<double>(i + 1) / p.lr_range_test_step_size;
  if (p.lr_range_test_staircase) interval = std::floor(interval);
  v.lr = min_lr * (1.0 + p.lr_range_test_step_rate * interval);
  return v;
}

}  // namespace

ScheduledValues scheduled_values(const LrScheduleParams& p, const GroupBase& base,
                                 std::size_t group, std::int64_t last_batch_iteration) {
  ZERO_CHECK(last_batch_iteration >= -1,
             "lr schedule: last_batch_iteration must be -1 or more, got {}", last_batch_iteration);
  const std::int64_t i = last_batch_iteration;
  switch (p.kind) {
    case LrScheduleKind::Constant: return {base.lr, base.betas};
    case LrScheduleKind::WarmupLR:
    case LrScheduleKind::WarmupDecayLR:
      ZERO_CHECK(p.warmup_num_steps > 0, "{}: warmup_num_steps must be a positive integer, got {}",
                 lr_schedule_name(p.kind), p.warmup_num_steps);
      return warmup_lr(p, base, group, i);
    case LrScheduleKind::WarmupCosineLR:
      ZERO_CHECK(p.warmup_num_steps > 0,
                 "WarmupCosineLR: warmup_num_steps must be a positive integer, got {}",
                 p.warmup_num_steps);
      return warmup_cosine_lr(p, base, i);
    case LrScheduleKind::OneCycle:
      ZERO_CHECK(p.cycle_first_step_size > 0,
                 "OneCycle: cycle_first_step_size must be positive, got {}",
                 p.cycle_first_step_size);
      ZERO_CHECK(p.cycle_second_step_size.value_or(1.0) > 0,
                 "OneCycle: cycle_second_step_size must be positive, got {}",
                 p.cycle_second_step_size.value_or(1.0));
      ZERO_CHECK(p.decay_step_size >= 0, "OneCycle: decay_step_size must be 0 or more, got {}",
                 p.decay_step_size);
      return one_cycle(p, base, i);
    case LrScheduleKind::LRRangeTest:
      ZERO_CHECK(p.lr_range_test_step_size > 0,
                 "LRRangeTest: lr_range_test_step_size must be positive, got {}",
                 p.lr_range_test_step_size);
      return lr_range_test(p, base, group, i);
  }
  ZERO_ASSERT(false);
}

std::string_view lr_schedule_name(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::Constant: return "constant";
    case LrScheduleKind::WarmupLR: return "WarmupLR";
    case LrScheduleKind::WarmupDecayLR: return "WarmupDecayLR";
    case LrScheduleKind::WarmupCosineLR: return "WarmupCosineLR";
    case LrScheduleKind::OneCycle: return "OneCycle";
    case LrScheduleKind::LRRangeTest: return "LRRangeTest";
  }
  return "?";
}

}  // namespace zero
