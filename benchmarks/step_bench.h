// INTERNAL to `zero-bench step`: what its files share. The command, its flags and what it
// measures are described in step_bench.cpp; the files:
//   step_bench.cpp           flags, and the loop over stages (run_step)
//   step_bench_workload.cpp  the workload, its config, one rank's trainer loop and timed steps
//   step_bench_limits.cpp    the memcpy and traffic-probe limits the optimizer is compared with
//   step_bench_report.cpp    per-stage figures from the ranks' results, and their printing
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "config/ds_config.h"
#include "kernels/optimizer.h"
#include "models/mlp.h"
#include "zero/base/dtype.h"
#include "zero/comm/communicator.h"
#include "zero/device/device.h"
#include "zero/engine.h"

namespace zero::bench::step_bench {

using Clock = std::chrono::steady_clock;

constexpr int kSyntheticLayers = 8;
// The synthetic workload's forward stand-in reads each gathered unit this many times.
constexpr int kForwardPasses = 4;

struct StepArgs {
  bool json = false;
  std::optional<models::MlpShape> model;
  std::optional<std::size_t> params;
  int world_size = 2;
  std::vector<int> stages = {0, 1, 2, 3};
  std::string precision = "bf16";
  int steps = 6;  // the first is a warm-up
  std::optional<int> threads;
  std::int64_t bucket_elems = 5'000'000;
  // Per-rank device memory cap (DeviceOptions::device_budget_bytes): beyond it a run fails with
  // an out-of-memory error naming the tag.
  std::optional<std::size_t> memory_budget;
  // Stage 3 runs once per entry: with the default stage3_prefetch_bucket_size, and/or with 0.
  // Without prefetch first, so the run with it can say how much gather waiting it hid.
  std::vector<bool> prefetch = {false, true};
  // "cuda": every rank's engine on a GPU (rank r on GPU r % visible), NCCL between them, the
  // synthetic gradients copied from device memory, the limits measured in device memory.
  std::string device = "cpu";
  // --ranks-per-node: the engine's collectives in two levels over simulated nodes
  // (hierarchical_comm.h); nullopt: ZERO_RANKS_PER_NODE, the launcher, or one node.
  std::optional<int> ranks_per_node;
  // --config: a ds_config whose zero_optimization block replaces the bench's (but for "stage",
  // which --stages sets).
  std::string config_path;
};

// What the ranks train: the parameter specs (dtype left to the precision) and initial values.
struct Workload {
  std::string label;
  std::optional<models::MlpShape> mlp;
  std::vector<ParamSpec> specs;
  std::size_t params = 0;
  std::size_t largest_param = 0;
  int units = 0;

