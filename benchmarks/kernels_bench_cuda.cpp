// kernels_bench_cuda.h in a build with CUDA.
#include "benchmarks/kernels_bench_cuda.h"

#include <cuda_runtime.h>

#include "kernels/optimizer_cuda.h"
#include "zero/base/cuda_error.h"

namespace zero::bench {

namespace {

class EventPair {
 public:
  EventPair() {
    ZERO_CUDA_CHECK(cudaEventCreate(&start_));
    ZERO_CUDA_CHECK(cudaEventCreate(&end_));
  }
  ~EventPair() {
    cudaEventDestroy(start_);
    cudaEventDestroy(end_);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;

  // Seconds `enqueue` takes on the legacy default stream, from an idle device.
  template <typename F>
  double time(F&& enqueue) {
    ZERO_CUDA_CHECK(cudaDeviceSynchronize());
    ZERO_CUDA_CHECK(cudaEventRecord(start_, nullptr));
    enqueue();
    ZERO_CUDA_CHECK(cudaEventRecord(end_, nullptr));
    ZERO_CUDA_CHECK(cudaEventSynchronize(end_));
    float ms = 0;
    ZERO_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, end_));
    return static_cast<double>(ms) * 1e-3;
  }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t end_ = nullptr;
};

}  // namespace

double time_optimizer_step_cuda(const kernels::OptimizerHyper& hyper,
                                const kernels::StepScalars& scalars,
                                std::span<const kernels::OptimizerTensors> tensors) {
  EventPair events;
  return events.time([&] { kernels::optimizer_step_cuda(hyper, scalars, tensors); });
}

double time_traffic_probe_cuda(std::span<const kernels::OptimizerTensors> tensors,
                               int state_count) {
  EventPair events;
  return events.time([&] { kernels::traffic_probe_cuda(tensors, state_count); });
}

}  // namespace zero::bench
