#include "zero/base/format.h"

#include <fmt/format.h>

#include <iterator>

namespace zero {

std::string format_bytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", value, kUnits[unit]);
}

std::string format_bytes_decimal(double bytes) {
  if (bytes == 0) return "0";
  if (bytes >= 1e12) return fmt::format("{:.2f} TB", bytes / 1e12);
  if (bytes >= 1e9) return fmt::format("{:.2f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.2f} MB", bytes / 1e6);
  if (bytes >= 1e3) return fmt::format("{:.2f} kB", bytes / 1e3);
  return fmt::format("{:.0f} B", bytes);
}

}  // namespace zero
