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
// persistence thresholds). "prefetch" says whether it issued any prefetch in the timed steps;
// "gather_wait" is every wait for a unit all-gather, including the re-gather of persistent units
// at the end of step(), which is outside gather().
#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "benchmarks/commands.h"
#include "cli/flags.h"
#include "config/ds_config.h"
#include "kernels/cast.h"
#include "kernels/cpu_parallel.h"
#include "kernels/isa.h"
#include "kernels/optimizer.h"
#include "kernels/traffic_probe.h"
#include "models/mlp.h"
#include "zero/base/dtype.h"
#include "zero/base/error.h"
#include "zero/base/shape.h"
#include "zero/base/timer.h"
#include "zero/comm/communicator.h"
#include "zero/comm/inproc_comm.h"
#include "zero/device/device.h"
#include "zero/engine.h"
#include "zero/estimate/estimate.h"

namespace zero::bench {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kUsage =
    "usage: zero-bench step [--json] [--model mlp:IN,H1,...,OUT | --params N] [--world-size W] "
    "[--stages 0,1,2,3] [--precision fp32|bf16|fp16] [--steps K] [--threads T] [--bucket N] "
    "[--prefetch on|off|both]";

constexpr int kSyntheticLayers = 8;
constexpr int kLimitReps = 5;
// fp16 starts at a loss scale of 2^16 and may skip a few steps on overflow before one applies.
constexpr int kMaxWarmupSteps = 32;
// After the warm-up step, at least this share of the fp32 master values must differ from their
// initial values (AdamW moves every element with a non-zero gradient or a non-zero value).
constexpr double kMinChangedFraction = 0.99;
constexpr std::uint64_t kSeed = 1234;
constexpr std::size_t kMemcpyTileBytes = std::size_t{1} << 20;

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
  // Stage 3 runs once per entry: with the default stage3_prefetch_bucket_size, and/or with 0.
  // Without prefetch first, so the run with it can say how much gather waiting it hid.
  std::vector<bool> prefetch = {false, true};
};

// "65536", "64K", "16M", "1G" (K, M, G binary, as zero-bench comm --sizes) or "5e6".
std::size_t parse_count(std::string_view text, std::string_view flag) {
  ZERO_CHECK(!text.empty(), "{}: empty value; {}", flag, kUsage);
  std::string digits(text);
  double scale = 1;
  const std::size_t unit = std::string_view("KMG").find(
      static_cast<char>(std::toupper(static_cast<unsigned char>(text.back()))));
  if (unit != std::string_view::npos) {
    scale = std::ldexp(1.0, 10 * static_cast<int>(unit + 1));
    digits.pop_back();
  }
  char* end = nullptr;
  const double v = std::strtod(digits.c_str(), &end) * scale;
  ZERO_CHECK(!digits.empty() && end != digits.c_str() && *end == '\0' && v >= 1 && v <= 0x1p40 &&
                 v == std::floor(v),
             "{} {}: expected a positive whole count such as 65536, 64K, 16M or 5e6", flag, text);
  return static_cast<std::size_t>(v);
}

StepArgs parse_args(std::span<const std::string> args) {
  StepArgs r;
  auto value = [&](cli::FlagArg& arg) {
    ZERO_CHECK(arg.has_value(), "{} needs a value; {}", arg.name(), kUsage);
    return arg.value(kUsage);
  };
  auto integer = [&](cli::FlagArg& arg, long long min, long long max) {
    const std::string text = value(arg);
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
      r.model = models::MlpShape::parse(value(arg));
    } else if (a == "--params") {
      r.params = parse_count(value(arg), a);
      ZERO_CHECK(*r.params >= kSyntheticLayers, "--params {}: at least {} (one per layer)",
                 *r.params, kSyntheticLayers);
    } else if (a == "--world-size") {
      r.world_size = integer(arg, 1, 256);
    } else if (a == "--stages") {
      r.stages.clear();
      const std::string text = value(arg);
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
      r.precision = value(arg);
      ZERO_CHECK(r.precision == "fp32" || r.precision == "bf16" || r.precision == "fp16",
                 "--precision {}: expected fp32, bf16 or fp16", r.precision);
    } else if (a == "--steps") {
      r.steps = integer(arg, 2, 1 << 20);
    } else if (a == "--threads") {
      r.threads = integer(arg, 1, 4096);
    } else if (a == "--prefetch") {
      const std::string v = value(arg);
      ZERO_CHECK(v == "on" || v == "off" || v == "both", "--prefetch {}: expected on, off or both",
                 v);
      r.prefetch = v == "both" ? std::vector<bool>{false, true} : std::vector<bool>{v == "on"};
    } else if (a == "--bucket") {
      r.bucket_elems = static_cast<std::int64_t>(parse_count(value(arg), a));
    } else {
      ZERO_CHECK(false, "unexpected argument '{}'; {}", args[i], kUsage);
    }
  }
  ZERO_CHECK(!(r.model && r.params), "--model and --params are alternatives: give one; {}", kUsage);
  if (!r.model && !r.params) r.params = std::size_t{16} << 20;
  return r;
}

