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

// Each pass of an element-wise loop takes kUnroll elements a grid stride apart per thread, all
// loaded before any is stored: enough loads in flight to keep HBM busy (one element per pass
// left the H100 at a third of its bandwidth). The same element math, so the same results.
constexpr int kUnroll = 8;

// for_each_unrolled(numel, load, store): load(i) for up to kUnroll indices of this thread's
// pass, then store(i, value) for each; every index below numel once.
template <typename Load, typename Store>
__device__ __forceinline__ void for_each_unrolled(long long numel, Load load, Store store) {
  const long long stride = grid_stride();
  for (long long base = first_index(); base < numel; base += kUnroll * stride) {
    float v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const long long i = base + k * stride;
      if (i < numel) v[k] = load(i);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const long long i = base + k * stride;
      if (i < numel) store(i, v[k]);
    }
  }
}

__global__ void __launch_bounds__(kCudaElementwiseThreads)
    unscale_kernel(void* data, DType dtype, long long numel, float scale, int* flag) {
  bool nonfinite = false;
  for_each_unrolled(
      numel, [&](long long i) { return load_elem(data, dtype, i) * scale; },
      [&](long long i, float x) {
        const float d = x - x;  // NaN exactly when x is ±inf or NaN, as the CPU checks
        nonfinite = nonfinite || d != d;
        store_elem(data, dtype, i, x);
      });
  if (nonfinite) *flag = 1;  // every writer writes the same value
}

// Norm block `block` of data into shared memory as fp32 (the value each lane converts to double),
// zeros past numel: adding +0.0 leaves a non-negative double sum's bits alone, so the tail needs no
// second loop. Every thread's kNormBlockElems / kCudaNormThreads loads are issued before any is
// stored.
template <DType kType>
__device__ __forceinline__ void stage_norm_block(const void* data, long long numel,
                                                 long long block, float* tile) {
  constexpr int kPerThread = static_cast<int>(kNormBlockElems) / kCudaNormThreads;
  const long long begin = block * static_cast<long long>(kNormBlockElems);
  float x[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const long long i = begin + k * kCudaNormThreads + threadIdx.x;
    x[k] = i < numel ? load_elem(data, kType, i) : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) tile[k * kCudaNormThreads + threadIdx.x] = x[k];
}

// Lanes 0..7 of a warp's eight-thread groups hold the sums of one norm block's lanes: added in
// the CPU's tree, ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), into the group's lane 0.
__device__ __forceinline__ double add_lanes(double acc) {
  acc = acc + __shfl_down_sync(0xffffffffu, acc, 1, kCudaNormLanes);
  acc = acc + __shfl_down_sync(0xffffffffu, acc, 2, kCudaNormLanes);
  acc = acc + __shfl_down_sync(0xffffffffu, acc, 4, kCudaNormLanes);
  return acc;
}

// The staged kernels' block: *sum ← the sum of squares of norm block `block` of data, by every
// thread of a kCudaNormThreads-thread CUDA block.
__device__ __forceinline__ void staged_norm_block(const void* data, DType dtype, long long numel,
                                                  long long block, double* sum) {
  __shared__ float tile[kNormBlockElems];
  if (dtype == DType::F32) {
    stage_norm_block<DType::F32>(data, numel, block, tile);
  } else if (dtype == DType::BF16) {
    stage_norm_block<DType::BF16>(data, numel, block, tile);
  } else {
    stage_norm_block<DType::F16>(data, numel, block, tile);
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  // Lane l sums elements l, l + 8, ... in order, as the CPU's lane does (the other threads of
  // the warp keep 0 and only take part in the shuffles).
  const int lane = static_cast<int>(threadIdx.x);
  double acc = 0.0;
  if (lane < kCudaNormLanes) {
#pragma unroll 16
    for (int r = 0; r < static_cast<int>(kNormBlockElems) / kCudaNormLanes; ++r) {
      const double d = static_cast<double>(tile[r * kCudaNormLanes + lane]);
      acc = acc + d * d;
    }
  }
  acc = add_lanes(acc);
  if (lane == 0) *sum = acc;
}

__global__ void __launch_bounds__(kCudaNormThreads)
    squared_norm_staged_kernel(const void* data, DType dtype, long long numel,
                               double* block_sums) {
  staged_norm_block(data, dtype, numel, blockIdx.x, block_sums + blockIdx.x);
}

// One CUDA block per norm block of every table entry (the table's entries are uniform within a
// block, so its dtype switch never diverges).
__global__ void __launch_bounds__(kCudaNormThreads)
    squared_norm_table_kernel(const CudaNormTable table, double* block_sums) {
  const long long g = blockIdx.x;
  const int s = norm_table_slot(table.first_block, table.count, g);
  const long long block = g - table.first_block[s];
  staged_norm_block(table.data[s], table.dtype[s], table.numel[s], block,
                    block_sums + table.out_offset[s] + block);
}

// Thread t is lane t % 8 of norm block t / 8: it sums elements lane, lane + 8, ... of the block
// in order, loading kUnroll of them before adding any (the launcher's kCudaNormLanesUnroll; the
// probe tries others). Zeros past numel (adding +0.0 leaves a non-negative sum's bits alone).
// Threads past the last block only join the shuffles.
template <DType kType, int kUnroll = kCudaNormLanesUnroll>
__global__ void __launch_bounds__(kCudaNormLanesThreads)
    squared_norm_lanes_kernel(const void* data, long long numel, long long norm_blocks,
                              double* block_sums) {
  const long long t = first_index();
  const long long block = t / kCudaNormLanes;
  const int lane = static_cast<int>(t % kCudaNormLanes);
  constexpr int kRows = static_cast<int>(kNormBlockElems) / kCudaNormLanes;
  double acc = 0.0;
  if (block < norm_blocks) {
    const long long first = block * static_cast<long long>(kNormBlockElems) + lane;
    for (int r0 = 0; r0 < kRows; r0 += kUnroll) {
      float x[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const long long i = first + static_cast<long long>(r0 + k) * kCudaNormLanes;
        x[k] = i < numel ? load_elem(data, kType, i) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const double d = static_cast<double>(x[k]);
        acc = acc + d * d;
      }
    }
  }
  acc = add_lanes(acc);
  if (lane == 0 && block < norm_blocks) block_sums[block] = acc;
}

__global__ void __launch_bounds__(kCudaElementwiseThreads)
    combine_kernel(const CudaCombineArgs args) {
  for_each_unrolled(
      args.numel,
      [&](long long i) {
        float v = load_elem(args.src, args.src_dtype, i);
        if (!args.plain_cast) v = v * args.scale;
        if (args.accumulate) v = load_elem(args.dst, args.dst_dtype, i) + v;
        return v;
      },
      [&](long long i, float v) { store_elem(args.dst, args.dst_dtype, i, v); });
}

// reduce_at's scalar path (cpu_impl.h): every source read before dst is written, so dst may
// alias a source exactly; Max takes x when x > acc or x is NaN (ScalarOps::max_nan).
__global__ void __launch_bounds__(kCudaElementwiseThreads)
    reduce_kernel(const CudaReduceArgs args) {
  for_each_unrolled(
      args.numel,
      [&](long long i) {
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
        return acc;
      },
      [&](long long i, float acc) { store_elem(args.dst, args.dtype, i, acc); });
}

// An earlier runtime call's unread error (its caller had it as a return value) would be taken for
// the launch's own by cudaGetLastError: cleared before each launch. A kernel fault is sticky and
// still reported.
void clear_stale_error() {
  (void)cudaGetLastError();
}

CudaLaunchStatus status_of(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  return {kernel, status == cudaSuccess ? nullptr : cudaGetErrorString(status)};
}

}  // namespace

