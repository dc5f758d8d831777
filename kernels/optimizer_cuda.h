// Optimizer step on the GPU: multi-tensor apply over a list of partitions, one fused kernel per
// launch, the same element functions as the CPU driver (so results agree bitwise with
// optimizer_step_cpu: nvcc builds with --fmad=false and IEEE sqrt/division).
#pragma once

#include <span>

#include "kernels/optimizer.h"

namespace zero::kernels {

struct CudaExec {
  void* stream = nullptr;  // cudaStream_t; null = the legacy default stream
};

// Enqueues the step for every tensor on exec.stream and returns; the arrays may be read once the
// stream reaches this point. All tensors share grad_dtype, state_dtype, and either all or none
// have a param_out of the same dtype. REQUIRES: device pointers, each naturally aligned (16-byte
// alignment of every array enables vector loads). Throws zero::Error for bad arguments and
// zero::CudaError naming the kernel when a launch fails.
void optimizer_step_cuda(const OptimizerHyper& hyper, const StepScalars& scalars,
                         std::span<const OptimizerTensors> tensors, const CudaExec& exec = {});

// The memory roofline of that step (traffic_probe.h's, on the GPU): the same kernel, launches
// and accesses with one add per array in place of the update; the arrays' values become
// meaningless. Enqueued on exec.stream like the step. `state_count` as optimizer_state_count().
void traffic_probe_cuda(const OptimizerTensors& tensors, int state_count,
                        const CudaExec& exec = {});
// The same over a list of tensors, planned into launches as optimizer_step_cuda plans that list
// (the roofline of one multi-tensor step). The tensors share dtypes as optimizer_step_cuda's do.
void traffic_probe_cuda(std::span<const OptimizerTensors> tensors, int state_count,
                        const CudaExec& exec = {});

}  // namespace zero::kernels
