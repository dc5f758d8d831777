// The reduction fused into the optimizer step (engine_fused_reduction.cpp) and the norm summed in
// the step's own walk (partition_optimizer_norm.cpp): on in-process ranks, at every stage and
// precision, bitwise against the collectives and the separate norm pass they replace.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <memory>
#include <optional>

#include "tests/zero/engine/engine_test_util.h"
#include "tests/zero/engine/gpu_stand_in.h"

namespace zero::test {
namespace {

TEST_CASE("the norm summed in the step's own walk has the bits of the norm taken before it",
          "[engine]") {
  // With no clipping and no overflow check the step sums the gradients' norm blocks as it steps
  // them; clipping at 1e30 (a coefficient of 1: the same update) takes the norm before the step.
  // Slices of several norm blocks, with a param group edge inside a block (the biases in group
  // 1), so that some blocks are summed after the step. On the GPU stand-in (no fused kernel, as
  // CUDA) the step's norm is one pass after it.
  for (const std::string precision : {"fp32", "bf16"}) {
    for (int stage : {0, 1, 3}) {
      for (int world : {2, 3}) {
        for (bool stand_in : {false, true}) {
          INFO(precision << ", stage " << stage << ", " << world << " ranks"
                         << (stand_in ? ", GPU stand-in" : ""));
          auto spec_for = [&](double clip) {
            TrainSpec spec;
            spec.config = base_config(stage, precision, 2);
            spec.config["gradient_clipping"] = clip;
            spec.world = world;
            spec.steps = 3;
            spec.model = "mlp:96,200,120,4";
            spec.groups = {{}, {std::nullopt, 0.0}};
            spec.group_of = [](std::size_t i) { return static_cast<int>(i % 2); };
            if (stand_in) {
              spec.device_factory = [](int rank, const DeviceOptions& options) {
                return std::unique_ptr<Device>(std::make_unique<GpuStandIn>(rank, options));
              };
            }
            return spec;
          };
          const TrainResult before = train(spec_for(1e30));
          const TrainResult during = train(spec_for(0.0));
          require_bitwise_equal(before, during);
          require_same_norms(before, during);
        }
      }
    }
  }
}

TEST_CASE("the reduction fused into the step gives the bits of the collective it replaces",
          "[engine]") {
  // Units 0 and 1 (256x256 weights and their biases) have slices of 16,448 elements or more at up
  // to 4 ranks: lone units. Without overlap_comm and with a budget that holds both, the window's
  // last backward ends with neither reduced, and the step sums each tile of the ranks' gradients
  // itself; with clipping (or an overflow check: fp16, bf16) the norm's pass forms the rank's own
  // slices first; in a window of several micro-steps the sums are added to what the earlier
  // micro-steps' collectives left, and with fp32 accumulation of bf16 gradients they are cast on
  // the way in. The biases are in a param group of their own, so a run starts inside a norm block
  // and those blocks are summed after the step, from the gradients the step formed. With
  // overlap_comm the newest units up to a bucket's elements are left to the step, the older ones
  // reduced during backward. With ZERO_FUSED_REDUCTION=0 the same units are reduce-scattered
  // (all-reduced at stage 0); with overlap_comm as well, their reductions start during backward
  // (the reference).
  struct Case {
    std::string precision;
    double clip;
    int gas;
    bool fp32_accumulation;
  };
  const Case cases[] = {{"fp32", 0.0, 1, false},  {"fp32", 0.05, 1, false},
                        {"fp32", 0.0, 3, false},  {"fp32", 0.05, 2, false},
                        {"bf16", 1.0, 1, false},  {"bf16", 1.0, 2, true},
                        {"fp16", 0.0, 1, false},  {"fp16", 0.0, 2, false}};
  const auto spec_for = [](const Case& c, int stage, int world, int budget, bool overlap = false) {
    TrainSpec spec;
    spec.config = base_config(stage, c.precision, c.gas);
    spec.config["gradient_clipping"] = c.clip;
    if (c.fp32_accumulation) spec.config["data_types"] = {{"grad_accum_dtype", "fp32"}};
    spec.config["zero_optimization"]["overlap_comm"] = overlap;
    spec.config["zero_optimization"]["reduce_bucket_size"] = budget;
    spec.world = world;
    spec.steps = 3;
    use_two_group_mlp(spec);
    return spec;
  };
  const auto fused_units = [](const TrainResult& r) {
    return agreed_count(r, &EngineTimings::units_fused);
  };
  for (const Case& c : cases) {
    for (int world : {2, 3, 4}) {
      INFO(c.precision << ", clipping " << c.clip << ", accumulation " << c.gas
                       << (c.fp32_accumulation ? " in fp32" : "") << ", " << world << " ranks");
      REQUIRE(::setenv("ZERO_FUSED_REDUCTION", "0", 1) == 0);
      const TrainResult reference = train(spec_for(c, 3, world, 1'000'000, true));
      ::unsetenv("ZERO_FUSED_REDUCTION");
      REQUIRE(fused_units(reference) == 0);
      for (int stage : {0, 1, 2, 3}) {
        INFO("stage " << stage);
        const TrainResult fused = train(spec_for(c, stage, world, 1'000'000));
        CHECK(fused_units(fused) == 3 * 2);
        require_bitwise_equal(reference, fused);
        require_same_norms(reference, fused);
        // A budget of a few hundred elements starts unit 1's reduction when unit 0 completes
        // (backward runs last layer first): only unit 0 is left to the step.
        const TrainResult some = train(spec_for(c, stage, world, 300));
        CHECK(fused_units(some) == 3 * 1);
        require_bitwise_equal(reference, some);
        // overlap_comm: a bucket's elements (one unit of 65,792 and the small ones) wait; unit 1,
        // complete first, starts when unit 0 completes; with a bucket that holds both, neither.
        const TrainResult overlapped = train(spec_for(c, stage, world, 70'000, true));
        CHECK(fused_units(overlapped) == 3 * 1);
        require_bitwise_equal(reference, overlapped);
        require_same_norms(reference, overlapped);
        const TrainResult held = train(spec_for(c, stage, world, 1'000'000, true));
        CHECK(fused_units(held) == 3 * 2);
        require_bitwise_equal(reference, held);
        REQUIRE(::setenv("ZERO_FUSED_REDUCTION", "0", 1) == 0);
        const TrainResult off = train(spec_for(c, stage, world, 1'000'000));
        ::unsetenv("ZERO_FUSED_REDUCTION");
        CHECK(fused_units(off) == 0);
        require_bitwise_equal(reference, off);
      }
    }
  }
}

}  // namespace
}  // namespace zero::test
