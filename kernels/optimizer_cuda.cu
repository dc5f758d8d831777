#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/multi_tensor.h"
#include "kernels/optimizer_cuda.h"
#include "kernels/optimizer_math.h"
#include "zero/error.h"

namespace zero::kernels {

namespace {

// FusedAdam's shape (SPEC_DEEPSPEED.md §6.2): 64 Ki-element chunks, 512 threads, ILP 4.
constexpr int kThreadsPerBlock = 512;
constexpr int kElemsPerThreadStep = 4;
constexpr int kMaxTensorsPerLaunch = 24;
constexpr int kMaxBlocksPerLaunch = 320;
constexpr std::size_t kChunkElems = 65536;

struct TensorSlot {
  float* master;
  const void* grad;
  void* state0;
  void* state1;
  void* param_out;
  long long numel;
};

// Passed by value as the kernel parameter (__grid_constant__: read in place, never copied).
struct LaunchArgs {
  math::StepCoeffs coeffs;
  TensorSlot tensors[kMaxTensorsPerLaunch];
  std::int32_t block_slot[kMaxBlocksPerLaunch];
  std::int32_t block_chunk[kMaxBlocksPerLaunch];
  long long chunk_elems;
  DType grad_dtype;
  DType state_dtype;
  DType param_out_dtype;
  bool has_param_out;
  bool vectorized;  // every array 16-byte aligned: 4 elements per access
};
static_assert(sizeof(LaunchArgs) <= 4096, "kernel parameters are limited to 4 KiB");

// dtype is uniform across the launch, so these switches never diverge within a warp.
__device__ __forceinline__ float load_elem(const void* base, DType dtype, long long i) {
  if (dtype == DType::F32) return static_cast<const float*>(base)[i];
  const std::uint16_t bits = static_cast<const std::uint16_t*>(base)[i];
  return dtype == DType::BF16 ? math::bf16_to_float(bits) : math::f16_to_float(bits);
}

__device__ __forceinline__ void store_elem(void* base, DType dtype, long long i, float x) {
  if (dtype == DType::F32) {
    static_cast<float*>(base)[i] = x;
  } else {
    static_cast<std::uint16_t*>(base)[i] =
        dtype == DType::BF16 ? math::float_to_bf16(x) : math::float_to_f16(x);
  }
}

// i is a multiple of 4 and base is 16-byte aligned.
__device__ __forceinline__ void load4(const void* base, DType dtype, long long i, float (&x)[4]) {
  if (dtype == DType::F32) {
    const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
    x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
    return;
  }
  const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const std::uint16_t*>(base) + i);
  const std::uint16_t bits[4] = {static_cast<std::uint16_t>(v.x & 0xffffu), static_cast<std::uint16_t>(v.x >> 16),
                                 static_cast<std::uint16_t>(v.y & 0xffffu), static_cast<std::uint16_t>(v.y >> 16)};
  for (int k = 0; k < 4; ++k) {
    x[k] = dtype == DType::BF16 ? math::bf16_to_float(bits[k]) : math::f16_to_float(bits[k]);
  }
}

__device__ __forceinline__ void store4(void* base, DType dtype, long long i, const float (&x)[4]) {
  if (dtype == DType::F32) {
    *reinterpret_cast<float4*>(static_cast<float*>(base) + i) = make_float4(x[0], x[1], x[2], x[3]);
    return;
  }
  std::uint32_t bits[4];
  for (int k = 0; k < 4; ++k) {
    bits[k] = dtype == DType::BF16 ? math::float_to_bf16(x[k]) : math::float_to_f16(x[k]);
  }
  *reinterpret_cast<uint2*>(static_cast<std::uint16_t*>(base) + i) =
      make_uint2(bits[0] | (bits[1] << 16), bits[2] | (bits[3] << 16));
}

template <OptimizerKind kKind, int kStates>
__global__ void __launch_bounds__(kThreadsPerBlock)
    multi_tensor_step_kernel(const __grid_constant__ LaunchArgs args) {
  const TensorSlot& t = args.tensors[args.block_slot[blockIdx.x]];
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

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

void launch(const LaunchArgs& args, int blocks, OptimizerKind kind, int states, cudaStream_t stream) {
  const char* name = "?";
  switch (kind) {
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW:
      name = "multi_tensor_step_kernel<adam>";
      multi_tensor_step_kernel<OptimizerKind::AdamW, 2><<<blocks, kThreadsPerBlock, 0, stream>>>(args);
      break;
    case OptimizerKind::Adagrad:
      name = "multi_tensor_step_kernel<adagrad>";
      multi_tensor_step_kernel<OptimizerKind::Adagrad, 1><<<blocks, kThreadsPerBlock, 0, stream>>>(args);
      break;
    case OptimizerKind::Lion:
      name = "multi_tensor_step_kernel<lion>";
      multi_tensor_step_kernel<OptimizerKind::Lion, 1><<<blocks, kThreadsPerBlock, 0, stream>>>(args);
      break;
    case OptimizerKind::Sgd:
      name = "multi_tensor_step_kernel<sgd>";
      if (states == 1) {
        multi_tensor_step_kernel<OptimizerKind::Sgd, 1><<<blocks, kThreadsPerBlock, 0, stream>>>(args);
      } else {
        multi_tensor_step_kernel<OptimizerKind::Sgd, 0><<<blocks, kThreadsPerBlock, 0, stream>>>(args);
      }
      break;
  }
  const cudaError_t status = cudaGetLastError();
  ZERO_CHECK_AS(CudaError, status == cudaSuccess, "{} with {} blocks: {}", name, blocks,
                cudaGetErrorString(status));
}

}  // namespace

void optimizer_step_cuda(const OptimizerHyper& hyper, const StepScalars& scalars,
                         std::span<const OptimizerTensors> tensors, const CudaExec& exec) {
  const math::StepCoeffs coeffs = make_step_coeffs(hyper, scalars);
  if (tensors.empty()) return;
  const int states = optimizer_state_count(hyper);
  const OptimizerTensors& first = tensors.front();
  std::vector<std::size_t> numels;
  numels.reserve(tensors.size());
  bool vectorized = true;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const OptimizerTensors& t = tensors[i];
    validate_tensors(hyper, t);
    ZERO_CHECK(t.grad_dtype == first.grad_dtype && t.state_dtype == first.state_dtype,
               "{} on cuda: tensor {} has grad/state dtypes {}/{}, tensor 0 has {}/{}",
               optimizer_name(hyper.kind), i, dtype_name(t.grad_dtype), dtype_name(t.state_dtype),
               dtype_name(first.grad_dtype), dtype_name(first.state_dtype));
    ZERO_CHECK((t.param_out == nullptr) == (first.param_out == nullptr) &&
                   (t.param_out == nullptr || t.param_out_dtype == first.param_out_dtype),
               "{} on cuda: tensor {} differs from tensor 0 in its param_out",
               optimizer_name(hyper.kind), i);
    numels.push_back(t.numel);
    const void* arrays[] = {t.master, t.grad, states > 0 ? t.state0 : nullptr,
                            states > 1 ? t.state1 : nullptr, t.param_out};
    for (const void* a : arrays) vectorized = vectorized && aligned16(a);
  }
  const MultiTensorLimits limits{kChunkElems, kMaxTensorsPerLaunch, kMaxBlocksPerLaunch};
  const auto stream = static_cast<cudaStream_t>(exec.stream);
  for (const MultiTensorLaunch& plan : plan_multi_tensor_launches(numels, limits)) {
    LaunchArgs args{};
    args.coeffs = coeffs;
    args.chunk_elems = static_cast<long long>(kChunkElems);
    args.grad_dtype = first.grad_dtype;
    args.state_dtype = first.state_dtype;
    args.param_out_dtype = first.param_out_dtype;
    args.has_param_out = first.param_out != nullptr;
    args.vectorized = vectorized;
    for (std::size_t slot = 0; slot < plan.tensors.size(); ++slot) {
      const OptimizerTensors& t = tensors[plan.tensors[slot]];
      args.tensors[slot] = {t.master, t.grad, t.state0, t.state1, t.param_out,
                            static_cast<long long>(t.numel)};
    }
    for (std::size_t b = 0; b < plan.blocks.size(); ++b) {
      args.block_slot[b] = plan.blocks[b].slot;
      args.block_chunk[b] = plan.blocks[b].chunk;
    }
    launch(args, static_cast<int>(plan.blocks.size()), hyper.kind, states, stream);
  }
}

}  // namespace zero::kernels
