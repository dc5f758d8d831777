#include "config/ds_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "config/did_you_mean.h"
#include "config/parse.h"
#include "config/schema.h"
#include "zero/base/error.h"
#include "zero/base/strings.h"

namespace zero::config {

std::string_view severity_name(Severity s) {
  switch (s) {
    case Severity::Note: return "note";
    case Severity::Warning: return "warning";
    case Severity::Unsupported: return "unsupported";
    case Severity::EngineError: return "engine_error";
  }
  return "?";
}

std::string_view source_name(Source s) {
  switch (s) {
    case Source::Config: return "config";
    case Source::Default: return "default";
    case Source::DeepSpeedAutoDefault: return "deepspeed-auto-default";
    case Source::Supplied: return "supplied";
    case Source::AliasOf: return "alias-of";
    case Source::DeprecatedMapped: return "deprecated-mapped";
    case Source::Derived: return "derived";
  }
  return "?";
}

std::vector<Finding> DsConfig::blockers() const {
  std::vector<Finding> out;
  for (const Finding& f : findings) {
    if (f.severity == Severity::Unsupported || f.severity == Severity::EngineError)
      out.push_back(f);
  }
  out.insert(out.end(), unresolved.begin(), unresolved.end());
  return out;
}

namespace {

using nlohmann::json;

std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string join(std::string_view block, std::string_view key) {
  if (block.empty()) return std::string(key);
  return fmt::format("{}.{}", block, key);
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool is_auto(const json& v) {
  return v.is_string() && v.get_ref<const std::string&>() == "auto";
}

// Numeric strings are accepted as pydantic's lax mode does ("5e8", " 16 ").
std::optional<double> number_from_string(const std::string& s) {
  const std::string t = trim(s);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || errno == ERANGE || !std::isfinite(d)) return std::nullopt;
  return d;
}

constexpr double kInt64Bound = 9223372036854775808.0;  // 2^63

std::optional<std::int64_t> integral(double d) {
  if (!std::isfinite(d) || d != std::trunc(d) || d < -kInt64Bound || d >= kInt64Bound)
    return std::nullopt;
  return static_cast<std::int64_t>(d);
}

bool coerce_bool(const json& v, json& out, std::string& why) {
  if (v.is_boolean()) {
    out = v;
    return true;
  }
  if (v.is_number()) {
    const double d = v.get<double>();
    if (d == 0 || d == 1) {
      out = d == 1;
      return true;
    }
  }
  if (v.is_string()) {
    const std::string s = lower(trim(v.get_ref<const std::string&>()));
    for (const char* t : {"true", "1", "yes", "on", "y", "t"}) {
      if (s == t) {
        out = true;
        return true;
      }
    }
    for (const char* f : {"false", "0", "no", "off", "n", "f"}) {
      if (s == f) {
        out = false;
        return true;
      }
    }
  }
  why = fmt::format("expected a boolean, got {}", show(v));
  return false;
}

bool coerce_int(const json& v, json& out, std::string& why) {
  if (v.is_number_unsigned()) {
    if (v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
      why = fmt::format("{} is out of the 64-bit integer range", show(v));
      return false;
    }
    out = static_cast<std::int64_t>(v.get<std::uint64_t>());
    return true;
  }
  if (v.is_number_integer()) {
    out = v.get<std::int64_t>();
    return true;
  }
  std::optional<double> d;
  if (v.is_number_float()) d = v.get<double>();
  if (v.is_string()) d = number_from_string(v.get_ref<const std::string&>());
  if (d) {
    if (auto i = integral(*d)) {
      out = *i;
      return true;
    }
    why = fmt::format("expected an integer, got {} (not a whole number)", show(v));
    return false;
  }
  why = fmt::format("expected an integer, got {}", show(v));
  return false;
}

bool coerce_float(const json& v, json& out, std::string& why) {
  if (v.is_number()) {
    const double d = v.get<double>();
    if (std::isfinite(d)) {
      out = d;
      return true;
    }
  }
  if (v.is_string()) {
    if (auto d = number_from_string(v.get_ref<const std::string&>())) {
      out = *d;
      return true;
    }
  }
  why = fmt::format("expected a finite number, got {}", show(v));
  return false;
}

bool coerce(const KeyRule& r, const json& v, json& out, std::string& why) {
  if (v.is_null()) {
    if (r.nullable) {
      out = nullptr;
      return true;
    }
    why = "null is not allowed here";
    return false;
  }
  bool ok = false;
  switch (r.type) {
    case ValueType::Bool: ok = coerce_bool(v, out, why); break;
    case ValueType::Int: ok = coerce_int(v, out, why); break;
    case ValueType::Float: ok = coerce_float(v, out, why); break;
    case ValueType::String:
      ok = v.is_string();
      if (ok)
        out = v;
      else
        why = fmt::format("expected a string, got {}", show(v));
      break;
    case ValueType::Enum: {
      if (v.is_string()) {
        const std::string& s = v.get_ref<const std::string&>();
        for (std::string_view c : r.choices) {
          if (s == c || (r.case_insensitive && lower(s) == lower(c))) {
            out = std::string(c);
            return true;
          }
        }
      }
      std::string list;
      for (std::string_view c : r.choices)
        list += fmt::format("{}\"{}\"", list.empty() ? "" : ", ", c);
      why = fmt::format("expected one of {}{}, got {}", list,
                        r.case_insensitive ? "" : " (case-sensitive)", show(v));
      if (v.is_string()) why += did_you_mean(v.get_ref<const std::string&>(), r.choices);
      return false;
    }
    case ValueType::Dtype: {
      if (v.is_string()) {
        if (auto d = parse_dtype(v.get_ref<const std::string&>())) {
          out = std::string(dtype_name(*d));
          return true;
        }
      }
      static const std::vector<std::string_view> kSpellings = {
          "fp32", "fp16", "bf16", "float32", "float16", "bfloat16", "half", "float"};
      why = fmt::format("expected a dtype (fp32, fp16, bf16 or a torch spelling), got {}", show(v));
      if (v.is_string()) why += did_you_mean(v.get_ref<const std::string&>(), kSpellings);
      return false;
    }
    case ValueType::Betas: {
      json a, b;
      std::string ignored;
      if (v.is_array() && v.size() == 2 && coerce_float(v[0], a, ignored) &&
          coerce_float(v[1], b, ignored)) {
        out = json::array({a, b});
        return true;
      }
      why = fmt::format("expected [beta1, beta2], got {}", show(v));
      return false;
    }
    case ValueType::FloatOrList: {
      if (!v.is_array()) return coerce_float(v, out, why);
      json list = json::array();
      for (const json& e : v) {
        json x;
        if (!coerce_float(e, x, why)) {
          why = fmt::format("expected a number or a list of numbers (one per param group), got {}",
                            show(v));
          return false;
        }
        list.push_back(x);
      }
      if (list.empty()) {
        why = "expected a number or a non-empty list of numbers (one per param group)";
        return false;
      }
      out = list;
      return true;
    }
    case ValueType::Object:
      ok = v.is_object();
      if (ok)
        out = v;
      else
        why = fmt::format("expected an object, got {}", show(v));
      break;
    case ValueType::Any: out = v; return true;
  }
  if (!ok) return false;
  if (out.is_number() && (r.min || r.max)) {
    const double d = out.get<double>();
    if (r.min && d < *r.min) {
      why = fmt::format("must be >= {}, got {}", *r.min, show(v));
      if (r.max) why = fmt::format("must be between {} and {}, got {}", *r.min, *r.max, show(v));
      return false;
    }
    if (r.max && d > *r.max) {
      why = fmt::format("must be <= {}, got {}", *r.max, show(v));
      if (r.min) why = fmt::format("must be between {} and {}, got {}", *r.min, *r.max, show(v));
      return false;
    }
  }
  return true;
}

const json* lookup(const json& root, std::string_view dotted) {
  const json* node = &root;
  std::size_t start = 0;
  while (start <= dotted.size()) {
    const std::size_t dot = std::min(dotted.find('.', start), dotted.size());
    const std::string key(dotted.substr(start, dot - start));
    if (!node->is_object()) return nullptr;
    auto it = node->find(key);
    if (it == node->end()) return nullptr;
    node = &*it;
    start = dot + 1;
  }
  return node;
}

double number_at(const json& root, std::string_view path, double fallback) {
  const json* v = lookup(root, path);
  return v && v->is_number() ? v->get<double>() : fallback;
}
std::int64_t int_at(const json& root, std::string_view path, std::int64_t fallback) {
  const json* v = lookup(root, path);
  return v && v->is_number_integer() ? v->get<std::int64_t>() : fallback;
}
bool bool_at(const json& root, std::string_view path, bool fallback) {
  const json* v = lookup(root, path);
  return v && v->is_boolean() ? v->get<bool>() : fallback;
}
std::string string_at(const json& root, std::string_view path) {
  const json* v = lookup(root, path);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

OffloadDevice device_of(const std::string& s) {
  if (s == "cpu") return OffloadDevice::Cpu;
  if (s == "nvme") return OffloadDevice::Nvme;
  return OffloadDevice::None;
}

OptimizerKind optimizer_kind(const std::string& type) {
  static const std::vector<std::pair<std::string_view, OptimizerKind>> kKinds = {
      {"adam", OptimizerKind::Adam},
      {"adamw", OptimizerKind::AdamW},
      {"adagrad", OptimizerKind::Adagrad},
      {"lion", OptimizerKind::Lion},
      {"SGD", OptimizerKind::Sgd},
      {"lamb", OptimizerKind::Lamb},
      {"onebitadam", OptimizerKind::OneBitAdam},
      {"zerooneadam", OptimizerKind::ZeroOneAdam},
      {"onebitlamb", OptimizerKind::OneBitLamb},
      {"muadam", OptimizerKind::MuAdam},
      {"muadamw", OptimizerKind::MuAdamW},
      {"musgd", OptimizerKind::MuSgd},
      {"muon", OptimizerKind::Muon}};
  for (const auto& [name, kind] : kKinds) {
    if (type == name) return kind;
  }
  return OptimizerKind::TorchOther;
}

SchedulerKind scheduler_kind(const std::string& type) {
  if (type == "WarmupLR") return SchedulerKind::WarmupLR;
  if (type == "WarmupDecayLR") return SchedulerKind::WarmupDecayLR;
  if (type == "WarmupCosineLR") return SchedulerKind::WarmupCosineLR;
  if (type == "OneCycle") return SchedulerKind::OneCycle;
  if (type == "LRRangeTest") return SchedulerKind::LRRangeTest;
  return SchedulerKind::TorchOther;
}

}  // namespace

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
  void resolve_batch(DsConfig& c, json& out);
  DsConfig run(json doc);
};

void Loader::apply_supplied(json& doc) {
  for (const auto& [path, value] : supplied.values) {
    std::vector<std::string> parts;
    std::size_t start = 0;
    while (true) {
      const std::size_t dot = path.find('.', start);
      parts.push_back(
          path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    if (std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); })) {
      error(path, "supplied value: not a dotted key path");
      continue;
    }
    json* node = &doc;
    bool ok = true;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      if (node->is_null()) *node = json::object();
      if (!node->is_object()) {
        ok = false;
        break;
      }
      node = &(*node)[parts[i]];
    }
    if (node->is_null()) *node = json::object();
    if (!ok || !node->is_object()) {
      error(path, "supplied value: the config has a non-object where this path needs a block");
      continue;
    }
    auto it = node->find(parts.back());
    if (it == node->end() || is_auto(*it)) {
      (*node)[parts.back()] = value;
      supplied_paths.insert(path);
    } else if (*it != value) {
      error(path, fmt::format("the embedding supplies {} but the config sets {}", show(value),
                              show(*it)));
    }
  }
}

