// How every CUDA runtime, driver and library failure becomes a zero::CudaError: the message names
// the call as written, the file and line it was made from, and the library's error name and text.
// This header has no CUDA dependency; ZERO_CUDA_CHECK may only be used where <cuda_runtime.h> is
// included (it calls cudaGetErrorName / cudaGetErrorString).
#pragma once

#include <string>

namespace zero {

// "cudaMalloc(&p, bytes) failed at zero/device/cuda_device.cpp:120: cudaErrorMemoryAllocation
// (out of memory)". `file` is shortened to its path inside the repository when it contains one.
std::string cuda_error_message(const char* call, const char* file, int line, const char* error_name,
                               const char* error_text);

// Throws CudaError with cuda_error_message(...).
[[noreturn]] void throw_cuda_error(const char* call, const char* file, int line,
                                   const char* error_name, const char* error_text);

}  // namespace zero

// ZERO_CUDA_CHECK(cudaStreamSynchronize(stream)); throws CudaError unless the call returns
// cudaSuccess. Clears the runtime's last error first, so a later check does not see this one.
#define ZERO_CUDA_CHECK(call)                                                                  \
  do {                                                                                         \
    const cudaError_t zero_cuda_status_ = (call);                                              \
    if (zero_cuda_status_ != cudaSuccess) [[unlikely]] {                                       \
      (void)cudaGetLastError();                                                                \
      ::zero::throw_cuda_error(#call, __FILE__, __LINE__, cudaGetErrorName(zero_cuda_status_), \
                               cudaGetErrorString(zero_cuda_status_));                         \
    }                                                                                          \
  } while (0)
