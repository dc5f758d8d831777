// zero-bench: benchmarks and replay tools, one subcommand per file.
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "benchmarks/commands.h"

namespace {

struct Subcommand {
  std::string_view name;
  std::string_view summary;
  int (*run)(std::span<const std::string> args);
};

constexpr Subcommand kSubcommands[] = {
    {"comm",
     "collective bus bandwidth vs memcpy  [--json] [--world-size N] [--sizes LIST] [--backend "
     "inproc|shm|mpi|all] [--reps R]",
     zero::bench::run_comm},
    {"kernels",
     "optimizer kernels vs their memory-traffic roofline  [--json] [--params N] [--tensors K] "
     "[--threads T] [--isa I] [--reps R] [--optimizer O] [--grad-dtype D] [--state-dtype D] "
     "[--device cpu|cuda] [--cold]",
     zero::bench::run_kernels},
    {"checkpoint",
     "save, load and zero_to_fp32 vs plain sequential I/O  [--json] [--params N] [--world-size W] "
     "[--stage S] [--reps R] [--dir D]",
     zero::bench::run_checkpoint},
    {"offload",
     "optimizer step per offload tier (host, nvme) vs traffic probe / O_DIRECT I/O alone  [--json] "
     "[--nvme-path DIR] [--elems N] [--sub-group N] [--buffer-count N] [--block-size BYTES] "
     "[--queue-depth N] [--repeats N] [--help]",
     zero::bench::run_offload},
    {"replay",
     "replay an optimizer golden file  GOLDEN.safetensors --out OUT.safetensors [--isa I]",
     zero::bench::run_replay},
    {"step",
     "engine step time and breakdown per ZeRO stage vs memcpy  [--json] [--model mlp:IN,...,OUT | "
     "--params N] [--world-size W] [--stages LIST] [--precision P] [--steps K] [--threads T] "
     "[--bucket N]",
     zero::bench::run_step},
};

void usage(std::FILE* to) {
  std::fprintf(to, "usage: zero-bench <subcommand> [options]\n\nsubcommands:\n");
  for (const auto& s : kSubcommands) {
    std::fprintf(to, "  %-10.*s %.*s\n", static_cast<int>(s.name.size()), s.name.data(),
                 static_cast<int>(s.summary.size()), s.summary.data());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string_view name = argv[1];
  if (name == "-h" || name == "--help" || name == "help") {
    usage(stdout);
    return 0;
  }
  const std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& s : kSubcommands) {
    if (s.name != name) continue;
    try {
      return s.run(args);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zero-bench %s: %s\n", argv[1], e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "zero-bench: unknown subcommand '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
