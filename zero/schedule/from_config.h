// The LR schedule, the loss scaler and the optimizer's base values a ds_config asks for.
//
// Each function reads only resolved values: one the config leaves to the embedding ("auto", see
// DsConfig::unresolved) is unusable, and so is a value zero cannot represent. Both throw
// zero::ConfigError whose problem names the dotted key path and the value. The batch-size triad
// is never read, so a config whose batch sizes are still to be supplied works.
#pragma once

#include "config/ds_config.h"
#include "zero/schedule/loss_scaler.h"
#include "zero/schedule/lr_schedule.h"

namespace zero {

// The schedule of the config's scheduler block (SPEC §1.8); Constant when there is none.
// Per-param-group lists are passed through for warmup_min_lr, warmup_max_lr and
// lr_range_test_min_lr; OneCycle takes a single value (or a one-element list) per key.
// Throws for a torch.optim.lr_scheduler type and for last_batch_iteration other than -1 (a
// schedule resumed from a checkpoint restores its position from the checkpoint instead).
LrScheduleParams lr_schedule_from_config(const config::DsConfig& cfg);

// fp16 block → dynamic (loss_scale 0) or static scaler (SPEC §7.1); bf16/fp32 → static scale 1.
LossScalerParams loss_scaler_from_config(const config::DsConfig& cfg);

// The optimizer's lr and betas (betas only for optimizers that have them: Adam, AdamW, Lion).
// Throws when the config has no optimizer block (the embedding's own optimizer decides then).
GroupBase group_base_from_config(const config::DsConfig& cfg);

}  // namespace zero
