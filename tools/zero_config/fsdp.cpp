// zero-config from-fsdp / to-fsdp: convert an Accelerate FSDP config to a ds_config and back
// (config/fsdp/convert.h has the mapping).
#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/flags.h"
#include "config/ds_config.h"
#include "config/fsdp/accelerate_config.h"
#include "config/fsdp/convert.h"
#include "tools/zero_config/commands.h"
#include "zero/base/error.h"

namespace zero::tools {

namespace {

constexpr const char* kFromUsage =
    R"(usage: zero-config from-fsdp ACCELERATE_CONFIG.yaml [-o ds_config.json]

Convert an Accelerate FSDP config (distributed_type: FSDP, settings under fsdp_config, FSDP1 or
FSDP2 keys, mixed_precision) into a ds_config, following Accelerate's FSDP-vs-DeepSpeed mapping:
the sharding strategy becomes the ZeRO stage, fsdp_offload_params the offload blocks,
fsdp_backward_prefetch the stage-3 prefetch bucket, FULL_STATE_DICT
stage3_gather_16bit_weights_on_model_save, mixed_precision the bf16/fp16 block (fp32 master
weights). Batch sizes and gradient_clipping are left "auto" for Accelerate to fill.

  -o FILE    write the ds_config to FILE (default: stdout)

stderr, one line per setting without an equivalent (never dropped silently):
  FILE: note: <key>: <why>
Errors (nothing is written):
  FILE: error: <key>: <message>      not an Accelerate FSDP config, or a value Accelerate refuses
Exit status: 0 converted, 1 unreadable or invalid input, 2 bad usage.
)";

constexpr const char* kToUsage =
    R"(usage: zero-config to-fsdp ds_config.json [-o accelerate.yaml] [--fsdp-version 1|2]

Convert a ds_config into an Accelerate FSDP config (YAML for accelerate launch --config_file),
the inverse of from-fsdp: ZeRO stage to sharding strategy, offload to fsdp_offload_params, the
stage-3 prefetch bucket to fsdp_backward_prefetch, stage3_gather_16bit_weights_on_model_save to
fsdp_state_dict_type, bf16/fp16 to mixed_precision.

