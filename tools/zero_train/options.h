// zero-train's command line: flags, defaults and the one-line usage errors (exit 2).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include "cli/flags.h"
#include "models/mlp.h"

namespace zero::train {

// A bad flag or value (cli/flags.h): printed as one line, exit status 2.
using UsageError = cli::UsageError;

struct TrainOptions {
  std::string config_path;
  std::optional<int> world_size;  // as given; under --comm mpi it must equal MPI's size
  std::string comm = "inproc";    // "inproc" or "mpi"
  // --ranks-per-node; nullopt: ZERO_RANKS_PER_NODE, the launcher, or one node (node_topology.h)
  std::optional<int> ranks_per_node;
  std::int64_t steps = 20;        // optimizer steps, skipped ones included
  std::uint64_t seed = 0;
  models::MlpShape model = models::MlpShape::parse("mlp:32,256,256,10");
  std::optional<int> threads;  // kernel threads per rank; nullopt: cores / ranks on this host
  std::optional<std::size_t> memory_budget;  // per-rank device bytes (--memory-budget)
  // make_device's kind (--device): "cpu", "cuda" or "auto" ("auto" reads ZERO_DEVICE).
  std::string device = "auto";
  std::string dump_params;      // safetensors path; empty: no dump
  std::string save_dir;         // checkpoint directory written at the end; empty: no save
  std::int64_t save_every = 0;  // also save every K optimizer steps (0: only at the end)
  std::string load_dir;         // checkpoint directory to resume from; empty: start fresh
  // --regather: stage 3 lets each layer go after its forward and gathers it again for backward,
  // as a module-wise stage 3 does (DeepSpeed, zero.initialize); default: units stay gathered
  // from forward through backward.
  bool regather = false;
  bool json = false;
  bool quiet = false;
  bool help = false;  // --help: print kUsage and exit 0; nothing else is checked
};

extern const char* const kUsage;

// Parses the arguments after the program name. Accepts "--flag value" and "--flag=value".
// Throws UsageError for an unknown flag, a missing or malformed value, a missing --config, or
// --save-every without --save.
TrainOptions parse_options(std::span<const std::string> args);

}  // namespace zero::train
