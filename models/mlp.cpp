#include "models/mlp.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <sstream>

#include "models/gemm.h"
#include "models/mlp_checks.h"
#include "zero/base/error.h"
#include "zero/base/half.h"
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

float load(const std::byte* p, DType t, std::size_t e) {
  switch (t) {
    case DType::BF16: {
      std::uint16_t h;
      std::memcpy(&h, p + 2 * e, 2);
      return half::bf16_to_float(h);
    }
    case DType::F16: {
      std::uint16_t h;
      std::memcpy(&h, p + 2 * e, 2);
      return half::f16_to_float(h);
    }
    default: {
      float f;
      std::memcpy(&f, p + 4 * e, 4);
      return f;
    }
  }
}

// Rounds n fp32 values into `out` (F32, BF16 or F16).
void store(const float* in, std::size_t n, std::byte* out, DType t) {
  if (t == DType::F32) {
    std::memcpy(out, in, n * sizeof(float));
    return;
  }
  for (std::size_t e = 0; e < n; ++e) {
    const std::uint16_t h =
        t == DType::BF16 ? half::float_to_bf16(in[e]) : half::float_to_f16(in[e]);
    std::memcpy(out + 2 * e, &h, 2);
  }
}

std::vector<std::uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = half::float_to_bf16(v[i]);
  return out;
}

// The precision of the products for weights of dtype t (the CPU has no fp16 product).
DType compute_type(DType t) {
  return t == DType::BF16 ? DType::BF16 : DType::F32;
}

struct Activations {
  DType compute = DType::F32;
  std::vector<std::vector<float>> values;           // values[k]: input of layer k (k = 0: inputs)
  std::vector<std::vector<std::uint16_t>> rounded;  // values[k] in bf16, for bf16 products
  std::vector<std::vector<float>> widened;          // fp16 weights as fp32, for fp32 products
  std::vector<float> output;

  // Layer k's weight as a product operand (compute precision).
  const void* weight(std::span<const ParamView> weights, std::size_t k) const {
    return widened.empty() ? static_cast<const void*>(weights[2 * k].bytes.data())
                           : static_cast<const void*>(widened[k].data());
  }
  const void* input(std::size_t k) const {
    return compute == DType::BF16 ? static_cast<const void*>(rounded[k].data())
                                  : static_cast<const void*>(values[k].data());
  }
};

struct DenseShape {
  std::size_t rows = 0, in = 0, out = 0;
  DType compute = DType::F32;  // of the product's operands
  bool relu = false;
};

// y = x · Wᵀ, then + b in every row, then the ReLU if asked: rows × out fp32 values. x and W in
// the compute precision, the bias in its view's dtype.
std::vector<float> dense(const DenseShape& d, const void* x, const void* w, const ParamView& bias,
                         int threads) {
  std::vector<float> y(d.rows * d.out);
  gemm({.m = d.rows,
        .n = d.out,
        .k = d.in,
        .a = x,
        .b = w,
        .b_transposed = true,
        .c = y.data(),
        .inputs = d.compute},
       threads);
  for (std::size_t o = 0; o < d.out; ++o) {
    const float b = load(bias.bytes.data(), bias.dtype, o);
    for (std::size_t r = 0; r < d.rows; ++r) y[r * d.out + o] += b;
  }
  if (d.relu) {
    for (float& v : y) v = std::max(v, 0.0f);
  }
  return y;
}

