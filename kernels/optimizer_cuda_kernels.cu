// The CUDA kernels of optimizer_step_cuda: one fused multi-tensor step per launch over the
// element functions of optimizer_math.h, and launch_multi_tensor_step (optimizer_cuda_launch.h);
// the same kernel with one add per array in place of the update is traffic_probe_cuda's.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_elements.cuh"
#include "kernels/optimizer_cuda_launch.h"
#include "kernels/optimizer_math.h"

namespace zero::kernels::detail {

namespace {

constexpr int kElemsPerThreadStep = 4;

// What the kernel does to one element: the optimizer's update, or the traffic probe's add.
template <OptimizerKind kKind>
struct Step {
  static __device__ void apply(const math::StepCoeffs& c, float& p, float g, float& s0, float& s1) {
    math::optimizer_update<kKind>(c, p, g, s0, s1);
  }
};
struct Probe {
  static __device__ void apply(const math::StepCoeffs&, float& p, float g, float& s0, float& s1) {
    p += g;
    s0 += g;
    s1 += g;
  }
};

// One block per chunk; within it a block-stride loop, 4 elements per thread step when aligned.
template <typename Update, int kStates>
__global__ void __launch_bounds__(kCudaThreadsPerBlock)
    multi_tensor_step_kernel(const __grid_constant__ CudaLaunchArgs args) {
  const CudaTensorSlot& t = args.tensors[args.block_slot[blockIdx.x]];
  const long long begin = static_cast<long long>(args.block_chunk[blockIdx.x]) * args.chunk_elems;
  const long long end = min(begin + args.chunk_elems, t.numel);
  const math::StepCoeffs& c = args.coeffs;
  long long scalar_begin = begin;
  if (args.vectorized) {
    const long long stride = static_cast<long long>(blockDim.x) * kElemsPerThreadStep;
    for (long long i = begin + static_cast<long long>(threadIdx.x) * kElemsPerThreadStep;
         i + kElemsPerThreadStep <= end; i += stride) {
      float p[4], g[4], s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
      load4(t.master, DType::F32, i, p);
      load4(t.grad, args.grad_dtype, i, g);
      if (kStates > 0) load4(t.state0, args.state_dtype, i, s0);
      if (kStates > 1) load4(t.state1, args.state_dtype, i, s1);
#pragma unroll
      for (int k = 0; k < 4; ++k) Update::apply(c, p[k], g[k], s0[k], s1[k]);
      store4(t.master, DType::F32, i, p);
      if (kStates > 0) store4(t.state0, args.state_dtype, i, s0);
      if (kStates > 1) store4(t.state1, args.state_dtype, i, s1);
      if (args.has_param_out) store4(t.param_out, args.param_out_dtype, i, p);
    }
    scalar_begin = begin + (end - begin) / kElemsPerThreadStep * kElemsPerThreadStep;
  }
  for (long long i = scalar_begin + threadIdx.x; i < end; i += blockDim.x) {
    float p = t.master[i];
    const float g = load_elem(t.grad, args.grad_dtype, i);
    float s0 = kStates > 0 ? load_elem(t.state0, args.state_dtype, i) : 0.0f;
    float s1 = kStates > 1 ? load_elem(t.state1, args.state_dtype, i) : 0.0f;
    Update::apply(c, p, g, s0, s1);
    t.master[i] = p;
    if (kStates > 0) store_elem(t.state0, args.state_dtype, i, s0);
    if (kStates > 1) store_elem(t.state1, args.state_dtype, i, s1);
    if (args.has_param_out) store_elem(t.param_out, args.param_out_dtype, i, p);
  }
}

// cudaGetLastError after a launch also returns the error of any earlier runtime call on this
// thread that nobody read (its caller had it as a return value): cleared first, so that a launch
// reports only its own. A sticky error (a kernel's fault) survives this and is reported.
void clear_stale_error() {
  (void)cudaGetLastError();
}

}  // namespace

CudaLaunchStatus launch_multi_tensor_step(const CudaLaunchArgs& args, int blocks, int state_count,
                                          void* stream_handle) {
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const char* name = "multi_tensor_step_kernel<?>";
  clear_stale_error();
  switch (args.coeffs.kind) {
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW:
      name = "multi_tensor_step_kernel<adam>";
      multi_tensor_step_kernel<Step<OptimizerKind::AdamW>, 2>
          <<<blocks, kCudaThreadsPerBlock, 0, stream>>>(args);
      break;
    case OptimizerKind::Adagrad:
      name = "multi_tensor_step_kernel<adagrad>";
      multi_tensor_step_kernel<Step<OptimizerKind::Adagrad>, 1>
          <<<blocks, kCudaThreadsPerBlock, 0, stream>>>(args);
      break;
    case OptimizerKind::Lion:
      name = "multi_tensor_step_kernel<lion>";
      multi_tensor_step_kernel<Step<OptimizerKind::Lion>, 1>
          <<<blocks, kCudaThreadsPerBlock, 0, stream>>>(args);
      break;
    case OptimizerKind::Sgd:
      name = "multi_tensor_step_kernel<sgd>";
      if (state_count == 1) {
        multi_tensor_step_kernel<Step<OptimizerKind::Sgd>, 1>
            <<<blocks, kCudaThreadsPerBlock, 0, stream>>>(args);
      } else {
        multi_tensor_step_kernel<Step<OptimizerKind::Sgd>, 0>
            <<<blocks, kCudaThreadsPerBlock, 0, stream>>>(args);
      }
      break;
  }
  const cudaError_t status = cudaGetLastError();
  return {name, status == cudaSuccess ? nullptr : cudaGetErrorString(status)};
}

CudaLaunchStatus launch_multi_tensor_probe(const CudaLaunchArgs& args, int blocks, int state_count,
                                           void* stream_handle) {
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const char* name = "multi_tensor_step_kernel<probe>";
  clear_stale_error();
  switch (state_count) {
    case 0:
      multi_tensor_step_kernel<Probe, 0><<<blocks, kCudaThreadsPerBlock, 0, stream>>>(args);
      break;
    case 1:
      multi_tensor_step_kernel<Probe, 1><<<blocks, kCudaThreadsPerBlock, 0, stream>>>(args);
      break;
    default:
      multi_tensor_step_kernel<Probe, 2><<<blocks, kCudaThreadsPerBlock, 0, stream>>>(args);
      break;
  }
  const cudaError_t status = cudaGetLastError();
  return {name, status == cudaSuccess ? nullptr : cudaGetErrorString(status)};
}

}  // namespace zero::kernels::detail
