// The kernels of quantize_cuda.h. Bits as quantize_cpu.cpp's portable loops: widened exactly
// (cuda_elements.cuh), the block max over |x|'s bit patterns, IEEE division for the scale and
// the codes, rintf (half to even, what the CPU's magic-number add gives for |x| < 2^22), the
// dequantized code · scale rounded once to the output dtype, and a NaN scale's block (an inf or
// a NaN quantized) the scale's own NaN, 0x7fc00000, as the CPU's multiply passes it through.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_elements.cuh"
#include "kernels/cuda_geometry.h"
#include "kernels/optimizer_cuda_launch.h"
#include "kernels/quantize.h"
#include "kernels/quantize_cuda.h"

namespace zero::kernels::detail {

namespace {

static_assert(kQuantBlock == 256, "one thread per element of a quantization block");
constexpr int kThreads = static_cast<int>(kQuantBlock);

// One thread block per quantization block; thread t quantizes element b·256 + t.
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const void* src, DType dtype, long long n, int bits, unsigned char* codes,
                    float* scales) {
  __shared__ std::uint32_t warp_top[kThreads / 32];
  __shared__ signed char q[kThreads];
  const long long block = blockIdx.x;
  const long long i = block * kThreads + threadIdx.x;
  const bool in = i < n;
  const float x = in ? load_elem(src, dtype, i) : 0.0f;
  // max |x| on the bits: non-negative floats order as their patterns, inf and NaN on top.
  std::uint32_t top = in ? (__float_as_uint(x) & 0x7fffffffu) : 0u;
  for (int offset = 16; offset > 0; offset /= 2) {
    const std::uint32_t other = __shfl_down_sync(0xffffffffu, top, offset);
    top = other > top ? other : top;
  }
  if (threadIdx.x % 32 == 0) warp_top[threadIdx.x / 32] = top;
  __syncthreads();
  top = warp_top[0];
  for (int w = 1; w < kThreads / 32; ++w) top = warp_top[w] > top ? warp_top[w] : top;
  const float qmax = bits == 8 ? 127.0f : 7.0f;
  float scale;
  signed char code = 0;
  if (top >= 0x7f800000u) {  // an inf or a NaN: a NaN scale, codes 0
    scale = __uint_as_float(0x7fc00000u);
  } else {
    scale = __fdiv_rn(__uint_as_float(top), qmax);
    if (scale != 0.0f && in) {
      const float r = rintf(__fdiv_rn(x, scale));
      code = static_cast<signed char>(static_cast<int>(r > qmax ? qmax : (r < -qmax ? -qmax : r)));
    }
  }
  if (threadIdx.x == 0) scales[block] = scale;
  if (bits == 8) {
    if (in) reinterpret_cast<signed char*>(codes)[i] = code;
    return;
  }
  // 4 bits: element 2j in the low nibble of byte j, 2j + 1 in the high one.
  q[threadIdx.x] = code;
  __syncthreads();
  if (threadIdx.x % 2 == 0 && in) {
    const int lo = q[threadIdx.x] & 0xf;
    const int hi = i + 1 < n ? (q[threadIdx.x + 1] & 0xf) : 0;
    codes[i / 2] = static_cast<unsigned char>(lo | (hi << 4));
  }
}

__device__ __forceinline__ float code_at(const unsigned char* codes, long long i, int bits) {
  if (bits == 8) return static_cast<float>(reinterpret_cast<const signed char*>(codes)[i]);
  const unsigned char byte = codes[i / 2];
  // The nibble sign-extended: moved to the top of a byte, then shifted back arithmetically.
  const auto nibble = static_cast<signed char>(i % 2 == 0 ? (byte << 4) : byte);
  return static_cast<float>(nibble >> 4);
}

__global__ void __launch_bounds__(kCudaElementwiseThreads)
    dequantize_kernel(const unsigned char* codes, const float* scales, long long n, int bits,
                      void* dst, DType dtype, bool accumulate) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    // NaN bits as an x86 CPU's: an operand's NaN passes through (quieted), the accumulator's
    // first, where the GPU's arithmetic would give its canonical 0x7fffffff.
    const float scale = scales[i / kThreads];
    const float x = isnan(scale) ? scale : __fmul_rn(code_at(codes, i, bits), scale);
    if (accumulate) {
      float* acc = static_cast<float*>(dst);
      const float a = acc[i];
      acc[i] = isnan(a)   ? __uint_as_float(__float_as_uint(a) | 0x00400000u)
               : isnan(x) ? x
                          : __fadd_rn(a, x);
    } else {
      store_elem(dst, dtype, i, x);
    }
  }
}

CudaLaunchStatus status_of(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  return {kernel, status == cudaSuccess ? nullptr : cudaGetErrorString(status)};
}

}  // namespace

CudaLaunchStatus launch_quantize(const void* src, DType dtype, long long n, int bits,
                                 unsigned char* codes, float* scales, void* stream) {
  (void)cudaGetLastError();  // a stale error is not this launch's
  const auto blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  quantize_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, dtype, n, bits,
                                                                              codes, scales);
  return status_of("quantize_kernel");
}

CudaLaunchStatus launch_dequantize(const unsigned char* codes, const float* scales, long long n,
                                   int bits, void* dst, DType dtype, bool accumulate,
                                   void* stream) {
  (void)cudaGetLastError();
  const auto blocks = static_cast<unsigned>(elementwise_blocks(static_cast<std::size_t>(n)));
  dequantize_kernel<<<blocks, kCudaElementwiseThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      codes, scales, n, bits, dst, dtype, accumulate);
  return status_of("dequantize_kernel");
}

}  // namespace zero::kernels::detail