CudaLaunchStatus launch_unscale(void* data, DType dtype, long long numel, float scale, int* flag,
                                void* stream) {
  clear_stale_error();
  const auto blocks = static_cast<unsigned>(elementwise_blocks(static_cast<std::size_t>(numel)));
  unscale_kernel<<<blocks, kCudaElementwiseThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      data, dtype, numel, scale, flag);
  return status_of("unscale_kernel");
}

CudaLaunchStatus launch_squared_norm_blocks_as(NormKernel kernel, const void* data, DType dtype,
                                               long long numel, double* block_sums,
                                               void* stream) {
  clear_stale_error();
  const NormGeometry g =
      norm_geometry_of(kernel, static_cast<std::size_t>(numel), kNormBlockElems);
  const auto blocks = static_cast<unsigned>(g.cuda_blocks);
  const auto s = static_cast<cudaStream_t>(stream);
  if (kernel == NormKernel::Staged) {
    squared_norm_staged_kernel<<<blocks, g.threads, 0, s>>>(data, dtype, numel, block_sums);
    return status_of("squared_norm_staged_kernel");
  }
  const auto norm_blocks = static_cast<long long>(g.norm_blocks);
  if (dtype == DType::F32) {
    squared_norm_lanes_kernel<DType::F32><<<blocks, g.threads, 0, s>>>(data, numel, norm_blocks,
                                                                        block_sums);
  } else if (dtype == DType::BF16) {
    squared_norm_lanes_kernel<DType::BF16><<<blocks, g.threads, 0, s>>>(data, numel, norm_blocks,
                                                                         block_sums);
  } else {
    squared_norm_lanes_kernel<DType::F16><<<blocks, g.threads, 0, s>>>(data, numel, norm_blocks,
                                                                        block_sums);
  }
  return status_of("squared_norm_lanes_kernel");
}

CudaLaunchStatus launch_squared_norm_table(const CudaNormTable& table, double* block_sums,
                                           void* stream) {
  clear_stale_error();
  const auto blocks = static_cast<unsigned>(table.first_block[table.count]);
  squared_norm_table_kernel<<<blocks, kCudaNormThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      table, block_sums);
  return status_of("squared_norm_table_kernel");
}

CudaLaunchStatus launch_squared_norm_blocks(const void* data, DType dtype, long long numel,
                                            double* block_sums, void* stream) {
  const NormGeometry g = norm_geometry(static_cast<std::size_t>(numel), kNormBlockElems);
  return launch_squared_norm_blocks_as(g.kernel, data, dtype, numel, block_sums, stream);
}

CudaLaunchStatus launch_combine(const CudaCombineArgs& args, void* stream) {
  clear_stale_error();
  const auto blocks =
      static_cast<unsigned>(elementwise_blocks(static_cast<std::size_t>(args.numel)));
  combine_kernel<<<blocks, kCudaElementwiseThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  return status_of("combine_kernel");
}

CudaLaunchStatus launch_reduce(const CudaReduceArgs& args, void* stream) {
  clear_stale_error();
  const auto blocks =
      static_cast<unsigned>(elementwise_blocks(static_cast<std::size_t>(args.numel)));
  reduce_kernel<<<blocks, kCudaElementwiseThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  return status_of("reduce_kernel");
}

}  // namespace zero::kernels::detail