  void init(std::size_t index, std::span<float> out) const;
};

Workload make_workload(const StepArgs& args, DType dtype);
// The ds_config of one run: AdamW, micro batch 1, no accumulation, the flags' bucket and precision.
nlohmann::json make_config_json(const StepArgs& args, int stage, bool prefetch);

// What one rank measured for one stage.
struct RankResult {
  std::vector<double> step_s;  // counted steps (rank 0's are reported)
  EngineTimings timings;       // over the counted steps
  double model_s = 0;          // over the counted steps: the trainer's own work (Trainer)
  MemorySnapshot memory;
  std::size_t optimizer_elems = 0;  // fp32 master elements this rank updates per step
  std::size_t optimizer_bytes_per_elem = 0;
  int warmup_steps = 0;
  int skipped_steps = 0;  // counted steps skipped on overflow
  double memcpy_s = 0;    // the limits: the same on every rank
  std::size_t memcpy_bytes = 0;
  double probe_s = 0;
  std::size_t probe_bytes_per_elem = 0;
  // offload_optimizer on a GPU: a pinned cudaMemcpy-style copy of the engine's average landing
  // (device to host) and upload (host to device) size, through the same Device::copy.
  double pinned_d2h_s = 0;
  std::size_t pinned_d2h_bytes = 0;
  double pinned_h2d_s = 0;
  std::size_t pinned_h2d_bytes = 0;
  // The engine's bytes sent per counted step, inside this rank's node and across nodes.
  double intra_node_bytes = 0;
  double inter_node_bytes = 0;
};

// Collective over the ranks of `comm`: builds an engine for `cfg`, warms up and validates, times
// args.steps - 1 steps, then measures the limits after the engine is freed.
void run_rank(const StepArgs& args, const Workload& w, const config::DsConfig& cfg, int threads,
              Communicator& comm, RankResult& out);

// Limits (step_bench_limits.cpp). Collective.
double memcpy_seconds(Communicator& comm, std::size_t bytes, int threads);
double probe_seconds(Communicator& comm, const kernels::OptimizerTensors& shape, int state_count,
                     std::size_t numel, int threads);
// The same in the memory of a device the host cannot address (a GPU): a device-to-device copy,
// and the device compute table's traffic_probe over device arrays.
double device_memcpy_seconds(Communicator& comm, Device& device, std::size_t bytes);
// Seconds for every rank at once to copy `bytes` between pinned host memory and its device's
// memory, towards the host when `to_host`. Collective over the host communicator `comm`.
double pinned_copy_seconds(Communicator& comm, Device& device, std::size_t bytes, bool to_host);
double device_probe_seconds(Communicator& comm, Device& device,
                            const kernels::OptimizerTensors& shape, int state_count,
                            std::size_t numel);

// The bytes (read + written, per rank) each phase of one step must move, from the config and
// the rank's partition: what no implementation of the phase can avoid, whatever it overlaps.
// optimizer_elems / optimizer_bytes_per_elem: the optimizer's (RankResult); gathered_elems:
// stage 3's unit elements all-gathered per step (EngineTimings::gathered_elems per step);
// pushed_bytes: stages 1/2's model copy the optimizer step wrote into the peers' copies per step
// (EngineTimings::pushed_bytes), written once in the optimizer's phase instead of copied by the
// all-gather.
// `model` is the trainer's own traffic with the synthetic workload (its forward stand-in's reads,
// which a GPU run has none of, and its gradient writes; 0 for --model, whose matrix products are
// not bound by memory).
struct PhaseBytes {
  double model = 0, pack = 0, reduce = 0, unpack = 0, norm = 0, optimizer = 0,
         all_gather = 0, gather = 0;
  double total() const {
    return model + pack + reduce + unpack + norm + optimizer + all_gather + gather;
  }
};
PhaseBytes phase_bytes(int stage, int world, const config::DsConfig& cfg,
                       std::size_t optimizer_elems, std::size_t optimizer_bytes_per_elem,
                       double gathered_elems, bool synthetic, bool forward_reads = true,
                       double pushed_bytes = 0);

// Bytes under `tag` summed over memory kinds: peak or current (step_bench_workload.cpp).
std::size_t tag_bytes(const MemorySnapshot& m, MemoryTag tag, bool peak);

// One reported figure: a stage (and prefetch setting), rank 0's timings, every rank's memory.
struct Figure {
  int stage = 0;
  double step_s = 0, step_mean_s = 0;
  EngineTimings per_step;  // timings / counted steps
  double model_s = 0;      // the trainer's own work per step (RankResult::model_s)
  double other_s = 0;      // mean step minus the engine's phases and the trainer's work
  double optimizer_gbps = 0, memcpy_gbps = 0, probe_gbps = 0;
  std::size_t optimizer_elems = 0, optimizer_bytes_per_elem = 0;
  std::size_t peak_bytes = 0;  // the largest over ranks of the sum of per-kind peaks
  std::array<std::size_t, kNumMemoryTags> peak_by_tag{};  // the largest over ranks
  double formula_bytes = 0;
  int warmup_steps = 0, skipped_steps = 0, counted_steps = 0;
  bool prefetch_enabled = true;
  // Stage 3 with prefetch, next to the same run without: 1 − (gather wait with) / (without).
  std::optional<double> gather_hidden_fraction;
  // The step's limit: each phase's bytes at the memcpy speed of the same run, summed; and the
  // median step time's share of it (1 = every phase at memory speed, nothing else).
  PhaseBytes limit_bytes;
  double step_limit_s = 0;
  double step_limit_ratio = 0;
  // Bytes each rank sent per step inside its node and across nodes, averaged over ranks.
  double intra_node_bytes = 0;
  double inter_node_bytes = 0;
  // offload_optimizer on a GPU (EngineTimings::landings > 0), per counted step on rank 0: the
  // gradient chunks landed in pinned host memory (bytes, seconds inside those copies, their speed
  // next to a pinned copy of the same size) and the model copy uploaded (bytes, seconds the step
  // waited for the uploads, the pinned copy's speed, and the time those bytes take at it).
  struct Offload {
    double landed_bytes = 0, land_s = 0, land_gbps = 0, pinned_d2h_gbps = 0;
    double uploaded_bytes = 0, upload_wait_s = 0, pinned_h2d_gbps = 0, upload_limit_s = 0;
  };
  std::optional<Offload> offload;
};

Figure summarize(int stage, const std::vector<RankResult>& ranks, const Workload& w,
                 const StepArgs& args, const config::DsConfig& cfg);
void print_header(const StepArgs& args, const Workload& w, int threads);
void print_figure(const StepArgs& args, const Workload& w, int threads, const Figure& f);
void print_footer(const StepArgs& args, const std::vector<Figure>& figures);

}  // namespace zero::bench::step_bench
