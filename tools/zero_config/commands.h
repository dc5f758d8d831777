// Subcommands of the zero-config tool. Each takes the arguments after its name and returns the
// process exit code: 0 success, 1 the input is invalid (problems printed), 2 bad usage.
#pragma once

#include <string>
#include <vector>

namespace zero::tools {

using Args = std::vector<std::string>;

int config_check(const Args& args);     // check_print.cpp
int config_print(const Args& args);     // check_print.cpp
int config_estimate(const Args& args);  // estimate.cpp

}  // namespace zero::tools