// A deterministic value in [lo, hi) per (stream, index).
float hashed(std::uint64_t stream, std::uint64_t index, float lo, float hi) {
  std::uint64_t z = index * 0x9e3779b97f4a7c15ull + stream * 0xd1b54a32d192ed03ull + kSeed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return lo + (hi - lo) * static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

// What the ranks train: the parameter specs (dtype left to the precision) and initial values.
struct Workload {
  std::string label;
  std::optional<models::MlpShape> mlp;
  std::vector<ParamSpec> specs;
  std::size_t params = 0;
  std::size_t largest_param = 0;
  int units = 0;

  void init(std::size_t index, std::span<float> out) const {
    if (mlp) {
      models::init_param(*mlp, index, kSeed, /*stream=*/0, out);
      return;
    }
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = hashed(index, j, -0.05f, 0.05f);
  }
};

Workload make_workload(const StepArgs& args, DType dtype) {
  Workload w;
  if (args.model) {
    w.mlp = args.model;
    w.label = args.model->to_string();
    const std::vector<models::MlpParam> mlp = models::mlp_params(*args.model);
    for (std::size_t i = 0; i < mlp.size(); ++i) {
      // Weight and bias of layer k form unit k, as zero-train registers them.
      w.specs.push_back({.name = mlp[i].name,
                         .shape = {mlp[i].shape.begin(), mlp[i].shape.end()},
                         .dtype = dtype,
                         .unit = static_cast<int>(i / 2)});
      w.params += mlp[i].numel();
      w.largest_param = std::max(w.largest_param, mlp[i].numel());
    }
    w.units = static_cast<int>(args.model->layers());
    return w;
  }
  const std::size_t n = *args.params;
  w.label =
      "synthetic:" + std::to_string(kSyntheticLayers) + "x" + std::to_string(n / kSyntheticLayers);
  for (int k = 0; k < kSyntheticLayers; ++k) {
    const std::size_t numel =
        n / kSyntheticLayers + (static_cast<std::size_t>(k) < n % kSyntheticLayers);
    w.specs.push_back({.name = "layers." + std::to_string(k) + ".weight",
                       .shape = {static_cast<std::int64_t>(numel)},
                       .dtype = dtype,
                       .unit = k});
    w.params += numel;
    w.largest_param = std::max(w.largest_param, numel);
  }
  w.units = kSyntheticLayers;
  return w;
}

nlohmann::json make_config_json(const StepArgs& args, int stage, bool prefetch) {
  nlohmann::json c = {
      {"train_micro_batch_size_per_gpu", 1},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", 1.0},
      {"optimizer",
       {{"type", "AdamW"},
        {"params",
         {{"lr", 1e-3}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}, {"weight_decay", 0.01}}}}},
      {"zero_optimization",
       {{"stage", stage},
        {"reduce_bucket_size", args.bucket_elems},
        {"allgather_bucket_size", args.bucket_elems},
        {"overlap_comm", true},
        {"stage3_prefetch_bucket_size", prefetch ? 50'000'000 : 0}}},
  };
  if (args.precision == "bf16") c["bf16"] = {{"enabled", true}};
  if (args.precision == "fp16") c["fp16"] = {{"enabled", true}};
  return c;
}

