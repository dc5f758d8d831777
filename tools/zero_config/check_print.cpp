// zero-config check / print: validate ds_config files and show them fully resolved.
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli/flags.h"
#include "config/ds_config.h"
#include "tools/zero_config/commands.h"
#include "zero/base/error.h"

namespace zero::tools {

namespace {

using nlohmann::json;

constexpr const char* kCheckUsage =
    R"(usage: zero-config check [--world-size N] [--set key=value]... [--strict] FILE...

Validate ds_config files as zero will see them once the embedding has supplied its values.

  --world-size N     data-parallel world size: the batch-size triad is checked exactly
                     (without it, the three batch sizes must admit some integer world size)
  --set key=value    a value the embedding supplies, e.g. --set optimizer.params.lr=3e-4 or
                     --set train_micro_batch_size_per_gpu=4; fills a key that is "auto" or
                     missing. value is parsed as JSON when it parses, else taken as a string
  --strict           also fail on keys zero does not support yet and on what DeepSpeed itself
                     refuses only when it builds the engine

Output (stderr), one line per finding:
  FILE: error: <dotted.key.path>: <message>       invalid config (exit 1)
  FILE: error: line L, column C: <message>        not parseable (exit 1)
  FILE: not supported yet: <path>: <message>      accepted, but zero does not honour it yet;
                                                  the engine refuses it. Fails only with --strict
  FILE: refused by the engine: <path>: <message>  valid for DeepSpeed's config parser, but
                                                  DeepSpeed (and zero's engine) refuse it when the
                                                  engine is built. Fails only with --strict
  FILE: warning: <path>: <message>                unknown top-level key, deprecated key, ...
  FILE: note: <path>: <message>                   other-subsystem block, "auto" replaced by
                                                  DeepSpeed's default, value to be supplied, ...
stdout carries one summary line per file.
Exit status: 0 every file valid, 1 some file invalid (or a --strict finding), 2 bad usage.
)";

constexpr const char* kPrintUsage =
    R"(usage: zero-config print [--world-size N] [--set key=value]... FILE

Print the fully resolved config as JSON on stdout: every key with defaults filled, aliases and
deprecated keys mapped to current names, "auto" resolved (or left as "auto" and listed under
"unresolved"), the batch triad resolved, where each value came from ("provenance": config,
default, deepspeed-auto-default, supplied, alias-of, deprecated-mapped, derived), and the notes,
warnings, not-supported-yet keys and engine refusals. Options as for 'zero-config check'.
Exit status: 0 printed, 1 invalid config (problems on stderr), 2 bad usage.
)";

}  // namespace

std::string parse_config_options(const Args& args, bool allow_strict, ConfigOptions& o) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    cli::FlagArg arg(args, i);
    if (arg.name() == "--world-size") {
      if (!arg.has_value()) return "--world-size needs a value";
      const std::string v = arg.value("a positive integer");
      std::size_t used = 0;
      long long n = 0;
      try {
        n = std::stoll(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != v.size() || v.empty() || n <= 0)
        return fmt::format("--world-size: expected a positive integer, got '{}'", v);
      o.supplied.world_size = n;
    } else if (arg.name() == "--set") {
      if (!arg.has_value()) return "--set needs key=value";
      const std::string v = arg.value("key=value");
      const auto eq = v.find('=');
      if (eq == std::string::npos || eq == 0)
        return fmt::format("--set: expected key=value, got '{}'", v);
      const std::string text = v.substr(eq + 1);
      json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (value.is_discarded()) value = text;
      o.supplied.values[v.substr(0, eq)] = value;
    } else if (allow_strict && a == "--strict") {
      o.strict = true;
    } else if (a.size() > 1 && a[0] == '-') {
      return fmt::format("unknown option '{}'", a);
    } else {
      o.files.push_back(a);
    }
  }
  return {};
}

