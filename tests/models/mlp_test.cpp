#include "models/mlp.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "tests/models/mlp_reference.h"
#include "zero/base/error.h"
#include "zero/base/half.h"

namespace zt = zero::models;

namespace {

// The fp32 model against the double-precision loop reference (mlp_reference.h): sums of up to
// a few hundred fp32 products rounded in another order, each layer's error carried into the next
// in backward. Relative to the largest |reference| of each tensor (and of the loss).
constexpr double kGradTolerance = 1e-4;
constexpr double kLossTolerance = 1e-5;

struct Model {
  zt::MlpShape shape;
  std::vector<std::vector<float>> w;
  std::vector<std::vector<float>> g;

  Model(const std::string& spec, std::uint64_t seed) : shape(zt::MlpShape::parse(spec)) {
    const auto params = zt::mlp_params(shape);
    for (std::size_t i = 0; i < params.size(); ++i) {
      w.emplace_back(params[i].numel());
      g.emplace_back(params[i].numel());
      zt::init_param(shape, i, seed, 0, w.back());
    }
  }
  std::vector<std::span<const float>> weights() const { return {w.begin(), w.end()}; }
  std::vector<std::span<float>> grads() { return {g.begin(), g.end()}; }
  // Runs forward and backward on `batch` and returns a copy of the gradients.
  std::vector<std::vector<float>> gradients(const zt::Batch& batch, float loss_scale,
                                            const zt::BackwardOptions& options = {}) {
    zt::forward_backward(shape, weights(), batch, loss_scale, grads(), options);
    return g;
  }
};

}  // namespace

TEST_CASE("mlp shapes parse from mlp:IN,H,...,OUT and bad shapes name the text") {
  const auto s = zt::MlpShape::parse("mlp:8,16,4");
  CHECK(s.widths == std::vector<std::size_t>{8, 16, 4});
  CHECK(s.to_string() == "mlp:8,16,4");
  const auto params = zt::mlp_params(s);
  REQUIRE(params.size() == 4);
  CHECK(params[0].name == "layers.0.weight");
  CHECK(params[0].shape == std::vector<std::size_t>{16, 8});
  CHECK(params[3].name == "layers.1.bias");
  REQUIRE_THROWS_WITH(zt::MlpShape::parse("mlp:8,x,4"), Catch::Contains("'x'"));
  REQUIRE_THROWS_WITH(zt::MlpShape::parse("mlp:8"), Catch::Contains("at least"));
  REQUIRE_THROWS_WITH(zt::MlpShape::parse("mlp:8,0,4"), Catch::Contains("'0'"));
}

TEST_CASE("mlp gradients match central finite differences of the loss") {
  Model m("mlp:5,7,6,3", 11);
  zt::TeacherStudentData data(m.shape, 11);
  const auto batch = data.batch(/*step=*/3, /*first=*/0, /*rows=*/4);
  const double loss = zt::forward_backward(m.shape, m.weights(), batch, 1.0f, m.grads());
  REQUIRE(loss > 1e-4);  // the student starts away from the teacher

  double max_err = 0, max_grad = 0;
  for (std::size_t p = 0; p < m.w.size(); ++p) {
    for (std::size_t e = 0; e < m.w[p].size(); ++e) {
      const float saved = m.w[p][e];
      const float h = 1e-3f;
      m.w[p][e] = saved + h;
      const double up = zt::forward_loss(m.shape, m.weights(), batch);
      m.w[p][e] = saved - h;
      const double down = zt::forward_loss(m.shape, m.weights(), batch);
      m.w[p][e] = saved;
      const double numeric = (up - down) / (2.0 * h);
      max_err = std::max(max_err, std::abs(numeric - m.g[p][e]));
      max_grad = std::max(max_grad, std::abs(static_cast<double>(m.g[p][e])));
    }
  }
  INFO("max |numeric - analytic| = " << max_err << ", max |grad| = " << max_grad);
  REQUIRE(max_grad > 1e-3);
  CHECK(max_err < 1e-2 * max_grad);
}

