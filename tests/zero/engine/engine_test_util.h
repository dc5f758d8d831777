// A small trainer for the engine tests: the teacher–student MLP of zero-train, run on in-process
// ranks exactly the way zero-train feeds it (rank r takes its contiguous share of every global
// batch), with hooks to corrupt a gradient or to swap the communicator.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "config/ds_config.h"
#include "kernels/cast.h"
#include "models/mlp.h"
#include "zero/comm/communicator.h"
#include "zero/comm/hierarchical_comm.h"
#include "zero/comm/inproc_comm.h"
#include "zero/device/device.h"
#include "zero/engine.h"

namespace zero::test {

struct TrainSpec {
  nlohmann::json config;
  int world = 1;
  int steps = 5;
  std::uint64_t seed = 7;
  std::string model = "mlp:8,24,16,4";
  // Per-layer unit (default) or one unit for the whole model.
  bool one_unit = false;
  std::vector<ParamGroupOptions> groups;
  // Param index → group / frozen.
  std::function<int(std::size_t)> group_of;
  std::function<bool(std::size_t)> frozen;
  // Called after a rank wrote its fp32 gradients, before they go to the engine:
  // (rank, optimizer step, micro-step, param, gradient).
  std::function<void(int, int, int, std::size_t, std::vector<float>&)> corrupt;
  // Wraps the rank's communicator (fault injection); returns the one the engine uses.
  std::function<Communicator&(int, Communicator&)> wrap_comm;
  // Checkpoints: save to save_dir (tag "step<N>") after optimizer step N; load load_dir's latest
  // right after create and continue from its step up to `steps`.
  std::string save_dir;
  int save_after = -1;
  std::string load_dir;
  // Per-rank budget of MemoryKind::Device bytes (DeviceOptions::device_budget_bytes).
  std::optional<std::size_t> device_budget;
  // make_device's kind. On a GPU ("cuda") rank r uses GPU r mod the visible count, the engine's
  // collectives go through make_gpu_communicator (NCCL, or DeviceInProcComm where the ranks share
  // one GPU; the in-process communicator is its control communicator), and weights and gradients
  // cross to and from host memory around the CPU model.
  std::string device = "cpu";
  // Makes each rank's device instead of make_device(device, ...), when given.
  std::function<std::unique_ptr<Device>(int rank, const DeviceOptions&)> device_factory;
  // The engine's collectives through make_gpu_communicator(comm, device) even on a device that
  // is no GPU (a stand-in: DeviceInProcComm), the in-process communicator its control
  // communicator. Always so on a GPU.
  bool device_comm = false;
  // With device_comm (or on a GPU): the communicator the engine uses over the device one (the
  // host one is the control communicator), owned by the rank and dropped before its device.
  std::function<std::unique_ptr<Communicator>(int, Communicator& device_comm, Device&,
                                              Communicator& host)>
      wrap_device_comm;
  // Stage 3 as a backward that re-gathers: each micro-step releases every unit after reading the
  // weights once and gathers them again; the re-gathered weights feed forward and backward.
  bool regather = false;
  // Gathers through gather_on_stream(unit, null): on a GPU with NCCL the legacy default stream,
  // where device->copy reads the weights, waits for each all-gather instead of the host.
  bool gather_on_stream = false;
};

struct TrainResult {
  std::vector<std::string> names;
  std::vector<std::vector<float>> params;   // final fp32 master, per parameter (rank 0)
  std::vector<std::vector<std::vector<float>>> rank_params;  // the same, per rank
  std::vector<std::vector<float>> initial;  // initial values
  std::vector<StepResult> steps;            // rank 0's step results at boundaries
  std::vector<MemorySnapshot> memory;       // per rank, at the end
  std::vector<double> losses;               // rank 0's local loss per window
  // Per rank, at the end: the bytes sent by level where the engine's communicator counts them
  // (a HierarchicalComm), zeros otherwise.
  std::vector<NodeTraffic> traffic;
  std::vector<EngineTimings> timings;  // per rank, at the end
};

inline nlohmann::json base_config(int stage, const std::string& precision, int gas, int micro = 4) {
  nlohmann::json c = {
      {"train_micro_batch_size_per_gpu", micro},
      {"gradient_accumulation_steps", gas},
      {"gradient_clipping", 1.0},
      {"optimizer",
       {{"type", "AdamW"},
        {"params",
         {{"lr", 0.003}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}, {"weight_decay", 0.01}}}}},
      {"scheduler",
       {{"type", "WarmupLR"},
        {"params", {{"warmup_min_lr", 0}, {"warmup_max_lr", 0.003}, {"warmup_num_steps", 3}}}}},
      {"zero_optimization",
       {{"stage", stage},
        {"reduce_bucket_size", 300},
        {"allgather_bucket_size", 300},
        {"overlap_comm", true}}}};
  if (precision == "bf16") c["bf16"] = {{"enabled", true}};
  if (precision == "fp16") c["fp16"] = {{"enabled", true}, {"initial_scale_power", 12}};
  return c;
}

