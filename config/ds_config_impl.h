// INTERNAL to the ds_config loader: include only from config/ds_config*.cpp. Not part of
// zero_config's interface; the public API is config/ds_config.h.
//
// One Loader lives for one load_config_* call. Its steps live in files by seam:
//   ds_config.cpp          entry points, the order of the steps (Loader::run), supplied values
//   ds_config_values.cpp   JSON value helpers: coercion by key rule, lookups by dotted path
//   ds_config_resolve.cpp  one block against the schema tables; the optimizer and scheduler
//                          blocks, whose params rules depend on their type
//   ds_config_build.cpp    the typed DsConfig read from the resolved JSON
//   ds_config_checks.cpp   cross-field checks and values zero does not support
//   ds_config_batch.cpp    the batch-size triad (SPEC §1.4)
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "config/ds_config.h"
#include "config/schema.h"
#include "zero/base/error.h"

namespace zero::config {

using nlohmann::json;

namespace detail {

// A value as error messages quote it: compact JSON, cut to 80 characters.
std::string show(const json& v);
// "block.key", or "key" for the top level (empty block).
std::string join(std::string_view block, std::string_view key);
std::string lower(std::string_view s);
bool is_auto(const json& v);

// Coerce `v` to what rule `r` (or a boolean) accepts, as pydantic's lax mode does. On success
// `out` holds the canonical value; on failure `why` says what was expected and what was given.
bool coerce_bool(const json& v, json& out, std::string& why);
bool coerce(const KeyRule& r, const json& v, json& out, std::string& why);

// The node at a dotted path ("zero_optimization.stage") under `root`, or nullptr.
const json* lookup(const json& root, std::string_view dotted);
// The value at `path` when it has the type, else `fallback` (string_at: else empty).
double number_at(const json& root, std::string_view path, double fallback);
std::int64_t int_at(const json& root, std::string_view path, std::int64_t fallback);
bool bool_at(const json& root, std::string_view path, bool fallback);
std::string string_at(const json& root, std::string_view path);
// A string or a list of strings as a list (empty when absent or null).
std::vector<std::string> paths_at(const json& root, std::string_view path);

}  // namespace detail

// One load: collects every problem and finding, then throws or returns the result.
struct Loader {
  const Supplied& supplied;
  std::vector<ConfigError::Problem> errors;
  std::vector<Finding> findings;
  std::vector<Finding> unresolved;
  std::map<std::string, Provenance> provenance;
  std::set<std::string> supplied_paths;
  // Provenance for a key that is present in a block only because it was mapped there.
  std::map<std::string, Provenance> mapped;

  void error(std::string path, std::string message) {
    errors.push_back({std::move(path), std::move(message)});
  }
  void add(Severity s, std::string path, std::string message) {
    findings.push_back({s, std::move(path), std::move(message)});
  }
  void to_supply(std::string path, std::string message) {
    unresolved.push_back({Severity::Note, std::move(path), std::move(message)});
  }

  Provenance given_source(const std::string& path) const {
    if (supplied_paths.count(path) != 0) return {Source::Supplied, ""};
    if (auto it = mapped.find(path); it != mapped.end()) return it->second;
    return {Source::Config, ""};
  }

  void apply_supplied(json& doc);
  json resolve_block(std::string_view rules_block, const std::string& path,
                     std::string_view variant, const json& given);
  void report_unknown(BlockPolicy policy, std::string_view rules_block, const std::string& path,
                      std::string_view variant, const std::string& key,
                      const std::vector<std::string_view>& known);
  void resolve_optimizer(const json& doc, json& out);
  void resolve_scheduler(const json& doc, json& out);
  DsConfig build(const json& out) const;
  void check_cross_fields(const DsConfig& c, json& out);
  void check_unsupported(const json& out);
  void check_loco(const json* v, int stage, bool qgz);
  void resolve_batch(DsConfig& c, json& out);
  DsConfig run(json doc);
};

}  // namespace zero::config