TEST_CASE("the loss scale multiplies every gradient exactly by a power of two") {
  Model m("mlp:4,8,2", 5);
  zt::TeacherStudentData data(m.shape, 5);
  const auto batch = data.batch(0, 0, 6);
  const auto plain = m.gradients(batch, 1.0f);
  m.gradients(batch, 1024.0f);
  bool nonzero = false;
  for (std::size_t p = 0; p < plain.size(); ++p)
    for (std::size_t e = 0; e < plain[p].size(); ++e) {
      CHECK(m.g[p][e] == plain[p][e] * 1024.0f);
      nonzero = nonzero || plain[p][e] != 0.0f;
    }
  CHECK(nonzero);
}

TEST_CASE("a batch depends only on (seed, step, sample), so shares of it can be made anywhere") {
  const auto shape = zt::MlpShape::parse("mlp:3,4,2");
  zt::TeacherStudentData a(shape, 7), b(shape, 7), c(shape, 8);
  const auto whole = a.batch(5, 0, 8);
  const auto tail = b.batch(5, 4, 4);
  for (std::size_t i = 0; i < tail.inputs.size(); ++i)
    CHECK(tail.inputs[i] == whole.inputs[12 + i]);
  for (std::size_t i = 0; i < tail.targets.size(); ++i)
    CHECK(tail.targets[i] == whole.targets[8 + i]);
  CHECK(c.batch(5, 0, 8).inputs != whole.inputs);
  CHECK(a.batch(6, 0, 8).inputs != whole.inputs);
}

TEST_CASE("plain gradient descent on the teacher-student task lowers the loss") {
  Model m("mlp:6,16,3", 3);
  zt::TeacherStudentData data(m.shape, 3);
  const auto first = data.batch(0, 0, 32);
  const double before = zt::forward_loss(m.shape, m.weights(), first);
  for (std::uint64_t t = 0; t < 200; ++t) {
    zt::forward_backward(m.shape, m.weights(), data.batch(t, 0, 32), 1.0f, m.grads());
    for (std::size_t p = 0; p < m.w.size(); ++p)
      for (std::size_t e = 0; e < m.w[p].size(); ++e) m.w[p][e] -= 0.2f * m.g[p][e];
  }
  const double after = zt::forward_loss(m.shape, m.weights(), first);
  INFO("loss " << before << " -> " << after);
  CHECK(after < 0.5 * before);
}

TEST_CASE("the fp32 model's loss and gradients match a double-precision loop reference") {
  // Widths above the kernels' register blocking and below it, a batch larger than one teacher
  // block, and a loss scale as fp16 training uses.
  for (const std::string spec : {"mlp:5,7,6,3", "mlp:64,96,33,10"}) {
    for (auto [rows, threads] : {std::pair<std::size_t, int>{1, 1}, {7, 1}, {40, 1}, {40, 3}}) {
      Model m(spec, 21);
      zt::TeacherStudentData data(m.shape, 21);
      const auto batch = data.batch(/*step=*/2, /*first=*/3, rows);
      const float scale = 512.0f;
      INFO(spec << ", " << rows << " rows, " << threads << " threads, loss scale " << scale);
      std::vector<std::size_t> layers_seen;
      const double loss = zt::forward_backward(
          m.shape, m.weights(), batch, scale, m.grads(),
          {.threads = threads, .on_layer_grads = [&](std::size_t k) { layers_seen.push_back(k); }});
      const auto ref = zero::test::reference_forward_backward(m.shape, m.weights(), batch, scale);
      REQUIRE(ref.loss > 1e-4);  // the student starts away from the teacher
      CHECK(std::abs(loss - ref.loss) <= kLossTolerance * ref.loss);
      for (std::size_t p = 0; p < m.g.size(); ++p) {
        double max_ref = 0, max_err = 0;
        for (std::size_t e = 0; e < m.g[p].size(); ++e) {
          max_ref = std::max(max_ref, std::abs(ref.grads[p][e]));
          max_err = std::max(max_err, std::abs(m.g[p][e] - ref.grads[p][e]));
        }
        INFO("parameter " << p << ": max |reference| " << max_ref << ", max |error| " << max_err);
        REQUIRE(max_ref > 0);  // not a comparison of zeros
        CHECK(max_err <= kGradTolerance * max_ref);
      }
      const std::size_t layers = m.shape.layers();
      REQUIRE(layers_seen.size() == layers);
      for (std::size_t i = 0; i < layers; ++i) CHECK(layers_seen[i] == layers - 1 - i);
    }
  }
}