void Loader::report_unknown(BlockPolicy policy, std::string_view rules_block,
                            const std::string& path, std::string_view variant,
                            const std::string& key, const std::vector<std::string_view>& known) {
  const std::string key_path = join(path, key);
  std::string hint;
  if (auto n = nearest(key, known)) {
    hint = fmt::format("; did you mean {}?", *n);
    for (const DeprecatedRule& d : deprecated_rules()) {
      if (d.block == rules_block && d.name == *n) hint += fmt::format(" ({})", d.message);
    }
  }
  switch (policy) {
    case BlockPolicy::Pydantic: error(key_path, "unknown key" + hint); break;
    case BlockPolicy::Dict:
      add(Severity::Warning, key_path, "unknown key, ignored (as DeepSpeed does)" + hint);
      break;
    case BlockPolicy::Kwargs:
      add(Severity::EngineError, key_path,
          fmt::format("not a parameter of {}: DeepSpeed passes it to the constructor, which raises "
                      "TypeError{}",
                      variant, hint));
      break;
  }
}

json Loader::resolve_block(std::string_view rules_block, const std::string& path,
                           std::string_view variant, const json& given) {
  const BlockRule* block = find_block(rules_block);
  const BlockPolicy policy = block ? block->policy : BlockPolicy::Dict;
  const std::vector<const KeyRule*> rules = rules_of(rules_block, variant);
  json in = json::object();
  if (given.is_object()) {
    in = given;
  } else if (!given.is_null()) {
    error(path, fmt::format("expected an object, got {}", show(given)));
  }
  auto canonical = [&](const std::string& key) -> std::string {
    for (const KeyRule* r : rules) {
      if (r->alias == key) return std::string(r->name);
    }
    return key;
  };

  // DeepSpeed drops "auto" inside pydantic blocks before validating (SPEC §1.2).
  std::set<std::string> auto_dropped;
  if (policy == BlockPolicy::Pydantic) {
    for (auto it = in.begin(); it != in.end();) {
      if (is_auto(it.value())) {
        auto_dropped.insert(canonical(it.key()));
        it = in.erase(it);
      } else {
        ++it;
      }
    }
  }

  for (const DeprecatedRule& d : deprecated_rules()) {
    if (d.block != rules_block || !in.contains(d.name)) continue;
    const std::string dep_path = join(path, d.name);
    const json value = in[std::string(d.name)];
    in.erase(std::string(d.name));
    add(Severity::Warning, dep_path, std::string(d.message));
    if (d.kind == DeprecationKind::Ignored) continue;
    const auto repl = std::find_if(rules.begin(), rules.end(),
                                   [&](const KeyRule* r) { return r->name == d.replacement; });
    ZERO_ASSERT(repl != rules.end());
    const KeyRule& r = **repl;
    if (in.contains(r.name) || (!r.alias.empty() && in.contains(r.alias)) ||
        auto_dropped.count(std::string(r.name))) {
      error(dep_path, fmt::format("cannot be given together with its replacement {}", r.name));
      continue;
    }
    json coerced;
    std::string why;
    if (!coerce_bool(value, coerced, why)) {
      error(dep_path, why);
      continue;
    }
    const std::string repl_path = join(path, r.name);
    if (d.kind == DeprecationKind::OffloadToCpu) {
      if (coerced.get<bool>()) {
        in[std::string(r.name)] = json{{"device", "cpu"}};
        mapped[repl_path] = {Source::DeprecatedMapped, std::string(d.name)};
        mapped[repl_path + ".device"] = {Source::DeprecatedMapped, std::string(d.name)};
      }
    } else {
      in[std::string(r.name)] = coerced;
      mapped[repl_path] = {Source::DeprecatedMapped, std::string(d.name)};
    }
  }

  for (const KeyRule* r : rules) {
    if (r->alias.empty() || !in.contains(r->alias)) continue;
    if (in.contains(r->name)) {
      error(join(path, r->alias),
            fmt::format("give only one of {} and {} (two spellings of the same setting)", r->name,
                        r->alias));
    } else {
      in[std::string(r->name)] = in[std::string(r->alias)];
      mapped[join(path, r->name)] = {Source::AliasOf, std::string(r->alias)};
    }
    in.erase(std::string(r->alias));
  }

  std::vector<std::string_view> known;
  for (const KeyRule* r : rules) known.push_back(r->name);
  for (const KeyRule* r : rules) {
    if (!r->alias.empty()) known.push_back(r->alias);
  }
  for (const DeprecatedRule& d : deprecated_rules()) {
    if (d.block == rules_block) known.push_back(d.name);
  }
  if (!rules_block.empty()) {
    for (auto it = in.begin(); it != in.end(); ++it) {
      const bool is_rule = std::any_of(rules.begin(), rules.end(),
                                       [&](const KeyRule* r) { return r->name == it.key(); });
      if (!is_rule) report_unknown(policy, rules_block, path, variant, it.key(), known);
    }
  }

  json out = json::object();
  for (const KeyRule* r : rules) {
    const std::string name(r->name);
    const std::string key_path = join(path, name);
    const std::string child_block = join(rules_block, name);
    const BlockRule* child = find_block(child_block);
    if (child != nullptr && child->policy != BlockPolicy::Kwargs) {
      if (in.contains(name) && !in[name].is_null()) {
        out[name] = resolve_block(child_block, key_path, "", in[name]);
      } else {
        out[name] = r->default_value;
        provenance[key_path] = {
            auto_dropped.count(name) ? Source::DeepSpeedAutoDefault : Source::Default, ""};
      }
      continue;
    }
    if (in.contains(name)) {
      const json& v = in[name];
      if (is_auto(v)) {
        out[name] = "auto";
        to_supply(key_path, "\"auto\": to be supplied by the embedding");
        provenance[key_path] = {Source::Config, "\"auto\", to be supplied"};
        continue;
      }
      json value;
      std::string why;
      if (coerce(*r, v, value, why)) {
        out[name] = value;
        provenance[key_path] = given_source(key_path);
      } else {
        error(key_path, why);
        out[name] = r->default_value;
      }
    } else if (r->required) {
      if (policy == BlockPolicy::Kwargs) {
        out[name] = "auto";
        to_supply(
            key_path,
            fmt::format("required by {} and not given: to be supplied by the embedding", variant));
        provenance[key_path] = {Source::Default, "no default: to be supplied"};
      } else {
        error(key_path, "required key is missing");
      }
    } else {
      out[name] = r->default_value;
      if (auto_dropped.count(name)) {
        provenance[key_path] = {Source::DeepSpeedAutoDefault, ""};
        add(Severity::Note, key_path,
            fmt::format("\"auto\" means DeepSpeed's default here ({}): DeepSpeed drops \"auto\" in "
                        "this block",
                        show(r->default_value)));
      } else {
        provenance[key_path] = {
            Source::Default,
            std::string(r->older.empty() ? "" : "older DeepSpeed: ") + std::string(r->older)};
      }
    }
  }
  return out;
}

