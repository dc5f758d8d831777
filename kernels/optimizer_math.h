// All optimizers' per-step coefficients in one struct, and one entry point that picks the update
// rule at compile time; the CPU ISA paths and the CUDA kernel both go through it.
#pragma once

#include "kernels/adagrad_math.h"
#include "kernels/adam_math.h"
#include "kernels/lion_math.h"
#include "kernels/optimizer_kind.h"
#include "kernels/sgd_math.h"
#include "zero/base/hd.h"

namespace zero::kernels::math {

struct StepCoeffs {
  OptimizerKind kind;
  AdamCoeffs adam;
  AdagradCoeffs adagrad;
  LionCoeffs lion;
  SgdCoeffs sgd;
};

// Number of optimizer-state arrays per parameter (0 for SGD without momentum).
ZERO_HD constexpr int optimizer_state_count(OptimizerKind kind, bool sgd_momentum) {
  switch (kind) {
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW: return 2;
    case OptimizerKind::Adagrad:
    case OptimizerKind::Lion: return 1;
    case OptimizerKind::Sgd: return sgd_momentum ? 1 : 0;
  }
  return 0;
}

inline namespace ZERO_KERNELS_ABI {

template <OptimizerKind kKind, class F>
ZERO_HD ZERO_INLINE void optimizer_update(const StepCoeffs& c, F& p, F g, F& state0, F& state1) {
  if constexpr (kKind == OptimizerKind::Adam || kKind == OptimizerKind::AdamW) {
    adam_update(c.adam, p, g, state0, state1);
  } else if constexpr (kKind == OptimizerKind::Adagrad) {
    adagrad_update(c.adagrad, p, g, state0);
  } else if constexpr (kKind == OptimizerKind::Lion) {
    lion_update(c.lion, p, g, state0);
  } else {
    sgd_update(c.sgd, p, g, state0);
  }
}

}  // namespace ZERO_KERNELS_ABI
}  // namespace zero::kernels::math
