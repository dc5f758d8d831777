// SGD element update (torch.optim.SGD, _single_tensor_sgd):
//   d ← g + wd·p (wd ≠ 0)
//   with momentum μ: b ← d on the first step, else b ← μ·b + (1 − dampening)·d;
//                    d ← d + μ·b (nesterov) or d ← b
//   p ← p + d·(−lr)
#pragma once

#include "zero/base/hd.h"

namespace zero::kernels::math {

struct SgdCoeffs {
  float grad_scale;
  float weight_decay;
  float momentum;
  float one_minus_dampening;
  float neg_lr;
  bool l2;            // wd ≠ 0
  bool use_momentum;  // μ ≠ 0: the momentum buffer exists
  bool first_step;    // the buffer is initialised to d (torch clones the gradient)
  bool nesterov;
};

inline namespace ZERO_KERNELS_ABI {

template <class F>
ZERO_HD ZERO_INLINE void sgd_update(const SgdCoeffs& c, F& p, F g, F& buffer) {
  g = g * F(c.grad_scale);
  if (c.l2) g = g + p * F(c.weight_decay);
  if (c.use_momentum) {
    if (c.first_step) {
      buffer = g;
    } else {
      buffer = buffer * F(c.momentum) + g * F(c.one_minus_dampening);
    }
    if (c.nesterov) {
      g = g + buffer * F(c.momentum);
    } else {
      g = buffer;
    }
  }
  p = p + g * F(c.neg_lr);
}

}  // namespace ZERO_KERNELS_ABI
}  // namespace zero::kernels::math
