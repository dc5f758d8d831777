// Small string helpers.
#pragma once

#include <string>
#include <string_view>

namespace zero {

// `text` without leading and trailing whitespace (std::isspace in the C locale: space, \t, \n,
// \v, \f, \r). Empty when `text` is all whitespace.
std::string trim(std::string_view text);

}  // namespace zero