// One rank's trainer loop body: gathers, gradients in backward order, step().
class Trainer {
 public:
  Trainer(const Workload& w, Engine& engine, int rank, DType dtype, const kernels::CpuExec& exec)
      : w_(w), engine_(engine), rank_(rank), dtype_(dtype), exec_(exec) {
    if (w_.mlp) {
      data_.emplace(*w_.mlp, kSeed);
      for (const ParamSpec& s : w_.specs) {
        const std::size_t n = numel_of(s.shape);
        weights_.emplace_back(n);
        grads_f32_.emplace_back(n);
      }
    }
  }

  StepResult step() {
    // Forward, unit by unit: with prefetch, the next units' all-gathers run on the communicator's
    // thread while this one's parameters are read.
    for (int u = 0; u < w_.units; ++u) {
      engine_.gather(u);
      if (!w_.mlp) forward_compute(u);
    }
    if (w_.mlp) {
      compute_mlp_grads();
    } else if (grads_scale_ != engine_.backward_scale()) {
      make_synthetic_grads();
    }
    for (int u = w_.units - 1; u >= 0; --u) {
      for (std::size_t i = w_.specs.size(); i-- > 0;) {
        if (w_.specs[i].unit != u) continue;
        const std::span<std::byte> slot = engine_.grad(i);
        if (w_.mlp) {
          kernels::cast_cpu(grads_f32_[i].data(), DType::F32, slot.data(), dtype_,
                            grads_f32_[i].size(), exec_);
        } else {
          std::memcpy(slot.data(), grads_[i].data(), slot.size());
        }
        engine_.grad_ready(i);
      }
      engine_.release(u);
    }
    return engine_.step();
  }

 private:
  // Stands in for a layer's forward: a few passes over the unit's gathered parameters.
  void forward_compute(int unit) {
    std::uint64_t acc = 0;
    for (std::size_t i = 0; i < w_.specs.size(); ++i) {
      if (w_.specs[i].unit != unit) continue;
      const std::span<const std::byte> p = engine_.param(i);
      for (int pass = 0; pass < kForwardPasses; ++pass) {
        for (std::size_t k = 0; k + 8 <= p.size(); k += 8) {
          std::uint64_t word;
          std::memcpy(&word, p.data() + k, 8);
          acc += word ^ static_cast<std::uint64_t>(pass);
        }
      }
    }
    sink_ += acc;
  }
  static constexpr int kForwardPasses = 4;
  std::uint64_t sink_ = 0;

  // Gradients in [-0.01, 0.01) that differ per rank and parameter, times the loss scale the
  // engine asks for, stored in the model dtype so a step only copies them.
  void make_synthetic_grads() {
    grads_scale_ = engine_.backward_scale();
    grads_.resize(w_.specs.size());
    std::vector<float> values;
    for (std::size_t i = 0; i < w_.specs.size(); ++i) {
      const std::size_t n = numel_of(w_.specs[i].shape);
      values.resize(n);
      const std::uint64_t stream = (static_cast<std::uint64_t>(rank_) << 32) + i + 1000;
      for (std::size_t j = 0; j < n; ++j) {
        values[j] = hashed(stream, j, -0.01f, 0.01f) * static_cast<float>(grads_scale_);
      }
      grads_[i].resize(n * dtype_size(dtype_));
      kernels::cast_cpu(values.data(), DType::F32, grads_[i].data(), dtype_, n, exec_);
    }
  }

  void compute_mlp_grads() {
    for (std::size_t i = 0; i < w_.specs.size(); ++i) {
      const std::span<const std::byte> p = engine_.param(i);
      kernels::cast_cpu(p.data(), dtype_, weights_[i].data(), DType::F32, weights_[i].size(),
                        exec_);
    }
    const models::Batch batch = data_->batch(static_cast<std::uint64_t>(engine_.global_steps()),
                                             static_cast<std::uint64_t>(rank_), 1);
    const std::vector<std::span<const float>> weight_views(weights_.begin(), weights_.end());
    const std::vector<std::span<float>> grad_views(grads_f32_.begin(), grads_f32_.end());
    (void)models::forward_backward(*w_.mlp, weight_views, batch,
                                   static_cast<float>(engine_.backward_scale()), grad_views);
  }

