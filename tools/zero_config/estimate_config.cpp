#include "config/ds_config.h"
#include "tools/zero_config/commands.h"
#include "zero/base/error.h"
#include "zero/estimate/estimate.h"
#include "zero/estimate/from_config.h"

namespace zero::tools {

void apply_config_to_estimate(const std::string& path, EstimateInput& in,
                              std::vector<std::string>& problems) {
  config::Supplied supplied;
  if (in.world_size > 0) supplied.world_size = static_cast<std::int64_t>(in.world_size);
  try {
    const config::DsConfig cfg = config::load_config_file(path, supplied);
    if (!zero::apply_config_to_estimate(cfg, in)) {
      problems.push_back(
          fmt::format("--config {}: optimizer '{}' has no memory formula here "
                      "(estimate knows Adam/AdamW, Adagrad, Lion and SGD)",
                      path, cfg.optimizer ? cfg.optimizer->type : std::string()));
    }
  } catch (const ConfigError& e) {
    for (const auto& p : e.problems()) {
      problems.push_back(
          fmt::format("--config {}: {}{}{}", path, p.path, p.path.empty() ? "" : ": ", p.message));
    }
  } catch (const Error& e) {
    problems.push_back(fmt::format("--config {}: {}", path, e.what()));
  }
}

}  // namespace zero::tools
