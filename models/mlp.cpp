#include "models/mlp.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>

#include "models/gemm.h"
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

// y = x · Wᵀ + b over `rows` rows: y starts as b in every row and the product is added to it.
void linear_forward(const float* x, const float* w, const float* b, float* y, std::size_t rows,
                    std::size_t in, std::size_t out, int threads) {
  for (std::size_t r = 0; r < rows; ++r) std::copy(b, b + out, y + r * out);
  gemm({.m = rows, .n = out, .k = in, .a = x, .b = w, .b_transposed = true, .c = y, .beta = 1.0f},
       threads);
}

struct Activations {
  std::vector<std::vector<float>> values;  // values[k]: input of layer k (values[0] = inputs)
  std::vector<float> output;
};

Activations run_forward(const MlpShape& shape, std::span<const std::span<const float>> weights,
                        const float* inputs, std::size_t rows, int threads) {
  const std::size_t layers = shape.layers();
  ZERO_CHECK(weights.size() == 2 * layers, "mlp: expected {} parameters, got {}", 2 * layers,
             weights.size());
  for (std::size_t k = 0; k < layers; ++k) {
    const std::size_t in = shape.widths[k], out = shape.widths[k + 1];
    ZERO_CHECK(weights[2 * k].size() == in * out && weights[2 * k + 1].size() == out,
               "mlp: parameters of layer {} have {} and {} elements, expected {} and {}", k,
               weights[2 * k].size(), weights[2 * k + 1].size(), in * out, out);
  }
  Activations a;
  a.values.resize(layers);
  a.values[0].assign(inputs, inputs + rows * shape.widths.front());
  for (std::size_t k = 0; k < layers; ++k) {
    const std::size_t in = shape.widths[k], out = shape.widths[k + 1];
    std::vector<float> y(rows * out);
    linear_forward(a.values[k].data(), weights[2 * k].data(), weights[2 * k + 1].data(), y.data(),
                   rows, in, out, threads);
    if (k + 1 < layers) {
      for (float& v : y) v = std::max(v, 0.0f);
      a.values[k + 1] = std::move(y);
    } else {
      a.output = std::move(y);
    }
  }
  return a;
}

Activations run_forward(const MlpShape& shape, std::span<const std::span<const float>> weights,
                        const Batch& batch, int threads) {
  ZERO_CHECK(batch.inputs.size() == batch.rows * shape.widths.front() &&
                 batch.targets.size() == batch.rows * shape.widths.back(),
             "mlp: a batch of {} rows has {} inputs and {} targets, expected {} and {}", batch.rows,
             batch.inputs.size(), batch.targets.size(), batch.rows * shape.widths.front(),
             batch.rows * shape.widths.back());
  return run_forward(shape, weights, batch.inputs.data(), batch.rows, threads);
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

TeacherStudentData::TeacherStudentData(const MlpShape& shape, std::uint64_t seed, int threads)
    : shape_(shape), seed_(seed), threads_(threads) {
  ZERO_CHECK(threads >= 1, "mlp: threads = {}, expected at least 1", threads);
  const auto params = mlp_params(shape);
  for (std::size_t i = 0; i < params.size(); ++i) {
    teacher_.emplace_back(params[i].numel());
    init_param(shape, i, seed, /*stream=*/1, teacher_.back());
  }
}

void TeacherStudentData::fill_inputs(std::uint64_t step, std::uint64_t first, std::size_t rows,
                                     float* out) const {
  const std::size_t in = shape_.widths.front();
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t i = 0; i < in; ++i) {
      out[r * in + i] = normal(key(seed_ ^ 0x5A17ull, step, first + r, i));
    }
  }
}