  const Workload& w_;
  Engine& engine_;
  int rank_;
  DType dtype_;
  kernels::CpuExec exec_;
  // --params
  std::vector<std::vector<std::byte>> grads_;
  double grads_scale_ = std::numeric_limits<double>::quiet_NaN();
  // --model
  std::optional<models::TeacherStudentData> data_;
  std::vector<std::vector<float>> weights_, grads_f32_;
};

// Collective: throws unless an optimizer step was applied and left every master value finite and
// almost all of them changed from the initial values.
void validate(Engine& engine, const Workload& w, const StepResult& r, int warmup_steps) {
  ZERO_CHECK(r.boundary && !r.skipped,
             "step bench: no optimizer step applied in {} warm-up steps (every one skipped on "
             "overflow)",
             warmup_steps);
  ZERO_CHECK(std::isfinite(r.grad_norm) && r.grad_norm > 0,
             "step bench: the warm-up step's gradient norm is {}, expected finite and positive",
             r.grad_norm);
  std::size_t total = 0, changed = 0;
  std::vector<float> initial;
  for (std::size_t i = 0; i < w.specs.size(); ++i) {
    const std::vector<float> master = engine.gather_master(i);
    initial.assign(master.size(), 0.0f);
    w.init(i, initial);
    for (std::size_t j = 0; j < master.size(); ++j) {
      ZERO_CHECK(std::isfinite(master[j]),
                 "step bench: rank {}: '{}'[{}] = {} after the warm-up step, expected finite",
                 engine.rank(), w.specs[i].name, j, master[j]);
      changed += master[j] != initial[j];
    }
    total += master.size();
  }
  ZERO_CHECK(static_cast<double>(changed) >= kMinChangedFraction * static_cast<double>(total),
             "step bench: rank {}: only {} of {} master values changed in the warm-up step",
             engine.rank(), changed, total);
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using HostArray = std::unique_ptr<std::byte, AlignedFree>;

// `bytes` of page-aligned memory outside the rank's Device, so the engine's ledger does not see
// it; first touched (zeroed) in 1 MiB tiles by `threads` OpenMP threads.
HostArray host_array(std::size_t bytes, int threads) {
  const std::size_t rounded = std::max<std::size_t>((bytes + 4095) / 4096 * 4096, 4096);
  HostArray a(static_cast<std::byte*>(std::aligned_alloc(4096, rounded)));
  ZERO_CHECK_AS(OutOfMemory, a != nullptr, "step bench: cannot allocate {} bytes", rounded);
  std::byte* p = a.get();
  kernels::detail::for_each_tile(
      rounded, kMemcpyTileBytes, threads,
      [&](std::size_t b, std::size_t e) { std::memset(p + b, 0, e - b); });
  return a;
}

// The slowest rank's seconds for fn(), best of kLimitReps; every rank starts each repetition
// after a barrier. Collective.
double best_seconds(Communicator& comm, const std::function<void()>& fn) {
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < kLimitReps; ++r) {
    comm.barrier().wait();
    const Clock::time_point start = Clock::now();
    fn();
    double seconds = seconds_since(start);
    comm.all_reduce(&seconds, &seconds, 1, DType::F64, ReduceOp::Max).wait();
    best = std::min(best, seconds);
  }
  return best;
}

// Seconds for every rank to copy `bytes` at once with `threads` OpenMP threads, after a
// validated warm-up copy. Each thread copies one contiguous run, as the optimizer's static split
// gives each thread, with one plain memcpy call (libc picks its strategy for the run's size, as
// for any copy). Collective.
double memcpy_seconds(Communicator& comm, std::size_t bytes, int threads) {
  const HostArray src = host_array(bytes, threads);
  const HostArray dst = host_array(bytes, threads);
  std::memset(src.get(), comm.rank() + 1, bytes);
  const auto t = static_cast<std::size_t>(threads);
  const std::size_t run_bytes = ((bytes + t - 1) / t + 4095) / 4096 * 4096;
  auto copy = [&] {
    kernels::detail::for_each_tile(bytes, run_bytes, threads, [&](std::size_t b, std::size_t e) {
      std::memcpy(dst.get() + b, src.get() + b, e - b);
    });
  };
  copy();
  ZERO_CHECK(std::memcmp(dst.get(), src.get(), bytes) == 0,
             "step bench: memcpy of {} bytes on rank {} gave a wrong result", bytes, comm.rank());
  return best_seconds(comm, copy);
}

