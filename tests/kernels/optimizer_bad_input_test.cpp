// Arguments torch/DeepSpeed would reject are errors that name the argument and its value.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/optimizer.h"
#include "zero/base/error.h"

namespace zk = zero::kernels;
using Catch::Contains;
using zero::DType;

namespace {

constexpr std::size_t kNumel = 64;

struct Fixture {
  std::vector<float> master = std::vector<float>(kNumel, 1.0f);
  std::vector<float> grad = std::vector<float>(kNumel, 0.5f);
  std::vector<float> s0 = std::vector<float>(kNumel, 0.0f);
  std::vector<float> s1 = std::vector<float>(kNumel, 0.0f);
  zk::OptimizerTensors tensors() {
    return {master.data(), grad.data(), DType::F32,  s0.data(), s1.data(),
            DType::F32,    nullptr,     DType::BF16, kNumel};
  }
};

zk::OptimizerHyper with(zk::OptimizerKind kind) {
  zk::OptimizerHyper h;
  h.kind = kind;
  return h;
}

void step(const zk::OptimizerHyper& h, zk::StepScalars s = {}) {
  Fixture f;
  zk::optimizer_step_cpu(h, s, f.tensors());
}

}  // namespace

TEST_CASE("hyper-parameters outside torch's accepted ranges are rejected with name and value") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto h = with(zk::OptimizerKind::AdamW);
  REQUIRE_THROWS_WITH(step(h, {-1e-3, 1, 1.0}), Contains("lr") && Contains("-0.001"));
  REQUIRE_THROWS_WITH(step(h, {nan, 1, 1.0}), Contains("lr") && Contains("nan"));
  REQUIRE_THROWS_WITH(step(h, {1e-3, 0, 1.0}), Contains("step") && Contains("0"));
  REQUIRE_THROWS_WITH(step(h, {1e-3, 1, 0.0}), Contains("grad_scale"));
  REQUIRE_THROWS_WITH(step(h, {1e-3, 1, INFINITY}), Contains("grad_scale") && Contains("inf"));
  h.eps = -1e-8;
  REQUIRE_THROWS_WITH(step(h), Contains("eps") && Contains("-1e-08"));
  h = with(zk::OptimizerKind::Adam);
  h.beta1 = 1.0;
  REQUIRE_THROWS_WITH(step(h), Contains("adam: beta1") && Contains("[0, 1)") && Contains("got 1"));
  h.beta1 = 0.9;
  h.beta2 = -0.1;
  REQUIRE_THROWS_WITH(step(h), Contains("beta2") && Contains("-0.1"));
  h.beta2 = 0.999;
  h.weight_decay = -0.01;
  REQUIRE_THROWS_WITH(step(h), Contains("weight_decay") && Contains("-0.01"));
  h = with(zk::OptimizerKind::Lion);
  h.beta2 = nan;
  REQUIRE_THROWS_WITH(step(h), Contains("lion: beta2"));
  h = with(zk::OptimizerKind::Sgd);
  h.momentum = -0.5;
  REQUIRE_THROWS_WITH(step(h), Contains("momentum") && Contains("-0.5"));
  h.momentum = 0.0;
  h.nesterov = true;
  REQUIRE_THROWS_WITH(step(h), Contains("nesterov") && Contains("momentum 0"));
  h.momentum = 0.9;
  h.dampening = 0.1;
  REQUIRE_THROWS_WITH(step(h), Contains("nesterov") && Contains("dampening 0.1"));
  h = with(zk::OptimizerKind::Adagrad);
  h.lr_decay = -1;
  REQUIRE_THROWS_WITH(step(h), Contains("lr_decay") && Contains("-1"));
  h.lr_decay = 0;
  h.initial_accumulator_value = -0.5;
  REQUIRE_THROWS_WITH(step(h), Contains("initial_accumulator_value") && Contains("-0.5"));
  REQUIRE_THROWS_AS(step(h), zero::Error);
}

TEST_CASE("null, misaligned or wrongly typed arrays are rejected before anything is written") {
  const auto h = with(zk::OptimizerKind::AdamW);
  Fixture f;
  auto t = f.tensors();
  t.master = nullptr;
  REQUIRE_THROWS_WITH(zk::optimizer_step_cpu(h, {}, t), Contains("master is null"));
  t = f.tensors();
  t.state1 = nullptr;
  REQUIRE_THROWS_WITH(zk::optimizer_step_cpu(h, {}, t), Contains("state1 is null"));
  t = f.tensors();
  t.grad = reinterpret_cast<const std::byte*>(f.grad.data()) + 2;
  REQUIRE_THROWS_WITH(zk::optimizer_step_cpu(h, {}, t),
                      Contains("grad") && Contains("not aligned"));
  t = f.tensors();
  t.grad_dtype = DType::F64;
  REQUIRE_THROWS_WITH(zk::optimizer_step_cpu(h, {}, t), Contains("grad_dtype") && Contains("fp64"));
  t = f.tensors();
  t.state_dtype = DType::F16;
  REQUIRE_THROWS_WITH(zk::optimizer_step_cpu(h, {}, t),
                      Contains("state_dtype") && Contains("fp16"));
  t = f.tensors();
  t.param_out = f.s1.data();
  t.param_out_dtype = DType::F64;
  REQUIRE_THROWS_WITH(zk::optimizer_step_cpu(h, {}, t),
                      Contains("param_out_dtype") && Contains("fp64"));
  REQUIRE(f.master == std::vector<float>(kNumel, 1.0f));
  // States beyond the optimizer's count may be null; an empty partition needs no arrays.
  t = f.tensors();
  t.state1 = nullptr;
  REQUIRE_NOTHROW(zk::optimizer_step_cpu(with(zk::OptimizerKind::Lion), {}, t));
  REQUIRE_NOTHROW(zk::optimizer_step_cpu(h, {}, zk::OptimizerTensors{}));
  REQUIRE_THROWS_WITH(zk::optimizer_step_cpu(h, {}, f.tensors(), {-1, zk::Isa::Auto}),
                      Contains("threads") && Contains("-1"));
}
