// kernels/quantize.h's block quantization on the GPU (ZeRO++'s qwZ and qgZ on device memory):
// the same layout and the same bytes as quantize_cpu, dequantize_cpu and dequantize_add_cpu for
// fp32, bf16 and fp16 (fp64 is the CPU's only). One thread block per quantization block: the
// block's max |x| on the bits (inf and NaN the largest, as there), scale = max / qmax and
// x / scale in IEEE division, rounding half to even, the codes and the dequantized q · scale
// (plus acc, never fused into one rounding: --fmad=false) as the CPU computes them.
//
// Each call enqueues on `stream` (a cudaStream_t; null = the legacy default stream) and returns;
// buffers are device memory that stays valid, and unwritten by others, until the stream passes
// this point. Throws zero::Error for bad arguments (before anything is enqueued) and
// zero::CudaError, naming the kernel, when a launch fails. The synchronous forms the engine calls
// are the CUDA compute table's entries (compute.h).
#pragma once

#include <cstddef>

#include "zero/base/dtype.h"

namespace zero::kernels {

void quantize_cuda_async(const void* src, DType dtype, std::size_t n, int bits, void* out,
                         void* stream);
void dequantize_cuda_async(const void* in, std::size_t n, int bits, void* dst, DType dtype,
                           void* stream);
void dequantize_add_cuda_async(const void* in, std::size_t n, int bits, float* acc, void* stream);

namespace detail {

struct CudaLaunchStatus;  // optimizer_cuda_launch.h

// The launches behind the three (quantize_cuda_kernels.cu): arguments already checked; `codes`
// is the buffer's start, `scales` where its fp32 scales begin.
CudaLaunchStatus launch_quantize(const void* src, DType dtype, long long n, int bits,
                                 unsigned char* codes, float* scales, void* stream);
// dst_dtype F32 with `accumulate`: acc += the dequantized value.
CudaLaunchStatus launch_dequantize(const unsigned char* codes, const float* scales, long long n,
                                   int bits, void* dst, DType dtype, bool accumulate,
                                   void* stream);

}  // namespace detail
}  // namespace zero::kernels