void Loader::resolve_optimizer(const json& doc, json& out) {
  const auto it = doc.find("optimizer");
  if (it == doc.end() || it->is_null()) {
    out["optimizer"] = nullptr;
    to_supply("optimizer",
              "no optimizer block: the embedding must supply the optimizer (type and params)");
    return;
  }
  json opt = resolve_block("optimizer", "optimizer", "", *it);
  if (!opt["type"].is_string()) {
    out["optimizer"] = opt;
    return;
  }
  std::string type = opt["type"].get<std::string>();
  const std::string lowered = lower(type);
  const auto names = deepspeed_optimizer_names();
  if (std::find(names.begin(), names.end(), lowered) != names.end()) type = lowered;
  opt["type"] = type;
  if (type != "SGD" && lowered == "sgd") {
    add(Severity::EngineError, "optimizer.type",
        fmt::format("DeepSpeed looks up torch.optim.{} (case-sensitive), which does not exist; did "
                    "you mean SGD?",
                    type));
  }

  json params = json::object();
  if (it->is_object()) {
    if (auto p = it->find("params"); p != it->end() && p->is_object()) params = *p;
  }
  if (params.contains("max_grad_norm")) {
    add(Severity::EngineError, "optimizer.params.max_grad_norm",
        "DeepSpeed refuses max_grad_norm as an optimizer parameter when it builds the optimizer "
        "(ValueError): use the top-level gradient_clipping");
    params.erase("max_grad_norm");
  }
  const std::string_view variant = optimizer_variant(type);
  if (!variant.empty()) {
    opt["params"] = resolve_block("optimizer.params", "optimizer.params", variant, params);
  } else {
    for (auto p = params.begin(); p != params.end(); ++p) {
      const std::string key_path = "optimizer.params." + p.key();
      provenance[key_path] = given_source(key_path);
      if (is_auto(p.value())) to_supply(key_path, "\"auto\": to be supplied by the embedding");
    }
    opt["params"] = params;
  }
  if (variant == "adam") {
    // DeepSpeed: decoupled weight decay = type "adamw" OR adam_w_mode (SPEC §1.7, §10.1).
    json& mode = opt["params"]["adam_w_mode"];
    if (type == "adamw" && mode.is_boolean() && !mode.get<bool>()) {
      mode = true;
      provenance["optimizer.params.adam_w_mode"] = {Source::Derived,
                                                    "type AdamW always decays decoupled"};
    }
  }
  out["optimizer"] = opt;
}

