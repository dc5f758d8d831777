#include "tools/zero_to_fp32/options.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <utility>
#include <vector>

namespace zero::to_fp32 {

const char* const kUsage = R"(usage: zero_to_fp32 CHECKPOINT_DIR OUTPUT [options]

Consolidates a zero checkpoint (any ZeRO stage and world size) into whole tensors: every
trainable parameter's fp32 master weight and every frozen parameter's model copy, under its
name and shape, as safetensors. Every rank file's checksums are verified first. Memory stays
bounded by a fixed buffer (and the largest frozen tensor), whatever the model size.

CHECKPOINT_DIR  the directory holding `latest` (zero-train --save DIR, Engine::save_checkpoint),
                or one tag directory of it (the one holding manifest.json)
OUTPUT          a .safetensors file: written as is when the weights fit in one shard; otherwise
                the shards go next to it, named after its stem (STEM-00001-of-0000N.safetensors,
                with STEM.safetensors.index.json). Anything else is a directory (created when
                missing) that receives model.safetensors, or when sharded
                model-00001-of-0000N.safetensors plus model.safetensors.index.json, as Hugging
                Face's save_pretrained lays them out.

options:
  -t, --tag TAG               the checkpoint tag to read (default: the one `latest` names)
  --max-shard-size SIZE       largest shard, e.g. 5GB, 500MB, 64KiB or a byte count (default 5GB;
                              a tensor larger than this gets a shard of its own)
  --dtype fp32|bf16|fp16      the output dtype of every tensor; master weights are rounded to
                              nearest even (default: fp32, and frozen parameters in the dtype
                              they were saved in, as DeepSpeed's zero_to_fp32 writes them)
  --exclude-frozen            leave out frozen (non-trainable) parameters
  --help                      this text

DeepSpeed's spellings --max_shard_size, --exclude_frozen_parameters and --safe_serialization
(always on here) are accepted too.
Progress goes to stderr when it is a terminal; a summary line (tensors, bytes, seconds, GB/s,
peak RSS) goes to stderr at the end.
Exit status: 0 written, 1 not a checkpoint, missing or corrupted file, write error, 2 bad usage.
)";

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

std::optional<std::uint64_t> parse_size(std::string_view text) {
  // Longest suffixes first, so "kib" is not read as "b".
  static const std::array<std::pair<std::string_view, double>, 9> kUnits = {{
      {"kib", 1024.0},
      {"mib", 1024.0 * 1024},
      {"gib", 1024.0 * 1024 * 1024},
      {"tib", 1024.0 * 1024 * 1024 * 1024},
      {"kb", 1e3},
      {"mb", 1e6},
      {"gb", 1e9},
      {"tb", 1e12},
      {"b", 1.0},
  }};
  const std::string s = lower(text);
  std::string_view number = s;
  double multiplier = 1;
  for (const auto& [suffix, factor] : kUnits) {
    if (number.ends_with(suffix)) {
      number.remove_suffix(suffix.size());
      multiplier = factor;
      break;
    }
  }
  while (!number.empty() && number.back() == ' ') number.remove_suffix(1);
  if (number.empty()) return std::nullopt;
  double value = 0;
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc() || end != number.data() + number.size()) return std::nullopt;
  const double bytes = std::floor(value * multiplier);
  // 2^63: far beyond any file, and exactly representable.
  if (!std::isfinite(bytes) || bytes < 1 || bytes >= 9.223372036854775808e18) return std::nullopt;
  return static_cast<std::uint64_t>(bytes);
}

Options parse_options(std::span<const std::string> args) {
  Options o;
  std::vector<std::string> positional;
  bool only_positional = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    if (only_positional || flag == "-" || !flag.starts_with("-")) {
      positional.push_back(flag);
      continue;
    }
    if (flag == "--") {
      only_positional = true;
      continue;
    }
    cli::FlagArg arg(args, i);
    flag = arg.name();

    if (flag == "--help" || flag == "-h") {
      o.help = true;
      return o;
    } else if (flag == "-t" || flag == "--tag") {
      o.tag = arg.value("a checkpoint tag such as global_step100");
      if (o.tag.empty() || o.tag.find('/') != std::string::npos || o.tag == "." || o.tag == "..") {
        throw UsageError(fmt::format(
            "{} '{}': expected a checkpoint tag (a directory name such as global_step100)", flag,
            o.tag));
      }
    } else if (flag == "--max-shard-size" || flag == "--max_shard_size") {
      const std::string v = arg.value("a size such as 5GB, 500MB or a byte count");
      const auto bytes = parse_size(v);
      if (!bytes) {
        throw UsageError(fmt::format(
            "{} {}: expected a positive size such as 5GB, 500MB, 64KiB or a byte count", flag, v));
      }
      o.max_shard_bytes = *bytes;
    } else if (flag == "--dtype") {
      const std::string v = arg.value("fp32, bf16 or fp16");
      const std::optional<DType> dtype = parse_dtype(v);
      if (!dtype || *dtype == DType::F64) {
        throw UsageError(fmt::format("--dtype {}: expected fp32, bf16 or fp16", v));
      }
      o.dtype = *dtype;
    } else if (flag == "--exclude-frozen" || flag == "--exclude_frozen_parameters") {
      arg.no_value();
      o.exclude_frozen = true;
    } else if (flag == "--safe_serialization" || flag == "--safe-serialization") {
      arg.no_value();  // the output is always safetensors
    } else {
      throw UsageError(fmt::format("unknown option '{}' (see zero_to_fp32 --help)", flag));
    }
  }
  if (positional.size() < 2) {
    throw UsageError(positional.empty()
                         ? "CHECKPOINT_DIR and OUTPUT are required (see zero_to_fp32 --help)"
                         : "OUTPUT is required after CHECKPOINT_DIR (see zero_to_fp32 --help)");
  }
  if (positional.size() > 2) {
    throw UsageError(
        fmt::format("unexpected argument '{}': zero_to_fp32 takes CHECKPOINT_DIR and OUTPUT only",
                    positional[2]));
  }
  o.checkpoint_dir = positional[0];
  o.output = positional[1];
  if (o.checkpoint_dir.empty()) throw UsageError("CHECKPOINT_DIR: expected a directory, got ''");
  if (o.output.empty())
    throw UsageError("OUTPUT: expected a .safetensors file or a directory, got ''");
  return o;
}

}  // namespace zero::to_fp32
