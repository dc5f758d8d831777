// Internal: the argument checks every companion kernel driver makes (CPU and CUDA alike), so both
// backends reject the same calls with the same messages.
#pragma once

#include <cstddef>

#include "zero/base/dtype.h"

namespace zero::kernels::detail {

bool is_float_dtype(DType dtype);

// Throws zero::Error naming `what` and `name` unless `dtype` is fp32, bf16 or fp16 and, for a
// non-empty array, `pointer` is non-null and aligned to the element size.
void check_float_array(const char* what, const char* name, const void* pointer, DType dtype,
                       std::size_t numel);

}  // namespace zero::kernels::detail