inline std::vector<float> to_f32(std::span<const std::byte> bytes, DType t) {
  const std::size_t n = bytes.size() / dtype_size(t);
  std::vector<float> out(n);
  kernels::cast_cpu(bytes.data(), t, out.data(), DType::F32, n);
  return out;
}

inline TrainResult train(const TrainSpec& spec) {
  using namespace zero::models;
  const MlpShape shape = MlpShape::parse(spec.model);
  const std::vector<MlpParam> mp = mlp_params(shape);
  config::Supplied supplied;
  supplied.world_size = spec.world;
  const config::DsConfig cfg = config::load_config_json(spec.config, supplied);
  const DType dtype = cfg.model_dtype;
  std::vector<ParamSpec> specs;
  for (std::size_t i = 0; i < mp.size(); ++i) {
    ParamSpec s;
    s.name = mp[i].name;
    for (std::size_t d : mp[i].shape) s.shape.push_back(static_cast<std::int64_t>(d));
    s.dtype = dtype;
    s.unit = spec.one_unit ? 0 : static_cast<int>(i / 2);
    s.group = spec.group_of ? spec.group_of(i) : 0;
    s.trainable = !(spec.frozen && spec.frozen(i));
    specs.push_back(s);
  }
  const auto micro = static_cast<std::size_t>(*cfg.train_micro_batch_size_per_gpu);
  const int gas = static_cast<int>(*cfg.gradient_accumulation_steps);
  TrainResult result;
  result.memory.resize(static_cast<std::size_t>(spec.world));
  result.rank_params.resize(static_cast<std::size_t>(spec.world));
  result.timings.resize(static_cast<std::size_t>(spec.world));
  result.traffic.resize(static_cast<std::size_t>(spec.world));
  std::mutex mu;
  const TeacherStudentData data(shape, spec.seed);
  run_ranks(spec.world, [&](Communicator& base_comm) {
    Communicator& comm = spec.wrap_comm ? spec.wrap_comm(base_comm.rank(), base_comm) : base_comm;
    const int r = comm.rank();
    DeviceOptions device_options;
    device_options.device_budget_bytes = spec.device_budget;
    std::unique_ptr<Device> device = spec.device_factory
                                         ? spec.device_factory(r, device_options)
                                         : make_device(spec.device, r, device_options);
    EngineOptions options;
    options.groups = spec.groups;
    options.kernel_threads = 1;
    std::unique_ptr<Communicator> gpu_comm, wrapped;
    Communicator* engine_comm = &comm;
    if (device->gpu_ordinal() >= 0 || spec.device_comm) {
      gpu_comm = make_gpu_communicator(comm, *device);
      options.control_comm = &comm;
      if (spec.wrap_device_comm) wrapped = spec.wrap_device_comm(r, *gpu_comm, *device, comm);
      engine_comm = wrapped ? wrapped.get() : gpu_comm.get();
    }
    // Engine memory as host bytes (a copy on a GPU).
    auto host_bytes = [&](std::span<const std::byte> engine_bytes) {
      std::vector<std::byte> out(engine_bytes.size());
      if (!out.empty()) device->copy(out.data(), engine_bytes.data(), out.size());
      return out;
    };
    std::vector<std::byte> grad_bytes;
    auto engine = Engine::create(
        cfg, *engine_comm, *device, specs,
        [&](std::size_t i, std::span<float> out) { init_param(shape, i, spec.seed, 0, out); },
        options);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      std::vector<float> v = engine->gather_master(i);
      if (r != 0) continue;
      result.names.push_back(specs[i].name);
      result.initial.push_back(std::move(v));
    }
    std::vector<std::vector<float>> weights(specs.size()), grads(specs.size());
    for (std::size_t i = 0; i < specs.size(); ++i) grads[i].resize(mp[i].numel());
    int first_step = 0;
    if (!spec.load_dir.empty()) {
      engine->load_checkpoint(spec.load_dir);
      first_step = static_cast<int>(engine->global_steps());
    }
    auto gather = [&](int u) {
      if (spec.gather_on_stream) {
        engine->gather_on_stream(u, nullptr);
      } else {
        engine->gather(u);
      }
    };
    for (int t = first_step; t < spec.steps; ++t) {
      double loss_sum = 0;
      for (int k = 0; k < gas; ++k) {
        for (std::size_t u = 0; u < engine->num_units(); ++u) gather(static_cast<int>(u));
        for (std::size_t i = 0; i < specs.size(); ++i)
          weights[i] = to_f32(host_bytes(engine->param(i)), dtype);
        if (spec.regather) {
          for (std::size_t u = engine->num_units(); u-- > 0;) engine->release(static_cast<int>(u));
          for (std::size_t u = 0; u < engine->num_units(); ++u) gather(static_cast<int>(u));
          for (std::size_t i = 0; i < specs.size(); ++i)
            weights[i] = to_f32(host_bytes(engine->param(i)), dtype);
        }
        const std::uint64_t first = static_cast<std::uint64_t>(r) * micro * gas + k * micro;
        const Batch batch = data.batch(static_cast<std::uint64_t>(t), first, micro);
        std::vector<std::span<const float>> w(weights.begin(), weights.end());
        std::vector<std::span<float>> g(grads.begin(), grads.end());
        loss_sum +=
            forward_backward(shape, w, batch, static_cast<float>(engine->backward_scale()), g);
        for (std::size_t u = engine->num_units(); u-- > 0;) engine->release(static_cast<int>(u));
        for (std::size_t i = specs.size(); i-- > 0;) {
          if (!specs[i].trainable) continue;
          if (spec.corrupt) spec.corrupt(r, t, k, i, grads[i]);
          std::span<std::byte> slot = engine->grad(i);
          grad_bytes.resize(slot.size());
          kernels::cast_cpu(grads[i].data(), DType::F32, grad_bytes.data(), dtype, grads[i].size());
          if (!slot.empty()) device->copy(slot.data(), grad_bytes.data(), slot.size());
          engine->grad_ready(i);
        }
        const StepResult sr = engine->step();
        if (r == 0 && sr.boundary) {
          result.steps.push_back(sr);
          result.losses.push_back(loss_sum / gas);
        }
      }
      if (t + 1 == spec.save_after) {
        engine->save_checkpoint(spec.save_dir, "step" + std::to_string(t + 1),
                                {{"next_step", t + 1}});
      }
    }
    std::vector<std::vector<float>> final_params;
    for (std::size_t i = 0; i < specs.size(); ++i) final_params.push_back(engine->gather_master(i));
    std::lock_guard<std::mutex> lock(mu);
    result.memory[static_cast<std::size_t>(r)] = engine->memory();
    result.timings[static_cast<std::size_t>(r)] = engine->timings();
    if (const auto* nodes = dynamic_cast<const HierarchicalComm*>(engine_comm))
      result.traffic[static_cast<std::size_t>(r)] = nodes->traffic();
    result.rank_params[static_cast<std::size_t>(r)] = final_params;
    if (r == 0) result.params = std::move(final_params);
  });
  return result;
}

