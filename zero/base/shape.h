// Element counts of tensor shapes.
#pragma once

#include <cstdint>
#include <optional>
#include <ranges>
#include <span>

namespace zero {

// The number of elements of a tensor of `shape`: the product of its dimensions, 1 for an empty
// shape (a scalar). REQUIRES: no dimension is negative and the product fits in 64 bits; use
// checked_numel for a shape read from a file.
template <std::ranges::input_range Shape>
constexpr std::uint64_t numel_of(const Shape& shape) {
  std::uint64_t n = 1;
  for (const auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

// numel_of, or nullopt when a dimension is negative or the product overflows 64 bits.
std::optional<std::uint64_t> checked_numel(std::span<const std::int64_t> shape);

}  // namespace zero
