// The optimizer a ds_config asks for, as the kernels take it: one OptimizerHyper per param group.
#pragma once

#include <vector>

#include "config/ds_config.h"
#include "kernels/optimizer.h"

namespace zero::engine_detail {

struct GroupOverrides {
  std::optional<double> lr;
  std::optional<double> weight_decay;
};

struct GroupOptimizer {
  kernels::OptimizerHyper hyper;
  double base_lr = 0;  // the lr the schedule starts from (the group's optimizer lr)
};

// The config's optimizer block (SPEC_DEEPSPEED.md §1.7: "Adam" is AdamW unless adam_w_mode is
// false), with each group's overrides applied. Throws ConfigError naming optimizer.type when the
// config has no optimizer or one the kernels do not implement; zero::Error for an invalid value.
std::vector<GroupOptimizer> group_optimizers(const config::DsConfig& cfg,
                                             const std::vector<GroupOverrides>& groups);

}  // namespace zero::engine_detail
