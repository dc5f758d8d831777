#include "zero/base/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <utility>

namespace zero {

std::optional<DType> parse_dtype(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower.starts_with("torch.")) lower.erase(0, 6);
  static constexpr std::array<std::pair<std::string_view, DType>, 10> kNames{{
      {"fp32", DType::F32},
      {"float32", DType::F32},
      {"float", DType::F32},
      {"fp16", DType::F16},
      {"float16", DType::F16},
      {"half", DType::F16},
      {"bf16", DType::BF16},
      {"bfloat16", DType::BF16},
      {"fp64", DType::F64},
      {"float64", DType::F64},
  }};
  for (const auto& [n, t] : kNames) {
    if (lower == n) return t;
  }
  return std::nullopt;
}

}  // namespace zero
