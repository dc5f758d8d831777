// The ds_config schema as data: every key zero reads, with DeepSpeed's type, current default,
// alias, deprecated spellings and constraints; the blocks and how strictly DeepSpeed validates
// each; the blocks of other DeepSpeed subsystems; and the keys zero does not honour yet.
// Validation, `zero-config print` and the docs are all driven from these tables.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace zero::config {

enum class ValueType {
  Bool,   // pydantic lax: true/false, 0/1, "yes"/"no"/"on"/"off"/"true"/"false"/...
  Int,    // integers, integral floats (5e8), integer strings; 5.5 refused
  Float,  // numbers and numeric strings, finite
  String,
  Enum,         // one of `choices` (case-insensitively when `case_insensitive`)
  Dtype,        // DeepSpeed's dtype spellings (zero::parse_dtype), stored as fp32/fp16/bf16
  Betas,        // [beta1, beta2]
  FloatOrList,  // a number, or one number per param group
  PathOrList,   // a path, or a non-empty list of paths (zero's extension: NVMe striping)
  Object,       // a nested block with its own rules (`BlockRule`), or free-form when it has none
  Any,
};

// How DeepSpeed treats a block (SPEC §1.2).
enum class BlockPolicy {
  Pydantic,  // unknown keys are errors; "auto" is dropped so the default applies
  Dict,      // read with dict.get: unknown keys ignored (zero warns); "auto" passed through raw
  Kwargs,    // optimizer/scheduler params: passed to a constructor, which refuses unknown names
};

struct BlockRule {
  std::string_view path;  // "" for the top level
  BlockPolicy policy;
};

struct KeyRule {
  std::string_view block = {};    // dotted path of the enclosing block, "" for the top level
  std::string_view variant = {};  // optimizer/scheduler type the key belongs to, "" for any
  std::string_view name = {};     // the current (canonical) key
  ValueType type = ValueType::Any;
  nlohmann::json default_value = nullptr;
  bool nullable = false;
  std::string_view alias = {};  // the other spelling DeepSpeed accepts for the same field
  std::optional<double> min = {};
  std::optional<double> max = {};
  std::vector<std::string_view> choices = {};
  bool case_insensitive = false;
  bool required = false;        // no default: the config or the embedding must give it
  std::string_view older = {};  // where older DeepSpeed releases differed (SPEC §0.1)
  std::string_view doc = {};
};

enum class DeprecationKind {
  Rename,        // the value moves to `replacement`
  OffloadToCpu,  // true ⇒ replacement block = {"device": "cpu"}; false ⇒ left unset
  Ignored,       // DeepSpeed warns and ignores the value
};

struct DeprecatedRule {
  std::string_view block;
  std::string_view name;
  ValueType type;
  std::string_view replacement;  // canonical key in the same block, "" when ignored
  DeprecationKind kind;
  std::string_view message;
};

// A key or value DeepSpeed honours that zero does not implement yet. `applies` sees the
// resolved value at `path`.
struct UnsupportedRule {
  std::string_view path;
  bool (*applies)(const nlohmann::json& value);
  std::string_view what;
  // Also required, when set: a condition on the whole resolved config (e.g. the ZeRO stage).
  bool (*when)(const nlohmann::json& root) = nullptr;
};

struct SubsystemBlock {
  std::string_view name;
  std::string_view what;
};

std::span<const BlockRule> block_rules();
std::span<const KeyRule> key_rules();
std::span<const DeprecatedRule> deprecated_rules();
std::span<const UnsupportedRule> unsupported_rules();
std::span<const SubsystemBlock> subsystem_blocks();

const BlockRule* find_block(std::string_view path);
// The rules of one block; for optimizer/scheduler params, those of `variant` only.
std::vector<const KeyRule*> rules_of(std::string_view block, std::string_view variant = {});

// DeepSpeed's own optimizer types, as its documentation spells them. DeepSpeed matches them in
// any case: it lower-cases a type whose lower-case form is one of these (SPEC §1.7).
std::span<const std::string_view> deepspeed_optimizer_names();
// Scheduler types DeepSpeed implements itself (case-sensitive).
std::span<const std::string_view> deepspeed_scheduler_names();
// What DeepSpeed looks up, case-sensitively, for any other type: the classes of torch.optim and
// of torch.optim.lr_scheduler. A type in none of these lists fails deepspeed.initialize.
std::span<const std::string_view> torch_optimizer_names();
std::span<const std::string_view> torch_scheduler_names();
// Which param rules an optimizer type uses ("adam" for adam/adamw, ...), "" when zero has none.
std::string_view optimizer_variant(std::string_view resolved_type);

}  // namespace zero::config