Activations run_forward(const MlpShape& shape, std::span<const ParamView> weights,
                        const float* inputs, std::size_t rows, int threads,
                        const std::function<void(std::size_t)>& after_layer = nullptr) {
  check_weights(shape, weights);
  const std::size_t layers = shape.layers();
  const DType stored = weights.front().dtype;
  Activations a;
  a.compute = compute_type(stored);
  a.values.resize(layers);
  a.values[0].assign(inputs, inputs + rows * shape.widths.front());
  if (a.compute == DType::BF16) a.rounded.resize(layers);
  if (stored == DType::F16) {
    for (std::size_t k = 0; k < layers; ++k) {
      const ParamView& w = weights[2 * k];
      std::vector<float>& wide = a.widened.emplace_back(w.bytes.size() / 2);
      for (std::size_t e = 0; e < wide.size(); ++e) wide[e] = load(w.bytes.data(), stored, e);
    }
  }
  for (std::size_t k = 0; k < layers; ++k) {
    if (a.compute == DType::BF16) a.rounded[k] = to_bf16(a.values[k]);
    std::vector<float> y = dense({.rows = rows,
                                  .in = shape.widths[k],
                                  .out = shape.widths[k + 1],
                                  .compute = a.compute,
                                  .relu = k + 1 < layers},
                                 a.input(k), a.weight(weights, k), weights[2 * k + 1], threads);
    if (k + 1 < layers) {
      a.values[k + 1] = std::move(y);
    } else {
      a.output = std::move(y);
    }
    if (after_layer) after_layer(k);
  }
  return a;
}

std::vector<ParamView> f32_views(std::span<const std::span<const float>> weights) {
  std::vector<ParamView> views;
  for (const auto& w : weights) views.push_back({std::as_bytes(w), DType::F32});
  return views;
}

Activations run_forward(const MlpShape& shape, std::span<const ParamView> weights,
                        const Batch& batch, int threads,
                        const std::function<void(std::size_t)>& after_layer = nullptr) {
  check_batch(shape, batch);
  return run_forward(shape, weights, batch.inputs.data(), batch.rows, threads, after_layer);
}

// The weight operand of layer k's input gradient: the widened fp16 copy, forward's view, or the
// view the sink hands back (checked against forward's: a gathered-again unit may move).
const void* backward_weight(const Activations& a, std::span<const ParamView> weights,
                            const GradSink& sink, std::size_t k) {
  if (!a.widened.empty() || !sink.backward_weight) return a.weight(weights, k);
  const ParamView w = sink.backward_weight(k);
  const ParamView& forward = weights[2 * k];
  ZERO_CHECK(w.dtype == forward.dtype && w.bytes.size() == forward.bytes.size(),
             "mlp: backward_weight({}) gave {} bytes of {}, forward read {} bytes of {}", k,
             w.bytes.size(), dtype_name(w.dtype), forward.bytes.size(),
             dtype_name(forward.dtype));
  return w.bytes.data();
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
                std::span<float> out, std::size_t first) {
  ZERO_CHECK(index < 2 * shape.layers(), "mlp: no parameter {}", index);
  const double fan_in = static_cast<double>(shape.widths[index / 2]);
  const double bound = 1.0 / std::sqrt(fan_in);
  for (std::size_t e = 0; e < out.size(); ++e) {
    const double u = unit(key(seed, static_cast<std::uint64_t>(stream) + 0x100, index, first + e));
    out[e] = static_cast<float>((2.0 * u - 1.0) * bound);
  }
}

TeacherStudentData::TeacherStudentData(const MlpShape& shape, std::uint64_t seed, int threads,
                                       std::size_t resident_limit_bytes)
    : shape_(shape), seed_(seed), threads_(threads) {
  ZERO_CHECK(threads >= 1, "mlp: threads = {}, expected at least 1", threads);
  const auto params = mlp_params(shape);
  std::size_t bytes = 0;
  for (const MlpParam& p : params) bytes += p.numel() * sizeof(float);
  if (bytes > resident_limit_bytes) return;  // made layer by layer in batch()
  for (std::size_t i = 0; i < params.size(); ++i) {
    teacher_.emplace_back(params[i].numel());
    init_param(shape, i, seed, /*stream=*/1, teacher_.back());
  }
}

