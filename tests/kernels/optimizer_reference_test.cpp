// The kernels against a double-precision reference written here from the torch.optim formulas,
// over dtype mixes, grad scaling, bias correction, fused param writes and Adam vs AdamW.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/optimizer.h"
#include "tests/kernels/test_util.h"

namespace zk = zero::kernels;
using zero::DType;

namespace {

constexpr std::size_t kNumel = 1037;  // not a multiple of any vector width
constexpr int kSteps = 6;
// fp32 states: the kernel rounds to float where the reference does not; the difference stays
// far below this.
constexpr double kFp32Atol = 2e-6;
constexpr double kFp32Rtol = 1e-5;
// bf16 states: one bf16 ulp (2^-8) of a moment moves an update by under 1% of lr; the reference
// rounds from double, the kernel from float, so an occasional moment differs by that ulp.
constexpr double kBf16StateErrorPerStepOverLr = 1e-2;

struct Reference {
  std::vector<double> p, s0, s1;
};

void reference_step(const zk::OptimizerHyper& h, const zk::StepScalars& sc,
                    const std::vector<double>& grad, bool bf16_states, Reference& r) {
  const double lr = sc.lr, wd = h.weight_decay, t = static_cast<double>(sc.step);
  for (std::size_t i = 0; i < r.p.size(); ++i) {
    double g = grad[i] * sc.grad_scale;
    double& p = r.p[i];
    switch (h.kind) {
      case zk::OptimizerKind::Adam:
      case zk::OptimizerKind::AdamW: {
        if (h.kind == zk::OptimizerKind::Adam) g += wd * p;
        if (h.kind == zk::OptimizerKind::AdamW) p *= 1.0 - lr * wd;
        double& m = r.s0[i];
        double& v = r.s1[i];
        m = h.beta1 * m + (1.0 - h.beta1) * g;
        v = h.beta2 * v + (1.0 - h.beta2) * g * g;
        const double bc1 = h.bias_correction ? 1.0 - std::pow(h.beta1, t) : 1.0;
        const double bc2 = h.bias_correction ? 1.0 - std::pow(h.beta2, t) : 1.0;
        p -= lr * (m / bc1) / (std::sqrt(v / bc2) + h.eps);
        break;
      }
      case zk::OptimizerKind::Adagrad: {
        g += wd * p;
        r.s0[i] += g * g;
        p -= lr / (1.0 + (t - 1.0) * h.lr_decay) * g / (std::sqrt(r.s0[i]) + h.eps);
        break;
      }
      case zk::OptimizerKind::Lion: {
        p *= 1.0 - lr * wd;
        const double c = h.beta1 * r.s0[i] + (1.0 - h.beta1) * g;
        p -= lr * (c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0));
        r.s0[i] = h.beta2 * r.s0[i] + (1.0 - h.beta2) * g;
        break;
      }
      case zk::OptimizerKind::Sgd: {
        g += wd * p;
        if (h.momentum != 0.0) {
          double& b = r.s0[i];
          b = sc.step == 1 ? g : h.momentum * b + (1.0 - h.dampening) * g;
          g = h.nesterov ? g + h.momentum * b : b;
        }
        p -= lr * g;
        break;
      }
    }
  }
  if (bf16_states) {
    for (auto* s : {&r.s0, &r.s1}) {
      for (double& x : *s)
        x = zk::test::bf16_value(zk::test::reference_bf16(static_cast<float>(x)));
    }
  }
}

struct Case {
  std::string name;
  zk::OptimizerHyper hyper;
  double lr;
  DType grad_dtype = DType::F32;
  DType state_dtype = DType::F32;
  bool param_out = false;
  DType param_out_dtype = DType::BF16;
  double grad_scale = 1.0;
};

