// Internal to zero_config: the ds_config's key rules, by block, each table in its own file, and
// what they share. schema.cpp joins them into key_rules() in this order, which `zero-config
// print` and the docs follow.
//
// Where a value still differs between DeepSpeed releases, a rule's `older` records it (SPEC
// §0.1); zero uses the 0.19.6 value, but for one: an absent gradient_clipping is off, as before
// 0.19.3 (0.19.3 made it 1.0), so a config means what the plain-PyTorch loop it replaces did; a
// note says so (check_cross_fields). Deltas without a key of their own: loss-scale growth timing
// and the pre-0.17.1 dynamic-scaler defaults live in zero/schedule; aio.thread_count and the
// fp16-style keys in bf16 are in kDeprecated (schema.cpp).
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "config/schema.h"

namespace zero::config::schema_detail {

using VT = ValueType;

inline constexpr std::string_view kZero = "zero_optimization";
inline constexpr std::string_view kOffParam = "zero_optimization.offload_param";
inline constexpr std::string_view kOffOpt = "zero_optimization.offload_optimizer";
inline constexpr std::string_view kOptParams = "optimizer.params";
inline constexpr std::string_view kSchedParams = "scheduler.params";
inline constexpr std::int64_t kMaxSize = std::numeric_limits<std::int64_t>::max();

// Top level, fp16 and bf16 (schema_keys_training.cpp).
std::vector<KeyRule> training_key_rules();
// zero_optimization and its offload blocks (schema_keys_zero.cpp).
std::vector<KeyRule> zero_key_rules();
// optimizer and scheduler, with every variant's params (schema_keys_optim.cpp).
std::vector<KeyRule> optimizer_key_rules();
// aio, checkpoint, data_types and torch_autocast (schema_keys_training.cpp).
std::vector<KeyRule> io_key_rules();

}  // namespace zero::config::schema_detail