Batch TeacherStudentData::batch(std::uint64_t step, std::uint64_t first, std::size_t rows) const {
  Batch b;
  b.rows = rows;
  const std::size_t in = shape_.widths.front(), out = shape_.widths.back();
  b.inputs.resize(rows * in);
  fill_inputs(step, first, rows, b.inputs.data());
  b.targets.resize(rows * out);
  if (rows == 0) return b;

  // The teacher runs on whole blocks of kTeacherBlockRows global samples, whatever share was
  // asked for: a BLAS product's rows depend on how many rows it computes together (models/gemm.h),
  // and the targets of sample j must not depend on which rank or micro-step asked for it.
  const std::vector<std::span<const float>> w(teacher_.begin(), teacher_.end());
  const std::uint64_t end = first + rows;
  const auto first_block = static_cast<std::int64_t>(first / kTeacherBlockRows);
  const auto end_block = static_cast<std::int64_t>((end - 1) / kTeacherBlockRows + 1);
  const int team = static_cast<int>(std::min<std::int64_t>(threads_, end_block - first_block));
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
  for (std::int64_t block = first_block; block < end_block; ++block) {
    const std::uint64_t block_first = static_cast<std::uint64_t>(block) * kTeacherBlockRows;
    const std::uint64_t block_end = block_first + kTeacherBlockRows;
    std::vector<float> scratch;
    const float* x = nullptr;
    if (block_first >= first && block_end <= end) {
      x = b.inputs.data() + (block_first - first) * in;  // the block lies inside the share
    } else {
      scratch.resize(kTeacherBlockRows * in);
      fill_inputs(step, block_first, kTeacherBlockRows, scratch.data());
      x = scratch.data();
    }
    const std::vector<float> y = run_forward(shape_, w, x, kTeacherBlockRows, 1).output;
    const std::uint64_t lo = std::max(first, block_first), hi = std::min(end, block_end);
    std::copy(y.begin() + static_cast<std::ptrdiff_t>((lo - block_first) * out),
              y.begin() + static_cast<std::ptrdiff_t>((hi - block_first) * out),
              b.targets.begin() + static_cast<std::ptrdiff_t>((lo - first) * out));
  }
  return b;
}

double forward_loss(const MlpShape& shape, std::span<const std::span<const float>> weights,
                    const Batch& batch, int threads) {
  return mse(run_forward(shape, weights, batch, threads).output, batch.targets);
}

double forward_backward(const MlpShape& shape, std::span<const std::span<const float>> weights,
                        const Batch& batch, float loss_scale,
                        std::span<const std::span<float>> grads, const BackwardOptions& options) {
  const std::size_t layers = shape.layers();
  ZERO_CHECK(grads.size() == 2 * layers, "mlp: expected {} gradient buffers, got {}", 2 * layers,
             grads.size());
  for (std::size_t k = 0; k < layers; ++k) {
    const std::size_t in = shape.widths[k], out = shape.widths[k + 1];
    ZERO_CHECK(grads[2 * k].size() == in * out && grads[2 * k + 1].size() == out,
               "mlp: gradient buffers of layer {} have {} and {} elements, expected {} and {}", k,
               grads[2 * k].size(), grads[2 * k + 1].size(), in * out, out);
  }
  const int threads = options.threads;
  const Activations a = run_forward(shape, weights, batch, threads);
  const double loss = mse(a.output, batch.targets);

  // d(scale · loss)/dy = scale · (y - target) / (rows · OUT)
  const float inv_count =
      loss_scale / static_cast<float>(std::max<std::size_t>(1, a.output.size()));
  std::vector<float> dy(a.output.size());
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = (a.output[i] - batch.targets[i]) * inv_count;

  const std::size_t rows = batch.rows;
  for (std::size_t k = layers; k-- > 0;) {
    const std::size_t in = shape.widths[k], out = shape.widths[k + 1];
    const std::span<float> gw = grads[2 * k], gb = grads[2 * k + 1];
    const std::vector<float>& x = a.values[k];
    // dW = dyᵀ · x; db sums the rows in ascending order.
    gemm({.m = out,
          .n = in,
          .k = rows,
          .a = dy.data(),
          .a_transposed = true,
          .b = x.data(),
          .c = gw.data()},
         threads);
    std::fill(gb.begin(), gb.end(), 0.0f);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* dyr = dy.data() + r * out;
      for (std::size_t o = 0; o < out; ++o) gb[o] += dyr[o];
    }
    if (options.on_layer_grads) options.on_layer_grads(k);
    if (k == 0) break;
    // dx = dy · W, then through the ReLU that produced x.
    std::vector<float> dx(rows * in);
    gemm({.m = rows, .n = in, .k = out, .a = dy.data(), .b = weights[2 * k].data(), .c = dx.data()},
         threads);
    for (std::size_t i = 0; i < dx.size(); ++i) dx[i] = x[i] > 0.0f ? dx[i] : 0.0f;
    dy = std::move(dx);
  }
  return loss;
}

}  // namespace zero::models
