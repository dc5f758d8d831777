#include "models/mlp.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>

#include "zero/base/error.h"
#include "zero/base/shape.h"

namespace zero::models {

namespace {

// splitmix64: a counter-based generator, so a value depends only on its key.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::uint64_t key(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  return mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
}

// Uniform in (0, 1), 53-bit.
double unit(std::uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
}

float normal(std::uint64_t k) {
  const double u1 = unit(mix(k));
  const double u2 = unit(mix(k ^ 0xD1B54A32D192ED03ull));
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

// y[r, o] = sum_i x[r, i] * w[o, i] + b[o]
void linear_forward(const float* x, const float* w, const float* b, float* y, std::size_t rows,
                    std::size_t in, std::size_t out) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * in;
    for (std::size_t o = 0; o < out; ++o) {
      const float* wo = w + o * in;
      float acc = 0;
      for (std::size_t i = 0; i < in; ++i) acc += xr[i] * wo[i];
      y[r * out + o] = acc + b[o];
    }
  }
}

struct Activations {
  std::vector<std::vector<float>> values;  // values[k]: input of layer k (values[0] = inputs)
  std::vector<float> output;
};

Activations run_forward(const MlpShape& shape, std::span<const std::span<const float>> weights,
                        const Batch& batch) {
  const std::size_t layers = shape.layers();
  ZERO_CHECK(weights.size() == 2 * layers, "mlp: expected {} parameters, got {}", 2 * layers,
             weights.size());
  Activations a;
  a.values.resize(layers);
  a.values[0] = batch.inputs;
  for (std::size_t k = 0; k < layers; ++k) {
    const std::size_t in = shape.widths[k], out = shape.widths[k + 1];
    std::vector<float> y(batch.rows * out);
    linear_forward(a.values[k].data(), weights[2 * k].data(), weights[2 * k + 1].data(), y.data(),
                   batch.rows, in, out);
    if (k + 1 < layers) {
      for (float& v : y) v = std::max(v, 0.0f);
      a.values[k + 1] = std::move(y);
    } else {
      a.output = std::move(y);
    }
  }
  return a;
}

double mse(const std::vector<float>& y, const std::vector<float>& target) {
  double loss = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double d = static_cast<double>(y[i]) - static_cast<double>(target[i]);
    loss += 0.5 * d * d;
  }
  return y.empty() ? 0.0 : loss / static_cast<double>(y.size());
}

}  // namespace

MlpShape MlpShape::parse(const std::string& text) {
  std::string body = text;
  if (body.starts_with("mlp:")) body.erase(0, 4);
  MlpShape s;
  std::stringstream in(body);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    ZERO_CHECK(used == item.size() && !item.empty() && v > 0,
               "model '{}': '{}' is not a positive layer width; expected mlp:IN,H1,...,OUT", text,
               item);
    s.widths.push_back(static_cast<std::size_t>(v));
  }
  ZERO_CHECK(s.widths.size() >= 2,
             "model '{}': needs at least an input and an output width, "
             "e.g. mlp:64,256,10",
             text);
  return s;
}

std::string MlpShape::to_string() const {
  return fmt::format("mlp:{}", fmt::join(widths, ","));
}

std::size_t MlpParam::numel() const {
  return numel_of(shape);
}

std::vector<MlpParam> mlp_params(const MlpShape& shape) {
  std::vector<MlpParam> params;
  for (std::size_t k = 0; k < shape.layers(); ++k) {
    params.push_back({fmt::format("layers.{}.weight", k), {shape.widths[k + 1], shape.widths[k]}});
    params.push_back({fmt::format("layers.{}.bias", k), {shape.widths[k + 1]}});
  }
  return params;
}

void init_param(const MlpShape& shape, std::size_t index, std::uint64_t seed, int stream,
                std::span<float> out) {
  ZERO_CHECK(index < 2 * shape.layers(), "mlp: no parameter {}", index);
  const double fan_in = static_cast<double>(shape.widths[index / 2]);
  const double bound = 1.0 / std::sqrt(fan_in);
  for (std::size_t e = 0; e < out.size(); ++e) {
    const double u = unit(key(seed, static_cast<std::uint64_t>(stream) + 0x100, index, e));
    out[e] = static_cast<float>((2.0 * u - 1.0) * bound);
  }
}