// The step tests' model: layers of 256x256 (units 0 and 1 are lone units at up to 4 ranks, unit 2
// goes through the buckets), the biases in a param group of their own without weight decay (a
// run that starts inside a norm block).
inline void use_two_group_mlp(TrainSpec& spec) {
  spec.model = "mlp:256,256,256,4";
  spec.groups = {{}, {std::nullopt, 0.0}};
  spec.group_of = [](std::size_t i) { return static_cast<int>(i % 2); };
}

// train() of `config` on `world` ranks of `device` for `steps` optimizer steps, saving after step
// `save_after` into `save_dir`, or resuming from `load_dir`'s latest checkpoint.
inline TrainResult train_run(const nlohmann::json& config, int world, int steps,
                             const std::string& save_dir = {}, int save_after = -1,
                             const std::string& load_dir = {}, const std::string& device = "cpu") {
  TrainSpec spec;
  spec.config = config;
  spec.world = world;
  spec.steps = steps;
  spec.save_dir = save_dir;
  spec.save_after = save_after;
  spec.load_dir = load_dir;
  spec.device = device;
  return train(spec);
}

// train() with only a config, a world size, a step count and a model.
inline TrainResult train_config(const nlohmann::json& config, int world, int steps,
                                const std::string& model = TrainSpec{}.model) {
  TrainSpec spec;
  spec.config = config;
  spec.world = world;
  spec.steps = steps;
  spec.model = model;
  return train(spec);
}

