// zero-config: check, print and estimate DeepSpeed ds_config files as zero sees them, show the
// LR and loss-scale schedule they give, and convert Accelerate FSDP configs to and from them.
#include <cstdio>
#include <exception>
#include <string_view>

#include "tools/zero_config/commands.h"
#include "zero/base/error.h"

namespace {

constexpr const char* kUsage = R"(usage: zero-config COMMAND [OPTIONS]

commands:
  check [--world-size N] [--set key=value]... FILE...
      Validate ds_config files as the runtime will see them once the embedding has supplied
      its values. Exit 0 when every file is valid (notes and warnings on stderr), 1 otherwise
      with one line per problem: FILE: error: <dotted.key.path>: <message>.
  print [--world-size N] [--set key=value]... FILE
      Print the fully resolved config as JSON: every key, defaults filled, aliases mapped to
      current names, "auto" resolved or listed as unresolved, and where each value came from.
  estimate --params N [--largest-param N] --world-size W [--gpus-per-node G] [--stage S]
           [--precision fp16|bf16|fp32] [--offload-optimizer none|cpu|nvme]
           [--offload-param none|cpu|nvme] [--config FILE] [--json]
      Per-rank model-state bytes (ZeRO paper §5) on device, host and NVMe.
  schedule FILE [--steps N] [--overflows BITS] [--json] [--world-size N] [--set key=value]...
      Per optimizer step: the lr and betas/momentum in effect, the loss scale and whether the
      step is skipped, given which steps overflow (--overflows 0010...: character t = step t).
  from-fsdp ACCELERATE_CONFIG.yaml [-o ds_config.json]
      Convert an Accelerate FSDP config into a ds_config (Accelerate's FSDP-vs-DeepSpeed
      mapping); every setting without an equivalent is named in a note on stderr.
  to-fsdp ds_config.json [-o accelerate.yaml] [--fsdp-version 1|2]
      Convert a ds_config into an Accelerate FSDP config (YAML), with the same notes.

Run 'zero-config COMMAND --help' for the options of one command.
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string_view command = argv[1];
  const zero::tools::Args args(argv + 2, argv + argc);
  try {
    if (command == "check") return zero::tools::config_check(args);
    if (command == "print") return zero::tools::config_print(args);
    if (command == "estimate") return zero::tools::config_estimate(args);
    if (command == "schedule") return zero::tools::config_schedule(args);
    if (command == "from-fsdp") return zero::tools::config_from_fsdp(args);
    if (command == "to-fsdp") return zero::tools::config_to_fsdp(args);
    if (command == "--help" || command == "-h" || command == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-config %s: error: %s\n", argv[1], e.what());
    return 1;
  }
  std::fprintf(stderr, "zero-config: unknown command '%s'\n\n%s", argv[1], kUsage);
  return 2;
}
