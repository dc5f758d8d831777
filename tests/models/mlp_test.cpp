#include "models/mlp.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "zero/base/error.h"

namespace zt = zero::models;

namespace {

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
  zt::forward_backward(m.shape, m.weights(), batch, 1.0f, m.grads());
  const auto plain = m.g;
  zt::forward_backward(m.shape, m.weights(), batch, 1024.0f, m.grads());
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
