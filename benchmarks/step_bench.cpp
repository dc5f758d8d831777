// zero-bench step: the engine's step time and where it goes, per ZeRO stage, on W in-process
// ranks (threads of this process, InProcComm), each with its own CPU Device.
//
// One step is what a trainer does per micro-batch (zero/engine.h): gather every unit, produce the
// gradients and hand them over in backward order (releasing each unit after its gradients), then
// step(). Accumulation is 1, so every step is an optimizer step. Two workloads:
//   --params N   8 synthetic layers of about N/8 elements, one unit each, with deterministic
//                gradients copied from a precomputed buffer: no model compute, so the figures are
//                the engine's own.
//   --model S    the teacher-student MLP of zero-train (models/mlp.h), micro-batch 1:
//                forward_backward runs between the engine calls, as in a real trainer.
// The first step (more while fp16 skips on overflow) is a warm-up, then the result is validated
// (every fp32 master value finite, almost all of them changed from their initial value), the
// engine's timings reset, and the remaining steps timed on rank 0.
//
// Per stage: rank 0's median step wall time, the engine's EngineTimings per step, and the memory
// ledger's peak per tag (the largest over ranks). The optimizer phase is reported as GB/s of the
// bytes it moves (kernels::optimizer_bytes_per_elem for the engine's dtypes, plus the fp32 copy
// into the model when training in fp32) next to the limit measured in the same run, after the
// engine is freed: every rank at once memcpy's half that many bytes (so the copy reads and writes
// the optimizer's traffic) on the same number of threads; limit = bytes read + written / the
// slowest rank's time, best of kLimitReps. memcpy is a reference, not a bound: its stores to a
// fresh destination cost more than the optimizer's in-place updates, so a ratio above 1 is
// possible. The tighter figure next to it is kernels::traffic_probe_cpu over arrays of the
// partition's size and dtypes (the optimizer's loads and stores without its arithmetic, as
// `zero-bench kernels` uses it), timed the same way.
//
// Stage 3 "gather" is reported as the engine times it: time inside gather(), with whatever the
// ParamFetcher does under the config's defaults (DeepSpeed's stage3_prefetch_bucket_size and
// persistence thresholds). Stage 3 runs twice, prefetch off and on ("prefetch_enabled");
// "prefetch" says whether it issued any prefetch in the timed steps;
// "gather_wait" is every wait for a unit all-gather, including the re-gather of persistent units
// at the end of step(), which is outside gather().
//
// --device cuda puts each rank's engine on a GPU (rank r on GPU r % visible) with NCCL between
// the ranks and the host communicator for everything else (EngineOptions::control_comm); the
// synthetic gradients are copied from device memory (there is no forward stand-in), and the
// limits are a device-to-device copy and the CUDA traffic probe in device memory. It has not
// run on a GPU yet (docs/gpu-status.md).
#include "benchmarks/step_bench.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "benchmarks/bench_flags.h"
#include "zero/comm/node_topology.h"
#include "benchmarks/commands.h"
#include "cli/flags.h"
#include "config/ds_config.h"
#include "kernels/cpu_parallel.h"
#include "zero/base/error.h"
#include "zero/comm/inproc_comm.h"

