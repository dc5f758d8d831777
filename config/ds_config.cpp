#include "config/ds_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "config/did_you_mean.h"
#include "config/ds_config_impl.h"
#include "config/parse.h"
#include "config/schema.h"
#include "zero/base/error.h"

namespace zero::config {

using namespace detail;

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
