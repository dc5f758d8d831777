// The engine, stages 0–3, on in-process ranks: stages against each other (bitwise), against a
// single-rank reference optimizer fed the mean gradient, the loss scaler against DeepSpeed's own
// sequences, the memory ledger against the ZeRO formulas, and misuse.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "kernels/optimizer.h"
#include "tests/zero/engine/engine_test_util.h"
#include "zero/base/error.h"
#include "zero/comm/testing/faulty_communicator.h"
#include "zero/estimate/estimate.h"
#include "zero/schedule/from_config.h"

namespace zero::test {
namespace {

using nlohmann::json;

// fp32 training against the fp64-free reference: only summation order differs.
constexpr double kTolFp32 = 1e-5;
// 16-bit model copies: the reference trains in fp32 on unrounded weights, and the engine
// accumulates gradients in the model dtype (as DeepSpeed does), so an element whose gradient is
// near zero can take an Adam step (about lr = 3e-3) in the other direction. Bound: under two
// such steps for bf16 (8-bit mantissa), a sixth of one for fp16.
constexpr double kTolBf16 = 5e-3;
constexpr double kTolFp16 = 5e-4;

// The reference: one process, full fp32 arrays, the whole global batch at once (the mean
// gradient), clipping by the global norm and the optimizer kernel on whole tensors.
std::vector<std::vector<float>> reference_fp32(const json& config, int world, int steps,
                                               std::uint64_t seed, const std::string& model) {
  using namespace zero::models;
  const MlpShape shape = MlpShape::parse(model);
  const auto mp = mlp_params(shape);
  config::Supplied supplied;
  supplied.world_size = world;
  const config::DsConfig cfg = config::load_config_json(config, supplied);
  const auto micro = static_cast<std::size_t>(*cfg.train_micro_batch_size_per_gpu);
  const auto gas = static_cast<std::size_t>(*cfg.gradient_accumulation_steps);
  const std::size_t rows = micro * gas * static_cast<std::size_t>(world);
  const TeacherStudentData data(shape, seed);
  std::vector<std::vector<float>> p(mp.size()), m(mp.size()), v(mp.size()), g(mp.size());
  for (std::size_t i = 0; i < mp.size(); ++i) {
    p[i].resize(mp[i].numel());
    init_param(shape, i, seed, 0, p[i]);
    m[i].assign(p[i].size(), 0.0f);
    v[i].assign(p[i].size(), 0.0f);
    g[i].assign(p[i].size(), 0.0f);
  }
  const LrScheduleParams sched = lr_schedule_from_config(cfg);
  kernels::OptimizerHyper h;
  h.kind = kernels::OptimizerKind::AdamW;
  h.weight_decay = cfg.optimizer->weight_decay;
  for (int t = 0; t < steps; ++t) {
    const Batch batch = data.batch(static_cast<std::uint64_t>(t), 0, rows);
    std::vector<std::span<const float>> w(p.begin(), p.end());
    std::vector<std::span<float>> gs(g.begin(), g.end());
    forward_backward(shape, w, batch, 1.0f, gs);
    double sumsq = 0;
    for (const auto& gi : g) {
      for (float x : gi) sumsq += static_cast<double>(x) * x;
    }
    const double norm = std::sqrt(sumsq);
    const double clip = cfg.gradient_clipping;
    const double coef = clip > 0 ? std::max(1.0, (norm + 1e-6) / clip) : 1.0;
    const double lr = scheduled_values(sched, {cfg.optimizer->lr, std::nullopt}, 0, t - 1).lr;
    for (std::size_t i = 0; i < p.size(); ++i) {
      kernels::OptimizerTensors ts;
      ts.master = p[i].data();
      ts.grad = g[i].data();
      ts.state0 = m[i].data();
      ts.state1 = v[i].data();
      ts.numel = p[i].size();
      kernels::optimizer_step_cpu(h, {lr, t + 1, 1.0 / coef}, ts, {1, kernels::Isa::Auto});
    }
  }
  return p;
}

TrainResult run(const json& config, int world, int steps = 5) {
  return train_config(config, world, steps);
}

TEST_CASE("stages 0-3 give bitwise identical parameters with accumulation 1", "[engine]") {
  for (const std::string precision : {"fp32", "bf16"}) {
    for (int world : {2, 3, 4, 8}) {
      INFO(precision << ", " << world << " ranks");
      const TrainResult s0 = run(base_config(0, precision, 1), world);
      for (int stage = 1; stage <= 3; ++stage) {
        INFO("stage " << stage << " vs stage 0");
        require_bitwise_equal(s0, run(base_config(stage, precision, 1), world));
      }
    }
  }
}

TEST_CASE("stages 0-3 give bitwise identical parameters with accumulation 2 and 3", "[engine]") {
  // Every stage sums a window as micro-steps of rank sums; a stage that summed a rank's
  // micro-steps first (DeepSpeed's stages 0/1) would round differently.
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    for (int gas : {2, 3}) {
      for (int world : {2, 3, 4}) {
        INFO(precision << ", accumulation " << gas << ", " << world << " ranks");
        const TrainResult s0 = run(base_config(0, precision, gas), world);
        REQUIRE(max_abs_diff(s0.params, s0.initial) > 1e-3);  // the run is not a no-op
        for (int stage = 1; stage <= 3; ++stage) {
          INFO("stage " << stage << " vs stage 0");
          require_bitwise_equal(s0, run(base_config(stage, precision, gas), world));
        }
      }
    }
  }
}

TEST_CASE("stage 3 gathered for a framework's stream trains as with gather()", "[engine]") {
  // On the host gather_on_stream(null) waits as gather() does (the GPU form: engine_gpu_test).
  TrainSpec spec;
  spec.config = base_config(3, "fp32", 2);
  spec.world = 2;
  spec.steps = 3;
  const TrainResult plain = train(spec);
  REQUIRE(max_abs_diff(plain.params, plain.initial) > 1e-3);
  spec.gather_on_stream = true;
  require_bitwise_equal(plain, train(spec));
}

TEST_CASE("every stage matches a single-rank reference optimizer fed the mean gradient",
          "[engine]") {
  const std::string model = "mlp:8,24,16,4";
  for (int gas : {1, 3}) {
    for (double clip : {1.0, 0.0}) {
      json c = base_config(0, "fp32", gas);
      c["gradient_clipping"] = clip;
      const auto ref = reference_fp32(c, 4, 5, 7, model);
      for (int stage = 0; stage <= 3; ++stage) {
        for (int world : {1, 2, 4}) {
          INFO("fp32 stage " << stage << ", " << world << " ranks, accumulation " << gas
                             << ", clipping " << clip);
          c["zero_optimization"]["stage"] = stage;
          json cw = c;
          // The same global batch at every world size.
          cw["train_micro_batch_size_per_gpu"] = 16 / world;
          const TrainResult r = run(cw, world);
          const auto ref_w = reference_fp32(cw, world, 5, 7, model);
          REQUIRE(max_abs_diff(ref_w, r.initial) > 1e-3);  // the run is not a no-op
          CHECK(max_abs_diff(r.params, ref_w) < kTolFp32);
          CHECK(max_abs_diff(r.params, ref) < kTolFp32);
        }
      }
    }
  }
  for (const std::string precision : {"bf16", "fp16"}) {
    for (int gas : {1, 3}) {
      json c = base_config(2, precision, gas, 16);
      const auto ref = reference_fp32(c, 1, 5, 7, model);
      for (int stage = 0; stage <= 3; ++stage) {
        c["zero_optimization"]["stage"] = stage;
        json cw = c;
        cw["train_micro_batch_size_per_gpu"] = 4;
        const TrainResult r = run(cw, 4);
        INFO(precision << " stage " << stage << ", accumulation " << gas);
        CHECK(max_abs_diff(r.params, ref) < (precision == "bf16" ? kTolBf16 : kTolFp16));
        CHECK(max_abs_diff(r.params, r.initial) > 1e-3);
      }
    }
  }
}

TEST_CASE(
    "every optimizer and reduction option keeps the stages bitwise equal and close to one "
    "rank",
    "[engine]") {
  struct Variant {
    std::string name;
    std::string precision;
    int gas;
    std::function<void(json&)> edit;
    double tol;  // against the same config on one rank with the whole batch
  };
  const std::vector<Variant> variants = {
      {"Adam with L2 decay (adam_w_mode false)", "fp32", 1,
       [](json& c) {
         c["optimizer"] = {
             {"type", "Adam"},
             {"params", {{"lr", 0.003}, {"weight_decay", 0.01}, {"adam_w_mode", false}}}};
       },
       kTolFp32},
      {"Adagrad", "fp32", 1,
       [](json& c) {
         c["optimizer"] = {{"type", "Adagrad"},
                           {"params", {{"lr", 0.01}, {"weight_decay", 0.001}}}};
       },
       kTolFp32},
      {"Lion", "bf16", 1,
       [](json& c) {
         c["optimizer"] = {{"type", "Lion"}, {"params", {{"lr", 0.0003}, {"weight_decay", 0.01}}}};
       },
       4 * 0.0003 * 5},  // sign updates: an element may step the other way every step
      {"SGD with Nesterov momentum", "fp32", 3,
       [](json& c) {
         c["optimizer"] = {{"type", "SGD"},
                           {"params", {{"lr", 0.05}, {"momentum", 0.9}, {"nesterov", true}}}};
         c["zero_allow_untested_optimizer"] = true;  // DeepSpeed's rule for torch optimizers
       },
       kTolFp32},
      {"bf16 model, fp32 communication and accumulation", "bf16", 3,
       [](json& c) {
         c["communication_data_type"] = "fp32";
         c["data_types"] = {{"grad_accum_dtype", "fp32"}};
       },
       kTolBf16},
      // DeepSpeed allows these only with reduce_scatter off at stage 2 (SPEC §3.9).
      {"prescale_gradients", "fp32", 1,
       [](json& c) {
         c["prescale_gradients"] = true;
         c["zero_optimization"]["reduce_scatter"] = false;
       },
       kTolFp32},
      {"gradient_predivide_factor 4", "fp32", 1,
       [](json& c) {
         c["gradient_predivide_factor"] = 4.0;
         c["zero_optimization"]["reduce_scatter"] = false;
       },
       kTolFp32},
      {"reduce_scatter false (all-reduce)", "bf16", 1,
       [](json& c) { c["zero_optimization"]["reduce_scatter"] = false; }, kTolBf16},
      {"fp16 with a static loss scale", "fp16", 1,
       [](json& c) {
         c["fp16"] = {{"enabled", true}, {"loss_scale", 256}};
       },
       kTolFp16},
      {"no overlap, one bucket per unit", "fp32", 3,
       [](json& c) {
         c["zero_optimization"]["overlap_comm"] = false;
         c["zero_optimization"]["reduce_bucket_size"] = 100000;
       },
       kTolFp32},
      {"WarmupDecayLR, no clipping", "fp32", 1,
       [](json& c) {
         c["gradient_clipping"] = 0.0;
         c["scheduler"] = {
             {"type", "WarmupDecayLR"},
             {"params",
              {{"warmup_max_lr", 0.003}, {"warmup_num_steps", 2}, {"total_num_steps", 6}}}};
       },
       kTolFp32},
  };
  for (const Variant& v : variants) {
    INFO(v.name);
    std::vector<TrainResult> runs;
    for (int stage = 0; stage <= 3; ++stage) {
      json c = base_config(stage, v.precision, v.gas);
      v.edit(c);
      runs.push_back(run(c, 3));
    }
    if (v.gas == 1) {
      for (int stage = 1; stage <= 3; ++stage)
        require_bitwise_equal(runs[0], runs[static_cast<std::size_t>(stage)]);
    } else {
      require_bitwise_equal(runs[0], runs[1]);
      require_bitwise_equal(runs[2], runs[3]);
    }
    json one = base_config(2, v.precision, v.gas, 12);
    v.edit(one);
    const TrainResult single = run(one, 1);
    CHECK(max_abs_diff(runs[0].params, runs[0].initial) > 1e-3);
    CHECK(max_abs_diff(runs[0].params, single.params) < v.tol);
    CHECK(max_abs_diff(runs[2].params, single.params) < v.tol);
  }
}

TEST_CASE("bf16 master weights keep 2 bytes per parameter and train like fp32 masters, loosely",
          "[engine]") {
  json low = base_config(2, "bf16", 1);
  low["bf16"]["bf16_master_weights_and_grads"] = true;
  json low_states = low;
  low_states["bf16"]["bf16_optimizer_states"] = true;
  const TrainResult fp32_master = run(base_config(2, "bf16", 1), 2);
  const TrainResult bf16_master = run(low, 2);
  const TrainResult bf16_all = run(low_states, 2);
  auto bytes = [](const TrainResult& r, MemoryTag tag) {
    return r.memory[0].at(MemoryKind::Device, tag).current_bytes;
  };
  CHECK(2 * bytes(bf16_master, MemoryTag::MasterParams) ==
        bytes(fp32_master, MemoryTag::MasterParams));
  CHECK(bytes(bf16_master, MemoryTag::OptimizerStates) ==
        bytes(fp32_master, MemoryTag::OptimizerStates));
  CHECK(2 * bytes(bf16_all, MemoryTag::OptimizerStates) ==
        bytes(fp32_master, MemoryTag::OptimizerStates));
  // Master values are bf16-representable.
  for (const auto& v : bf16_master.params) {
    for (float x : v) {
      std::uint32_t bits;
      std::memcpy(&bits, &x, 4);
      REQUIRE((bits & 0xffffu) == 0);
    }
  }
  CHECK(max_abs_diff(bf16_master.params, fp32_master.params) > 0);  // not the same run
  CHECK(max_abs_diff(bf16_master.params, fp32_master.params) < kTolBf16);
  CHECK(max_abs_diff(bf16_all.params, fp32_master.params) < kTolBf16);
  // Stages 1-3 (DeepSpeed needs ZeRO for this mode) agree bitwise.
  for (int stage : {1, 3}) {
    json other = low_states;
    other["zero_optimization"]["stage"] = stage;
    require_bitwise_equal(bf16_all, run(other, 2));
  }
}

TEST_CASE(
    "CPU offload of optimizer states and stage-3 parameters changes where memory is, not "
    "the result",
    "[engine]") {
  for (int stage = 1; stage <= 3; ++stage) {
    INFO("stage " << stage);
    const json plain = base_config(stage, "bf16", 1);
    json offload = plain;
    offload["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
    if (stage == 3)
      offload["zero_optimization"]["offload_param"] = {{"device", "cpu"}, {"pin_memory", false}};
    const TrainResult a = run(plain, 3);
    const TrainResult b = run(offload, 3);
    require_bitwise_equal(a, b);
    for (const MemorySnapshot& m : b.memory) {
      CHECK(m.at(MemoryKind::Device, MemoryTag::MasterParams).current_bytes == 0);
      CHECK(m.at(MemoryKind::PinnedHost, MemoryTag::MasterParams).current_bytes ==
            a.memory[0].at(MemoryKind::Device, MemoryTag::MasterParams).current_bytes);
      CHECK(m.at(MemoryKind::PinnedHost, MemoryTag::OptimizerStates).current_bytes > 0);
      if (stage == 3)
        CHECK(m.at(MemoryKind::Host, MemoryTag::LowPrecisionParams).current_bytes > 0);
    }
  }
}

TEST_CASE("param groups override lr and weight decay, frozen parameters never change", "[engine]") {
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage);
    auto spec_for = [&](int s) {
      TrainSpec spec;
      spec.config = base_config(s, "fp32", 1);
      spec.world = 3;
      spec.groups = {{}, {0.01, 0.0}};
      spec.group_of = [](std::size_t i) { return static_cast<int>(i % 2); };  // biases: group 1
      spec.frozen = [](std::size_t i) { return i == 2; };                     // layers.1.weight
      return spec;
    };
    const TrainResult r = train(spec_for(stage));
    REQUIRE(r.params[2] == r.initial[2]);
    REQUIRE(r.params[3] != r.initial[3]);
    if (stage > 0) require_bitwise_equal(train(spec_for(0)), r);
    // A group-1 lr of 0.01 moves biases further than group 0's 0.003 would.
    TrainSpec plain = spec_for(stage);
    plain.groups = {{}, {}};
    const TrainResult p = train(plain);
    CHECK(max_abs_diff({r.params[1]}, {r.initial[1]}) >
          max_abs_diff({p.params[1]}, {p.initial[1]}));
  }
}

