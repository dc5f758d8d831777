// fp16 loss scaling as DeepSpeed 0.19.6 does it (deepspeed/runtime/fp16/loss_scaler.py):
// a static scale, or a dynamic one that halves on overflow (after `hysteresis` tolerated
// overflows) and doubles after `scale_window` clean steps.
#pragma once

#include <cstdint>

namespace zero {

struct LossScalerParams {
  bool dynamic = false;
  double static_scale = 1.0;         // used when !dynamic (bf16/fp32: 1)
  double initial_scale = 65536.0;    // 2^initial_scale_power
  std::int64_t scale_window = 1000;  // loss_scale_window
  double min_scale = 1.0;            // min_loss_scale
  std::int64_t hysteresis = 2;       // "delayed shift"
  bool consecutive_hysteresis = false;
};

// The scaler's whole state, saved in checkpoints.
struct LossScalerState {
  double scale = 1.0;
  std::int64_t iteration = 0;  // optimizer steps seen, skipped ones included
  std::int64_t last_overflow_iteration = -1;
  std::int64_t hysteresis_left = 1;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerParams& params);

  // The scale the loss of the current step is multiplied by.
  double scale() const { return state_.scale; }
  bool dynamic() const { return params_.dynamic; }

  // Called once per optimizer step with whether any rank saw inf/NaN gradients, before the
  // gradients are unscaled (DeepSpeed unscales with the updated scale — SPEC §7.3).
  // Throws zero::Error when an overflow happens with the scale already at min_scale, as
  // DeepSpeed stops training there. On a throw the state is unchanged.
  void update(bool overflow);

  const LossScalerState& state() const { return state_; }
  void restore(const LossScalerState& state) { state_ = state; }

 private:
  LossScalerParams params_;
  LossScalerState state_;
};

}  // namespace zero