void Loader::resolve_scheduler(const json& doc, json& out) {
  const auto it = doc.find("scheduler");
  if (it == doc.end() || it->is_null()) {
    out["scheduler"] = nullptr;
    return;
  }
  json sched = resolve_block("scheduler", "scheduler", "", *it);
  if (!sched["type"].is_string()) {
    out["scheduler"] = sched;
    return;
  }
  const std::string type = sched["type"].get<std::string>();
  json params = json::object();
  if (it->is_object()) {
    if (auto p = it->find("params"); p != it->end() && p->is_object()) params = *p;
  }
  const auto names = deepspeed_scheduler_names();
  if (std::find(names.begin(), names.end(), type) != names.end()) {
    sched["params"] = resolve_block("scheduler.params", "scheduler.params", type, params);
    json& p = sched["params"];
    if (p.contains("warmup_type") && p["warmup_type"].is_string() && p["warmup_type"] != "log" &&
        p["warmup_type"] != "linear") {
      add(Severity::Warning, "scheduler.params.warmup_type",
          fmt::format("{} is neither \"log\" nor \"linear\": DeepSpeed uses log warmup",
                      show(p["warmup_type"])));
      p["warmup_type"] = "log";
      provenance["scheduler.params.warmup_type"] = {Source::Derived,
                                                    "unknown warmup_type falls back to log"};
    }
    if (type == "WarmupLR" && p["warmup_max_lr"].is_null()) {
      const json* lr = lookup(out, "optimizer.params.lr");
      if (lr != nullptr && lr->is_number()) {
        p["warmup_max_lr"] = *lr;
        provenance["scheduler.params.warmup_max_lr"] = {Source::Derived, "optimizer.params.lr"};
      } else {
        p["warmup_max_lr"] = "auto";
        to_supply("scheduler.params.warmup_max_lr",
                  "defaults to the optimizer's lr, which is to be supplied");
      }
    }
    if (type == "OneCycle") {
      for (const auto& [second, first] :
           {std::pair{"cycle_second_step_size", "cycle_first_step_size"},
            std::pair{"cycle_second_stair_count", "cycle_first_stair_count"}}) {
        if (p[second].is_null()) {
          p[second] = p[first];
          provenance[std::string("scheduler.params.") + second] = {Source::Derived, first};
        }
      }
    }
  } else {
    for (auto q = params.begin(); q != params.end(); ++q) {
      const std::string key_path = "scheduler.params." + q.key();
      provenance[key_path] = given_source(key_path);
      if (is_auto(q.value())) to_supply(key_path, "\"auto\": to be supplied by the embedding");
    }
    sched["params"] = params;
  }
  out["scheduler"] = sched;
}

