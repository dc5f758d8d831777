// The CUDA kernels of companions_cuda.h and their launchers (companions_cuda_launch.h).
#include <cuda_runtime.h>

#include "kernels/companions_cuda_launch.h"
#include "kernels/cpu_kernels.h"
#include "kernels/cuda_elements.cuh"
#include "kernels/cuda_geometry.h"

namespace zero::kernels::detail {

namespace {

// The grid-stride loop every element-wise kernel walks.
__device__ __forceinline__ long long first_index() {
  return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long grid_stride() {
  return static_cast<long long>(gridDim.x) * blockDim.x;
}

__global__ void __launch_bounds__(kCudaElementwiseThreads)
    unscale_kernel(void* data, DType dtype, long long numel, float scale, int* flag) {
  bool nonfinite = false;
  for (long long i = first_index(); i < numel; i += grid_stride()) {
    const float x = load_elem(data, dtype, i) * scale;
    const float d = x - x;  // NaN exactly when x is ±inf or NaN, as the CPU checks
    nonfinite = nonfinite || d != d;
    store_elem(data, dtype, i, x);
  }
  if (nonfinite) *flag = 1;  // every writer writes the same value
}

__global__ void __launch_bounds__(kCudaNormThreads)
    squared_norm_blocks_kernel(const void* data, DType dtype, long long numel,
                               long long norm_blocks, double* block_sums) {
  const long long block = static_cast<long long>(blockIdx.x) * kCudaNormBlocksPerCudaBlock +
                          threadIdx.x / kCudaNormLanes;
  const int lane = static_cast<int>(threadIdx.x % kCudaNormLanes);
  double acc = 0.0;
  if (block < norm_blocks) {
    const long long begin = block * static_cast<long long>(kNormBlockElems);
    const long long end = min(begin + static_cast<long long>(kNormBlockElems), numel);
    for (long long i = begin + lane; i < end; i += kCudaNormLanes) {
      const double d = static_cast<double>(load_elem(data, dtype, i));
      acc = acc + d * d;
    }
  }
  // ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), the CPU's tree. Every thread of the warp
  // takes part in the shuffles, in range or not.
  acc = acc + __shfl_down_sync(0xffffffffu, acc, 1, kCudaNormLanes);
  acc = acc + __shfl_down_sync(0xffffffffu, acc, 2, kCudaNormLanes);
  acc = acc + __shfl_down_sync(0xffffffffu, acc, 4, kCudaNormLanes);
  if (lane == 0 && block < norm_blocks) block_sums[block] = acc;
}

__global__ void __launch_bounds__(kCudaElementwiseThreads)
    combine_kernel(const CudaCombineArgs args) {
  for (long long i = first_index(); i < args.numel; i += grid_stride()) {
    float v = load_elem(args.src, args.src_dtype, i);
    if (!args.plain_cast) v = v * args.scale;
    if (args.accumulate) v = load_elem(args.dst, args.dst_dtype, i) + v;
    store_elem(args.dst, args.dst_dtype, i, v);
  }
}

// reduce_at's scalar path (cpu_impl.h): every source read before dst is written, so dst may
// alias a source exactly; Max takes x when x > acc or x is NaN (ScalarOps::max_nan).
__global__ void __launch_bounds__(kCudaElementwiseThreads)
    reduce_kernel(const CudaReduceArgs args) {
  for (long long i = first_index(); i < args.numel; i += grid_stride()) {
    float acc = load_elem(args.srcs[0], args.dtype, i);
    for (int k = 1; k < args.nsrc; ++k) {
      const float x = load_elem(args.srcs[k], args.dtype, i);
      if (args.max) {
        acc = (x > acc || x != x) ? x : acc;
      } else {
        acc = acc + x;
      }
    }
    if (args.divisor != 0.0f) acc = acc / args.divisor;
    store_elem(args.dst, args.dtype, i, acc);
  }
}

CudaLaunchStatus status_of(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  return {kernel, status == cudaSuccess ? nullptr : cudaGetErrorString(status)};
}

}  // namespace

CudaLaunchStatus launch_unscale(void* data, DType dtype, long long numel, float scale, int* flag,
                                void* stream) {
  const auto blocks = static_cast<unsigned>(elementwise_blocks(static_cast<std::size_t>(numel)));
  unscale_kernel<<<blocks, kCudaElementwiseThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      data, dtype, numel, scale, flag);
  return status_of("unscale_kernel");
}

CudaLaunchStatus launch_squared_norm_blocks(const void* data, DType dtype, long long numel,
                                            double* block_sums, void* stream) {
  const NormGeometry g = norm_geometry(static_cast<std::size_t>(numel), kNormBlockElems);
  squared_norm_blocks_kernel<<<static_cast<unsigned>(g.cuda_blocks), kCudaNormThreads, 0,
                               static_cast<cudaStream_t>(stream)>>>(
      data, dtype, numel, static_cast<long long>(g.norm_blocks), block_sums);
  return status_of("squared_norm_blocks_kernel");
}

CudaLaunchStatus launch_combine(const CudaCombineArgs& args, void* stream) {
  const auto blocks =
      static_cast<unsigned>(elementwise_blocks(static_cast<std::size_t>(args.numel)));
  combine_kernel<<<blocks, kCudaElementwiseThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  return status_of("combine_kernel");
}

CudaLaunchStatus launch_reduce(const CudaReduceArgs& args, void* stream) {
  const auto blocks =
      static_cast<unsigned>(elementwise_blocks(static_cast<std::size_t>(args.numel)));
  reduce_kernel<<<blocks, kCudaElementwiseThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  return status_of("reduce_kernel");
}

}  // namespace zero::kernels::detail
