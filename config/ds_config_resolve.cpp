// Resolving blocks against the schema tables (config/schema.h): aliases, deprecated keys,
// "auto", unknown keys, defaults and provenance; then the optimizer and scheduler blocks.
#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <span>
#include <string_view>
#include <vector>

#include "config/did_you_mean.h"
#include "config/ds_config_impl.h"
#include "config/schema.h"
#include "zero/base/error.h"

namespace zero::config {

using namespace detail;

namespace {

bool is_one_of(std::string_view word, std::span<const std::string_view> names) {
  return std::find(names.begin(), names.end(), word) != names.end();
}

// DeepSpeed builds a type it does not implement itself by looking it up in a torch module
// (getattr on torch.optim or torch.optim.lr_scheduler), so any other name fails
// deepspeed.initialize; zero refuses it while reading the config.
std::string unknown_type_message(const std::string& type, std::string_view deepspeed_what,
                                 std::string_view torch_module,
                                 std::span<const std::string_view> deepspeed_names,
                                 std::span<const std::string_view> torch_names) {
  std::vector<std::string_view> candidates(deepspeed_names.begin(), deepspeed_names.end());
  candidates.insert(candidates.end(), torch_names.begin(), torch_names.end());
  std::string hint = did_you_mean(type, candidates);
  if (hint.empty()) {
    hint = "; DeepSpeed's own are";
    for (std::size_t i = 0; i < deepspeed_names.size(); ++i)
      hint += (i == 0 ? " " : ", ") + std::string(deepspeed_names[i]);
  }
  return fmt::format(
      "\"{}\" is neither {} nor a class of {} (DeepSpeed looks any other type up there, "
      "case-sensitively){}",
      type, deepspeed_what, torch_module, hint);
}

}  // namespace

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
  const auto deepspeed_names = deepspeed_optimizer_names();
  if (std::any_of(deepspeed_names.begin(), deepspeed_names.end(),
                  [&](std::string_view n) { return lower(n) == lowered; })) {
    type = lowered;
  } else if (!is_one_of(type, torch_optimizer_names())) {
    error("optimizer.type", unknown_type_message(type, "a DeepSpeed optimizer", "torch.optim",
                                                 deepspeed_names, torch_optimizer_names()));
  }
  opt["type"] = type;

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
  if (!is_one_of(type, deepspeed_scheduler_names()) && !is_one_of(type, torch_scheduler_names())) {
    error("scheduler.type",
          unknown_type_message(type, "a DeepSpeed scheduler", "torch.optim.lr_scheduler",
                               deepspeed_scheduler_names(), torch_scheduler_names()));
  }
  if (is_one_of(type, deepspeed_scheduler_names())) {
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

}  // namespace zero::config