zk::OptimizerHyper make(zk::OptimizerKind kind) {
  zk::OptimizerHyper h;
  h.kind = kind;
  return h;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  auto adamw = make(zk::OptimizerKind::AdamW);
  adamw.weight_decay = 0.1;
  auto adam = make(zk::OptimizerKind::Adam);
  adam.weight_decay = 0.1;
  auto adam_nobc = adam;
  adam_nobc.bias_correction = false;
  auto adagrad = make(zk::OptimizerKind::Adagrad);
  adagrad.eps = 1e-10;
  adagrad.lr_decay = 0.01;
  adagrad.initial_accumulator_value = 0.1;
  adagrad.weight_decay = 0.01;
  auto lion = make(zk::OptimizerKind::Lion);
  lion.beta2 = 0.99;
  lion.weight_decay = 0.1;
  auto sgd = make(zk::OptimizerKind::Sgd);
  sgd.momentum = 0.9;
  sgd.dampening = 0.1;
  sgd.weight_decay = 1e-3;
  auto nesterov = make(zk::OptimizerKind::Sgd);
  nesterov.momentum = 0.9;
  nesterov.nesterov = true;
  auto plain_sgd = make(zk::OptimizerKind::Sgd);
  out.push_back({"adamw fp32", adamw, 1e-2});
  out.push_back({"adam L2 fp32", adam, 1e-2});
  out.push_back({"adam without bias correction", adam_nobc, 1e-3});
  out.push_back({"adamw bf16 grads", adamw, 1e-2, DType::BF16});
  out.push_back({"adamw fp16 grads", adamw, 1e-2, DType::F16});
  out.push_back({"adamw bf16 states", adamw, 1e-2, DType::F32, DType::BF16});
  out.push_back(
      {"adamw grad scale 0.3", adamw, 1e-2, DType::F32, DType::F32, false, DType::BF16, 0.3});
  out.push_back(
      {"adamw fused bf16 param write", adamw, 1e-2, DType::F32, DType::F32, true, DType::BF16});
  out.push_back(
      {"adamw fused fp16 param write", adamw, 1e-2, DType::BF16, DType::BF16, true, DType::F16});
  out.push_back(
      {"adamw fused fp32 param write", adamw, 1e-2, DType::F32, DType::F32, true, DType::F32});
  out.push_back({"sgd fused fp32 param write", sgd, 1e-2, DType::BF16, DType::F32, true,
                 DType::F32});
  out.push_back({"adagrad", adagrad, 1e-2});
  out.push_back({"adagrad bf16 grads and states", adagrad, 1e-2, DType::BF16, DType::BF16});
  out.push_back({"lion", lion, 1e-3});
  out.push_back({"lion fp16 grads, bf16 states, bf16 param write", lion, 1e-3, DType::F16,
                 DType::BF16, true});
  out.push_back({"sgd momentum dampening", sgd, 1e-2});
  out.push_back(
      {"sgd nesterov grad scale", nesterov, 1e-2, DType::F32, DType::F32, false, DType::BF16, 0.5});
  out.push_back({"sgd without momentum", plain_sgd, 1e-2, DType::BF16});
  return out;
}

// Gradient storage in the case's dtype, and the exact values the kernel will read.
struct Grad {
  std::vector<std::byte> bytes;
  std::vector<double> values;
};

Grad make_grad(DType dtype, std::uint32_t seed) {
  const auto f = zk::test::random_floats(kNumel, seed, -1.0f, 1.0f);
  Grad g;
  g.bytes.resize(kNumel * zero::dtype_size(dtype));
  g.values.resize(kNumel);
  for (std::size_t i = 0; i < kNumel; ++i) {
    const float x = f[i] * (i % 3 == 0 ? 1e-3f : 1.0f);
    if (dtype == DType::F32) {
      std::memcpy(g.bytes.data() + 4 * i, &x, 4);
      g.values[i] = x;
    } else {
      const std::uint16_t h =
          dtype == DType::BF16 ? zk::test::reference_bf16(x) : zk::test::reference_f16(x);
      std::memcpy(g.bytes.data() + 2 * i, &h, 2);
      g.values[i] = dtype == DType::BF16 ? zk::test::bf16_value(h) : zk::test::f16_value(h);
    }
  }
  return g;
}

}  // namespace