std::vector<float> TeacherStudentData::teacher_param(std::size_t index) const {
  std::vector<float> out(mlp_params(shape_)[index].numel());
  // In pieces over the threads; an element's value depends on its index only.
  const auto count = static_cast<std::int64_t>(threads_);
  const std::size_t piece =
      (out.size() + static_cast<std::size_t>(threads_) - 1) / static_cast<std::size_t>(threads_);
#pragma omp parallel for schedule(static) num_threads(threads_) if (threads_ > 1)
  for (std::int64_t t = 0; t < count; ++t) {
    const std::size_t lo = std::min(out.size(), static_cast<std::size_t>(t) * piece);
    const std::size_t hi = std::min(out.size(), lo + piece);
    init_param(shape_, index, seed_, /*stream=*/1, std::span(out).subspan(lo, hi - lo), lo);
  }
  return out;
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
  // asked for: a product's rows depend on how many rows it computes together (models/gemm.h),
  // and the targets of sample j must not depend on which rank or micro-step asked for it.
  const std::uint64_t end = first + rows;
  const auto first_block = static_cast<std::int64_t>(first / kTeacherBlockRows);
  const auto end_block = static_cast<std::int64_t>((end - 1) / kTeacherBlockRows + 1);
  const int team = static_cast<int>(std::min<std::int64_t>(threads_, end_block - first_block));
  // Block `block`'s inputs: a slice of the share's, or generated when the share cuts the block.
  auto block_inputs = [&](std::int64_t block) {
    const std::uint64_t block_first = static_cast<std::uint64_t>(block) * kTeacherBlockRows;
    std::vector<float> x(kTeacherBlockRows * in);
    if (block_first >= first && block_first + kTeacherBlockRows <= end) {
      const float* from = b.inputs.data() + (block_first - first) * in;
      std::copy(from, from + x.size(), x.begin());
    } else {
      fill_inputs(step, block_first, kTeacherBlockRows, x.data());
    }
    return x;
  };
  auto keep_targets = [&](std::int64_t block, const std::vector<float>& y) {
    const std::uint64_t block_first = static_cast<std::uint64_t>(block) * kTeacherBlockRows;
    const std::uint64_t lo = std::max(first, block_first);
    const std::uint64_t hi = std::min(end, block_first + kTeacherBlockRows);
    std::copy(y.begin() + static_cast<std::ptrdiff_t>((lo - block_first) * out),
              y.begin() + static_cast<std::ptrdiff_t>((hi - block_first) * out),
              b.targets.begin() + static_cast<std::ptrdiff_t>((lo - first) * out));
  };

  if (!teacher_.empty()) {
    const std::vector<std::span<const float>> teacher(teacher_.begin(), teacher_.end());
    const std::vector<ParamView> w = f32_views(teacher);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
    for (std::int64_t block = first_block; block < end_block; ++block) {
      const std::vector<float> x = block_inputs(block);
      keep_targets(block, run_forward(shape_, w, x.data(), kTeacherBlockRows, 1).output);
    }
    return b;
  }

  // A teacher too large to keep: layer by layer, each layer made once and applied to every block
  // with the products run_forward makes (the same bits).
  std::vector<std::vector<float>> xs(static_cast<std::size_t>(end_block - first_block));
  for (std::int64_t block = first_block; block < end_block; ++block) {
    xs[static_cast<std::size_t>(block - first_block)] = block_inputs(block);
  }
  const std::size_t layers = shape_.layers();
  for (std::size_t k = 0; k < layers; ++k) {
    const std::vector<float> w = teacher_param(2 * k);
    const std::vector<float> bias = teacher_param(2 * k + 1);
    const DenseShape d{.rows = kTeacherBlockRows,
                       .in = shape_.widths[k],
                       .out = shape_.widths[k + 1],
                       .compute = DType::F32,
                       .relu = k + 1 < layers};
    const ParamView bias_view{std::as_bytes(std::span(bias)), DType::F32};
    const auto blocks = static_cast<std::int64_t>(xs.size());
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
    for (std::int64_t i = 0; i < blocks; ++i) {
      std::vector<float>& x = xs[static_cast<std::size_t>(i)];
      x = dense(d, x.data(), w.data(), bias_view, 1);
    }
  }
  for (std::int64_t block = first_block; block < end_block; ++block) {
    keep_targets(block, xs[static_cast<std::size_t>(block - first_block)]);
  }
  return b;
}