  -o FILE             write the YAML to FILE (default: stdout)
  --fsdp-version V    2 (default, Accelerate's default): fsdp_reshard_after_forward;
                      1: fsdp_sharding_strategy, which also has NO_SHARD and HYBRID_SHARD

stderr, one line per ds_config setting without an FSDP equivalent and per value chosen for FSDP:
  FILE: note: <key>: <why>
Errors as for 'zero-config check' (nothing is written).
Exit status: 0 converted, 1 unreadable or invalid ds_config, 2 bad usage.
)";

struct ConvertOptions {
  std::string input;
  std::string output;  // empty: stdout
  int fsdp_version = 2;
};

// Returns a usage error, empty when the arguments parse.
std::string parse_convert_options(const Args& args, bool to_fsdp, ConvertOptions& o) {
  try {
    for (std::size_t i = 0; i < args.size(); ++i) {
      cli::FlagArg arg(args, i);
      if (arg.name() == "-o" || arg.name() == "--output") {
        o.output = arg.value("an output file");
      } else if (to_fsdp && arg.name() == "--fsdp-version") {
        const std::string v = arg.value("1 or 2");
        if (v != "1" && v != "2")
          return fmt::format("--fsdp-version: expected 1 or 2, got '{}'", v);
        o.fsdp_version = v == "1" ? 1 : 2;
      } else if (arg.name().size() > 1 && arg.name()[0] == '-') {
        return fmt::format("unknown option '{}'", arg.name());
      } else if (!o.input.empty()) {
        return fmt::format("give one input file, got '{}' and '{}'", o.input, arg.name());
      } else {
        o.input = arg.name();
      }
    }
  } catch (const cli::UsageError& e) {
    return e.what();
  }
  return o.input.empty() ? "no input file given" : "";
}

// --help, or arguments that do not parse: the exit code, with the usage printed. Otherwise
// nullopt and `o` filled.
std::optional<int> start(const Args& args, bool to_fsdp, ConvertOptions& o) {
  const char* usage = to_fsdp ? kToUsage : kFromUsage;
  if (wants_help(args)) {
    std::fputs(usage, stdout);
    return 0;
  }
  if (const std::string bad = parse_convert_options(args, to_fsdp, o); !bad.empty()) {
    std::fprintf(stderr, "zero-config %s: %s\n\n%s", to_fsdp ? "to-fsdp" : "from-fsdp", bad.c_str(),
                 usage);
    return 2;
  }
  return std::nullopt;
}

void print_notes(const std::string& file, const std::vector<config::fsdp::Note>& notes) {
  for (const auto& n : notes)
    std::fprintf(stderr, "%s: note: %s: %s\n", file.c_str(), n.key.c_str(), n.message.c_str());
}

void print_problems(const std::string& file, const ConfigError& e, std::string_view prefix = {}) {
  for (const auto& p : e.problems()) {
    std::fprintf(stderr, "%s: error: %.*s%s%s%s\n", file.c_str(), static_cast<int>(prefix.size()),
                 prefix.data(), p.path.c_str(), p.path.empty() ? "" : ": ", p.message.c_str());
  }
}

// Writes `text` to `path` through a temporary file renamed into place, so a failed write leaves
// nothing behind; stdout when `path` is empty. Prints the reason and returns false on failure.
bool write_output(const std::string& path, const std::string& text) {
  if (path.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return std::fflush(stdout) == 0;
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      std::fprintf(stderr, "%s: error: cannot write: %s\n", path.c_str(), std::strerror(errno));
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      return false;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::fprintf(stderr, "%s: error: cannot write: %s\n", path.c_str(), ec.message().c_str());
    std::filesystem::remove(tmp, ec);
    return false;
  }
  return true;
}

}  // namespace

int config_from_fsdp(const Args& args) {
  ConvertOptions o;
  if (const auto done = start(args, /*to_fsdp=*/false, o)) return *done;
  std::ifstream in(o.input, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "%s: error: cannot open %s: %s\n", o.input.c_str(), o.input.c_str(),
                 std::strerror(errno));
    return 1;
  }
  std::ostringstream text;
  text << in.rdbuf();

  config::fsdp::FromFsdp converted;
  try {
    converted =
        config::fsdp::ds_config_from_fsdp(config::fsdp::parse_accelerate_config(text.str()));
  } catch (const ConfigError& e) {
    print_problems(o.input, e);
    return 1;
  }
  try {
    config::load_config_json(converted.ds_config);
  } catch (const ConfigError& e) {
    print_problems(o.input, e, "the ds_config made from it is invalid (a zero-config bug): ");
    return 1;
  }
  print_notes(o.input, converted.notes);
  return write_output(o.output, converted.ds_config.dump(2) + "\n") ? 0 : 1;
}

int config_to_fsdp(const Args& args) {
  ConvertOptions o;
  if (const auto done = start(args, /*to_fsdp=*/true, o)) return *done;
  const auto ds = load_reporting(o.input, ConfigOptions{});
  if (!ds) return 1;
  for (const config::Finding& f : ds->findings) {
    // What DeepSpeed itself ignores is worth saying once more before it disappears for good.
    if (f.severity == config::Severity::Warning)
      std::fprintf(stderr, "%s: warning: %s: %s\n", o.input.c_str(), f.path.c_str(),
                   f.message.c_str());
  }
  const config::fsdp::ToFsdp converted = config::fsdp::fsdp_from_ds_config(*ds, o.fsdp_version);
  print_notes(o.input, converted.notes);
  return write_output(o.output, config::fsdp::write_accelerate_config(converted.accelerate)) ? 0
                                                                                             : 1;
}

}  // namespace zero::tools
