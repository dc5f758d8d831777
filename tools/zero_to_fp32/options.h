// zero_to_fp32's command line: DeepSpeed's zero_to_fp32.py flags where they overlap
// (deepspeed/utils/zero_to_fp32.py: checkpoint_dir output, -t/--tag, --max_shard_size,
// --exclude_frozen_parameters), in this project's dashed spelling, with the underscored ones
// accepted too.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "cli/flags.h"
#include "zero/base/dtype.h"

namespace zero::to_fp32 {

// A bad flag or value (cli/flags.h): printed as one line, exit status 2.
using UsageError = cli::UsageError;

// Hugging Face's default shard size (transformers' save_pretrained, DeepSpeed's script).
inline constexpr std::uint64_t kDefaultMaxShardBytes = 5'000'000'000;

struct Options {
  std::string checkpoint_dir;  // holds `latest`, or is a tag directory (holds manifest.json)
  std::string output;          // a .safetensors file, or a directory
  std::string tag;             // empty: the one `latest` names
  std::uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  // Every tensor's dtype; nothing: fp32, but frozen parameters keep the dtype they were saved in
  // (as DeepSpeed's zero_to_fp32 does).
  std::optional<DType> dtype;
  bool exclude_frozen = false;
  bool help = false;  // --help: print kUsage and exit 0; nothing else is checked
};

extern const char* const kUsage;

// Parses the arguments after the program name. Accepts "--flag value" and "--flag=value".
// Throws UsageError for an unknown flag, a missing or malformed value, or a missing positional.
Options parse_options(std::span<const std::string> args);

// "5GB" → 5·10^9, "500MB", "64KiB" → 65536, "1.5GB", "1048576" (bytes). Units as Hugging Face
// counts them (huggingface_hub's parse_size_to_int: KB/MB/GB/TB are powers of 1000), plus the
// binary KiB/MiB/GiB/TiB and a bare B; case-insensitive. Nothing for anything else or for 0.
std::optional<std::uint64_t> parse_size(std::string_view text);

}  // namespace zero::to_fp32
