// Lion element update, the reference formula of the Lion paper (Chen et al. 2023, Alg. 2) as the
// golden data has it:
//   p ← p·(1 − lr·wd) ;  c ← β1·m + (1−β1)·g ;  p ← p + sign(c)·(−lr) ;  m ← β2·m + (1−β2)·g
// sign is torch.sign (0 for ±0). DeepSpeed's CPU Lion uses copysign (−lr at +0) and FusedLion
// +lr at 0 (SPEC_DEEPSPEED.md §10.19); an exact zero is rare enough that we keep torch's choice.
#pragma once

#include "kernels/element_math.h"
#include "zero/base/hd.h"

namespace zero::kernels::math {

struct LionCoeffs {
  float grad_scale;
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float neg_lr;
  float decay_factor;  // 1 − lr·wd
};

inline namespace ZERO_KERNELS_ABI {

template <class F>
ZERO_HD ZERO_INLINE void lion_update(const LionCoeffs& c, F& p, F g, F& m) {
  g = g * F(c.grad_scale);
  p = p * F(c.decay_factor);
  const F interpolated = m * F(c.beta1) + g * F(c.one_minus_beta1);
  p = p + zero_sign(interpolated) * F(c.neg_lr);
  m = m * F(c.beta2) + g * F(c.one_minus_beta2);
}

}  // namespace ZERO_KERNELS_ABI
}  // namespace zero::kernels::math
