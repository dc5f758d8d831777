// Adam / AdamW element update, the one definition used by every CPU ISA path and by CUDA.
//
// Form: torch.optim.Adam / AdamW (torch/optim/adam.py, _single_tensor_adam), whose trajectories
// the golden data holds, with DeepSpeed's CPU Adam denominator (csrc/includes/cpu_adam.h):
//   AdamW:  p ← p·(1 − lr·wd)                      (decoupled, on the pre-update p)
//   Adam:   g ← g + wd·p                           (L2, only when wd ≠ 0)
//   m ← β1·m + (1−β1)·g ;  v ← β2·v + ((1−β2)·g)·g
//   p ← p + (−lr/bc1 · m) / (sqrt(v)·(1/sqrt(bc2)) + eps)
// torch divides sqrt(v) by sqrt(bc2) (SPEC_DEEPSPEED.md §10.19); multiplying by the reciprocal
// agrees to rounding (2.4e-7 from the goldens) and saves a division per element, which matters:
// with AVX-512 the step is bound by the divide/sqrt unit, not by arithmetic in general.
// F is float (scalar, CUDA) or a SIMD vector of floats with the same operators: every path does
// the same IEEE operations in the same order and is bitwise identical. No FMA contraction.
#pragma once

#include "kernels/element_math.h"
#include "zero/base/hd.h"

namespace zero::kernels::math {

// Per-step coefficients, computed on the host in double and rounded once (as torch does with its
// Python-float scalars).
struct AdamCoeffs {
  float grad_scale;  // 1 / (loss scale × clip coefficient)
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float inv_bias_correction2_sqrt;  // 1 / sqrt(1 − β2^t), 1 without bias correction
  float neg_step_size;              // −lr / (1 − β1^t)
  float l2_weight_decay;            // Adam: wd; AdamW: 0
  float decay_factor;               // AdamW: 1 − lr·wd; Adam: 1
  bool l2;                          // Adam with wd ≠ 0
  bool decoupled;                   // AdamW
};

inline namespace ZERO_KERNELS_ABI {

template <class F>
ZERO_HD ZERO_INLINE void adam_update(const AdamCoeffs& c, F& p, F g, F& m, F& v) {
  g = g * F(c.grad_scale);
  if (c.l2) g = g + p * F(c.l2_weight_decay);
  if (c.decoupled) p = p * F(c.decay_factor);
  m = m * F(c.beta1) + g * F(c.one_minus_beta1);
  v = v * F(c.beta2) + (F(c.one_minus_beta2) * g) * g;
  const F denom = zero_sqrt(v) * F(c.inv_bias_correction2_sqrt) + F(c.eps);
  p = p + (F(c.neg_step_size) * m) / denom;
}

}  // namespace ZERO_KERNELS_ABI
}  // namespace zero::kernels::math
