#include "models/mlp_checks.h"

#include "zero/base/error.h"

namespace zero::models {

void check_weights(const MlpShape& shape, std::span<const ParamView> weights) {
  const std::size_t layers = shape.layers();
  ZERO_CHECK(weights.size() == 2 * layers, "mlp: expected {} parameters, got {}", 2 * layers,
             weights.size());
  const DType t = weights.front().dtype;
  ZERO_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16,
             "mlp: weights in {}; expected fp32, bf16 or fp16", dtype_name(t));
  for (std::size_t k = 0; k < layers; ++k) {
    const std::size_t in = shape.widths[k], out = shape.widths[k + 1];
    for (std::size_t i : {2 * k, 2 * k + 1}) {
      ZERO_CHECK(weights[i].dtype == t, "mlp: parameter {} is {}, parameter 0 is {}", i,
                 dtype_name(weights[i].dtype), dtype_name(t));
    }
    const std::size_t size = dtype_size(t);
    ZERO_CHECK(weights[2 * k].bytes.size() == in * out * size &&
                   weights[2 * k + 1].bytes.size() == out * size,
               "mlp: parameters of layer {} have {} and {} bytes, expected {} and {} ({})", k,
               weights[2 * k].bytes.size(), weights[2 * k + 1].bytes.size(), in * out * size,
               out * size, dtype_name(t));
  }
}

void check_batch(const MlpShape& shape, const Batch& batch) {
  ZERO_CHECK(batch.inputs.size() == batch.rows * shape.widths.front() &&
                 batch.targets.size() == batch.rows * shape.widths.back(),
             "mlp: a batch of {} rows has {} inputs and {} targets, expected {} and {}", batch.rows,
             batch.inputs.size(), batch.targets.size(), batch.rows * shape.widths.front(),
             batch.rows * shape.widths.back());
}

GradView checked_slot(const GradSink& sink, std::size_t i, std::size_t numel) {
  const GradView g = sink.slot(i);
  ZERO_CHECK(g.dtype == DType::F32 || g.dtype == DType::BF16 || g.dtype == DType::F16,
             "mlp: gradient slot {} is {}; expected fp32, bf16 or fp16", i, dtype_name(g.dtype));
  ZERO_CHECK(g.bytes.size() == numel * dtype_size(g.dtype),
             "mlp: gradient slot {} has {} bytes, expected {} ({} elements of {})", i,
             g.bytes.size(), numel * dtype_size(g.dtype), numel, dtype_name(g.dtype));
  return g;
}

}  // namespace zero::models
