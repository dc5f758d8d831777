// The optimizer step taken during backward (Engine::set_step_in_backward): the bits of the step
// after backward at every stage, precision and accumulation, how many units it takes, and what a
// caller may still do once a step has begun in backward.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>

#include "tests/zero/engine/engine_test_util.h"
#include "zero/base/error.h"

namespace zero::test {
namespace {

using nlohmann::json;

// Every rank's count of units stepped in backward; they agree.
std::int64_t stepped_in_backward(const TrainResult& r) {
  return agreed_count(r, &EngineTimings::units_stepped_in_backward);
}

// Runs `spec` with ZERO_STEP_IN_BACKWARD=0 in the environment (the engine reads it once built).
TrainResult train_after_backward(const TrainSpec& spec) {
  REQUIRE(::setenv("ZERO_STEP_IN_BACKWARD", "0", 1) == 0);
  TrainResult r = train(spec);
  ::unsetenv("ZERO_STEP_IN_BACKWARD");
  return r;
}

TEST_CASE("the step taken during backward gives the bits of the step after it", "[engine]") {
  // Units 0 and 1 (256x256 weights with their biases) are lone units at up to 4 ranks, unit 2
  // (256x4) goes through the buckets. Without clipping or an overflow check nothing reads the
  // norm before the step, so from the second step on (the first exchanges the boards) each
  // window's last micro-step steps units 0 and 1 as every rank's gradients of them complete:
  // twice per rank and step. The biases are in a param group of their own (a run that starts
  // inside a norm block), the window accumulates over 1-3 micro-steps (the late sum added to the
  // earlier ones' collectives; bf16 gradients into fp32), and the scheduler warms the lr up.
  // The references step after backward (ZERO_STEP_IN_BACKWARD=0), and at stage 3 with
  // collectives in place of the fused reduction too.
  struct Case {
    std::string precision;
    int gas;
    bool fp32_accumulation;
  };
  const Case cases[] = {{"fp32", 1, false}, {"fp32", 3, false}, {"bf16", 1, false},
                        {"bf16", 2, true}};
  const auto spec_for = [](const Case& c, int stage, int world, bool overlap) {
    TrainSpec spec;
    spec.config = base_config(stage, c.precision, c.gas);
    spec.config["gradient_clipping"] = 0.0;
    if (c.fp32_accumulation) spec.config["data_types"] = {{"grad_accum_dtype", "fp32"}};
    // bf16's overflow check (DeepSpeed's default) reads the norm before the step.
    if (c.precision == "bf16") spec.config["bf16"]["check_grad_overflow"] = false;
    spec.config["zero_optimization"]["overlap_comm"] = overlap;
    spec.config["zero_optimization"]["reduce_bucket_size"] = 1'000'000;
    spec.world = world;
    spec.steps = 4;
    use_two_group_mlp(spec);
    return spec;
  };
  for (const Case& c : cases) {
    for (int world : {2, 3, 4}) {
      INFO(c.precision << ", accumulation " << c.gas << (c.fp32_accumulation ? " in fp32" : "")
                       << ", " << world << " ranks");
      REQUIRE(::setenv("ZERO_FUSED_REDUCTION", "0", 1) == 0);
      const TrainResult collectives = train(spec_for(c, 3, world, true));
      ::unsetenv("ZERO_FUSED_REDUCTION");
      REQUIRE(stepped_in_backward(collectives) == 0);
      for (int stage : {0, 1, 2, 3}) {
        for (bool overlap : {false, true}) {
          INFO("stage " << stage << ", overlap_comm " << overlap);
          const TrainResult after = train_after_backward(spec_for(c, stage, world, overlap));
          REQUIRE(stepped_in_backward(after) == 0);
          const TrainResult during = train(spec_for(c, stage, world, overlap));
          CHECK(stepped_in_backward(during) == 3 * 2);
          require_bitwise_equal(after, during);
          require_same_norms(after, during);
          require_bitwise_equal(collectives, during);
          require_same_norms(collectives, during);
        }
      }
    }
  }
}

TEST_CASE("the step waits for backward where the norm is read first or the units are not held",
          "[engine]") {
  const auto spec_for = [](const std::string& precision, double clip, int bucket) {
    TrainSpec spec;
    spec.config = base_config(2, precision, 1);
    spec.config["gradient_clipping"] = clip;
    spec.config["zero_optimization"]["overlap_comm"] = false;
    spec.config["zero_optimization"]["reduce_bucket_size"] = bucket;
    spec.world = 2;
    spec.steps = 3;
    spec.model = "mlp:256,256,256,4";
    return spec;
  };
  // Clipping and the overflow checks of fp16 and bf16 (DeepSpeed's check_grad_overflow default)
  // read the norm before the step; a bucket smaller than the lone units reduces one of them
  // during backward. None steps in backward, and all train as the step after backward does.
  for (const auto& [precision, clip, bucket] :
       {std::tuple{"fp32", 0.05, 1'000'000}, std::tuple{"fp16", 0.0, 1'000'000},
        std::tuple{"bf16", 0.0, 1'000'000}, std::tuple{"fp32", 0.0, 300}}) {
    INFO(precision << ", clipping " << clip << ", bucket " << bucket);
    const TrainSpec spec = spec_for(precision, clip, bucket);
    const TrainResult r = train(spec);
    CHECK(stepped_in_backward(r) == 0);
    require_bitwise_equal(train_after_backward(spec), r);
  }
  // One rank: nothing to sum, no fused reduction, no step in backward.
  TrainSpec one = spec_for("fp32", 0.0, 1'000'000);
  one.world = 1;
  CHECK(stepped_in_backward(train(one)) == 0);
}

// Two in-process ranks of two lone units at stage 1, fp32, no clipping, a constant lr; `body`
// runs on each rank after `steps` plain steps (the boards exchanged), with the engine and a
// function that hands in every gradient of a micro-step (all ones, last parameter first), the
// ranks meeting at a barrier once unit 1 is complete: unit 0's completion then steps unit 1 in
// backward on both (hand_in.one(i) hands in parameter i's gradient alone), and the ranks'
// communicator.
struct HandIn {
  std::function<void(std::size_t)> one;
  std::function<void()> all;
  void operator()() const { all(); }
};
using Body = std::function<void(Engine&, const HandIn&, Communicator&)>;
void with_engine(int steps, const Body& body) {
  json c = base_config(1, "fp32", 1);
  c["gradient_clipping"] = 0.0;
  c.erase("scheduler");
  c["zero_optimization"]["overlap_comm"] = false;
  c["zero_optimization"]["reduce_bucket_size"] = 1'000'000;
  config::Supplied s;
  s.world_size = 2;
  const config::DsConfig cfg = config::load_config_json(c, s);
  const std::vector<ParamSpec> specs = {{"w0", {256, 256}, DType::F32, 0, 0, true},
                                        {"b0", {256}, DType::F32, 0, 0, true},
                                        {"w1", {256, 256}, DType::F32, 0, 1, true},
                                        {"b1", {256}, DType::F32, 0, 1, true}};
  auto init = [](std::size_t, std::span<float> out) { std::fill(out.begin(), out.end(), 0.5f); };
  run_ranks(2, [&](Communicator& comm) {
    auto device = make_device("cpu", comm.rank());
    auto engine = Engine::create(cfg, comm, *device, specs, init);
    HandIn hand_in;
    hand_in.one = [&](std::size_t i) {
      std::span<std::byte> slot = engine->grad(i);
      std::vector<float> ones(slot.size() / sizeof(float), 1.0f);
      std::memcpy(slot.data(), ones.data(), slot.size());
      engine->grad_ready(i);
    };
    hand_in.all = [&] {
      for (std::size_t i = specs.size(); i-- > 0;) {
        hand_in.one(i);
        if (i == 2) comm.barrier().wait();  // no collective of the engine's is in flight
      }
    };
    for (int t = 0; t < steps; ++t) {
      hand_in();
      engine->step();
    }
    body(*engine, hand_in, comm);
  });
}

TEST_CASE("a step begun in backward keeps its lr and refuses what would see it half done",
          "[engine]") {
  // The first step exchanges the boards; the second begins in backward. An lr set after its
  // units were stepped is the next step's: the step reports the lr it began with.
  with_engine(1, [](Engine& engine, const HandIn& hand_in, Communicator&) {
    const double lr = engine.current_lr(0);
    REQUIRE(lr > 0.0);
    hand_in();
    REQUIRE(engine.step_begun_in_backward());
    engine.set_lr(0, lr / 2);
    const StepResult r = engine.step();
    CHECK(r.lr == lr);
    CHECK(engine.current_lr(0) == lr / 2);
    CHECK_FALSE(engine.step_begun_in_backward());
    hand_in();
    CHECK(engine.step().lr == lr / 2);
    CHECK(engine.timings().units_stepped_in_backward == 2 * 2);
  });
  // Between a begun step's backward and step(): no end of the window taken back, no parameter
  // replaced, no checkpoint.
  with_engine(1, [](Engine& engine, const HandIn& hand_in, Communicator&) {
    hand_in();
    REQUIRE(engine.step_begun_in_backward());
    REQUIRE_THROWS_WITH(engine.set_accumulation_boundary(false),
                        Catch::Contains("begun in backward") &&
                            Catch::Contains("ZERO_STEP_IN_BACKWARD=0"));
    std::vector<float> values(256, 1.0f);
    REQUIRE_THROWS_WITH(engine.set_param(1, values, 0),
                        Catch::Contains("set_param") && Catch::Contains("half stepped"));
    REQUIRE_THROWS_WITH(engine.save_checkpoint("/nonexistent", "t"),
                        Catch::Contains("save_checkpoint") && Catch::Contains("call step() first"));
    engine.set_accumulation_boundary(true);  // what it is already
    CHECK(engine.step().boundary);
  });
  // set_step_in_backward(false) applies from the next micro-step: every rank alike.
  with_engine(1, [](Engine& engine, const HandIn& hand_in, Communicator&) {
    engine.set_step_in_backward(false);
    hand_in();
    CHECK_FALSE(engine.step_begun_in_backward());
    engine.step();
    CHECK(engine.timings().units_stepped_in_backward == 0);
    engine.set_step_in_backward(true);
    hand_in();
    CHECK(engine.step_begun_in_backward());
    engine.step();
    CHECK(engine.timings().units_stepped_in_backward == 2);
  });
}

TEST_CASE("an lr set between backward and step() is the next step's on every rank, stepped or not",
          "[engine]") {
  // Rank 1 hands in its whole backward before rank 0 hands in any gradient: rank 1 steps no unit
  // during backward, rank 0 steps both as their gradients complete. Both fixed the step's lr at
  // their first completed unit, so an lr set now is the next step's on both ranks, with the bits
  // of one set after step() (a rank that took it for this step would step its share with another
  // lr than its peer's).
  const auto run = [](bool set_between) {
    std::vector<std::vector<float>> masters(2);
    with_engine(1, [&](Engine& engine, const HandIn& hand_in, Communicator& comm) {
      const double lr = engine.current_lr(0);
      const bool early = engine.rank() == 1;
      if (!early) comm.barrier().wait();
      for (std::size_t i = engine.num_params(); i-- > 0;) hand_in.one(i);
      if (early) comm.barrier().wait();
      CHECK(engine.timings().units_stepped_in_backward == (early ? 0 : 2));
      CHECK(engine.step_begun_in_backward());
      if (set_between) engine.set_lr(0, lr / 2);
      CHECK(engine.step().lr == lr);
      if (!set_between) engine.set_lr(0, lr / 2);
      hand_in();
      CHECK(engine.step().lr == lr / 2);
      std::vector<float>& mine = masters[static_cast<std::size_t>(engine.rank())];
      for (std::size_t i = 0; i < engine.num_params(); ++i) {
        const std::vector<float> m = engine.gather_master(i);
        mine.insert(mine.end(), m.begin(), m.end());
      }
    });
    return masters;
  };
  const auto between = run(true);
  const auto after = run(false);
  for (std::size_t q = 0; q < 2; ++q) {
    INFO("rank " << q);
    REQUIRE(between[q].size() == 2 * (256 * 256 + 256));
    CHECK(std::count(between[q].begin(), between[q].end(), 0.5f) == 0);  // all trained
    CHECK(std::memcmp(between[q].data(), after[q].data(), between[q].size() * sizeof(float)) == 0);
  }
}

}  // namespace
}  // namespace zero::test
