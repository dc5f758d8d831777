// The element kernels of CudaMlp (mlp_cuda_kernels.h): everything of the MLP but the products.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_elements.cuh"
#include "models/mlp_cuda_kernels.h"

namespace zero::models::cuda_detail {

namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU; the grid-stride loops cover the rest.
constexpr long long kMaxBlocks = 4096;

unsigned blocks_for(long long n) {
  const long long blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ __forceinline__ long long first_index() {
  return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long grid_stride() {
  return static_cast<long long>(gridDim.x) * blockDim.x;
}

// The element loads and stores of the optimizer kernels (the conversions every backend shares).
using kernels::detail::load_elem;
using kernels::detail::store_elem;

__global__ void __launch_bounds__(kThreads)
    round_kernel(const float* in, void* out, DType out_dtype, long long n) {
  for (long long i = first_index(); i < n; i += grid_stride()) store_elem(out, out_dtype, i, in[i]);
}

__global__ void __launch_bounds__(kThreads)
    bias_act_kernel(float* y, const void* bias, DType bias_dtype, long long rows, long long cols,
                    bool relu) {
  const long long n = rows * cols;
  for (long long i = first_index(); i < n; i += grid_stride()) {
    float v = y[i] + load_elem(bias, bias_dtype, i % cols);
    if (relu) v = v < 0.0f ? 0.0f : v;
    y[i] = v;
  }
}

__global__ void __launch_bounds__(kThreads)
    mse_kernel(const float* y, const float* target, long long n, float grad_scale, float* dy,
               double* loss) {
  __shared__ double partial[kThreads];
  double sum = 0;
  for (long long i = threadIdx.x; i < n; i += kThreads) {
    const double d = static_cast<double>(y[i]) - static_cast<double>(target[i]);
    sum += 0.5 * d * d;
    dy[i] = (y[i] - target[i]) * grad_scale;
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half_width = kThreads / 2; half_width > 0; half_width /= 2) {
    if (static_cast<int>(threadIdx.x) < half_width) {
      partial[threadIdx.x] += partial[threadIdx.x + half_width];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = n > 0 ? partial[0] / static_cast<double>(n) : 0.0;
}

__global__ void __launch_bounds__(kThreads)
    column_sums_kernel(const float* dy, long long rows, long long cols, void* out,
                       DType out_dtype) {
  // One thread per column: the rows in ascending order, as the CPU sums them. Neighbouring
  // threads read neighbouring columns of a row, so each row's read is coalesced.
  for (long long c = first_index(); c < cols; c += grid_stride()) {
    float sum = 0.0f;
    for (long long r = 0; r < rows; ++r) sum += dy[r * cols + c];
    store_elem(out, out_dtype, c, sum);
  }
}

__global__ void __launch_bounds__(kThreads)
    relu_backward_kernel(float* dx, const float* x, long long n) {
  for (long long i = first_index(); i < n; i += grid_stride()) dx[i] = x[i] > 0.0f ? dx[i] : 0.0f;
}

}  // namespace

cudaError_t launch_round(const float* in, void* out, DType out_dtype, long long n,
                         cudaStream_t stream) {
  if (n > 0) round_kernel<<<blocks_for(n), kThreads, 0, stream>>>(in, out, out_dtype, n);
  return cudaGetLastError();
}

cudaError_t launch_bias_act(float* y, const void* bias, DType bias_dtype, long long rows,
                            long long cols, bool relu, cudaStream_t stream) {
  if (rows > 0 && cols > 0) {
    bias_act_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(y, bias, bias_dtype, rows,
                                                                      cols, relu);
  }
  return cudaGetLastError();
}

cudaError_t launch_mse(const float* y, const float* target, long long n, float grad_scale,
                       float* dy, double* loss, cudaStream_t stream) {
  mse_kernel<<<1, kThreads, 0, stream>>>(y, target, n, grad_scale, dy, loss);
  return cudaGetLastError();
}

cudaError_t launch_column_sums(const float* dy, long long rows, long long cols, void* out,
                               DType out_dtype, cudaStream_t stream) {
  if (cols > 0) {
    column_sums_kernel<<<blocks_for(cols), kThreads, 0, stream>>>(dy, rows, cols, out, out_dtype);
  }
  return cudaGetLastError();
}

cudaError_t launch_relu_backward(float* dx, const float* x, long long n, cudaStream_t stream) {
  if (n > 0) relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dx, x, n);
  return cudaGetLastError();
}

}  // namespace zero::models::cuda_detail
