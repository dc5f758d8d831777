// The float primitives the optimizer element functions (adam_math.h, adagrad_math.h,
// lion_math.h) call besides + − × ÷. cpu_simd.h gives each vector type the same two functions
// with the same results lane by lane.
#pragma once

#include "zero/base/hd.h"

namespace zero::kernels::math {
inline namespace ZERO_KERNELS_ABI {

// Correctly rounded on both sides: nvcc's default -prec-sqrt=true, and the host instruction.
ZERO_HD inline float zero_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return __builtin_sqrtf(x);
#endif
}

// torch.sign: +1, -1, and the input itself (times zero) for ±0 and NaN, so a NaN propagates.
ZERO_HD inline float zero_sign(float x) {
  return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x * 0.0f);
}

}  // namespace ZERO_KERNELS_ABI
}  // namespace zero::kernels::math