// Seconds for every rank at once to run kernels::traffic_probe_cpu (the optimizer's loads and
// stores, same tiles and threads, no arithmetic) over `shape`'s dtypes and `numel` elements, after
// one warm-up run. The probe leaves meaningless values: nothing to validate. Collective.
double probe_seconds(Communicator& comm, const kernels::OptimizerTensors& shape, int state_count,
                     std::size_t numel, int threads) {
  const HostArray master = host_array(numel * sizeof(float), threads);
  const HostArray grad = host_array(numel * dtype_size(shape.grad_dtype), threads);
  const HostArray state0 = host_array(numel * dtype_size(shape.state_dtype), threads);
  const HostArray state1 = host_array(numel * dtype_size(shape.state_dtype), threads);
  const HostArray out = host_array(numel * dtype_size(shape.param_out_dtype), threads);
  kernels::OptimizerTensors t = shape;
  t.master = reinterpret_cast<float*>(master.get());
  t.grad = grad.get();
  t.state0 = state0.get();
  t.state1 = state1.get();
  t.param_out = shape.param_out != nullptr ? out.get() : nullptr;
  t.numel = numel;
  const kernels::CpuExec exec{threads, kernels::Isa::Auto};
  auto probe = [&] { kernels::traffic_probe_cpu(t, state_count, exec); };
  probe();
  return best_seconds(comm, probe);
}

// What one rank measured for one stage.
struct RankResult {
  std::vector<double> step_s;  // counted steps (rank 0's are reported)
  EngineTimings timings;       // over the counted steps
  MemorySnapshot memory;
  std::size_t optimizer_elems = 0;  // fp32 master elements this rank updates per step
  std::size_t optimizer_bytes_per_elem = 0;
  int warmup_steps = 0;
  int skipped_steps = 0;  // counted steps skipped on overflow
  double memcpy_s = 0;    // the limits: the same on every rank
  std::size_t memcpy_bytes = 0;
  double probe_s = 0;
  std::size_t probe_bytes_per_elem = 0;
};

std::size_t tag_bytes(const MemorySnapshot& m, MemoryTag tag, bool peak) {
  std::size_t sum = 0;
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    const MemoryUsage& u = m.at(static_cast<MemoryKind>(k), tag);
    sum += peak ? u.peak_bytes : u.current_bytes;
  }
  return sum;
}

