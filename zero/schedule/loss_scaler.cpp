#include "zero/schedule/loss_scaler.h"

#include <algorithm>

#include "zero/base/error.h"

namespace zero {

LossScaler::LossScaler(const LossScalerParams& params) : params_(params) {
  if (params_.dynamic) {
    ZERO_CHECK(params_.initial_scale > 0, "loss scaler: initial scale must be positive, got {}",
               params_.initial_scale);
    ZERO_CHECK(params_.scale_window > 0, "loss scaler: loss_scale_window must be positive, got {}",
               params_.scale_window);
    ZERO_CHECK(params_.min_scale > 0, "loss scaler: min_loss_scale must be positive, got {}",
               params_.min_scale);
    ZERO_CHECK(params_.hysteresis >= 1, "loss scaler: hysteresis must be at least 1, got {}",
               params_.hysteresis);
    state_.scale = params_.initial_scale;
  } else {
    ZERO_CHECK(params_.static_scale > 0, "loss scaler: static loss_scale must be positive, got {}",
               params_.static_scale);
    state_.scale = params_.static_scale;
  }
  state_.hysteresis_left = params_.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!params_.dynamic) {
    ++state_.iteration;
    return;
  }
  LossScalerState next = state_;
  if (overflow) {
    if (params_.hysteresis == 1 || next.hysteresis_left == 1) {
      ZERO_CHECK(next.scale != params_.min_scale,
                 "fp16 gradients overflowed with the loss scale already at min_loss_scale ({}); "
                 "training cannot go on. Lower the learning rate, check the data for inf/NaN, or "
                 "use bf16",
                 params_.min_scale);
      next.scale = std::max(next.scale / 2.0, params_.min_scale);
    } else {
      --next.hysteresis_left;
    }
    next.last_overflow_iteration = next.iteration;
  } else {
    if (params_.consecutive_hysteresis) next.hysteresis_left = params_.hysteresis;
    // Since DeepSpeed 0.17.1 growth waits one step longer than before: the first doubling from
    // a fresh start comes on the (window + 1)-th clean step.
    const std::int64_t clean = next.iteration - next.last_overflow_iteration - 1;
    if (clean > 0 && clean % params_.scale_window == 0) {
      if (!params_.consecutive_hysteresis) next.hysteresis_left = params_.hysteresis;
      next.scale *= 2.0;
    }
  }
  ++next.iteration;
  state_ = next;
}

}  // namespace zero