TEST_CASE("optimizer steps match a double-precision reference for every dtype mix and option") {
  for (const Case& c : cases()) {
    for (zk::Isa isa : zk::test::runnable_isas()) {
      INFO(c.name << " on " << zk::isa_name(isa) << " lr " << c.lr << " grad_scale "
                  << c.grad_scale);
      const int states = zk::optimizer_state_count(c.hyper);
      const std::size_t state_bytes = zero::dtype_size(c.state_dtype);
      std::vector<float> master = zk::test::random_floats(kNumel, 11, -1.0f, 1.0f);
      std::vector<std::byte> s0(kNumel * state_bytes), s1(kNumel * state_bytes);
      Reference ref;
      ref.p.assign(master.begin(), master.end());
      ref.s0.assign(kNumel, zk::optimizer_state_initial_value(c.hyper, 0));
      ref.s1.assign(kNumel, 0.0);
      for (std::size_t i = 0; i < kNumel; ++i) {
        const float init = zk::optimizer_state_initial_value(c.hyper, 0);
        if (c.state_dtype == DType::F32) {
          std::memcpy(s0.data() + 4 * i, &init, 4);
        } else {
          const std::uint16_t h = zk::test::reference_bf16(init);
          std::memcpy(s0.data() + 2 * i, &h, 2);
          ref.s0[i] = zk::test::bf16_value(h);
        }
      }
      std::vector<std::uint16_t> out(kNumel);
      std::vector<float> out32(kNumel);
      double worst = 0;
      for (int step = 1; step <= kSteps; ++step) {
        const Grad g = make_grad(c.grad_dtype, 100 + step);
        zk::OptimizerTensors t;
        t.master = master.data();
        t.grad = g.bytes.data();
        t.grad_dtype = c.grad_dtype;
        t.state0 = s0.data();
        t.state1 = s1.data();
        t.state_dtype = c.state_dtype;
        void* param_out = c.param_out_dtype == DType::F32 ? static_cast<void*>(out32.data())
                                                          : static_cast<void*>(out.data());
        t.param_out = c.param_out ? param_out : nullptr;
        t.param_out_dtype = c.param_out_dtype;
        t.numel = kNumel;
        const zk::StepScalars sc{c.lr, step, c.grad_scale};
        zk::optimizer_step_cpu(c.hyper, sc, t, {2, isa});
        reference_step(c.hyper, sc, g.values, c.state_dtype == DType::BF16, ref);
        const double atol = c.state_dtype == DType::F32
                                ? kFp32Atol
                                : kFp32Atol + kBf16StateErrorPerStepOverLr * c.lr * step;
        for (std::size_t i = 0; i < kNumel; ++i) {
          const double err = std::fabs(master[i] - ref.p[i]);
          worst = std::max(worst, err);
          INFO("step " << step << " element " << i << " ours " << master[i] << " reference "
                       << ref.p[i]);
          REQUIRE(err <= atol + kFp32Rtol * std::fabs(ref.p[i]));
          if (c.param_out && c.param_out_dtype == DType::F32) {
            // The master's own bits.
            REQUIRE(std::memcmp(&out32[i], &master[i], sizeof(float)) == 0);
          } else if (c.param_out) {
            const std::uint16_t want = c.param_out_dtype == DType::BF16
                                           ? zk::test::reference_bf16(master[i])
                                           : zk::test::reference_f16(master[i]);
            REQUIRE(out[i] == want);
          }
        }
        if (c.state_dtype == DType::F32 && states > 0) {
          for (std::size_t i = 0; i < kNumel; ++i) {
            REQUIRE(std::fabs(zk::test::element_value(s0, c.state_dtype, i) - ref.s0[i]) <=
                    1e-6 + 1e-5 * std::fabs(ref.s0[i]));
          }
        }
      }
      // Not vacuous: the parameters moved by many tolerances.
      double moved = 0;
      const auto start = zk::test::random_floats(kNumel, 11, -1.0f, 1.0f);
      for (std::size_t i = 0; i < kNumel; ++i)
        moved = std::max(moved, static_cast<double>(std::fabs(master[i] - start[i])));
      REQUIRE(moved > 100 * kFp32Atol);
      INFO("worst abs error " << worst);
    }
  }
}