DsConfig Loader::build(const json& out) const {
  DsConfig c;
  auto opt_int = [&](const char* key) -> std::optional<std::int64_t> {
    const json* v = lookup(out, key);
    if (v && v->is_number_integer()) return v->get<std::int64_t>();
    return std::nullopt;
  };
  c.train_batch_size = opt_int("train_batch_size");
  c.train_micro_batch_size_per_gpu = opt_int("train_micro_batch_size_per_gpu");
  c.gradient_accumulation_steps = opt_int("gradient_accumulation_steps");
  c.gradient_clipping = number_at(out, "gradient_clipping", 1.0);
  c.prescale_gradients = bool_at(out, "prescale_gradients", false);
  c.gradient_predivide_factor = number_at(out, "gradient_predivide_factor", 1.0);
  c.gradient_allreduce_sum = string_at(out, "gradient_allreduce_op") == "sum";
  c.steps_per_print = opt_int("steps_per_print");
  c.wall_clock_breakdown = bool_at(out, "wall_clock_breakdown", false);
  c.memory_breakdown = bool_at(out, "memory_breakdown", false);
  c.zero_allow_untested_optimizer = bool_at(out, "zero_allow_untested_optimizer", false);
  c.zero_force_ds_cpu_optimizer = bool_at(out, "zero_force_ds_cpu_optimizer", true);

  Fp16& h = c.fp16;
  h.enabled = bool_at(out, "fp16.enabled", false);
  h.auto_cast = bool_at(out, "fp16.auto_cast", false);
  h.loss_scale = number_at(out, "fp16.loss_scale", 0);
  h.initial_scale_power = int_at(out, "fp16.initial_scale_power", 16);
  h.loss_scale_window = int_at(out, "fp16.loss_scale_window", 1000);
  h.hysteresis = int_at(out, "fp16.hysteresis", 2);
  h.consecutive_hysteresis = bool_at(out, "fp16.consecutive_hysteresis", false);
  h.min_loss_scale = number_at(out, "fp16.min_loss_scale", 1);
  h.fp16_master_weights_and_grads = bool_at(out, "fp16.fp16_master_weights_and_grads", false);

  Bf16& b = c.bf16;
  b.enabled = bool_at(out, "bf16.enabled", false);
  b.immediate_grad_update = bool_at(out, "bf16.immediate_grad_update", false);
  b.check_grad_overflow = bool_at(out, "bf16.check_grad_overflow", true);
  b.bf16_master_weights_and_grads = bool_at(out, "bf16.bf16_master_weights_and_grads", false);
  b.bf16_optimizer_states = bool_at(out, "bf16.bf16_optimizer_states", false);
  c.model_dtype = h.enabled ? DType::F16 : b.enabled ? DType::BF16 : DType::F32;
  const std::string comm = string_at(out, "communication_data_type");
  c.communication_data_type =
      comm.empty() ? c.model_dtype : parse_dtype(comm).value_or(c.model_dtype);

  ZeroOptimization& z = c.zero_optimization;
  const std::string zp = "zero_optimization.";
  auto zi = [&](const char* k, std::int64_t d) { return int_at(out, zp + k, d); };
  auto zb = [&](const char* k, bool d) { return bool_at(out, zp + k, d); };
  z.stage = static_cast<int>(zi("stage", 0));
  z.contiguous_gradients = zb("contiguous_gradients", true);
  z.reduce_scatter = zb("reduce_scatter", true);
  z.reduce_bucket_elems = zi("reduce_bucket_size", z.reduce_bucket_elems);
  z.use_multi_rank_bucket_allreduce = zb("use_multi_rank_bucket_allreduce", true);
  z.allgather_partitions = zb("allgather_partitions", true);
  z.allgather_bucket_elems = zi("allgather_bucket_size", z.allgather_bucket_elems);
  z.overlap_comm = zb("overlap_comm", z.stage == 3);
  z.load_from_fp32_weights = zb("load_from_fp32_weights", true);
  z.elastic_checkpoint = zb("elastic_checkpoint", false);
  z.sub_group_elems = zi("sub_group_size", z.sub_group_elems);
  z.prefetch_bucket_elems = zi("stage3_prefetch_bucket_size", z.prefetch_bucket_elems);
  z.param_persistence_threshold_elems =
      zi("stage3_param_persistence_threshold", z.param_persistence_threshold_elems);
  z.model_persistence_threshold_elems =
      zi("stage3_model_persistence_threshold", z.model_persistence_threshold_elems);
  z.max_live_parameters_elems = zi("stage3_max_live_parameters", z.max_live_parameters_elems);
  z.max_reuse_distance_elems = zi("stage3_max_reuse_distance", z.max_reuse_distance_elems);
  z.gather_16bit_weights_on_model_save = zb("stage3_gather_16bit_weights_on_model_save", false);
  z.module_granularity_threshold = zi("stage3_module_granularity_threshold", 0);
  z.use_all_reduce_for_fetch_params = zb("stage3_use_all_reduce_for_fetch_params", false);
  z.allgather_sequential = zb("stage3_allgather_sequential", false);
  z.ignore_unused_parameters = zb("ignore_unused_parameters", true);
  z.round_robin_gradients = zb("round_robin_gradients", false);
  z.zero_hpz_partition_size = zi("zero_hpz_partition_size", 1);
  z.zero_quantized_weights = zb("zero_quantized_weights", false);
  z.zero_quantized_nontrainable_weights = zb("zero_quantized_nontrainable_weights", false);
  z.zero_quantized_gradients = zb("zero_quantized_gradients", false);
  z.mics_shard_size = zi("mics_shard_size", -1);
  if (const json* p = lookup(out, "zero_optimization.offload_param"); p && p->is_object()) {
    OffloadParam o;
    o.device = device_of(string_at(*p, "device"));
    o.nvme_path = string_at(*p, "nvme_path");
    o.buffer_count = int_at(*p, "buffer_count", o.buffer_count);
    o.buffer_size_elems = int_at(*p, "buffer_size", o.buffer_size_elems);
    o.max_in_cpu_elems = int_at(*p, "max_in_cpu", o.max_in_cpu_elems);
    o.pin_memory = bool_at(*p, "pin_memory", true);
    z.offload_param = o;
  }
  if (const json* p = lookup(out, "zero_optimization.offload_optimizer"); p && p->is_object()) {
    OffloadOptimizer o;
    o.device = device_of(string_at(*p, "device"));
    o.nvme_path = string_at(*p, "nvme_path");
    o.buffer_count = int_at(*p, "buffer_count", o.buffer_count);
    o.pin_memory = bool_at(*p, "pin_memory", true);
    o.pipeline_read = bool_at(*p, "pipeline_read", false);
    o.pipeline_write = bool_at(*p, "pipeline_write", false);
    o.fast_init = bool_at(*p, "fast_init", false);
    o.ratio = number_at(*p, "ratio", 1.0);
    o.super_offload = bool_at(*p, "super_offload", false);
    o.cpuadam_cores_perc = number_at(*p, "cpuadam_cores_perc", 0.8);
    z.offload_optimizer = o;
  }

  if (const json* o = lookup(out, "optimizer"); o && o->is_object() && (*o)["type"].is_string()) {
    Optimizer opt;
    opt.type = (*o)["type"].get<std::string>();
    opt.kind = optimizer_kind(opt.type);
    const json& p = (*o)["params"];
    opt.params = p;
    opt.lr = number_at(p, "lr", opt.lr);
    if (const json* betas = lookup(p, "betas"); betas && betas->is_array() && betas->size() == 2 &&
                                                (*betas)[0].is_number() &&
                                                (*betas)[1].is_number()) {
      opt.betas = {(*betas)[0].get<double>(), (*betas)[1].get<double>()};
    }
    opt.eps = number_at(p, "eps", opt.eps);
    opt.weight_decay = number_at(p, "weight_decay", 0);
    opt.bias_correction = bool_at(p, "bias_correction", true);
    opt.adam_w_mode = opt.kind == OptimizerKind::AdamW || bool_at(p, "adam_w_mode", true);
    opt.torch_adam = bool_at(p, "torch_adam", false);
    opt.fp32_optimizer_states = bool_at(p, "fp32_optimizer_states", true);
    opt.momentum = number_at(p, "momentum", 0);
    opt.nesterov = bool_at(p, "nesterov", false);
    c.optimizer = opt;
  }
  if (const json* s = lookup(out, "scheduler"); s && s->is_object() && (*s)["type"].is_string()) {
    Scheduler sched;
    sched.type = (*s)["type"].get<std::string>();
    sched.kind = scheduler_kind(sched.type);
    sched.params = (*s)["params"];
    c.scheduler = sched;
  }

  c.aio.block_size_bytes = int_at(out, "aio.block_size", c.aio.block_size_bytes);
  c.aio.queue_depth = int_at(out, "aio.queue_depth", c.aio.queue_depth);
  c.aio.intra_op_parallelism = int_at(out, "aio.intra_op_parallelism", 1);
  c.aio.single_submit = bool_at(out, "aio.single_submit", false);
  c.aio.overlap_events = bool_at(out, "aio.overlap_events", true);
  c.aio.use_gds = bool_at(out, "aio.use_gds", false);
  const std::string tag = lower(string_at(out, "checkpoint.tag_validation"));
  c.checkpoint.tag_validation = tag == "ignore" ? TagValidation::Ignore
                                : tag == "fail" ? TagValidation::Fail
                                                : TagValidation::Warn;
  c.checkpoint.load_universal = bool_at(out, "checkpoint.load_universal", false);
  c.checkpoint.use_node_local_storage = bool_at(out, "checkpoint.use_node_local_storage", false);
  const std::string accum = string_at(out, "data_types.grad_accum_dtype");
  if (!accum.empty()) c.data_types.grad_accum_dtype = parse_dtype(accum);
  return c;
}

