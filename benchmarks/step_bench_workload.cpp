// The workload of `zero-bench step` (synthetic layers or the zero-train MLP), its ds_config, and
// one rank's run: a trainer loop like a real one, warm-up, validation, timed steps.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "benchmarks/step_bench.h"
#include "config/parse.h"
#include "kernels/cast.h"
#include "kernels/cpu_parallel.h"
#include "kernels/optimizer.h"
#include "kernels/traffic_probe.h"
#include "models/mlp.h"
#include "zero/base/error.h"
#include "zero/base/shape.h"
#include "zero/base/timer.h"
#include "zero/comm/hierarchical_comm.h"
#include "zero/comm/node_topology.h"
#include "zero/device/device.h"
#include "zero/engine.h"

namespace zero::bench::step_bench {

namespace {

// fp16 starts at a loss scale of 2^16 and may skip a few steps on overflow before one applies.
constexpr int kMaxWarmupSteps = 32;
// After the warm-up step, at least this share of the fp32 master values must differ from their
// initial values (AdamW moves every element with a non-zero gradient or a non-zero value).
constexpr double kMinChangedFraction = 0.99;
constexpr std::uint64_t kSeed = 1234;

// A deterministic value in [lo, hi) per (stream, index).
float hashed(std::uint64_t stream, std::uint64_t index, float lo, float hi) {
  std::uint64_t z = index * 0x9e3779b97f4a7c15ull + stream * 0xd1b54a32d192ed03ull + kSeed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return lo + (hi - lo) * static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

}  // namespace

void Workload::init(std::size_t index, std::span<float> out) const {
  if (mlp) {
    models::init_param(*mlp, index, kSeed, /*stream=*/0, out);
    return;
  }
  for (std::size_t j = 0; j < out.size(); ++j) out[j] = hashed(index, j, -0.05f, 0.05f);
}

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
  if (!args.config_path.empty()) {
    std::ifstream in(args.config_path, std::ios::binary);
    ZERO_CHECK(in.good(), "--config {}: cannot be read", args.config_path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const nlohmann::json file = config::parse_relaxed_json(text);
    ZERO_CHECK(file.contains("zero_optimization") && file["zero_optimization"].is_object(),
               "--config {}: no zero_optimization block to take", args.config_path);
    for (const auto& [key, value] : file["zero_optimization"].items()) {
      if (key != "stage") c["zero_optimization"][key] = value;
    }
  }
  if (args.precision == "bf16") c["bf16"] = {{"enabled", true}};
  if (args.precision == "fp16") c["fp16"] = {{"enabled", true}};
  return c;
}

namespace {

// One rank's trainer loop body: gathers, gradients in backward order, step().
class Trainer {
 public:
  Trainer(const Workload& w, Engine& engine, Device& device, int rank, DType dtype,
          const kernels::CpuExec& exec)
      : w_(w), engine_(engine), device_(device), rank_(rank), dtype_(dtype), exec_(exec) {
    if (w_.mlp) {
      data_.emplace(*w_.mlp, kSeed, exec_.threads);
      for (const ParamSpec& s : w_.specs) {
        const std::size_t n = numel_of(s.shape);
        weights_.emplace_back(n);
        grads_f32_.emplace_back(n);
      }
    }
  }

  // Seconds this trainer spent on its own work since construction (not in an engine call): the
  // forward stand-in and the gradient writes (--params), or the MLP's casts, forward and
  // backward and the gradient writes (--model).
  double model_seconds() const { return model_s_; }