TEST_CASE("16-bit models: bf16 products and f16 weights against the reference of the values held") {
  // bf16: activations and output gradients are rounded to bf16 (8 significant bits) before each
  // product, so each layer adds a relative error of about 2^-8 of |y|; the output gradient is
  // y - target, much smaller than y, so that error is amplified (measured: up to 11% of the largest
  // reference element of a weight gradient), and weight gradients are rounded once more into bf16
  // slots. gemm_test checks the bf16 products themselves tightly; this catches a wrong operand,
  // order or layout (errors of 100%). f16: the weights are widened exactly and the
  // products run in fp32; only the f16 gradient slots round (11 bits). Tolerances relative to the
  // largest |reference| of each tensor, and of the loss.
  struct Case {
    zero::DType dtype;
    double grad_tolerance, loss_tolerance;
  };
  for (const Case c : {Case{zero::DType::BF16, 0.2, 2e-2}, Case{zero::DType::F16, 2e-3, 1e-4}}) {
    INFO(zero::dtype_name(c.dtype));
    Model m("mlp:64,96,33,10", 31);
    const std::size_t n = m.w.size();
    std::vector<std::vector<std::uint16_t>> w16(n), g16(n);
    std::vector<std::vector<float>> held(n);  // the values the 16-bit weights hold
    std::vector<zt::ParamView> views;
    for (std::size_t p = 0; p < n; ++p) {
      for (const float x : m.w[p]) {
        const std::uint16_t h = c.dtype == zero::DType::BF16 ? zero::half::float_to_bf16(x)
                                                             : zero::half::float_to_f16(x);
        w16[p].push_back(h);
        held[p].push_back(c.dtype == zero::DType::BF16 ? zero::half::bf16_to_float(h)
                                                       : zero::half::f16_to_float(h));
      }
      g16[p].assign(m.w[p].size(), 0x7e00);  // NaN in both: every element must be written
      views.push_back({std::as_bytes(std::span(w16[p])), c.dtype});
    }
    zt::TeacherStudentData data(m.shape, 31);
    const auto batch = data.batch(1, 0, 16);
    std::vector<std::size_t> slots_asked;
    const zt::GradSink sink{.slot = [&](std::size_t p) -> zt::GradView {
      slots_asked.push_back(p);
      return {std::as_writable_bytes(std::span(g16[p])), c.dtype};
    }};
    const double loss = zt::forward_backward(m.shape, views, batch, 4.0f, sink);
    CHECK(slots_asked == std::vector<std::size_t>{5, 4, 3, 2, 1, 0});  // bias, weight, downwards

    const std::vector<std::span<const float>> held_views(held.begin(), held.end());
    const auto ref = zero::test::reference_forward_backward(m.shape, held_views, batch, 4.0f);
    REQUIRE(ref.loss > 1e-4);
    CHECK(std::abs(loss - ref.loss) <= c.loss_tolerance * ref.loss);
    for (std::size_t p = 0; p < n; ++p) {
      double max_ref = 0, max_err = 0;
      for (std::size_t e = 0; e < g16[p].size(); ++e) {
        const double got = c.dtype == zero::DType::BF16 ? zero::half::bf16_to_float(g16[p][e])
                                                        : zero::half::f16_to_float(g16[p][e]);
        max_ref = std::max(max_ref, std::abs(ref.grads[p][e]));
        max_err = std::max(max_err, std::abs(got - ref.grads[p][e]));  // NaN fails below
      }
      INFO("parameter " << p << ": max |reference| " << max_ref << ", max |error| " << max_err);
      REQUIRE(max_ref > 0);
      CHECK(max_err <= c.grad_tolerance * max_ref);
    }
  }
}

