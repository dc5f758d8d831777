// Stage 0's step shared out (engine_model_push.cpp, PartitionOptimizer::step_own_domain_only):
// on in-process ranks, each rank steps only its own partition and pushes it into every peer's
// model copy, with the bits of every rank stepping every partition.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>

#include "tests/temp_dir.h"
#include "tests/zero/engine/engine_test_util.h"

namespace zero::test {
namespace {

// Every rank's final master equals rank 0's, bitwise.
void require_ranks_agree(const TrainResult& r) {
  REQUIRE(r.rank_params.size() > 1);
  for (std::size_t q = 1; q < r.rank_params.size(); ++q) {
    INFO("rank " << q);
    REQUIRE(r.rank_params[q].size() == r.params.size());
    for (std::size_t i = 0; i < r.params.size(); ++i) {
      INFO("parameter " << r.names[i]);
      REQUIRE(r.rank_params[q][i].size() == r.params[i].size());
      REQUIRE(std::memcmp(r.rank_params[q][i].data(), r.params[i].data(),
                          r.params[i].size() * sizeof(float)) == 0);
    }
  }
}

// ZERO_MODEL_PUSH=0 for the run: every rank steps every partition (stage 0 as it was).
TrainResult train_unpushed(const TrainSpec& spec) {
  REQUIRE(::setenv("ZERO_MODEL_PUSH", "0", 1) == 0);
  struct Unset {
    ~Unset() { ::unsetenv("ZERO_MODEL_PUSH"); }
  } unset;
  return train(spec);
}

TEST_CASE("stage 0 with its step shared out gives the bits of every rank stepping everything",
          "[engine]") {
  // Two param groups (the biases without weight decay), so that runs of both groups are stepped
  // in every domain. Clipping takes the norm before the step; without it the step sums it, and
  // without overlap_comm and with a budget that holds the lone units (units 0 and 1, 256x256
  // weights and their biases) the step is taken during backward from the second step on. The optimizer state offloaded to host memory keeps the
  // master in the model copy at stage 0, so it shares the step out too.
  struct Case {
    double clip;
    int gas;
    bool overlap;
    bool offload;
  };
  const Case cases[] = {{1.0, 1, true, false},  {0.05, 2, true, false}, {0.0, 1, false, false},
                        {0.0, 3, false, false}, {0.0, 2, true, false},  {1.0, 1, true, true}};
  for (const Case& c : cases) {
    for (int world : {2, 3, 4}) {
      INFO("clipping " << c.clip << ", accumulation " << c.gas << ", overlap_comm " << c.overlap
                       << (c.offload ? ", optimizer offloaded" : "") << ", " << world << " ranks");
      auto spec_for = [&](int stage) {
        TrainSpec spec;
        spec.config = base_config(stage, "fp32", c.gas);
        spec.config["gradient_clipping"] = c.clip;
        spec.config["zero_optimization"]["overlap_comm"] = c.overlap;
        spec.config["zero_optimization"]["reduce_bucket_size"] = c.overlap ? 300 : 1'000'000;
        if (c.offload) spec.config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
        spec.world = world;
        spec.steps = 4;
        use_two_group_mlp(spec);
        return spec;
      };
      const TrainResult everything = train_unpushed(spec_for(0));
      for (const EngineTimings& t : everything.timings) REQUIRE(t.pushed_bytes == 0);
      const TrainResult shared = train(spec_for(0));
      require_bitwise_equal(everything, shared);
      require_same_norms(everything, shared);
      require_ranks_agree(everything);
      require_ranks_agree(shared);
      // Each rank pushed its slices of every unit to every peer, every step: as many bytes as
      // stage 1's push of the same slices on in-process ranks (which keep their own copies).
      const TrainResult stage1 = train(spec_for(1));
      require_bitwise_equal(everything, stage1);
      for (int q = 0; q < world; ++q) {
        INFO("rank " << q);
        const auto& t = shared.timings[static_cast<std::size_t>(q)];
        CHECK(t.pushed_bytes > 0);
        CHECK(t.pushed_bytes == stage1.timings[static_cast<std::size_t>(q)].pushed_bytes);
      }
      if (c.clip == 0.0 && !c.overlap) {
        // Taken during backward from the second step on, shared out there as well.
        CHECK(agreed_count(shared, &EngineTimings::units_stepped_in_backward) == 3 * 2);
      }
    }
  }
}

TEST_CASE("stage 0's shared-out step resumes from a checkpoint, shared out or not", "[engine]") {
  // Each rank saves its own partition, the one it steps; a load writes every partition, so the
  // run continues bitwise whether the step is shared out after it or not.
  TrainSpec spec;
  spec.config = base_config(0, "fp32", 1);
  spec.world = 3;
  spec.steps = 6;
  const TrainResult whole = train(spec);
  TempDir dir;
  TrainSpec saving = spec;
  saving.save_dir = dir.str();
  saving.save_after = 3;
  (void)train(saving);
  TrainSpec resuming = spec;
  resuming.load_dir = dir.str();
  const TrainResult shared = train(resuming);
  require_bitwise_equal(whole, shared);
  REQUIRE(shared.steps.size() == 3);
  CHECK(shared.timings[0].pushed_bytes > 0);
  const TrainResult unshared = train_unpushed(resuming);
  require_bitwise_equal(whole, unshared);
  require_ranks_agree(unshared);
}

}  // namespace
}  // namespace zero::test
