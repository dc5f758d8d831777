// CudaMlp in a build without CUDA (models/CMakeLists.txt builds this file instead of
// mlp_cuda.cpp): there is no GPU model, so there is never an object to call.
#include <fmt/format.h>

#include "models/mlp_cuda.h"
#include "zero/base/error.h"

namespace zero::models {

struct CudaMlp::Impl {};

CudaMlp::CudaMlp(const MlpShape& shape, int ordinal) : shape_(shape), ordinal_(ordinal) {
  throw Error(fmt::format("CudaMlp: GPU {} asked for {}, but zero was built without CUDA", ordinal,
                          shape.to_string()));
}

CudaMlp::~CudaMlp() = default;

double CudaMlp::forward_backward(std::span<const ParamView> /*weights*/, const Batch& /*batch*/,
                                 float /*loss_scale*/, const GradSink& /*sink*/) {
  ZERO_ASSERT(impl_ != nullptr);  // unreachable: the constructor always throws
  return 0;
}

}  // namespace zero::models