TEST_CASE(
    "an fp16 overflow on one rank skips the step everywhere, and the scale follows "
    "DeepSpeed's sequence",
    "[engine]") {
  std::ifstream in(ZERO_TEST_GOLDEN_DIR "/deepspeed/loss_scale.json");
  REQUIRE(in.good());
  const json golden = json::parse(in);
  REQUIRE(!golden["cases"].empty());
  for (const json& c : golden["cases"]) {
    const json& p = c["params"];
    const std::string bits = p["overflows"];
    INFO("overflows " << bits);
    for (int stage : {1, 3}) {
      json cfg = base_config(stage, "fp16", 1);
      cfg["fp16"] = {
          {"enabled", true},
          {"loss_scale", 0},
          {"initial_scale_power", static_cast<int>(std::log2(p["init_scale"].get<double>()))},
          {"loss_scale_window", p["scale_window"]},
          {"min_loss_scale", p["min_scale"]},
          {"hysteresis", p["delayed_shift"]},
          {"consecutive_hysteresis", p["consecutive_hysteresis"]}};
      TrainSpec spec;
      spec.config = cfg;
      spec.world = 2;
      spec.steps = static_cast<int>(bits.size());
      spec.model = "mlp:4,8,2";
      spec.corrupt = [&](int rank, int t, int, std::size_t param, std::vector<float>& g) {
        if (rank == 1 && param == 0 && bits[static_cast<std::size_t>(t)] == '1') {
          g[0] = std::numeric_limits<float>::infinity();
        }
      };
      const TrainResult r = train(spec);
      REQUIRE(r.steps.size() == bits.size());
      std::int64_t skipped = 0;
      for (std::size_t t = 0; t < bits.size(); ++t) {
        INFO("step " << t);
        CHECK(r.steps[t].loss_scale == c["sequence"][t]["scale_before"].get<double>());
        CHECK(r.steps[t].skipped == (bits[t] == '1'));
        skipped += bits[t] == '1';
      }
      REQUIRE(skipped > 0);
      CHECK(r.steps.back().skipped_steps == skipped);
      for (const auto& v : r.params) {
        for (float x : v) REQUIRE(std::isfinite(x));
      }
    }
  }
}