void run_rank(const StepArgs& args, const Workload& w, const config::DsConfig& cfg, int threads,
              Communicator& comm, RankResult& out) {
  const DType dtype = cfg.model_dtype;
  {
    // The device outlives the engine (Engine::create's REQUIRES).
    const std::unique_ptr<Device> device = make_device("cpu", comm.rank());
    EngineOptions options;
    options.kernel_threads = threads;
    const InitFn init = [&](std::size_t index, std::span<float> values) { w.init(index, values); };
    const std::unique_ptr<Engine> engine =
        Engine::create(cfg, comm, *device, w.specs, init, options);
    Trainer trainer(w, *engine, comm.rank(), dtype, kernels::CpuExec{.threads = threads});

    StepResult r;
    do {
      r = trainer.step();
      ++out.warmup_steps;
    } while (r.skipped && out.warmup_steps < kMaxWarmupSteps);
    validate(*engine, w, r, out.warmup_steps);

    engine->reset_timings();
    for (int k = 1; k < args.steps; ++k) {
      const Clock::time_point start = Clock::now();
      r = trainer.step();
      out.step_s.push_back(seconds_since(start));
      out.skipped_steps += r.skipped;
    }
    out.timings = engine->timings();
    out.memory = engine->memory();
    out.optimizer_elems = tag_bytes(out.memory, MemoryTag::MasterParams, false) / sizeof(float);
  }
  // The arrays of the engine's optimizer call (engine.cpp, step()): gradients in the accumulation
  // dtype, fp32 master and states, the fused low-precision write; in fp32 the engine copies the
  // master into the model instead, one more read and write per element.
  kernels::OptimizerHyper hyper;
  hyper.kind = kernels::OptimizerKind::AdamW;
  const int state_count = kernels::optimizer_state_count(hyper);
  kernels::OptimizerTensors shape;
  shape.grad_dtype = cfg.data_types.grad_accum_dtype.value_or(dtype);
  shape.state_dtype = DType::F32;
  std::byte marker{};  // only whether param_out is set counts
  shape.param_out = dtype != DType::F32 ? &marker : nullptr;
  shape.param_out_dtype = dtype != DType::F32 ? dtype : DType::BF16;
  out.probe_bytes_per_elem = kernels::optimizer_bytes_per_elem(shape, state_count);
  out.optimizer_bytes_per_elem =
      out.probe_bytes_per_elem + (dtype == DType::F32 ? 2 * sizeof(float) : 0);

  // After the engine is gone, so the limits do not compete with its memory.
  out.memcpy_bytes = out.optimizer_elems * out.optimizer_bytes_per_elem / 2;
  out.memcpy_s = memcpy_seconds(comm, out.memcpy_bytes, threads);
  out.probe_s = probe_seconds(comm, shape, state_count, out.optimizer_elems, threads);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Four significant digits: enough for timings that vary by more than that from run to run.
double sig4(double x) {
  if (x == 0 || !std::isfinite(x)) return x;
  const double scale = std::pow(10.0, 3 - std::floor(std::log10(std::fabs(x))));
  return std::round(x * scale) / scale;
}

struct Figure {
  int stage = 0;
  double step_s = 0, step_mean_s = 0;
  EngineTimings per_step;  // timings / counted steps
  double other_s = 0;      // mean step minus the engine's phases
  double optimizer_gbps = 0, memcpy_gbps = 0, probe_gbps = 0;
  std::size_t optimizer_elems = 0, optimizer_bytes_per_elem = 0;
  std::size_t peak_bytes = 0;  // the largest over ranks of the sum of per-kind peaks
  std::array<std::size_t, kNumMemoryTags> peak_by_tag{};  // the largest over ranks
  double formula_bytes = 0;
  int warmup_steps = 0, skipped_steps = 0, counted_steps = 0;
  bool prefetch_enabled = true;
  // Stage 3 with prefetch, next to the same run without: 1 − (gather wait with) / (without).
  std::optional<double> gather_hidden_fraction;
};

Figure summarize(int stage, const std::vector<RankResult>& ranks, const Workload& w,
                 const StepArgs& args, const config::DsConfig& cfg) {
  const RankResult& r0 = ranks[0];
  Figure f;
  f.stage = stage;
  f.counted_steps = static_cast<int>(r0.step_s.size());
  f.step_s = median(r0.step_s);
  double sum = 0;
  for (double s : r0.step_s) sum += s;
  f.step_mean_s = sum / f.counted_steps;
  const double n = f.counted_steps;
  const EngineTimings& t = r0.timings;
  EngineTimings& p = f.per_step;
  p.pack_s = t.pack_s / n;
  p.reduce_wait_s = t.reduce_wait_s / n;
  p.unpack_s = t.unpack_s / n;
  p.accumulate_s = t.accumulate_s / n;
  p.norm_s = t.norm_s / n;
  p.optimizer_s = t.optimizer_s / n;
  p.all_gather_s = t.all_gather_s / n;
  p.gather_s = t.gather_s / n;
  p.gather_wait_s = t.gather_wait_s / n;
  p.buckets = t.buckets;
  p.gathers = t.gathers;
  p.prefetches = t.prefetches;
  f.other_s = f.step_mean_s - (p.pack_s + p.reduce_wait_s + p.unpack_s + p.accumulate_s + p.norm_s +
                               p.optimizer_s + p.all_gather_s + p.gather_s);
  f.optimizer_elems = r0.optimizer_elems;
  f.optimizer_bytes_per_elem = r0.optimizer_bytes_per_elem;
  f.optimizer_gbps =
      static_cast<double>(r0.optimizer_elems * r0.optimizer_bytes_per_elem) / p.optimizer_s / 1e9;
  f.memcpy_gbps = 2.0 * static_cast<double>(r0.memcpy_bytes) / r0.memcpy_s / 1e9;
  f.probe_gbps =
      static_cast<double>(r0.optimizer_elems * r0.probe_bytes_per_elem) / r0.probe_s / 1e9;
  for (const RankResult& r : ranks) {
    std::size_t total = 0;
    for (const MemoryUsage& u : r.memory.by_kind) total += u.peak_bytes;
    f.peak_bytes = std::max(f.peak_bytes, total);
    for (std::size_t tag = 0; tag < kNumMemoryTags; ++tag) {
      f.peak_by_tag[tag] =
          std::max(f.peak_by_tag[tag], tag_bytes(r.memory, static_cast<MemoryTag>(tag), true));
    }
    f.skipped_steps = std::max(f.skipped_steps, r.skipped_steps);
    f.warmup_steps = std::max(f.warmup_steps, r.warmup_steps);
  }
  EstimateInput in;
  in.params = w.params;
  in.largest_param = w.largest_param;
  in.world_size = static_cast<std::uint64_t>(args.world_size);
  in.stage = stage;
  in.precision = cfg.model_dtype == DType::BF16  ? Precision::Bf16
                 : cfg.model_dtype == DType::F16 ? Precision::Fp16
                                                 : Precision::Fp32;
  in.optimizer = EstimateOptimizer::Adam;
  const TierBytes formula = estimate_model_states(in).total();
  f.formula_bytes = formula.device + formula.host + formula.nvme;
  return f;
}

void print_header(const StepArgs& args, const Workload& w, int threads) {
  if (args.json) return;
  std::printf(
      "zero-bench step: %s (%zu params), %d in-process ranks x %d threads, %s, AdamW, bucket %lld "
      "elems, median of %d timed steps after a warm-up; ms per step on rank 0; limits: memcpy "
      "(cpy) and the optimizer's traffic probe (prb) of the optimizer's bytes on every rank at "
      "once\n",
      w.label.c_str(), w.params, args.world_size, threads, args.precision.c_str(),
      static_cast<long long>(args.bucket_elems), args.steps - 1);
  std::printf("%5s %8s %7s %8s %7s %7s %7s %7s %7s %7s %7s %7s %8s %8s %6s %8s %6s %9s\n", "stage",
              "step", "pack", "red.wait", "unpack", "accum", "norm", "optim", "allgath", "gather",
              "g.wait", "other", "opt GB/s", "cpy GB/s", "ratio", "prb GB/s", "ratio", "peak MiB");
}

void print_figure(const StepArgs& args, const Workload& w, int threads, const Figure& f) {
  const EngineTimings& p = f.per_step;
  const double ratio = f.optimizer_gbps / f.memcpy_gbps;
  if (args.json) {
    nlohmann::ordered_json j;
    j["bench"] = "step";
    j["stage"] = f.stage;
    j["world_size"] = args.world_size;
    j["precision"] = args.precision;
    j["model"] = w.label;
    j["params"] = w.params;
    j["threads"] = threads;
    j["bucket_elems"] = args.bucket_elems;
    j["steps"] = f.counted_steps;
    j["warmup_steps"] = f.warmup_steps;
    j["skipped_steps"] = f.skipped_steps;
    j["step_s"] = sig4(f.step_s);
    j["step_mean_s"] = sig4(f.step_mean_s);
    j["breakdown_s"] = {{"pack", sig4(p.pack_s)},
                        {"reduce_wait", sig4(p.reduce_wait_s)},
                        {"unpack", sig4(p.unpack_s)},
                        {"accumulate", sig4(p.accumulate_s)},
                        {"norm", sig4(p.norm_s)},
                        {"optimizer", sig4(p.optimizer_s)},
                        {"all_gather", sig4(p.all_gather_s)},
                        {"gather", sig4(p.gather_s)},
                        {"gather_wait", sig4(p.gather_wait_s)}};
    j["other_s"] = sig4(f.other_s);
    j["buckets_per_step"] = static_cast<double>(p.buckets) / f.counted_steps;
    j["gathers_per_step"] = static_cast<double>(p.gathers) / f.counted_steps;
    j["prefetch"] = f.prefetch_enabled && p.prefetches > 0;
    if (f.gather_hidden_fraction) j["gather_hidden_fraction"] = sig4(*f.gather_hidden_fraction);
    j["prefetches_per_step"] = static_cast<double>(p.prefetches) / f.counted_steps;
    j["optimizer_elems_per_rank"] = f.optimizer_elems;
    j["optimizer_bytes_per_elem"] = f.optimizer_bytes_per_elem;
    j["optimizer_gb_per_s"] = sig4(f.optimizer_gbps);
    j["limit"] = "memcpy";
    j["limit_gb_per_s"] = sig4(f.memcpy_gbps);
    j["ratio"] = sig4(ratio);
    j["probe_gb_per_s"] = sig4(f.probe_gbps);
    j["probe_ratio"] = sig4(f.optimizer_gbps / f.probe_gbps);
    j["peak_bytes_per_rank"] = f.peak_bytes;
    nlohmann::ordered_json tags = nlohmann::ordered_json::object();
    for (std::size_t tag = 0; tag < kNumMemoryTags; ++tag) {
      if (f.peak_by_tag[tag] != 0) {
        tags[std::string(memory_tag_name(static_cast<MemoryTag>(tag)))] = f.peak_by_tag[tag];
      }
    }
    j["peak_bytes_by_tag"] = tags;
    j["zero_formula_bytes_per_rank"] = f.formula_bytes;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "%5d %8.2f %7.2f %8.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %8.2f %8.2f %6.3f "
        "%8.2f %6.3f %9.1f\n",
        f.stage, f.step_s * 1e3, p.pack_s * 1e3, p.reduce_wait_s * 1e3, p.unpack_s * 1e3,
        p.accumulate_s * 1e3, p.norm_s * 1e3, p.optimizer_s * 1e3, p.all_gather_s * 1e3,
        p.gather_s * 1e3, p.gather_wait_s * 1e3, f.other_s * 1e3, f.optimizer_gbps, f.memcpy_gbps,
        ratio, f.probe_gbps, f.optimizer_gbps / f.probe_gbps,
        static_cast<double>(f.peak_bytes) / (1 << 20));
  }
  std::fflush(stdout);
}

