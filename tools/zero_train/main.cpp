// zero-train: the project's main job. Trains a teacher-student MLP with the ZeRO engine on N
// ranks (threads of this process, or MPI processes) as a DeepSpeed ds_config says, and reports
// loss, lr, gradient norm, loss scale and per-rank memory next to the ZeRO paper's formula.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "config/ds_config.h"
#include "kernels/isa.h"
#include "tools/zero_train/options.h"
#include "tools/zero_train/report.h"
#include "tools/zero_train/train.h"
#include "zero/base/error.h"
#include "zero/comm/communicator.h"
#include "zero/comm/inproc_comm.h"

namespace {

using zero::train::TrainOptions;

// Ranks sharing this host's cores: the in-process ranks, or under MPI the launcher's count of
// processes on this node (OpenMPI, MPICH/Hydra), else 1.
int ranks_on_this_host(const TrainOptions& o, int in_process_ranks) {
  if (o.comm != "mpi") return in_process_ranks;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* v = std::getenv(name)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 1;
}

int default_threads(const TrainOptions& o, int in_process_ranks) {
  const int cores = zero::kernels::resolve_threads(0);
  return std::max(1, cores / std::max(1, ranks_on_this_host(o, in_process_ranks)));
}

// Prints a failure as "zero-train: error: ..." lines on stderr; a ConfigError as one line per
// problem, naming the config file and the key path.
void print_error(const std::exception& e, const TrainOptions& o, const std::string& where) {
  if (const auto* config_error = dynamic_cast<const zero::ConfigError*>(&e)) {
    for (const auto& p : config_error->problems()) {
      std::fprintf(stderr, "zero-train: error: %s%s: %s%s\n", where.c_str(), o.config_path.c_str(),
                   p.path.empty() ? "" : (p.path + ": ").c_str(), p.message.c_str());
    }
    return;
  }
  std::fprintf(stderr, "zero-train: error: %s%s\n", where.c_str(), e.what());
}

void print_config_warnings(const zero::config::DsConfig& cfg, const TrainOptions& o) {
  if (o.quiet) return;
  for (const auto& f : cfg.findings) {
    if (f.severity != zero::config::Severity::Warning) continue;
    std::fprintf(stderr, "zero-train: warning: %s: %s%s\n", o.config_path.c_str(),
                 f.path.empty() ? "" : (f.path + ": ").c_str(), f.message.c_str());
  }
}

// zero-train is the embedding here, so it supplies a "train_batch_size": "auto" the way Hugging
// Face's Trainer does: micro batch × accumulation × ranks, once the config gives those two.
zero::config::DsConfig load_config(const TrainOptions& o, int world) {
  zero::config::Supplied supplied{.world_size = world, .values = {}};
  zero::config::DsConfig cfg = zero::config::load_config_file(o.config_path, supplied);
  const bool batch_to_supply =
      std::any_of(cfg.unresolved.begin(), cfg.unresolved.end(),
                  [](const zero::config::Finding& f) { return f.path == "train_batch_size"; });
  if (batch_to_supply && cfg.train_micro_batch_size_per_gpu && cfg.gradient_accumulation_steps) {
    supplied.values["train_batch_size"] =
        *cfg.train_micro_batch_size_per_gpu * *cfg.gradient_accumulation_steps * world;
    cfg = zero::config::load_config_file(o.config_path, supplied);
  }
  return cfg;
}

// Under mpirun a rank's stdout is the launcher's pseudo-terminal even when mpirun's own output
// goes to a file, so the progress bar is for in-process ranks only.
zero::train::ReportStyle report_style(const TrainOptions& o) {
  if (o.json) return zero::train::ReportStyle::Json;
  return o.comm == "inproc" && isatty(fileno(stdout)) ? zero::train::ReportStyle::Terminal
                                                      : zero::train::ReportStyle::Lines;
}

int run_inproc(const TrainOptions& o) {
  const int world = o.world_size.value_or(1);
  zero::train::Reporter reporter(report_style(o), o.quiet, o.config_path);
  try {
    const zero::config::DsConfig cfg = load_config(o, world);
    print_config_warnings(cfg, o);
    const int threads = o.threads.value_or(default_threads(o, world));
    zero::run_ranks(world, [&](zero::Communicator& comm) {
      zero::train::train_rank(o, cfg, threads, comm, comm.rank() == 0 ? &reporter : nullptr);
    });
  } catch (const std::exception& e) {
    reporter.interrupt();
    print_error(e, o, "");
    return 1;
  }
  return 0;
}

// Every rank runs this. Only rank 0 reports; any rank prints its own errors. A failing rank
// leaves with _Exit: MPI_Finalize (run at exit) would wait for peers that are still inside a
// collective, while an exit without it makes mpirun end the whole job at once.
int run_mpi(const TrainOptions& o) {
  std::unique_ptr<zero::Communicator> comm;
  try {
    comm = zero::make_communicator("mpi");
  } catch (const std::exception& e) {
    print_error(e, o, "");
    return 1;
  }
  const int rank = comm->rank(), world = comm->size();
  const std::string where = world > 1 ? "rank " + std::to_string(rank) + ": " : "";
  if (o.world_size && *o.world_size != world) {
    std::fprintf(stderr,
                 "zero-train: %s--world-size %d: under --comm mpi the world size is MPI's (%d "
                 "processes); drop --world-size or launch %d processes\n",
                 where.c_str(), *o.world_size, world, *o.world_size);
    std::fflush(stderr);
    std::_Exit(2);
  }
  zero::train::Reporter reporter(report_style(o), o.quiet, o.config_path);
  try {
    const zero::config::DsConfig cfg = load_config(o, world);
    if (rank == 0) print_config_warnings(cfg, o);
    const int threads = o.threads.value_or(default_threads(o, 1));
    zero::train::train_rank(o, cfg, threads, *comm, rank == 0 ? &reporter : nullptr);
  } catch (const std::exception& e) {
    reporter.interrupt();
    print_error(e, o, where);
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
  comm.reset();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  TrainOptions options;
  try {
    options = zero::train::parse_options(args);
  } catch (const zero::train::UsageError& e) {
    std::fprintf(stderr, "zero-train: %s\n", e.what());
    return 2;
  }
  if (options.help) {
    std::fputs(zero::train::kUsage, stdout);
    return 0;
  }
  if (options.comm == "mpi" && !zero::communicator_available("mpi")) {
    std::fprintf(stderr,
                 "zero-train: --comm mpi: this build has no MPI (configure found none, or "
                 "ZERO_WITH_MPI=OFF); use --comm inproc\n");
    return 2;
  }
  return options.comm == "mpi" ? run_mpi(options) : run_inproc(options);
}