TEST_CASE("the memory ledger matches the ZeRO formulas within padding and bucket sizes",
          "[engine]") {
  const std::string model = "mlp:64,256,256,16";
  const std::uint64_t psi = 64 * 256 + 256 + 256 * 256 + 256 + 256 * 16 + 16;
  const int world = 4;
  for (int stage = 0; stage <= 3; ++stage) {
    TrainSpec spec;
    spec.config = base_config(stage, "bf16", 1);
    spec.config["zero_optimization"]["reduce_bucket_size"] = 4096;
    // Nothing persistent: stage 3 holds only its slices between gathers.
    spec.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
    spec.world = world;
    spec.steps = 2;
    spec.model = model;
    const TrainResult r = train(spec);
    EstimateInput in;
    in.params = psi;
    in.largest_param = 256 * 256;
    in.world_size = world;
    in.stage = stage;
    in.precision = Precision::Bf16;
    const EstimateResult e = estimate_model_states(in);
    // Padding: each unit rounds up to world × 16 elements (3 units); buckets: 2 × (W + 1) × 4096
    // bf16 elements.
    const double pad_elems = 3.0 * world * 16;
    const double bucket_bytes = 2.0 * (world + 1) * 4096 * 2;
    for (const MemorySnapshot& m : r.memory) {
      INFO("stage " << stage << ", rank " << m.rank);
      auto peak = [&](MemoryTag tag) {
        return static_cast<double>(m.at(MemoryKind::Device, tag).peak_bytes);
      };
      auto now = [&](MemoryTag tag) {
        return static_cast<double>(m.at(MemoryKind::Device, tag).current_bytes);
      };
      REQUIRE(e.fp32_master.device > 0);
      CHECK(std::fabs(now(MemoryTag::MasterParams) - e.fp32_master.device) <= 4 * pad_elems);
      CHECK(std::fabs(now(MemoryTag::OptimizerStates) - e.optimizer_states.device) <=
            8 * pad_elems);
      CHECK(std::fabs(now(MemoryTag::LowPrecisionParams) - e.lp_params.device) <= 2 * pad_elems);
      // Gradients: the resident ones match the formula, but at stage 1, which reduces every
      // micro-step as stage 2 does (one summation order at every stage) and so keeps only the
      // reduced partition, not the paper's full local gradients; the peak adds the micro-step's
      // staging of units not yet reduced (at most the whole model).
      const double resident = stage == 1 ? 2.0 * psi / world : e.gradients.device;
      CHECK(std::fabs(now(MemoryTag::Gradients) - resident) <= 3 * pad_elems);
      CHECK(peak(MemoryTag::Gradients) <= resident + 2.0 * psi + 3 * pad_elems);
      CHECK(peak(MemoryTag::Buckets) <= bucket_bytes);
      if (stage == 3) CHECK(peak(MemoryTag::GatherBuffers) <= 2.0 * psi + 2 * pad_elems);
    }
  }
}