void print_footer(const StepArgs& args, const std::vector<Figure>& figures) {
  if (args.json) return;
  std::printf(
      "\nother = mean step minus the engine's phases but g.wait (gradient writes%s, untimed "
      "engine work). g.wait = waiting for stage-3 all-gathers, in gather() or not (after step(), "
      "persistent units are re-gathered outside gather()).\n",
      args.model ? ", MLP forward/backward" : "");
  for (const Figure& f : figures) {
    if (f.stage != 3) continue;
    std::printf("stage 3: %.1f unit all-gathers per step, %.1f of them prefetched\n",
                static_cast<double>(f.per_step.gathers) / f.counted_steps,
                static_cast<double>(f.per_step.prefetches) / f.counted_steps);
  }
  std::printf("peak memory per rank by tag (MiB, largest over ranks; ZeRO formula in brackets):\n");
  for (const Figure& f : figures) {
    std::printf("  stage %d: %.1f [%.1f] =", f.stage, static_cast<double>(f.peak_bytes) / (1 << 20),
                f.formula_bytes / (1 << 20));
    for (std::size_t tag = 0; tag < kNumMemoryTags; ++tag) {
      if (f.peak_by_tag[tag] == 0) continue;
      const std::string name(memory_tag_name(static_cast<MemoryTag>(tag)));
      std::printf(" %s %.1f", name.c_str(), static_cast<double>(f.peak_by_tag[tag]) / (1 << 20));
    }
    std::printf("\n");
  }
  for (const Figure& f : figures) {
    if (f.skipped_steps > 0) {
      std::printf("stage %d: %d timed step(s) skipped on overflow (optimizer time includes them)\n",
                  f.stage, f.skipped_steps);
    }
  }
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