  StepResult step() {
    // Forward, unit by unit: with prefetch, the next units' all-gathers run on the communicator's
    // thread while this one's parameters are read.
    for (int u = 0; u < w_.units; ++u) {
      engine_.gather(u);
      if (!w_.mlp && device_.host_addressable()) {
        const Clock::time_point start = Clock::now();
        forward_compute(u);
        model_s_ += seconds_since(start);
      }
    }
    if (w_.mlp) {
      compute_mlp_grads();  // hands each unit over from backward, as its gradients are done
    } else {
      if (grads_scale_ != engine_.backward_scale()) make_synthetic_grads();
      for (int u = w_.units - 1; u >= 0; --u) hand_over(u);
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
  std::uint64_t sink_ = 0;
  double model_s_ = 0;

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
    if (device_.host_addressable()) return;
    // A GPU's gradients come from its own memory, as a model's backward would leave them.
    grads_on_device_.resize(grads_.size());
    for (std::size_t i = 0; i < grads_.size(); ++i) {
      if (grads_[i].empty()) continue;
      grads_on_device_[i] =
          device_.allocate(grads_[i].size(), MemoryKind::Device, MemoryTag::Staging);
      device_.copy(grads_on_device_[i].data(), grads_[i].data(), grads_[i].size());
    }
  }

  // Unit u's gradients to the engine in backward order, then the unit is released.
  void hand_over(int unit) {
    for (std::size_t i = w_.specs.size(); i-- > 0;) {
      if (w_.specs[i].unit != unit) continue;
      const std::span<std::byte> slot = engine_.grad(i);
      const Clock::time_point start = Clock::now();
      if (w_.mlp) {
        kernels::cast_cpu(grads_f32_[i].data(), DType::F32, slot.data(), dtype_,
                          grads_f32_[i].size(), exec_);
      } else if (!grads_on_device_.empty()) {
        if (!slot.empty()) device_.copy(slot.data(), grads_on_device_[i].data(), slot.size());
      } else {
        std::memcpy(slot.data(), grads_[i].data(), slot.size());
      }
      model_s_ += seconds_since(start);
      engine_.grad_ready(i);
    }
    engine_.release(unit);
  }

  // The model's time is the whole of this minus the hand-overs from backward (hand_over counts
  // its own gradient writes).
  void compute_mlp_grads() {
    const Clock::time_point start = Clock::now();
    double hand_over_s = 0;
    for (std::size_t i = 0; i < w_.specs.size(); ++i) {
      const std::span<const std::byte> p = engine_.param(i);
      kernels::cast_cpu(p.data(), dtype_, weights_[i].data(), DType::F32, weights_[i].size(),
                        exec_);
    }
    const models::Batch batch = data_->batch(static_cast<std::uint64_t>(engine_.global_steps()),
                                             static_cast<std::uint64_t>(rank_), 1);
    const std::vector<std::span<const float>> weight_views(weights_.begin(), weights_.end());
    const std::vector<std::span<float>> grad_views(grads_f32_.begin(), grads_f32_.end());
    const models::BackwardOptions backward{
        .threads = exec_.threads,
        .on_layer_grads =
            [&](std::size_t layer) {
              const Clock::time_point hand_over_start = Clock::now();
              hand_over(static_cast<int>(layer));
              hand_over_s += seconds_since(hand_over_start);
            }};
    (void)models::forward_backward(*w_.mlp, weight_views, batch,
                                   static_cast<float>(engine_.backward_scale()), grad_views,
                                   backward);
    model_s_ += seconds_since(start) - hand_over_s;
  }

  const Workload& w_;
  Engine& engine_;
  Device& device_;
  int rank_;
  DType dtype_;
  kernels::CpuExec exec_;
  // --params
  std::vector<std::vector<std::byte>> grads_;
  std::vector<Buffer> grads_on_device_;  // a GPU's copy of grads_
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

}  // namespace

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
  // The device outlives the engine (Engine::create's REQUIRES) and serves the limits after it.
  DeviceOptions device_options;
  device_options.device_budget_bytes = args.memory_budget;
  const std::unique_ptr<Device> device = make_device(args.device, comm.rank(), device_options);
  {
    EngineOptions options;
    options.kernel_threads = threads;
    // On a GPU the engine's collectives go through NCCL; `comm` carries the host-side ones.
    std::unique_ptr<Communicator> gpu_comm;
    if (device->gpu_ordinal() >= 0) {
      gpu_comm = make_gpu_communicator(comm, device->gpu_ordinal());
      options.control_comm = &comm;
    }
    const InitFn init = [&](std::size_t index, std::span<float> values) { w.init(index, values); };
    // On the CPU, counted (and, with several simulated nodes, in two levels) by a
    // HierarchicalComm; on a GPU, NCCL's collectives, not counted.
    std::unique_ptr<HierarchicalComm> nodes;
    if (!gpu_comm) {
      nodes = HierarchicalComm::create(comm, resolve_node_topology(comm.size(), args.ranks_per_node));
    }
    Communicator& engine_comm = gpu_comm ? *gpu_comm : static_cast<Communicator&>(*nodes);
    const std::unique_ptr<Engine> engine =
        Engine::create(cfg, engine_comm, *device, w.specs, init, options);
    auto traffic = [&] { return nodes ? nodes->traffic() : NodeTraffic{}; };
    Trainer trainer(w, *engine, *device, comm.rank(), dtype, kernels::CpuExec{.threads = threads});

    StepResult r;
    do {
      r = trainer.step();
      ++out.warmup_steps;
    } while (r.skipped && out.warmup_steps < kMaxWarmupSteps);
    validate(*engine, w, r, out.warmup_steps);

    engine->reset_timings();
    const double model_before = trainer.model_seconds();
    const NodeTraffic traffic_before = traffic();
    for (int k = 1; k < args.steps; ++k) {
      const Clock::time_point start = Clock::now();
      r = trainer.step();
      out.step_s.push_back(seconds_since(start));
      out.skipped_steps += r.skipped;
    }
    out.model_s = trainer.model_seconds() - model_before;
    const NodeTraffic traffic_after = traffic();
    const auto counted = static_cast<double>(out.step_s.size());
    out.intra_node_bytes =
        static_cast<double>(traffic_after.intra_bytes - traffic_before.intra_bytes) / counted;
    out.inter_node_bytes =
        static_cast<double>(traffic_after.inter_bytes - traffic_before.inter_bytes) / counted;
    out.timings = engine->timings();
    out.memory = engine->memory();
  }
  // The arrays of the engine's optimizer call (engine.cpp, step()): gradients in the accumulation
  // dtype, fp32 master and states, the fused low-precision write. In fp32 the master weights are
  // the model copy itself where nothing is offloaded (no master_params in the ledger); else the
  // kernel writes the model copy as well, one more write per element and its read for ownership.
  kernels::OptimizerHyper hyper;
  hyper.kind = kernels::OptimizerKind::AdamW;
  const int state_count = kernels::optimizer_state_count(hyper);
  // AdamW's fp32 states cover the elements this rank steps (every domain at stage 0).
  out.optimizer_elems = tag_bytes(out.memory, MemoryTag::OptimizerStates, false) /
                        (static_cast<std::size_t>(state_count) * sizeof(float));
  const bool separate_master = tag_bytes(out.memory, MemoryTag::MasterParams, false) > 0;
  kernels::OptimizerTensors shape;
  shape.grad_dtype = cfg.data_types.grad_accum_dtype.value_or(dtype);
  shape.state_dtype = DType::F32;
  std::byte marker{};  // only whether param_out is set counts
  shape.param_out = dtype != DType::F32 ? &marker : nullptr;
  shape.param_out_dtype = dtype != DType::F32 ? dtype : DType::BF16;
  out.probe_bytes_per_elem = kernels::optimizer_bytes_per_elem(shape, state_count);
  out.optimizer_bytes_per_elem =
      out.probe_bytes_per_elem + (dtype == DType::F32 && separate_master ? 2 * sizeof(float) : 0);

