// Element types the runtime stores and moves.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace zero {

enum class DType { F32, F16, BF16, F64 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::F64: return 8;
  }
  return 0;
}

// Short names as DeepSpeed's configs spell them: "fp32", "fp16", "bf16", "fp64".
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::F16: return "fp16";
    case DType::BF16: return "bf16";
    case DType::F64: return "fp64";
  }
  return "?";
}

// safetensors spelling: "F32", "F16", "BF16", "F64".
constexpr std::string_view dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
  }
  return "?";
}

// Accepts the spellings DeepSpeed's data_types block accepts (SPEC_DEEPSPEED.md §1.10):
// fp32/float32/float/torch.float32, fp16/float16/half/torch.float16, bf16/bfloat16/torch.bfloat16,
// case-insensitive. Returns nothing for any other string.
std::optional<DType> parse_dtype(std::string_view name);

}  // namespace zero
