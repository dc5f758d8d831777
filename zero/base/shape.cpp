#include "zero/base/shape.h"

namespace zero {

std::optional<std::uint64_t> checked_numel(std::span<const std::int64_t> shape) {
  std::uint64_t n = 1;
  for (const std::int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return std::nullopt;
  }
  return n;
}

}  // namespace zero