  // After the engine is gone, so the limits do not compete with its memory.
  out.memcpy_bytes = out.optimizer_elems * out.optimizer_bytes_per_elem / 2;
  if (device->host_addressable()) {
    out.memcpy_s = memcpy_seconds(comm, out.memcpy_bytes, threads);
    out.probe_s = probe_seconds(comm, shape, state_count, out.optimizer_elems, threads);
  } else {
    out.memcpy_s = device_memcpy_seconds(comm, *device, out.memcpy_bytes);
    out.probe_s = device_probe_seconds(comm, *device, shape, state_count, out.optimizer_elems);
  }
  // Offloaded on a GPU: pinned copies of the ranks' average landing and upload sizes (every rank
  // takes part, whatever its own counts).
  const EngineTimings& t = out.timings;
  double counts[4] = {static_cast<double>(t.landings), static_cast<double>(t.landed_bytes),
                      static_cast<double>(t.uploads), static_cast<double>(t.uploaded_bytes)};
  comm.all_reduce(counts, counts, 4, DType::F64, ReduceOp::Sum).wait();
  if (!device->host_addressable() && counts[0] > 0) {
    out.pinned_d2h_bytes = static_cast<std::size_t>(counts[1] / counts[0]);
    out.pinned_d2h_s = pinned_copy_seconds(comm, *device, out.pinned_d2h_bytes, true);
    if (counts[2] > 0) {
      out.pinned_h2d_bytes = static_cast<std::size_t>(counts[3] / counts[2]);
      out.pinned_h2d_s = pinned_copy_seconds(comm, *device, out.pinned_h2d_bytes, false);
    }
  }
}

}  // namespace zero::bench::step_bench
