// The drivers of quantize_cuda.h on the host: the CPU's argument checks, the layout's offsets
// (quantize.h), the padding after the codes zeroed as quantize_cpu zeroes it, launch errors as
// CudaError.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/array_checks.h"
#include "kernels/optimizer_cuda_launch.h"
#include "kernels/quantize.h"
#include "kernels/quantize_cuda.h"
#include "zero/base/cuda_error.h"
#include "zero/base/error.h"

namespace zero::kernels {

namespace {

std::size_t raw_code_bytes(std::size_t n, int bits) {
  return bits == 8 ? n : (n + 1) / 2;
}
std::size_t code_bytes(std::size_t n, int bits) {
  return (raw_code_bytes(n, bits) + 3) / 4 * 4;
}

void check_buffer(const char* what, const void* q, std::size_t n, int bits) {
  ZERO_CHECK(bits == 8 || bits == 4, "{}: {} bits; expected 8 or 4", what, bits);
  if (n == 0) return;
  ZERO_CHECK(q != nullptr, "{}: the quantized buffer is null", what);
  ZERO_CHECK(reinterpret_cast<std::uintptr_t>(q) % 4 == 0,
             "{}: the quantized buffer at {} is not 4-byte aligned (its scales are fp32)", what, q);
}

void check_launch(const detail::CudaLaunchStatus& status, std::size_t n, int bits) {
  ZERO_CHECK_AS(CudaError, status.error == nullptr, "{} over {} elements in {} bits: {}",
                status.kernel, n, bits, status.error ? status.error : "");
}

}  // namespace

void quantize_cuda_async(const void* src, DType dtype, std::size_t n, int bits, void* out,
                         void* stream) {
  detail::check_float_array("quantize (cuda)", "src", src, dtype, n);
  check_buffer("quantize (cuda)", out, n, bits);
  if (n == 0) return;
  auto* codes = static_cast<unsigned char*>(out);
  const std::size_t raw = raw_code_bytes(n, bits), padded = code_bytes(n, bits);
  if (padded > raw) {
    ZERO_CUDA_CHECK(
        cudaMemsetAsync(codes + raw, 0, padded - raw, static_cast<cudaStream_t>(stream)));
  }
  check_launch(detail::launch_quantize(src, dtype, static_cast<long long>(n), bits, codes,
                                       reinterpret_cast<float*>(codes + padded), stream),
               n, bits);
}

void dequantize_cuda_async(const void* in, std::size_t n, int bits, void* dst, DType dtype,
                           void* stream) {
  check_buffer("dequantize (cuda)", in, n, bits);
  detail::check_float_array("dequantize (cuda)", "dst", dst, dtype, n);
  if (n == 0) return;
  const auto* codes = static_cast<const unsigned char*>(in);
  check_launch(detail::launch_dequantize(
                   codes, reinterpret_cast<const float*>(codes + code_bytes(n, bits)),
                   static_cast<long long>(n), bits, dst, dtype, false, stream),
               n, bits);
}

void dequantize_add_cuda_async(const void* in, std::size_t n, int bits, float* acc,
                               void* stream) {
  check_buffer("dequantize_add (cuda)", in, n, bits);
  detail::check_float_array("dequantize_add (cuda)", "acc", acc, DType::F32, n);
  if (n == 0) return;
  const auto* codes = static_cast<const unsigned char*>(in);
  check_launch(detail::launch_dequantize(
                   codes, reinterpret_cast<const float*>(codes + code_bytes(n, bits)),
                   static_cast<long long>(n), bits, acc, DType::F32, true, stream),
               n, bits);
}

}  // namespace zero::kernels