double forward_loss(const MlpShape& shape, std::span<const std::span<const float>> weights,
                    const Batch& batch, int threads) {
  const std::vector<ParamView> views = f32_views(weights);
  return mse(run_forward(shape, views, batch, threads).output, batch.targets);
}

double forward_backward(const MlpShape& shape, std::span<const ParamView> weights,
                        const Batch& batch, float loss_scale, const GradSink& sink,
                        int threads) {
  ZERO_CHECK(static_cast<bool>(sink.slot), "mlp: forward_backward needs GradSink::slot");
  const std::size_t layers = shape.layers();
  Activations a = run_forward(shape, weights, batch, threads, sink.on_layer_forward);
  const double loss = mse(a.output, batch.targets);

  // d(scale · loss)/dy = scale · (y - target) / (rows · OUT)
  const float inv_count =
      loss_scale / static_cast<float>(std::max<std::size_t>(1, a.output.size()));
  std::vector<float> dy(a.output.size());
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = (a.output[i] - batch.targets[i]) * inv_count;

  const std::size_t rows = batch.rows;
  std::vector<float> sums, scratch;
  for (std::size_t k = layers; k-- > 0;) {
    const std::size_t in = shape.widths[k], out = shape.widths[k + 1];
    std::vector<std::uint16_t> dy_rounded;
    if (a.compute == DType::BF16) dy_rounded = to_bf16(dy);
    const void* dy_operand = a.compute == DType::BF16 ? static_cast<const void*>(dy_rounded.data())
                                                      : static_cast<const void*>(dy.data());

    // db sums the rows in ascending order, in fp32.
    const GradView gb = checked_slot(sink, 2 * k + 1, out);
    sums.assign(out, 0.0f);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* dyr = dy.data() + r * out;
      for (std::size_t o = 0; o < out; ++o) sums[o] += dyr[o];
    }
    store(sums.data(), out, gb.bytes.data(), gb.dtype);

    // dW = dyᵀ · x, straight into an f32 or bf16 slot, through fp32 into an f16 one.
    const GradView gw = checked_slot(sink, 2 * k, in * out);
    const bool direct = gw.dtype != DType::F16;
    if (!direct) scratch.resize(in * out);
    gemm({.m = out,
          .n = in,
          .k = rows,
          .a = dy_operand,
          .a_transposed = true,
          .b = a.input(k),
          .c = direct ? static_cast<void*>(gw.bytes.data()) : scratch.data(),
          .inputs = a.compute,
          .output = direct ? gw.dtype : DType::F32},
         threads);
    if (!direct) store(scratch.data(), in * out, gw.bytes.data(), gw.dtype);

    // dx = dy · W, then through the ReLU that produced x; then layer k's weights are done with.
    std::vector<float> dx;
    if (k > 0) {
      dx.resize(rows * in);
      gemm({.m = rows,
            .n = in,
            .k = out,
            .a = dy_operand,
            .b = backward_weight(a, weights, sink, k),
            .c = dx.data(),
            .inputs = a.compute},
           threads);
      const std::vector<float>& x = a.values[k];
      for (std::size_t i = 0; i < dx.size(); ++i) dx[i] = x[i] > 0.0f ? dx[i] : 0.0f;
    }
    if (sink.on_layer_grads) sink.on_layer_grads(k);
    dy = std::move(dx);
  }
  return loss;
}

double forward_backward(const MlpShape& shape, std::span<const std::span<const float>> weights,
                        const Batch& batch, float loss_scale,
                        std::span<const std::span<float>> grads, const BackwardOptions& options) {
  ZERO_CHECK(grads.size() == 2 * shape.layers(), "mlp: expected {} gradient buffers, got {}",
             2 * shape.layers(), grads.size());
  const std::vector<ParamView> views = f32_views(weights);
  const GradSink sink{.slot = [&](std::size_t i) -> GradView {
                        return {std::as_writable_bytes(grads[i]), DType::F32};
                      },
                      .on_layer_grads = options.on_layer_grads};
  return forward_backward(shape, views, batch, loss_scale, sink, options.threads);
}

}  // namespace zero::models
