#include "zero/base/strings.h"

#include <cctype>

namespace zero {

std::string trim(std::string_view text) {
  const auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  std::size_t first = 0;
  std::size_t last = text.size();
  while (first < last && is_space(text[first])) ++first;
  while (last > first && is_space(text[last - 1])) --last;
  return std::string(text.substr(first, last - first));
}

}  // namespace zero