TEST_CASE("mixed or unsupported weight dtypes and mis-sized slots are errors naming them") {
  Model m("mlp:4,6,2", 3);
  zt::TeacherStudentData data(m.shape, 3);
  const auto batch = data.batch(0, 0, 2);
  std::vector<zt::ParamView> views;
  for (const auto& w : m.w) views.push_back({std::as_bytes(std::span(w)), zero::DType::F32});
  std::vector<float> small(3);
  const zt::GradSink bad_slot{.slot = [&](std::size_t) -> zt::GradView {
    return {std::as_writable_bytes(std::span(small)), zero::DType::F32};
  }};
  REQUIRE_THROWS_WITH(zt::forward_backward(m.shape, views, batch, 1.0f, bad_slot),
                      Catch::Contains("gradient slot 3 has 12 bytes, expected 8"));
  views[1].dtype = zero::DType::F64;
  const zt::GradSink any{.slot = [&](std::size_t p) -> zt::GradView {
    return {std::as_writable_bytes(std::span(m.g[p])), zero::DType::F32};
  }};
  REQUIRE_THROWS_WITH(zt::forward_backward(m.shape, views, batch, 1.0f, any),
                      Catch::Contains("parameter 1 is fp64"));
}

TEST_CASE("a layer's gradients are final when backward hands the layer over") {
  Model m("mlp:6,12,10,4", 9);
  zt::TeacherStudentData data(m.shape, 9);
  const auto finished = m.gradients(data.batch(0, 0, 5), 1.0f);
  std::vector<std::vector<float>> seen(m.g.size());
  m.gradients(data.batch(0, 0, 5), 1.0f, {.on_layer_grads = [&](std::size_t k) {
                seen[2 * k] = m.g[2 * k];
                seen[2 * k + 1] = m.g[2 * k + 1];
                // The buffers are the callback's to reuse from here on.
                std::fill(m.g[2 * k].begin(), m.g[2 * k].end(), -1.0f);
              }});
  bool nonzero = false;
  for (std::size_t p = 0; p < finished.size(); ++p) {
    CHECK(seen[p] == finished[p]);
    for (float v : finished[p]) nonzero = nonzero || v != 0.0f;
  }
  CHECK(nonzero);
}

TEST_CASE("teacher targets do not depend on the threads or the share that computes them") {
  const auto shape = zt::MlpShape::parse("mlp:24,40,8");
  const zt::TeacherStudentData one(shape, 4, 1), three(shape, 4, 3);
  // 50 rows from sample 5: a partial block at each end and whole blocks between.
  const auto a = one.batch(1, 5, 50), b = three.batch(1, 5, 50);
  CHECK(a.targets == b.targets);
  // ... nor on the share: sample 20 alone gets what it got inside the 50.
  const auto single = three.batch(1, 20, 1);
  const std::size_t out = shape.widths.back();
  CHECK(std::vector<float>(a.targets.begin() + 15 * out, a.targets.begin() + 16 * out) ==
        single.targets);
  bool nonzero = false;
  for (float v : a.targets) nonzero = nonzero || v != 0.0f;
  CHECK(nonzero);
}

TEST_CASE("a teacher too large to keep gives the kept teacher's targets, bit for bit") {
  const auto shape = zt::MlpShape::parse("mlp:24,40,33,8");
  const zt::TeacherStudentData kept(shape, 9, 2);
  // A limit of 0 bytes: no teacher is kept; every batch() makes the layers anew.
  const zt::TeacherStudentData made(shape, 9, 2, /*resident_limit_bytes=*/0);
  const zt::TeacherStudentData made_one_thread(shape, 9, 1, 0);
  for (const auto& [first, rows] :
       {std::pair<std::uint64_t, std::size_t>{5, 50}, {16, 16}, {3, 1}}) {
    INFO("samples " << first << " + " << rows);
    const auto a = kept.batch(2, first, rows);
    const auto b = made.batch(2, first, rows);
    const auto c = made_one_thread.batch(2, first, rows);
    CHECK(a.inputs == b.inputs);
    CHECK(a.targets == b.targets);
    CHECK(a.targets == c.targets);
    CHECK(std::any_of(a.targets.begin(), a.targets.end(), [](float v) { return v != 0.0f; }));
  }
}
