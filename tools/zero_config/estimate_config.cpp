#include "tools/zero_config/commands.h"
#include "zero/estimate/estimate.h"

namespace zero::tools {

void apply_config_to_estimate(const std::string& path, EstimateInput& /*in*/,
                              std::vector<std::string>& problems) {
  problems.push_back("--config " + path + ": reading a ds_config for estimate is not wired yet");
}

}  // namespace zero::tools