TEST_CASE(
    "a failed collective inside step() leaves master weights, scaler and schedule as "
    "they were",
    "[engine]") {
  const std::vector<ParamSpec> specs = {{"w", {64}, DType::F16, 0, 0, true},
                                        {"b", {8}, DType::F16, 0, 1, true}};
  auto init = [](std::size_t i, std::span<float> out) {
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = 0.01f * static_cast<float>(j + i);
  };
  config::Supplied supplied;
  supplied.world_size = 2;
  const config::DsConfig cfg = config::load_config_json(base_config(2, "fp16", 1), supplied);
  // One rank's micro-step: gradients that depend on the step and the rank.
  auto micro_step = [](Engine& e, int t) {
    for (std::size_t i = 2; i-- > 0;) {
      std::span<std::byte> slot = e.grad(i);
      std::vector<float> g(slot.size() / 2);
      for (std::size_t j = 0; j < g.size(); ++j) {
        g[j] = static_cast<float>(e.backward_scale() * 1e-3 * (1.0 + j + t + e.rank()));
      }
      kernels::cast_cpu(g.data(), DType::F32, slot.data(), DType::F16, g.size());
      e.grad_ready(i);
    }
  };
  // fail_call 0: a clean run that reports the call count before and after step 2's step().
  // Catch2 assertions are not thread-safe: ranks record what they saw, the test thread checks.
  struct Seen {
    bool threw_comm_error = false;
    bool state_kept = false;
  };
  auto run_with = [&](std::size_t fail_call, std::size_t* before_step2, std::size_t* after_step2) {
    std::vector<Seen> seen(2);
    run_ranks(2, [&](Communicator& inner) {
      FaultyCommunicator comm(inner, fail_call);
      auto device = make_device("cpu", comm.rank());
      auto engine = Engine::create(cfg, comm, *device, specs, init);
      micro_step(*engine, 0);
      engine->step();
      std::vector<std::vector<float>> before;
      for (std::size_t i = 0; i < 2; ++i) before.push_back(engine->gather_master(i));
      const double scale = engine->loss_scale();
      const double lr = engine->current_lr();
      micro_step(*engine, 1);
      if (comm.rank() == 0 && before_step2) *before_step2 = comm.calls();
      if (fail_call == 0) {
        engine->step();
        if (comm.rank() == 0 && after_step2) *after_step2 = comm.calls();
        return;
      }
      Seen& s = seen[static_cast<std::size_t>(comm.rank())];
      try {
        engine->step();
      } catch (const CommError&) {
        s.threw_comm_error = true;
      }
      s.state_kept = engine->global_steps() == 1 && engine->loss_scale() == scale &&
                     engine->current_lr() == lr;
      for (std::size_t i = 0; i < 2; ++i)
        s.state_kept = s.state_kept && engine->gather_master(i) == before[i];
    });
    if (fail_call == 0) return;
    for (const Seen& s : seen) {
      CHECK(s.threw_comm_error);
      CHECK(s.state_kept);
    }
  };
  std::size_t before = 0, after = 0;
  run_with(0, &before, &after);
  // step() of stage 2: the last bucket's reduce-scatter, the overflow vote, the norm, then one
  // all-gather per unit (2) once the update is committed.
  REQUIRE(after - before == 5);
  for (std::size_t call = before + 1; call <= before + 3; ++call) {
    INFO("failing call " << call);
    run_with(call, nullptr, nullptr);
  }
}

