// A naive reference for the teacher-student MLP (models/mlp.h): plain loops, every sum in double,
// so it shares no code and no rounding with the oneDNN model it checks. Test-only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "models/mlp.h"

namespace zero::test {

struct ReferenceResult {
  double loss = 0;
  std::vector<std::vector<double>> grads;  // mlp_params order, × loss_scale
};

// Forward and backward of models::forward_backward's MLP for the given inputs and targets.
inline ReferenceResult reference_forward_backward(const models::MlpShape& shape,
                                                  std::span<const std::span<const float>> weights,
                                                  const models::Batch& batch, double loss_scale) {
  const std::size_t layers = shape.layers();
  const std::size_t rows = batch.rows;
  // acts[k]: input of layer k, rows × widths[k]; acts[layers]: the output.
  std::vector<std::vector<double>> acts(layers + 1);
  acts[0].assign(batch.inputs.begin(), batch.inputs.end());
  for (std::size_t k = 0; k < layers; ++k) {
    const std::size_t in = shape.widths[k], out = shape.widths[k + 1];
    const std::span<const float> w = weights[2 * k], b = weights[2 * k + 1];
    acts[k + 1].assign(rows * out, 0.0);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t o = 0; o < out; ++o) {
        double acc = b[o];
        for (std::size_t i = 0; i < in; ++i) acc += acts[k][r * in + i] * w[o * in + i];
        acts[k + 1][r * out + o] = k + 1 < layers ? std::max(acc, 0.0) : acc;
      }
    }
  }
  ReferenceResult result;
  const std::vector<double>& y = acts[layers];
  std::vector<double> dy(y.size());
  for (std::size_t j = 0; j < y.size(); ++j) {
    const double d = y[j] - static_cast<double>(batch.targets[j]);
    result.loss += 0.5 * d * d;
    dy[j] = d * loss_scale / static_cast<double>(y.size());
  }
  result.loss /= static_cast<double>(y.size());

  result.grads.resize(2 * layers);
  for (std::size_t k = layers; k-- > 0;) {
    const std::size_t in = shape.widths[k], out = shape.widths[k + 1];
    std::vector<double>& gw = result.grads[2 * k];
    std::vector<double>& gb = result.grads[2 * k + 1];
    gw.assign(in * out, 0.0);
    gb.assign(out, 0.0);
    std::vector<double> dx(rows * in, 0.0);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t o = 0; o < out; ++o) {
        const double d = dy[r * out + o];
        gb[o] += d;
        for (std::size_t i = 0; i < in; ++i) {
          gw[o * in + i] += d * acts[k][r * in + i];
          dx[r * in + i] += d * weights[2 * k][o * in + i];
        }
      }
    }
    for (std::size_t j = 0; j < dx.size(); ++j) dx[j] = acts[k][j] > 0.0 ? dx[j] : 0.0;
    dy = std::move(dx);
  }
  return result;
}

}  // namespace zero::test
