// Internal to models/: the boundary between CudaMlp (mlp_cuda.cpp: checks, cuBLAS, errors) and
// its element kernels (mlp_cuda_kernels.cu: no fmt, no exceptions). Each launcher enqueues one
// kernel on `stream` (none for an empty range, except launch_mse, which still writes its loss)
// and returns cudaGetLastError() after the launch for the caller to check. Matrices are row-major
// and densely packed; fp32 unless a DType says otherwise (F32, BF16 or F16, read and rounded by
// zero/base/half.h as on the CPU).
#pragma once

#include <cuda_runtime.h>

#include "zero/base/dtype.h"

namespace zero::models::cuda_detail {

// out[i] = in[i] rounded to out_dtype, i < n.
cudaError_t launch_round(const float* in, void* out, DType out_dtype, long long n,
                         cudaStream_t stream);

// y[r][c] = y[r][c] + bias[c] for every row of the rows × cols y, then, if `relu`, the ReLU
// (v < 0 ? 0 : v, as the CPU's std::max(v, 0.0f): NaN and -0 pass).
cudaError_t launch_bias_act(float* y, const void* bias, DType bias_dtype, long long rows,
                            long long cols, bool relu, cudaStream_t stream);

// *loss = Σ (y - target)² / 2 / n, summed in double (n = 0: 0), and
// dy[i] = (y[i] - target[i]) · grad_scale in fp32. One block: the sum's order is fixed.
cudaError_t launch_mse(const float* y, const float* target, long long n, float grad_scale,
                       float* dy, double* loss, cudaStream_t stream);

// out[c] = Σ_r dy[r][c] in fp32, rows in ascending order (the CPU's bias gradient, bit for bit),
// rounded to out_dtype.
cudaError_t launch_column_sums(const float* dy, long long rows, long long cols, void* out,
                               DType out_dtype, cudaStream_t stream);

// dx[i] = x[i] > 0 ? dx[i] : 0: the gradient through the ReLU that produced x.
cudaError_t launch_relu_backward(float* dx, const float* x, long long n, cudaStream_t stream);

}  // namespace zero::models::cuda_detail