namespace zero::bench {

using namespace step_bench;

namespace {

constexpr std::string_view kUsage =
    "usage: zero-bench step [--json] [--model mlp:IN,H1,...,OUT | --params N] [--world-size W] "
    "[--stages 0,1,2,3] [--precision fp32|bf16|fp16] [--steps K] [--threads T] [--bucket N] "
    "[--prefetch on|off|both] [--memory-budget BYTES] [--device cpu|cuda] [--ranks-per-node N] "
    "[--config FILE]";

StepArgs parse_args(std::span<const std::string> args) {
  StepArgs r;
  auto integer = [&](cli::FlagArg& arg, long long min, long long max) {
    const std::string text = flag_value(arg, kUsage);
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    ZERO_CHECK(end != text.c_str() && *end == '\0' && v >= min && v <= max,
               "{} {}: expected an integer in [{}, {}]", arg.name(), text, min, max);
    return static_cast<int>(v);
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    cli::FlagArg arg(args, i);
    const std::string& a = arg.name();
    if (a == "--json") {
      arg.no_value();
      r.json = true;
    } else if (a == "--model") {
      r.model = models::MlpShape::parse(flag_value(arg, kUsage));
    } else if (a == "--params") {
      r.params = parse_count(flag_value(arg, kUsage), a, kUsage);
      ZERO_CHECK(*r.params >= kSyntheticLayers, "--params {}: at least {} (one per layer)",
                 *r.params, kSyntheticLayers);
    } else if (a == "--world-size") {
      r.world_size = integer(arg, 1, 256);
    } else if (a == "--stages") {
      r.stages.clear();
      const std::string text = flag_value(arg, kUsage);
      std::string_view list = text;
      while (!list.empty()) {
        const std::size_t comma = list.find(',');
        const std::string_view item = list.substr(0, comma);
        ZERO_CHECK(item.size() == 1 && item[0] >= '0' && item[0] <= '3',
                   "--stages: '{}' is not a ZeRO stage (0, 1, 2 or 3)", item);
        r.stages.push_back(item[0] - '0');
        list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
      }
      ZERO_CHECK(!r.stages.empty(), "--stages needs at least one stage; {}", kUsage);
    } else if (a == "--precision") {
      r.precision = flag_value(arg, kUsage);
      ZERO_CHECK(r.precision == "fp32" || r.precision == "bf16" || r.precision == "fp16",
                 "--precision {}: expected fp32, bf16 or fp16", r.precision);
    } else if (a == "--steps") {
      r.steps = integer(arg, 2, 1 << 20);
    } else if (a == "--threads") {
      r.threads = integer(arg, 1, 4096);
    } else if (a == "--prefetch") {
      const std::string v = flag_value(arg, kUsage);
      ZERO_CHECK(v == "on" || v == "off" || v == "both", "--prefetch {}: expected on, off or both",
                 v);
      r.prefetch = v == "both" ? std::vector<bool>{false, true} : std::vector<bool>{v == "on"};
    } else if (a == "--memory-budget") {
      r.memory_budget = parse_count(flag_value(arg, kUsage), a, kUsage);
    } else if (a == "--device") {
      r.device = flag_value(arg, kUsage);
      ZERO_CHECK(r.device == "cpu" || r.device == "cuda", "--device {}: expected cpu or cuda",
                 r.device);
    } else if (a == "--ranks-per-node") {
      r.ranks_per_node = integer(arg, 1, 256);
    } else if (a == "--config") {
      r.config_path = flag_value(arg, kUsage);
    } else if (a == "--bucket") {
      r.bucket_elems = static_cast<std::int64_t>(parse_count(flag_value(arg, kUsage), a, kUsage));
    } else {
      ZERO_CHECK(false, "unexpected argument '{}'; {}", args[i], kUsage);
    }
  }
  ZERO_CHECK(!(r.model && r.params), "--model and --params are alternatives: give one; {}", kUsage);
  ZERO_CHECK(r.device == "cpu" || !r.model,
             "--device {} runs the synthetic layers (--params N); the MLP on a GPU is zero-train's "
             "(zero-train --device cuda)",
             r.device);
  ZERO_CHECK(r.device == "cpu" || !r.ranks_per_node,
             "--ranks-per-node with --device {}: two-level collectives run on host memory; drop "
             "one of the two",
             r.device);
  if (r.ranks_per_node) resolve_node_topology(r.world_size, r.ranks_per_node);  // names divisors
  if (!r.model && !r.params) r.params = std::size_t{16} << 20;
  return r;
}

}  // namespace

int run_step(std::span<const std::string> argv) {
  const StepArgs args = parse_args(argv);
  const int threads =
      args.threads.value_or(std::max(1, kernels::resolve_threads(0) / args.world_size));
  const DType dtype = args.precision == "bf16"   ? DType::BF16
                      : args.precision == "fp16" ? DType::F16
                                                 : DType::F32;
  const Workload w = make_workload(args, dtype);
  print_header(args, w, threads);
  std::vector<Figure> figures;
  for (int stage : args.stages) {
    std::optional<double> wait_without_prefetch;
    for (const bool prefetch : stage == 3 ? args.prefetch : std::vector<bool>{true}) {
      const config::DsConfig cfg =
          config::load_config_json(make_config_json(args, stage, prefetch),
                                   config::Supplied{.world_size = args.world_size, .values = {}});
      std::vector<RankResult> ranks(static_cast<std::size_t>(args.world_size));
      run_ranks(args.world_size, [&](Communicator& comm) {
        run_rank(args, w, cfg, threads, comm, ranks[static_cast<std::size_t>(comm.rank())]);
      });
      figures.push_back(summarize(stage, ranks, w, args, cfg));
      Figure& f = figures.back();
      f.prefetch_enabled = prefetch;
      if (stage == 3 && !prefetch) wait_without_prefetch = f.per_step.gather_wait_s;
      if (stage == 3 && prefetch && wait_without_prefetch && *wait_without_prefetch > 0) {
        f.gather_hidden_fraction = 1.0 - f.per_step.gather_wait_s / *wait_without_prefetch;
      }
      print_figure(args, w, threads, f);
    }
  }
  print_footer(args, figures);
  return 0;
}

}  // namespace zero::bench