TEST_CASE("misuse is an error that says what and where", "[engine]") {
  const config::DsConfig cfg = [] {
    config::Supplied s;
    s.world_size = 1;
    json c = base_config(3, "fp32", 1);
    c["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
    return config::load_config_json(c, s);
  }();
  std::vector<ParamSpec> specs = {{"a", {4, 3}, DType::F32, 0, 0, true},
                                  {"b", {3}, DType::F32, 0, 1, true},
                                  {"c", {2}, DType::F32, 0, 1, false}};
  auto init = [](std::size_t, std::span<float> out) { std::fill(out.begin(), out.end(), 0.5f); };
  run_ranks(1, [&](Communicator& comm) {
    auto device = make_device("cpu", 0);
    auto engine = Engine::create(cfg, comm, *device, specs, init);
    REQUIRE_THROWS_WITH(engine->gather(7), Catch::Contains("unknown unit 7"));
    REQUIRE_THROWS_WITH(engine->param(0),
                        Catch::Contains("'a'") && Catch::Contains("not gathered"));
    REQUIRE_THROWS_WITH(engine->release(0), Catch::Contains("release without gather"));
    REQUIRE_THROWS_WITH(engine->param(9), Catch::Contains("unknown parameter id 9"));
    engine->gather(0);
    REQUIRE(engine->param(0).size() == 12 * sizeof(float));
    engine->release(0);
    // A host engine has no streams: gather_on_stream takes null only, and then is gather().
    int stream_token = 0;
    REQUIRE_THROWS_WITH(engine->gather_on_stream(0, &stream_token),
                        Catch::Contains("no native streams") && Catch::Contains("cpu"));
    REQUIRE_THROWS_WITH(engine->gather_on_stream(7, nullptr), Catch::Contains("unknown unit 7"));
    engine->gather_on_stream(0, nullptr);
    REQUIRE(engine->param(0).size() == 12 * sizeof(float));
    engine->release(0);
    REQUIRE_THROWS_WITH(engine->grad(2), Catch::Contains("'c' is frozen"));
    REQUIRE_THROWS_WITH(engine->grad_ready(0), Catch::Contains("call grad(0) first"));
    engine->grad(0);
    engine->grad_ready(0);
    REQUIRE_THROWS_WITH(engine->grad_ready(0), Catch::Contains("ready twice"));
    // "b" has no gradient: ignore_unused_parameters (default true) counts it as zero.
    const StepResult r = engine->step();
    REQUIRE(r.boundary);
    REQUIRE(engine->global_steps() == 1);
  });
  // ignore_unused_parameters: false names the parameter without a gradient.
  json strict = base_config(2, "fp32", 1);
  strict["zero_optimization"]["ignore_unused_parameters"] = false;
  run_ranks(1, [&](Communicator& comm) {
    config::Supplied s;
    s.world_size = 1;
    auto device = make_device("cpu", 0);
    auto engine = Engine::create(config::load_config_json(strict, s), comm, *device, specs, init);
    engine->grad(0);
    engine->grad_ready(0);
    REQUIRE_THROWS_WITH(engine->step(),
                        Catch::Contains("b") && Catch::Contains("ignore_unused_parameters"));
  });
  // A dtype other than the config's, duplicate names.
  run_ranks(1, [&](Communicator& comm) {
    auto device = make_device("cpu", 0);
    std::vector<ParamSpec> bad = specs;
    bad[1].dtype = DType::BF16;
    REQUIRE_THROWS_WITH(Engine::create(cfg, comm, *device, bad, init),
                        Catch::Contains("'b' has dtype bf16") && Catch::Contains("fp32"));
    bad = specs;
    bad[1].name = std::string(specs[0].name);
    REQUIRE_THROWS_WITH(Engine::create(cfg, comm, *device, bad, init),
                        Catch::Contains("'a' is registered twice"));
  });
  // Ranks that register different parameters fail at create() instead of hanging; a config
  // resolved for another world size is refused. (Ranks record messages; the test thread checks.)
  std::vector<std::string> messages(2);
  auto expect_create_failure = [&](const config::DsConfig& c, bool differ) {
    messages.assign(2, "");
    try {
      run_ranks(2, [&](Communicator& comm) {
        auto device = make_device("cpu", comm.rank());
        std::vector<ParamSpec> mine = specs;
        if (differ && comm.rank() == 1) mine[0].shape = {4, 4};
        try {
          Engine::create(c, comm, *device, mine, init);
        } catch (const std::exception& e) {
          messages[static_cast<std::size_t>(comm.rank())] = e.what();
          throw;
        }
      });
    } catch (const std::exception&) {
    }
  };
  config::Supplied two;
  two.world_size = 2;
  expect_create_failure(config::load_config_json(base_config(2, "fp32", 1), two), true);
  for (const std::string& m : messages) CHECK_THAT(m, Catch::Contains("parameter specs"));
  expect_create_failure(cfg, false);
  for (const std::string& m : messages) {
    CHECK_THAT(m, Catch::Contains("resolves to 1 ranks but the communicator has 2"));
  }
}

}  // namespace
}  // namespace zero::test
