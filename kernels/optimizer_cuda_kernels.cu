// The CUDA kernels of optimizer_step_cuda: one fused multi-tensor step per launch over the
// element functions of optimizer_math.h, and launch_multi_tensor_step (optimizer_cuda_launch.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/optimizer_cuda_launch.h"
#include "kernels/optimizer_math.h"
#include "zero/base/half.h"

namespace zero::kernels::detail {

namespace {

constexpr int kElemsPerThreadStep = 4;

// dtype is uniform across the launch, so these switches never diverge within a warp.
__device__ __forceinline__ float load_elem(const void* base, DType dtype, long long i) {
  if (dtype == DType::F32) return static_cast<const float*>(base)[i];
  const std::uint16_t bits = static_cast<const std::uint16_t*>(base)[i];
  return dtype == DType::BF16 ? half::bf16_to_float(bits) : half::f16_to_float(bits);
}

__device__ __forceinline__ void store_elem(void* base, DType dtype, long long i, float x) {
  if (dtype == DType::F32) {
    static_cast<float*>(base)[i] = x;
  } else {
    static_cast<std::uint16_t*>(base)[i] =
        dtype == DType::BF16 ? half::float_to_bf16(x) : half::float_to_f16(x);
  }
}

// i is a multiple of 4 and base is 16-byte aligned.
__device__ __forceinline__ void load4(const void* base, DType dtype, long long i, float (&x)[4]) {
  if (dtype == DType::F32) {
    const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
    x[0] = v.x;
    x[1] = v.y;
    x[2] = v.z;
    x[3] = v.w;
    return;
  }
  const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const std::uint16_t*>(base) + i);
  const std::uint16_t bits[4] = {
      static_cast<std::uint16_t>(v.x & 0xffffu), static_cast<std::uint16_t>(v.x >> 16),
      static_cast<std::uint16_t>(v.y & 0xffffu), static_cast<std::uint16_t>(v.y >> 16)};
  for (int k = 0; k < 4; ++k) {
    x[k] = dtype == DType::BF16 ? half::bf16_to_float(bits[k]) : half::f16_to_float(bits[k]);
  }
}

__device__ __forceinline__ void store4(void* base, DType dtype, long long i, const float (&x)[4]) {
  if (dtype == DType::F32) {
    *reinterpret_cast<float4*>(static_cast<float*>(base) + i) = make_float4(x[0], x[1], x[2], x[3]);
    return;
  }
  std::uint32_t bits[4];
  for (int k = 0; k < 4; ++k) {
    bits[k] = dtype == DType::BF16 ? half::float_to_bf16(x[k]) : half::float_to_f16(x[k]);
  }
  *reinterpret_cast<uint2*>(static_cast<std::uint16_t*>(base) + i) =
      make_uint2(bits[0] | (bits[1] << 16), bits[2] | (bits[3] << 16));
}

// One block per chunk; within it a block-stride loop, 4 elements per thread step when aligned.
template <OptimizerKind kKind, int kStates>
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
      for (int k = 0; k < 4; ++k) math::optimizer_update<kKind>(c, p[k], g[k], s0[k], s1[k]);
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
    math::optimizer_update<kKind>(c, p, g, s0, s1);
    t.master[i] = p;
    if (kStates > 0) store_elem(t.state0, args.state_dtype, i, s0);
    if (kStates > 1) store_elem(t.state1, args.state_dtype, i, s1);
    if (args.has_param_out) store_elem(t.param_out, args.param_out_dtype, i, p);
  }
}

}  // namespace

CudaLaunchStatus launch_multi_tensor_step(const CudaLaunchArgs& args, int blocks, int state_count,
                                          void* stream_handle) {
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const char* name = "multi_tensor_step_kernel<?>";
  switch (args.coeffs.kind) {
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW:
      name = "multi_tensor_step_kernel<adam>";
      multi_tensor_step_kernel<OptimizerKind::AdamW, 2>
          <<<blocks, kCudaThreadsPerBlock, 0, stream>>>(args);
      break;
    case OptimizerKind::Adagrad:
      name = "multi_tensor_step_kernel<adagrad>";
      multi_tensor_step_kernel<OptimizerKind::Adagrad, 1>
          <<<blocks, kCudaThreadsPerBlock, 0, stream>>>(args);
      break;
    case OptimizerKind::Lion:
      name = "multi_tensor_step_kernel<lion>";
      multi_tensor_step_kernel<OptimizerKind::Lion, 1>
          <<<blocks, kCudaThreadsPerBlock, 0, stream>>>(args);
      break;
    case OptimizerKind::Sgd:
      name = "multi_tensor_step_kernel<sgd>";
      if (state_count == 1) {
        multi_tensor_step_kernel<OptimizerKind::Sgd, 1>
            <<<blocks, kCudaThreadsPerBlock, 0, stream>>>(args);
      } else {
        multi_tensor_step_kernel<OptimizerKind::Sgd, 0>
            <<<blocks, kCudaThreadsPerBlock, 0, stream>>>(args);
      }
      break;
  }
  const cudaError_t status = cudaGetLastError();
  return {name, status == cudaSuccess ? nullptr : cudaGetErrorString(status)};
}

}  // namespace zero::kernels::detail
