// One rank of zero-train: registers the MLP with the engine, feeds it this rank's share of every
// global batch, and tells rank 0's observer what happened.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/ds_config.h"
#include "tools/zero_train/options.h"
#include "zero/comm/communicator.h"
#include "zero/comm/hierarchical_comm.h"
#include "zero/device/memory_ledger.h"
#include "zero/engine_timings.h"
#include "zero/estimate/estimate.h"

namespace zero::train {

// What rank 0 knows before the first step.
struct RunInfo {
  std::string model;  // "mlp:32,256,256,10"
  std::uint64_t params = 0;
  std::size_t tensors = 0;
  int world_size = 1;
  std::string backend;  // "inproc", "mpi"
  int nodes = 1;        // the topology the engine's collectives follow (node_topology.h)
  int ranks_per_node = 1;
  int threads = 1;      // kernel threads per rank
  int stage = 0;
  std::string dtype;      // "bf16"
  std::string optimizer;  // as the config names it
  std::string scheduler;  // empty: none
  std::int64_t micro_batch = 0;
  std::int64_t accumulation = 0;
  std::int64_t global_batch = 0;  // micro × accumulation × world size
  std::int64_t steps = 0;         // optimizer steps in all, those before a --load included
  std::int64_t start_step = 0;    // optimizer steps already done (restored by --load)
  std::uint64_t seed = 0;
  std::int64_t steps_per_print = 10;
};

// A checkpoint saved (--save) or loaded (--load), as rank 0 reports it.
struct CheckpointRecord {
  bool saved = true;  // false: loaded
  std::string dir;
  std::string tag;        // "global_step<N>"
  std::int64_t step = 0;  // optimizer steps done at the save / restored by the load
  double seconds = 0;     // the collective save or load, on rank 0
  // Loaded: the run that saved it, when zero-train saved it (0: unknown).
  int saved_world_size = 0;
  int saved_stage = -1;
  std::int64_t saved_global_batch = 0;
  std::int64_t global_batch = 0;  // this run's: a different one means different data from here on
};

// One optimizer step (accumulation window) as rank 0 reports it.
struct StepRecord {
  std::int64_t step = 0;  // 1-based: optimizer steps done, skipped ones included
  double loss = 0;        // mean over the global batch and the window's micro-steps
  double lr = 0;
  double grad_norm = 0;  // NaN when skipped
  double loss_scale = 1;
  bool skipped = false;
  double step_time_s = 0;  // rank 0's wall time for the window (forward, backward, step)
  // Of that, rank 0's model compute: the teacher's targets, forward and backward, without the
  // gradient handover to the engine that backward calls per layer.
  double model_time_s = 0;
};

struct RunSummary {
  std::int64_t steps = 0;
  // Rank 0's engine phases over this run's steps (EngineTimings), and the engine's notes.
  EngineTimings timings;
  std::vector<std::string> notes;
  double first_loss = 0;
  double final_loss = 0;
  std::int64_t skipped_steps = 0;
  double train_seconds = 0;
  double samples_per_s = 0;
  std::vector<MemorySnapshot> memory;           // one per rank, at the end of training
  std::optional<EstimateInput> estimate_input;  // nullopt: the optimizer has no formula
  std::optional<EstimateResult> estimate;
  // Bytes each rank sent per optimizer step inside its node and across nodes (the engine's
  // collectives, checkpoint saves excluded), averaged over ranks and this run's steps and
  // rounded; nullopt on a GPU (NCCL's collectives are not counted).
  std::optional<NodeTraffic> traffic;
  std::string dump_path;        // written, or empty
  std::string checkpoint_path;  // the last checkpoint saved (DIR/TAG), or empty
};

// Rank 0's sink for progress. Called on rank 0's thread only.
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_start(const RunInfo& info) = 0;
  virtual void on_step(const StepRecord& step) = 0;
  virtual void on_checkpoint(const CheckpointRecord& checkpoint) = 0;
  virtual void on_finish(const RunSummary& summary) = 0;
};

// Rank `rank`'s micro-step k of a global batch of `global_batch` rows split over `world` ranks
// and `accumulation` micro-steps: consecutive rows, shares as even as integers allow. `weight`
// scales that micro-step's loss so the engine's average over ranks and micro-steps is the mean
// over the whole batch: rows × world × accumulation / global_batch (exactly 1 for even shares).
struct MicroShare {
  std::uint64_t first = 0;
  std::size_t rows = 0;
  double weight = 1.0;
};
MicroShare micro_share(std::int64_t global_batch, int world, int rank, std::int64_t accumulation,
                       std::int64_t k);

// Trains on this rank until options.steps optimizer steps are done: from 0, or with --load from
// the step the checkpoint restores. Saves (--save) every options.save_every steps and at the end.
// Collective: every rank of `comm` calls it with the same options and config. `observer` is rank
// 0's (null on the other ranks).
// Throws what the engine throws (ConfigError when the config cannot run, CommError, IoError for
// a checkpoint that cannot be read or written, ...).
void train_rank(const TrainOptions& options, const config::DsConfig& config, int threads,
                Communicator& comm, TrainObserver* observer);

// The ZeRO-paper estimate zero-config estimate prints for this run (Ψ, W, stage, precision,
// optimizer, offload); nullopt when the config's optimizer has no formula.
std::optional<EstimateInput> estimate_input_for(const config::DsConfig& config,
                                                std::uint64_t params, std::uint64_t largest_param,
                                                int world_size);

}  // namespace zero::train