// SPEC §1.11 and the asserts DeepSpeed runs when it builds the ZeRO optimizer (§1.3, §1.6).
void Loader::check_cross_fields(const DsConfig& c, json& out) {
  const ZeroOptimization& z = c.zero_optimization;
  const int stage = z.stage;
  if (c.fp16.enabled && c.bf16.enabled)
    error("bf16.enabled", "fp16 and bf16 cannot both be enabled");
  if (c.fp16.fp16_master_weights_and_grads && stage == 0) {
    error("fp16.fp16_master_weights_and_grads",
          "needs ZeRO stage 1, 2 or 3 (zero_optimization.stage is 0)");
  }
  if (c.bf16.bf16_master_weights_and_grads && stage == 0) {
    error("bf16.bf16_master_weights_and_grads",
          "needs ZeRO stage 1, 2 or 3 (zero_optimization.stage is 0)");
  }
  if (c.fp16.fp16_master_weights_and_grads && c.bf16.bf16_master_weights_and_grads) {
    error("bf16.bf16_master_weights_and_grads",
          "cannot be combined with fp16.fp16_master_weights_and_grads");
  }
  if (c.bf16.bf16_optimizer_states && !c.bf16.bf16_master_weights_and_grads) {
    error("bf16.bf16_optimizer_states", "needs bf16.bf16_master_weights_and_grads: true");
  }
  if (c.gradient_allreduce_sum && stage == 3) {
    error("gradient_allreduce_op",
          "\"sum\" is not allowed with ZeRO stage 3 (DeepSpeed raises ValueError)");
  }
  if ((stage == 2 || stage == 3) && z.reduce_scatter) {
    if (c.prescale_gradients) {
      error("prescale_gradients",
            fmt::format("must be false with ZeRO stage {} and zero_optimization.reduce_scatter "
                        "(DeepSpeed asserts)",
                        stage));
    }
    if (c.gradient_predivide_factor != 1.0) {
      error("gradient_predivide_factor",
            fmt::format("must be 1.0 with ZeRO stage {} and zero_optimization.reduce_scatter "
                        "(DeepSpeed asserts), got {}",
                        stage, c.gradient_predivide_factor));
    }
  }
  if ((stage == 1 || stage == 2) && z.allgather_bucket_elems % 2 != 0) {
    error("zero_optimization.allgather_bucket_size",
          fmt::format("must be a multiple of 2 (DeepSpeed asserts), got {}",
                      z.allgather_bucket_elems));
  }
  if (z.offload_optimizer && z.offload_optimizer->ratio < 1.0 && stage != 3) {
    error("zero_optimization.offload_optimizer.ratio",
          fmt::format("a ratio below 1 needs ZeRO stage 3 (stage is {})", stage));
  }
  const std::pair<const char*, bool> nvme_blocks[] = {
      {"zero_optimization.offload_param", z.offload_param &&
                                              z.offload_param->device == OffloadDevice::Nvme &&
                                              z.offload_param->nvme_path.empty()},
      {"zero_optimization.offload_optimizer",
       z.offload_optimizer && z.offload_optimizer->device == OffloadDevice::Nvme &&
           z.offload_optimizer->nvme_path.empty()}};
  for (const auto& [block, missing] : nvme_blocks) {
    if (missing) error(std::string(block) + ".nvme_path", "required when device is \"nvme\"");
  }

  if (c.fp16.dynamic_loss_scale()) {
    if (c.fp16.loss_scale_window <= 0) {
      error("fp16.loss_scale_window",
            fmt::format("must be > 0 with dynamic loss scaling (fp16.loss_scale 0), got {}",
                        c.fp16.loss_scale_window));
    }
    // DeepSpeed 0.19.6 refuses a non-positive or fractional floor; configs written for older
    // releases use 0.0 and 1e-7, so zero keeps the value and says so.
    if (provenance["fp16.min_loss_scale"].source == Source::Config) {
      const double m = c.fp16.min_loss_scale;
      if (m <= 0) {
        add(Severity::Warning, "fp16.min_loss_scale",
            fmt::format("{} gives dynamic loss scaling no floor; DeepSpeed >= 0.17.1 refuses it "
                        "(older releases "
                        "accepted it)",
                        m));
      } else if (m != std::trunc(m)) {
        add(Severity::Warning, "fp16.min_loss_scale",
            fmt::format(
                "{} is not an integer; DeepSpeed >= 0.17.1 refuses it, zero uses it as given", m));
      }
    }
  }
  if (c.fp16.auto_cast) {
    add(Severity::Note, "fp16.auto_cast",
        "casting forward inputs is the trainer's job; the runtime does not run forward");
  }

  if (const json* dt = lookup(out, "data_types.param_dtype"); dt && dt->is_string()) {
    if (dt->get<std::string>() != dtype_name(c.model_dtype)) {
      error("data_types.param_dtype", fmt::format("{} differs from the enabled precision {}",
                                                  show(*dt), dtype_name(c.model_dtype)));
    }
  }

  if (z.offload_param && z.offload_param->device != OffloadDevice::None && stage < 3) {
    add(Severity::Warning, "zero_optimization.offload_param",
        fmt::format("ignored below ZeRO stage 3 (stage is {}), as DeepSpeed does", stage));
  }
  if (z.offload_optimizer && z.offload_optimizer->device != OffloadDevice::None && stage == 0) {
    add(Severity::Warning, "zero_optimization.offload_optimizer",
        "ignored at ZeRO stage 0, as DeepSpeed does");
  }
  if (z.offload_optimizer && z.offload_optimizer->device == OffloadDevice::Nvme &&
      (stage == 1 || stage == 2)) {
    add(Severity::Note, "zero_optimization.offload_optimizer.device",
        "stages 1 and 2 keep optimizer states in CPU memory for \"nvme\", exactly like \"cpu\" (as "
        "DeepSpeed does)");
  }
  if (stage == 3 && z.elastic_checkpoint) {
    add(Severity::Warning, "zero_optimization.elastic_checkpoint",
        "DeepSpeed does not support elastic checkpoints with stage 3; zero checkpoints reshard at "
        "any stage");
  }
  if (const json* v = lookup(out, "zero_optimization.leaf_module"); v && !v->is_null()) {
    add(Severity::Note, "zero_optimization.leaf_module",
        "stage-3 fetch units are the units the embedding registers; leaf_module has no effect");
  }
  if (const json* v = lookup(out, "vocabulary_size");
      v && v->is_number_integer() && v->get<std::int64_t>() % 8 != 0) {
    add(Severity::Warning, "vocabulary_size",
        fmt::format("{} is not a multiple of 8, which slows fp16/bf16 kernels",
                    v->get<std::int64_t>()));
  }

  // What DeepSpeed refuses only when it builds the engine (deepspeed.initialize).
  if (c.optimizer && stage > 0) {
    const OptimizerKind k = c.optimizer->kind;
    if (k == OptimizerKind::OneBitAdam || k == OptimizerKind::ZeroOneAdam ||
        k == OptimizerKind::OneBitLamb) {
      add(Severity::EngineError, "optimizer.type",
          fmt::format("DeepSpeed refuses {} with ZeRO (stage {}): 1-bit optimizers are not "
                      "compatible with ZeRO",
                      c.optimizer->type, stage));
    } else if (k != OptimizerKind::Adam && k != OptimizerKind::AdamW &&
               k != OptimizerKind::Adagrad && k != OptimizerKind::Lion &&
               k != OptimizerKind::Muon && !c.zero_allow_untested_optimizer) {
      add(Severity::EngineError, "optimizer.type",
          fmt::format("DeepSpeed refuses ZeRO with the untested optimizer {} unless "
                      "zero_allow_untested_optimizer "
                      "is true",
                      c.optimizer->type));
    }
  }
  if (c.optimizer &&
      (c.optimizer->kind == OptimizerKind::Lamb ||
       c.optimizer->kind == OptimizerKind::OneBitLamb) &&
      c.fp16.enabled && !c.fp16.dynamic_loss_scale()) {
    add(Severity::EngineError, "fp16.loss_scale",
        fmt::format("DeepSpeed's {} needs dynamic loss scaling (fp16.loss_scale 0)",
                    c.optimizer->type));
  }
  if (bool_at(out, "zero_optimization.legacy_stage1", false)) {
    add(Severity::EngineError, "zero_optimization.legacy_stage1",
        "DeepSpeed removed the legacy stage 1 implementation and raises when it is requested");
  }
  if (bool_at(out, "amp.enabled", false) && stage > 0) {
    add(Severity::EngineError, "amp.enabled", "DeepSpeed refuses Apex AMP together with ZeRO");
  }

  if (const json* v = lookup(out, "zero_optimization.overlap_comm"); v && v->is_null()) {
    out["zero_optimization"]["overlap_comm"] = stage == 3;
    provenance["zero_optimization.overlap_comm"] = {Source::Derived,
                                                    "null: true for stage 3, false otherwise"};
  }
  if (const json* v = lookup(out, "communication_data_type"); v && v->is_null()) {
    out["communication_data_type"] = std::string(dtype_name(c.communication_data_type));
    provenance["communication_data_type"] = {Source::Derived, "null: the model dtype"};
  }
}

