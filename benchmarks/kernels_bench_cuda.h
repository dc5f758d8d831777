// zero-bench kernels on a GPU: one multi-tensor optimizer step or traffic probe over a list of
// tensors (kernels/optimizer_cuda.h, one call over the whole list), timed on the GPU. CMake builds
// kernels_bench_cuda.cpp in a build with CUDA and kernels_bench_no_cuda.cpp (each function throws
// zero::Error) without it, so the benchmark itself has no #if.
#pragma once

#include <span>

#include "kernels/optimizer.h"

namespace zero::bench {

// Each call waits for the whole device to be idle (cudaDeviceSynchronize), records an event on
// the legacy default stream, enqueues the step (or probe) over every tensor in one
// optimizer_step_cuda (traffic_probe_cuda) call, records a second event and waits for it; returns
// the seconds between the events (cudaEventElapsedTime). The arrays hold the results on return.
// REQUIRES: the calling thread's current device is the one holding the arrays (make_device
// sets it); the arguments as optimizer_step_cuda's. Throws zero::CudaError when CUDA fails.
double time_optimizer_step_cuda(const kernels::OptimizerHyper& hyper,
                                const kernels::StepScalars& scalars,
                                std::span<const kernels::OptimizerTensors> tensors);
double time_traffic_probe_cuda(std::span<const kernels::OptimizerTensors> tensors, int state_count);

}  // namespace zero::bench
