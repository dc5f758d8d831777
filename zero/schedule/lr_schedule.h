// DeepSpeed's five learning-rate schedules (deepspeed/runtime/lr_schedules.py, 0.19.6), as pure
// functions of the schedule's position.
//
// A schedule's whole state is `last_batch_iteration` (i): -1 before the first optimizer step that
// was applied, incremented once per applied step (never on an overflow-skipped step). The values
// in effect for optimizer step t are those at the i reached before it: i = -1 for the first step.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace zero {

enum class LrScheduleKind {
  Constant,
  WarmupLR,
  WarmupDecayLR,
  WarmupCosineLR,
  OneCycle,
  LRRangeTest
};
enum class WarmupType { Log, Linear };

struct LrScheduleParams {
  LrScheduleKind kind = LrScheduleKind::Constant;

  // WarmupLR, WarmupDecayLR. One value for every param group, or one per group.
  std::vector<double> warmup_min_lr{0.0};
  std::vector<double> warmup_max_lr;  // empty: the optimizer's lr of each group
  std::int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::Log;
  std::int64_t total_num_steps = 0;  // WarmupDecayLR, WarmupCosineLR

  // WarmupCosineLR: ratios of each group's optimizer lr.
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 1e-4;

  // OneCycle.
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;
  double decay_lr_rate = 0.0;
  double cycle_first_step_size = 2000;
  std::optional<double> cycle_second_step_size;  // default: cycle_first_step_size
  std::int64_t cycle_first_stair_count = 0;
  std::optional<std::int64_t> cycle_second_stair_count;  // default: cycle_first_stair_count
  double decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;

  // LRRangeTest.
  std::vector<double> lr_range_test_min_lr{1e-3};
  double lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

// What the optimizer of one param group was configured with.
struct GroupBase {
  double lr = 1e-3;
  std::optional<std::array<double, 2>> betas;  // present for optimizers with betas (Adam, Lion)
};

struct ScheduledValues {
  double lr = 0;
  std::optional<std::array<double, 2>> betas;  // the group's betas, cycled by OneCycle
};

// Values in effect for `group` after the schedule reached `last_batch_iteration` (>= -1).
// Throws zero::Error when a per-group list does not cover `group`, or parameters are invalid
// (warmup_num_steps <= 0, step sizes <= 0).
ScheduledValues scheduled_values(const LrScheduleParams& params, const GroupBase& base,
                                 std::size_t group, std::int64_t last_batch_iteration);

std::string_view lr_schedule_name(LrScheduleKind kind);

}  // namespace zero