TeacherStudentData::TeacherStudentData(const MlpShape& shape, std::uint64_t seed)
    : shape_(shape), seed_(seed) {
  const auto params = mlp_params(shape);
  for (std::size_t i = 0; i < params.size(); ++i) {
    teacher_.emplace_back(params[i].numel());
    init_param(shape, i, seed, /*stream=*/1, teacher_.back());
  }
}

Batch TeacherStudentData::batch(std::uint64_t step, std::uint64_t first, std::size_t rows) const {
  Batch b;
  b.rows = rows;
  const std::size_t in = shape_.widths.front();
  b.inputs.resize(rows * in);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t i = 0; i < in; ++i) {
      b.inputs[r * in + i] = normal(key(seed_ ^ 0x5A17ull, step, first + r, i));
    }
  }
  std::vector<std::span<const float>> w(teacher_.begin(), teacher_.end());
  b.targets = run_forward(shape_, w, b).output;
  return b;
}

double forward_loss(const MlpShape& shape, std::span<const std::span<const float>> weights,
                    const Batch& batch) {
  return mse(run_forward(shape, weights, batch).output, batch.targets);
}

double forward_backward(const MlpShape& shape, std::span<const std::span<const float>> weights,
                        const Batch& batch, float loss_scale,
                        std::span<const std::span<float>> grads) {
  const std::size_t layers = shape.layers();
  ZERO_CHECK(grads.size() == 2 * layers, "mlp: expected {} gradient buffers, got {}", 2 * layers,
             grads.size());
  const Activations a = run_forward(shape, weights, batch);
  const double loss = mse(a.output, batch.targets);

  // d(scale · loss)/dy = scale · (y - target) / (rows · OUT)
  const float inv_count =
      loss_scale / static_cast<float>(std::max<std::size_t>(1, a.output.size()));
  std::vector<float> dy(a.output.size());
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = (a.output[i] - batch.targets[i]) * inv_count;

  for (std::size_t k = layers; k-- > 0;) {
    const std::size_t in = shape.widths[k], out = shape.widths[k + 1];
    const std::span<float> gw = grads[2 * k], gb = grads[2 * k + 1];
    ZERO_CHECK(gw.size() == in * out && gb.size() == out,
               "mlp: gradient buffers of layer {} have {} and {} elements, expected {} and {}", k,
               gw.size(), gb.size(), in * out, out);
    const std::vector<float>& x = a.values[k];
    // Rows are summed in ascending order for every element; the loops run over contiguous
    // memory innermost so they vectorise without reordering any sum.
    std::fill(gw.begin(), gw.end(), 0.0f);
    std::fill(gb.begin(), gb.end(), 0.0f);
    for (std::size_t r = 0; r < batch.rows; ++r) {
      const float* xr = x.data() + r * in;
      for (std::size_t o = 0; o < out; ++o) {
        const float d = dy[r * out + o];
        gb[o] += d;
        float* gwo = gw.data() + o * in;
        for (std::size_t i = 0; i < in; ++i) gwo[i] += d * xr[i];
      }
    }
    if (k == 0) break;
    // dx = dy · W, then through the ReLU that produced x.
    std::vector<float> dx(batch.rows * in, 0.0f);
    const float* w = weights[2 * k].data();
    for (std::size_t r = 0; r < batch.rows; ++r) {
      float* dxr = dx.data() + r * in;
      for (std::size_t o = 0; o < out; ++o) {
        const float d = dy[r * out + o];
        const float* wo = w + o * in;
        for (std::size_t i = 0; i < in; ++i) dxr[i] += d * wo[i];
      }
      const float* xr = x.data() + r * in;
      for (std::size_t i = 0; i < in; ++i) dxr[i] = xr[i] > 0.0f ? dxr[i] : 0.0f;
    }
    dy = std::move(dx);
  }
  return loss;
}

}  // namespace zero::models
