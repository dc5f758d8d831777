// libFuzzer target: arbitrary bytes as a ds_config. Loading must return or throw
// zero::ConfigError; any other exception, crash, hang or leak is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "config/ds_config.h"
#include "zero/base/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const zero::config::DsConfig c = zero::config::load_config_string(text);
    (void)c.to_json().dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  } catch (const zero::ConfigError&) {
  }
  // Again with a world size and supplied values, to reach the exact batch triad and the
  // supplied-value paths.
  zero::config::Supplied supplied;
  supplied.world_size = 1 + static_cast<std::int64_t>(size % 7);
  supplied.values["optimizer.params.lr"] = 1e-3;
  supplied.values["train_micro_batch_size_per_gpu"] = 2;
  try {
    (void)zero::config::load_config_string(text, supplied);
  } catch (const zero::ConfigError&) {
  }
  return 0;
}
