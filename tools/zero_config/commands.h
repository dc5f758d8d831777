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

namespace zero {
struct EstimateInput;
}

namespace zero::tools {

// Takes stage, precision, optimizer and offload tiers from the ds_config at `path` into `in`;
// appends a message to `problems` for each reason it cannot (estimate_config.cpp).
void apply_config_to_estimate(const std::string& path, EstimateInput& in,
                              std::vector<std::string>& problems);

}  // namespace zero::tools
