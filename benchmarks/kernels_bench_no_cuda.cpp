// kernels_bench_cuda.h in a build without CUDA: make_device("cuda") already refuses, so these are
// never reached from zero-bench kernels; they throw rather than link-fail.
#include "benchmarks/kernels_bench_cuda.h"
#include "zero/base/error.h"

namespace zero::bench {

double time_optimizer_step_cuda(const kernels::OptimizerHyper&, const kernels::StepScalars&,
                                std::span<const kernels::OptimizerTensors>) {
  throw Error("zero-bench kernels: this build has no CUDA");
}

double time_traffic_probe_cuda(std::span<const kernels::OptimizerTensors>, int) {
  throw Error("zero-bench kernels: this build has no CUDA");
}

}  // namespace zero::bench
