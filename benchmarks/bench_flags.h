// Flag values the zero-bench subcommands share (benchmark-only code).
#pragma once

#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cli/flags.h"
#include "zero/base/error.h"

namespace zero::bench {

// The value of a flag that takes one; a zero::Error naming the flag and `usage` when it has none.
inline std::string flag_value(cli::FlagArg& arg, std::string_view usage) {
  ZERO_CHECK(arg.has_value(), "{} needs a value; {}", arg.name(), usage);
  return arg.value(usage);
}

// A count written "65536", "64K", "16M", "1G" (K, M, G binary, as zero-bench comm --sizes) or
// "5e6": a positive whole number up to 2^40. Throws zero::Error naming `flag`, the text and
// `usage` otherwise.
inline std::size_t parse_count(std::string_view text, std::string_view flag,
                               std::string_view usage) {
  ZERO_CHECK(!text.empty(), "{}: empty value; {}", flag, usage);
  std::string digits(text);
  double scale = 1;
  const std::size_t unit = std::string_view("KMG").find(
      static_cast<char>(std::toupper(static_cast<unsigned char>(text.back()))));
  if (unit != std::string_view::npos) {
    scale = std::ldexp(1.0, 10 * static_cast<int>(unit + 1));
    digits.pop_back();
  }
  char* end = nullptr;
  const double v = std::strtod(digits.c_str(), &end) * scale;
  ZERO_CHECK(!digits.empty() && end != digits.c_str() && *end == '\0' && v >= 1 && v <= 0x1p40 &&
                 v == std::floor(v),
             "{} {}: expected a positive whole count such as 65536, 64K, 16M or 5e6", flag, text);
  return static_cast<std::size_t>(v);
}

}  // namespace zero::bench
