// Adagrad element update (torch.optim.Adagrad, _single_tensor_adagrad):
//   g ← g + wd·p (wd ≠ 0) ;  s ← s + g·g ;  p ← p + (−clr · g) / (sqrt(s) + eps),
//   clr = lr / (1 + (t − 1)·lr_decay).
// The numerator includes the weight decay, as in torch; DeepSpeed's CPU Adagrad uses the raw
// gradient there (SPEC_DEEPSPEED.md §6.3, §10.19). Same rules as adam_math.h for F.
#pragma once

#include "kernels/element_math.h"
#include "zero/base/hd.h"

namespace zero::kernels::math {

struct AdagradCoeffs {
  float grad_scale;
  float eps;
  float neg_clr;  // −lr / (1 + (t − 1)·lr_decay)
  float weight_decay;
  bool l2;  // wd ≠ 0
};

inline namespace ZERO_KERNELS_ABI {

template <class F>
ZERO_HD ZERO_INLINE void adagrad_update(const AdagradCoeffs& c, F& p, F g, F& sum) {
  g = g * F(c.grad_scale);
  if (c.l2) g = g + p * F(c.weight_decay);
  sum = sum + g * g;
  const F denom = zero_sqrt(sum) + F(c.eps);
  p = p + (F(c.neg_clr) * g) / denom;
}

}  // namespace ZERO_KERNELS_ABI
}  // namespace zero::kernels::math