void Loader::check_unsupported(const json& out) {
  for (const UnsupportedRule& u : unsupported_rules()) {
    const json* v = lookup(out, u.path);
    if (v == nullptr || is_auto(*v) || !u.applies(*v) || (u.when && !u.when(out))) continue;
    add(Severity::Unsupported, std::string(u.path),
        fmt::format("{}; the config sets {}", u.what, show(*v)));
  }
}

// SPEC §1.4, with the world size supplied; without it, checks that some integer world size fits.
void Loader::resolve_batch(DsConfig& c, json& out) {
  const char* kTb = "train_batch_size";
  const char* kMb = "train_micro_batch_size_per_gpu";
  const char* kGa = "gradient_accumulation_steps";
  for (const char* k : {kTb, kMb, kGa}) {
    if (is_auto(out[k])) return;  // listed as to be supplied already
  }
  auto tb = c.train_batch_size;
  auto mb = c.train_micro_batch_size_per_gpu;
  auto ga = c.gradient_accumulation_steps;
  if (!tb && !mb) {
    to_supply(
        kTb,
        "train_batch_size or train_micro_batch_size_per_gpu to be supplied (DeepSpeed needs one)");
    return;
  }
  auto derive = [&](const char* key, std::int64_t value, std::string how) {
    out[key] = value;
    provenance[key] = {Source::Derived, std::move(how)};
  };

  if (!supplied.world_size) {
    if (tb && mb && ga) {
      const std::int64_t per_rank = *mb * *ga;
      if (*tb % per_rank != 0) {
        error(kTb,
              fmt::format("no integer world size W satisfies train_batch_size {} = "
                          "train_micro_batch_size_per_gpu {} * gradient_accumulation_steps {} * W",
                          *tb, *mb, *ga));
        return;
      }
      c.world_size = *tb / per_rank;
      add(Severity::Note, kTb,
          fmt::format("train_batch_size {} = {} * {} * W holds only for world size W = {}", *tb,
                      *mb, *ga, *c.world_size));
      return;
    }
    if (tb && mb && *tb % *mb != 0) {
      error(kTb,
            fmt::format(
                "train_batch_size {} is not a multiple of train_micro_batch_size_per_gpu {}, so "
                "{} * ((train_batch_size // {}) // W) * W != {} for every world size W",
                *tb, *mb, *mb, *mb, *tb));
      return;
    }
    if (tb && ga && !mb && *tb % *ga != 0) {
      error(kTb,
            fmt::format(
                "train_batch_size {} is not a multiple of gradient_accumulation_steps {}, so no "
                "world size W gives an integer micro batch",
                *tb, *ga));
      return;
    }
    to_supply("world_size", "the data-parallel world size, to resolve the batch sizes");
    return;
  }

  const std::int64_t w = *supplied.world_size;
  c.world_size = w;
  if (w <= 0) {
    error("world_size", fmt::format("must be positive, got {}", w));
    return;
  }
  if (tb && mb && ga) {
  } else if (tb && mb) {
    ga = (*tb / *mb) / w;
    derive(kGa, *ga,
           fmt::format("(train_batch_size // train_micro_batch_size_per_gpu) // world size {}", w));
  } else if (tb && ga) {
    mb = (*tb / w) / *ga;
    derive(kMb, *mb,
           fmt::format("(train_batch_size // world size {}) // gradient_accumulation_steps", w));
  } else if (mb && ga) {
    tb = *mb * *ga * w;
    derive(kTb, *tb, fmt::format("micro batch * accumulation * world size {}", w));
  } else if (tb) {
    ga = 1;
    mb = *tb / w;
    derive(kGa, 1, "only train_batch_size given");
    derive(kMb, *mb, fmt::format("train_batch_size // world size {}", w));
  } else {
    tb = *mb * w;
    ga = 1;
    derive(kTb, *tb, fmt::format("micro batch * world size {}", w));
    derive(kGa, 1, "only train_micro_batch_size_per_gpu given");
  }
  c.train_batch_size = tb;
  c.train_micro_batch_size_per_gpu = mb;
  c.gradient_accumulation_steps = ga;
  if (*tb <= 0 || *mb <= 0 || *ga <= 0) {
    error(
        kTb,
        fmt::format(
            "batch sizes must be positive: train_batch_size {}, train_micro_batch_size_per_gpu {}, "
            "gradient_accumulation_steps {} with world size {}",
            *tb, *mb, *ga, w));
    return;
  }
  if (*tb != *mb * *ga * w) {
    error(kTb, fmt::format("train_batch_size {} != train_micro_batch_size_per_gpu {} * "
                           "gradient_accumulation_steps "
                           "{} * world size {} = {}",
                           *tb, *mb, *ga, w, *mb * *ga * w));
  }
}

