// Helpers shared by the config tests.
#pragma once

#include <catch2/catch.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "config/ds_config.h"
#include "zero/base/error.h"

namespace zero::config::testing {

// The problems a config is rejected with; fails the test when it loads.
inline std::vector<ConfigError::Problem> problems_of(std::string_view text,
                                                     const Supplied& supplied = {}) {
  try {
    load_config_string(text, supplied);
  } catch (const ConfigError& e) {
    return e.problems();
  }
  FAIL("expected a ConfigError for: " << text);
  return {};
}

inline bool has_problem(const std::vector<ConfigError::Problem>& problems, std::string_view path,
                        std::string_view message_part) {
  for (const auto& p : problems) {
    if (p.path == path && p.message.find(message_part) != std::string::npos) return true;
  }
  return false;
}

inline bool has_finding(const std::vector<Finding>& findings, Severity s, std::string_view path,
                        std::string_view message_part = {}) {
  for (const auto& f : findings) {
    if (f.severity == s && f.path == path && f.message.find(message_part) != std::string::npos)
      return true;
  }
  return false;
}

inline std::string describe(const std::vector<ConfigError::Problem>& problems) {
  std::string out;
  for (const auto& p : problems) out += p.path + ": " + p.message + "\n";
  return out;
}

}  // namespace zero::config::testing
