// zero-bench subcommands. Each lives in its own file and is listed in main.cpp's table.
#pragma once

#include <span>
#include <string>

namespace zero::bench {

// args excludes the program and subcommand names; flags are parsed with cli::FlagArg. Returns the
// process exit status; errors may also be thrown as zero::Error or cli::UsageError (main prints
// them and exits 1).
int run_checkpoint(std::span<const std::string> args);
int run_comm(std::span<const std::string> args);
int run_kernels(std::span<const std::string> args);
int run_offload(std::span<const std::string> args);
int run_replay(std::span<const std::string> args);
int run_step(std::span<const std::string> args);

}  // namespace zero::bench