DsConfig Loader::run(json doc) {
  if (!doc.is_object()) {
    throw ConfigError("",
                      fmt::format("a ds_config must be a JSON object, got {}", doc.type_name()));
  }
  apply_supplied(doc);

  static const std::set<std::string, std::less<>> kBlocks = {
      "zero_optimization", "fp16", "bf16",       "bfloat16",   "optimizer",
      "scheduler",         "aio",  "checkpoint", "data_types", "torch_autocast"};
  std::vector<std::string_view> known;
  for (const KeyRule* r : rules_of("")) known.push_back(r->name);
  for (const auto& b : kBlocks) known.push_back(b);
  for (const SubsystemBlock& s : subsystem_blocks()) known.push_back(s.name);

  json out = json::object();
  json top = json::object();
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& k = it.key();
    const bool top_rule =
        std::any_of(known.begin(), known.end(), [&](std::string_view n) { return n == k; }) &&
        kBlocks.count(k) == 0;
    const auto deprecated =
        std::find_if(deprecated_rules().begin(), deprecated_rules().end(),
                     [&](const DeprecatedRule& d) { return d.block.empty() && d.name == k; });
    const auto subsystem = std::find_if(subsystem_blocks().begin(), subsystem_blocks().end(),
                                        [&](const SubsystemBlock& s) { return s.name == k; });
    if (subsystem != subsystem_blocks().end()) {
      add(Severity::Note, k,
          fmt::format(
              "{} block: accepted; another DeepSpeed subsystem, not the optimizer runtime's",
              subsystem->what));
      out[k] = it.value();
      provenance[k] = {Source::Config, "passed through"};
    } else if (top_rule || deprecated != deprecated_rules().end()) {
      top[k] = it.value();
    } else if (kBlocks.count(k) == 0) {
      add(Severity::Warning, k,
          "unknown top-level key, ignored (as DeepSpeed does)" + did_you_mean(k, known));
    }
  }
  out.update(resolve_block("", "", "", top));

  json zero_given = nullptr;
  if (auto z = doc.find("zero_optimization"); z != doc.end()) {
    if (z->is_boolean()) {
      add(Severity::Warning, "zero_optimization",
          "the boolean form is deprecated: write {\"stage\": N}; true means stage 1 with "
          "allgather_bucket_size "
          "from the top-level allgather_size");
      zero_given = json{{"stage", z->get<bool>() ? 1 : 0}};
      mapped["zero_optimization.stage"] = {Source::Derived, "\"zero_optimization\": true/false"};
      if (z->get<bool>()) {
        zero_given["allgather_bucket_size"] = out["allgather_size"];
        mapped["zero_optimization.allgather_bucket_size"] = {Source::Derived,
                                                             "top-level allgather_size"};
      }
    } else {
      zero_given = *z;
    }
  }
  out["zero_optimization"] =
      resolve_block("zero_optimization", "zero_optimization", "", zero_given);
  out["fp16"] = resolve_block("fp16", "fp16", "", doc.value("fp16", json()));
  if (doc.contains("bf16")) {
    out["bf16"] = resolve_block("bf16", "bf16", "", doc["bf16"]);
    if (doc.contains("bfloat16")) {
      add(Severity::Warning, "bfloat16",
          "ignored: bf16 is given too (DeepSpeed reads bfloat16 only without bf16)");
    }
  } else if (doc.contains("bfloat16")) {
    add(Severity::Note, "bfloat16", "legacy name of the bf16 block, read as bf16");
    out["bf16"] = resolve_block("bf16", "bfloat16", "", doc["bfloat16"]);
    for (auto it = provenance.lower_bound("bfloat16.");
         it != provenance.end() && it->first.rfind("bfloat16.", 0) == 0;) {
      Provenance p = it->second;
      if (p.source == Source::Config) p = {Source::AliasOf, it->first};
      provenance["bf16." + it->first.substr(9)] = p;
      it = provenance.erase(it);
    }
  } else {
    out["bf16"] = resolve_block("bf16", "bf16", "", json());
  }
  resolve_optimizer(doc, out);
  resolve_scheduler(doc, out);
  for (const char* block : {"aio", "checkpoint", "data_types", "torch_autocast"}) {
    out[block] = resolve_block(block, block, "", doc.value(block, json()));
  }

  DsConfig c = build(out);
  check_cross_fields(c, out);
  check_unsupported(out);
  resolve_batch(c, out);
  if (!errors.empty()) throw ConfigError(std::move(errors));

  c.findings = std::move(findings);
  c.unresolved = std::move(unresolved);
  c.provenance = std::move(provenance);
  c.resolved_ = std::move(out);
  return c;
}

DsConfig load_config_json(const nlohmann::json& document, const Supplied& supplied) {
  Loader loader{supplied, {}, {}, {}, {}, {}, {}};
  return loader.run(document);
}

DsConfig load_config_string(std::string_view text, const Supplied& supplied) {
  return load_config_json(parse_relaxed_json(text), supplied);
}

DsConfig load_config_file(const std::filesystem::path& path, const Supplied& supplied) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("cannot open {}: {}", path.string(), std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    throw IoError(fmt::format("cannot read {}: {}", path.string(), std::strerror(errno)));
  return load_config_string(text.str(), supplied);
}

}  // namespace zero::config
