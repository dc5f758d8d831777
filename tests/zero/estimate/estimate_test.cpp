#include "zero/estimate/estimate.h"

#include <catch2/catch.hpp>

#include "zero/base/error.h"

namespace {

constexpr double kGB = 1e9;

double device_gb(int stage, zero::Precision precision = zero::Precision::Fp16) {
  zero::EstimateInput in;
  in.params = 7'500'000'000;
  in.world_size = 64;
  in.stage = stage;
  in.precision = precision;
  return zero::estimate_model_states(in).total().device / kGB;
}

}  // namespace

TEST_CASE("estimate reproduces the ZeRO paper's Figure 1 for 7.5B parameters on 64 ranks") {
  // Paper: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per device for stages 0..3 (K = 12).
  CHECK(device_gb(0) == Approx(120.0).epsilon(1e-12));
  CHECK(device_gb(1) == Approx(31.40625).epsilon(1e-12));
  CHECK(device_gb(2) == Approx(16.640625).epsilon(1e-12));
  CHECK(device_gb(3) == Approx(1.875).epsilon(1e-12));
}

TEST_CASE("estimate splits model states into the four categories with K = 12 for Adam") {
  zero::EstimateInput in;
  in.params = 1000;
  in.world_size = 4;
  in.stage = 2;
  const auto r = zero::estimate_model_states(in);
  CHECK(r.lp_params.device == 2000);
  CHECK(r.gradients.device == 500);
  CHECK(r.fp32_master.device == 1000);
  CHECK(r.optimizer_states.device == 2000);
  CHECK(r.optimizer_state_bytes_per_param == 8);
  CHECK(r.total().host == 0);
  CHECK(r.total().nvme == 0);
}

TEST_CASE(
    "estimate moves offloaded states off the device and honours offload_param only at stage 3") {
  zero::EstimateInput in;
  in.params = 1000;
  in.world_size = 2;
  in.stage = 2;
  in.offload_optimizer = zero::OffloadTier::Cpu;
  in.offload_param = zero::OffloadTier::Nvme;
  auto r = zero::estimate_model_states(in);
  CHECK(r.fp32_master.device == 0);
  CHECK(r.fp32_master.host == 2000);
  CHECK(r.optimizer_states.host == 4000);
  CHECK(r.gradients.host == 2000);    // fp32 gradient partition the CPU optimizer reads
  CHECK(r.lp_params.device == 2000);  // offload_param ignored below stage 3
  CHECK(r.lp_params.nvme == 0);

  in.stage = 3;
  in.largest_param = 100;
  r = zero::estimate_model_states(in);
  CHECK(r.lp_params.nvme == 1000);
  CHECK(r.lp_params.device == 0);
  CHECK(r.working_set.device == 400);  // 100 fp16 elements gathered plus their gradient
}

TEST_CASE("estimate uses 4-byte model copies in fp32 and the optimizer's own state size") {
  zero::EstimateInput in;
  in.params = 100;
  in.world_size = 1;
  in.precision = zero::Precision::Fp32;
  in.optimizer = zero::EstimateOptimizer::Sgd;
  const auto r = zero::estimate_model_states(in);
  CHECK(r.lp_params.device == 400);
  CHECK(r.gradients.device == 400);
  CHECK(r.optimizer_states.device == 0);
  // The fp32 model copy is the master: no second copy unless one of them is offloaded.
  CHECK(r.fp32_master.device == 0);
  CHECK(r.total().device == 800);
  in.offload_optimizer = zero::OffloadTier::Cpu;
  CHECK(zero::estimate_model_states(in).fp32_master.host == 400);
  in.offload_optimizer = zero::OffloadTier::None;
  in.stage = 3;
  in.offload_param = zero::OffloadTier::Cpu;
  CHECK(zero::estimate_model_states(in).fp32_master.device == 400);
  in.precision = zero::Precision::Bf16;
  in.offload_param = zero::OffloadTier::None;
  CHECK(zero::estimate_model_states(in).fp32_master.device == 400);
}

TEST_CASE("estimate rejects impossible inputs with the offending value") {
  zero::EstimateInput in;
  in.params = 10;
  in.world_size = 0;
  REQUIRE_THROWS_WITH(zero::estimate_model_states(in), Catch::Contains("got 0"));
  in.world_size = 1;
  in.stage = 4;
  REQUIRE_THROWS_WITH(zero::estimate_model_states(in), Catch::Contains("got 4"));
  in.stage = 3;
  in.largest_param = 11;
  REQUIRE_THROWS_WITH(zero::estimate_model_states(in), Catch::Contains("(11)"));
}