bool wants_help(const Args& args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

namespace {

std::string located(const std::string& path, const std::string& message) {
  return path.empty() ? message : fmt::format("{}: {}", path, message);
}

std::string_view finding_label(config::Severity s) {
  switch (s) {
    case config::Severity::Note: return "note";
    case config::Severity::Warning: return "warning";
    case config::Severity::Unsupported: return "not supported yet";
    case config::Severity::EngineError: return "refused by the engine";
  }
  return "note";
}

}  // namespace

std::optional<config::DsConfig> load_reporting(const std::string& file, const ConfigOptions& o) {
  try {
    return config::load_config_file(file, o.supplied);
  } catch (const ConfigError& e) {
    for (const auto& p : e.problems()) {
      std::fprintf(stderr, "%s: error: %s\n", file.c_str(), located(p.path, p.message).c_str());
    }
    std::printf("%s: invalid (%zu error%s)\n", file.c_str(), e.problems().size(),
                e.problems().size() == 1 ? "" : "s");
  } catch (const IoError& e) {
    std::fprintf(stderr, "%s: error: %s\n", file.c_str(), e.what());
    std::printf("%s: unreadable\n", file.c_str());
  }
  return std::nullopt;
}

int config_check(const Args& args) {
  if (wants_help(args)) {
    std::fputs(kCheckUsage, stdout);
    return 0;
  }
  ConfigOptions o;
  if (const std::string bad = parse_config_options(args, /*allow_strict=*/true, o);
      !bad.empty() || o.files.empty()) {
    std::fprintf(stderr, "zero-config check: %s\n\n%s", bad.empty() ? "no FILE given" : bad.c_str(),
                 kCheckUsage);
    return 2;
  }
  int status = 0;
  for (const std::string& file : o.files) {
    const auto cfg = load_reporting(file, o);
    if (!cfg) {
      status = 1;
      continue;
    }
    std::size_t counts[4] = {0, 0, 0, 0};
    for (const config::Finding& f : cfg->findings) {
      ++counts[static_cast<int>(f.severity)];
      std::fprintf(stderr, "%s: %s: %s\n", file.c_str(),
                   std::string(finding_label(f.severity)).c_str(),
                   located(f.path, f.message).c_str());
    }
    for (const config::Finding& f : cfg->unresolved) {
      std::fprintf(stderr, "%s: note: %s\n", file.c_str(), located(f.path, f.message).c_str());
    }
    const std::size_t blocking = counts[static_cast<int>(config::Severity::Unsupported)] +
                                 counts[static_cast<int>(config::Severity::EngineError)];
    const bool fails = o.strict && blocking > 0;
    if (fails) status = 1;
    std::printf(
        "%s: %s (%zu not supported yet, %zu refused by the engine, %zu to be supplied, %zu "
        "warnings, %zu notes)\n",
        file.c_str(), fails ? "fails --strict" : "valid",
        counts[static_cast<int>(config::Severity::Unsupported)],
        counts[static_cast<int>(config::Severity::EngineError)], cfg->unresolved.size(),
        counts[static_cast<int>(config::Severity::Warning)],
        counts[static_cast<int>(config::Severity::Note)]);
  }
  return status;
}

int config_print(const Args& args) {
  if (wants_help(args)) {
    std::fputs(kPrintUsage, stdout);
    return 0;
  }
  ConfigOptions o;
  if (const std::string bad = parse_config_options(args, /*allow_strict=*/false, o);
      !bad.empty() || o.files.size() != 1) {
    std::fprintf(stderr, "zero-config print: %s\n\n%s",
                 bad.empty() ? "give exactly one FILE" : bad.c_str(), kPrintUsage);
    return 2;
  }
  const std::string& file = o.files.front();
  const auto cfg = load_reporting(file, o);
  if (!cfg) return 1;

  json out;
  out["file"] = file;
  out["config"] = cfg->to_json();
  if (cfg->world_size) {
    out["world_size"] = {{"value", *cfg->world_size},
                         {"source", o.supplied.world_size ? "supplied" : "derived"}};
  } else {
    out["world_size"] = nullptr;
  }
  json provenance = json::object();
  for (const auto& [path, p] : cfg->provenance) {
    json entry = {{"source", config::source_name(p.source)}};
    if (!p.detail.empty()) entry["detail"] = p.detail;
    provenance[path] = entry;
  }
  out["provenance"] = provenance;
  auto list = [](const std::vector<config::Finding>& findings,
                 std::optional<config::Severity> only) {
    json a = json::array();
    for (const config::Finding& f : findings) {
      if (!only || f.severity == *only) a.push_back({{"path", f.path}, {"message", f.message}});
    }
    return a;
  };
  out["unresolved"] = list(cfg->unresolved, std::nullopt);
  out["unsupported"] = list(cfg->findings, config::Severity::Unsupported);
  out["engine_errors"] = list(cfg->findings, config::Severity::EngineError);
  out["warnings"] = list(cfg->findings, config::Severity::Warning);
  out["notes"] = list(cfg->findings, config::Severity::Note);
  std::printf("%s\n", out.dump(2, ' ', false, json::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace zero::tools