TEST_CASE(
    "bf16 optimizer states hold the round-to-nearest-even of the fp32 result, which the update "
    "uses") {
  auto h = make(zk::OptimizerKind::AdamW);
  h.weight_decay = 0.01;
  const auto grad = zk::test::random_floats(kNumel, 5, -1.0f, 1.0f);
  // Initial moments that are exactly representable in bf16, so both runs start equal.
  std::vector<float> m(kNumel), v(kNumel);
  const auto m_init = zk::test::random_floats(kNumel, 6, -0.1f, 0.1f);
  const auto v_init = zk::test::random_floats(kNumel, 7, 0.0f, 0.01f);
  std::vector<std::uint16_t> m16(kNumel), v16(kNumel);
  for (std::size_t i = 0; i < kNumel; ++i) {
    m16[i] = zk::test::reference_bf16(m_init[i]);
    v16[i] = zk::test::reference_bf16(v_init[i]);
    m[i] = static_cast<float>(zk::test::bf16_value(m16[i]));
    v[i] = static_cast<float>(zk::test::bf16_value(v16[i]));
  }
  std::vector<float> p32 = zk::test::random_floats(kNumel, 8, -1.0f, 1.0f), p16 = p32;
  zk::OptimizerTensors full{p32.data(), grad.data(), DType::F32,  m.data(), v.data(),
                            DType::F32, nullptr,     DType::BF16, kNumel};
  zk::OptimizerTensors half{p16.data(),  grad.data(), DType::F32,  m16.data(), v16.data(),
                            DType::BF16, nullptr,     DType::BF16, kNumel};
  zk::optimizer_step_cpu(h, {1e-3, 3, 1.0}, full);
  zk::optimizer_step_cpu(h, {1e-3, 3, 1.0}, half);
  REQUIRE(std::memcmp(p32.data(), p16.data(), kNumel * 4) == 0);
  for (std::size_t i = 0; i < kNumel; ++i) {
    REQUIRE(m16[i] == zk::test::reference_bf16(m[i]));
    REQUIRE(v16[i] == zk::test::reference_bf16(v[i]));
  }
}

TEST_CASE("a power-of-two grad_scale on scaled gradients reproduces the unscaled step bitwise") {
  for (auto kind : {zk::OptimizerKind::AdamW, zk::OptimizerKind::Adagrad, zk::OptimizerKind::Lion,
                    zk::OptimizerKind::Sgd}) {
    auto h = make(kind);
    h.momentum = 0.9;
    const auto grad = zk::test::random_floats(kNumel, 9, -1.0f, 1.0f);
    std::vector<float> scaled(grad);
    for (float& x : scaled) x *= 1024.0f;
    std::vector<float> pa = zk::test::random_floats(kNumel, 10, -1.0f, 1.0f), pb = pa;
    std::vector<float> sa0(kNumel, 0.01f), sa1(kNumel, 0.01f), sb0 = sa0, sb1 = sa1;
    zk::optimizer_step_cpu(h, {1e-2, 2, 1.0},
                           {pa.data(), grad.data(), DType::F32, sa0.data(), sa1.data(), DType::F32,
                            nullptr, DType::BF16, kNumel});
    zk::optimizer_step_cpu(h, {1e-2, 2, 1.0 / 1024},
                           {pb.data(), scaled.data(), DType::F32, sb0.data(), sb1.data(),
                            DType::F32, nullptr, DType::BF16, kNumel});
    INFO(zk::optimizer_name(kind));
    REQUIRE(pa != zk::test::random_floats(kNumel, 10, -1.0f, 1.0f));
    REQUIRE(std::memcmp(pa.data(), pb.data(), kNumel * 4) == 0);
    REQUIRE(std::memcmp(sa0.data(), sb0.data(), kNumel * 4) == 0);
  }
}

TEST_CASE("Adam applies weight decay as L2 on the gradient and AdamW decouples it") {
  auto adam = make(zk::OptimizerKind::Adam);
  auto adamw = make(zk::OptimizerKind::AdamW);
  adam.weight_decay = adamw.weight_decay = 0.5;
  const auto grad = zk::test::random_floats(kNumel, 12, -1.0f, 1.0f);
  const auto start = zk::test::random_floats(kNumel, 13, -1.0f, 1.0f);
  std::vector<float> pa = start, pw = start, ma(kNumel), va(kNumel), mw(kNumel), vw(kNumel);
  zk::optimizer_step_cpu(adam, {1e-2, 1, 1.0},
                         {pa.data(), grad.data(), DType::F32, ma.data(), va.data(), DType::F32,
                          nullptr, DType::BF16, kNumel});
  zk::optimizer_step_cpu(adamw, {1e-2, 1, 1.0},
                         {pw.data(), grad.data(), DType::F32, mw.data(), vw.data(), DType::F32,
                          nullptr, DType::BF16, kNumel});
  std::size_t differ = 0;
  for (std::size_t i = 0; i < kNumel; ++i) {
    // AdamW: the first step's moment is the raw gradient; Adam's includes 0.5·p.
    REQUIRE(mw[i] == static_cast<float>(0.1f * grad[i]));
    differ += pa[i] != pw[i];
  }
  REQUIRE(differ > kNumel / 2);
  REQUIRE(ma != mw);
}