// Bitwise equality of two runs' final parameters, with a guard against a vacuous pass (the
// parameters moved away from their initial values).
inline void require_bitwise_equal(const TrainResult& a, const TrainResult& b) {
  REQUIRE(a.params.size() == b.params.size());
  REQUIRE(!a.params.empty());
  std::size_t moved = 0;
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    REQUIRE(a.params[i].size() == b.params[i].size());
    INFO("parameter " << a.names[i]);
    REQUIRE(std::memcmp(a.params[i].data(), b.params[i].data(),
                        a.params[i].size() * sizeof(float)) == 0);
    for (std::size_t j = 0; j < a.params[i].size(); ++j) moved += a.params[i][j] != a.initial[i][j];
  }
  REQUIRE(moved > 0);
}

// Every step's gradient norm, bitwise, and positive (not a vacuous pass).
inline void require_same_norms(const TrainResult& a, const TrainResult& b) {
  REQUIRE(!b.steps.empty());
  REQUIRE(b.steps.size() == a.steps.size());
  for (std::size_t i = 0; i < b.steps.size(); ++i) {
    INFO("step " << i);
    REQUIRE(b.steps[i].grad_norm > 0.0);
    REQUIRE(std::memcmp(&b.steps[i].grad_norm, &a.steps[i].grad_norm, sizeof(double)) == 0);
  }
}

// A count every rank's timings hold (units_fused, units_stepped_in_backward, ...): the ranks
// agree on it, and it is returned.
inline std::int64_t agreed_count(const TrainResult& r, std::int64_t EngineTimings::*count) {
  REQUIRE(!r.timings.empty());
  const std::int64_t n = r.timings[0].*count;
  for (const EngineTimings& t : r.timings) REQUIRE(t.*count == n);
  return n;
}

// Largest |a − b| over every element.
inline double max_abs_diff(const std::vector<std::vector<float>>& a,
                           const std::vector<std::vector<float>>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    for (std::size_t j = 0; j < a[i].size(); ++j) {
      m = std::max(m, std::fabs(static_cast<double>(a[i][j]) - b[i][j]));
    }
  }
  return m;
}

}  // namespace zero::test
