// Subcommands of the zero-config tool. Each takes the arguments after its name and returns the
// process exit code: 0 success, 1 the input is invalid (problems printed), 2 bad usage.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/ds_config.h"

namespace zero::tools {

using Args = std::vector<std::string>;

int config_check(const Args& args);      // check_print.cpp
int config_print(const Args& args);      // check_print.cpp
int config_estimate(const Args& args);   // estimate.cpp
int config_schedule(const Args& args);   // schedule.cpp
int config_from_fsdp(const Args& args);  // fsdp.cpp
int config_to_fsdp(const Args& args);    // fsdp.cpp

// The options of the subcommands that load a ds_config (check_print.cpp): --world-size N,
// --set key=value (repeatable), --strict when allowed, and the FILE arguments.
struct ConfigOptions {
  config::Supplied supplied;
  bool strict = false;
  std::vector<std::string> files;
};

// Returns an error message for bad usage, empty when the arguments parse.
std::string parse_config_options(const Args& args, bool allow_strict, ConfigOptions& o);

// Whether --help or -h is among the arguments.
bool wants_help(const Args& args);

// Loads one file, printing its problems (stderr) and a summary line (stdout); nullopt when it is
// invalid or unreadable.
std::optional<config::DsConfig> load_reporting(const std::string& file, const ConfigOptions& o);

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
