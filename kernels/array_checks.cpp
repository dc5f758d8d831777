#include "kernels/array_checks.h"

#include <cstdint>

#include "zero/base/error.h"

namespace zero::kernels::detail {

bool is_float_dtype(DType dtype) {
  return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16;
}

void check_float_array(const char* what, const char* name, const void* pointer, DType dtype,
                       std::size_t numel) {
  ZERO_CHECK(is_float_dtype(dtype), "{}: {} dtype must be fp32, bf16 or fp16, got {}", what, name,
             dtype_name(dtype));
  if (numel == 0) return;
  ZERO_CHECK(pointer != nullptr, "{}: {} is null", what, name);
  ZERO_CHECK(reinterpret_cast<std::uintptr_t>(pointer) % dtype_size(dtype) == 0,
             "{}: {} at {} is not aligned to its {} elements", what, name, pointer,
             dtype_name(dtype));
}

}  // namespace zero::kernels::detail
