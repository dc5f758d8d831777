// The argument checks of models::forward_backward, shared by the CPU model (mlp.cpp) and the GPU
// one (mlp_cuda.cu) so both refuse the same inputs with the same messages. They look at sizes and
// dtypes only, never at the bytes, so the views may point to device memory.
#pragma once

#include <cstddef>
#include <span>

#include "models/mlp.h"

namespace zero::models {

// Throws zero::Error unless `weights` holds the shape's 2 × layers parameters, all of one dtype
// (F32, BF16 or F16), each with its parameter's byte size.
void check_weights(const MlpShape& shape, std::span<const ParamView> weights);

// Throws zero::Error unless the batch holds rows × IN inputs and rows × OUT targets.
void check_batch(const MlpShape& shape, const Batch& batch);

// sink.slot(i), checked to be F32, BF16 or F16 and `numel` elements long (throws zero::Error).
GradView checked_slot(const GradSink& sink, std::size_t i, std::size_t numel);

}  // namespace zero::models
