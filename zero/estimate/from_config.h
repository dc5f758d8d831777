// The ZeRO-paper estimate's inputs that a ds_config decides: stage, precision, optimizer and
// offload tiers. Shared by `zero-config estimate --config` and zero-train's memory report.
#pragma once

#include "config/ds_config.h"
#include "zero/estimate/estimate.h"

namespace zero {

// Sets in.stage, precision, optimizer, offload_optimizer and offload_param from `config`.
// Returns false (leaving `in` partly set) when the config's optimizer has no formula here
// (Lamb, 1-bit optimizers, ...); a config without an optimizer block counts as Adam, the
// paper's case.
bool apply_config_to_estimate(const config::DsConfig& config, EstimateInput& in);

}  // namespace zero
