// Internal: the boundary between the host driver (optimizer_cuda_host.cpp, plain C++ with the
// argument checks and the launch plan) and the CUDA kernels (optimizer_cuda_kernels.cu, no fmt, no
// exceptions).
#pragma once

#include <cstdint>

#include "kernels/optimizer_math.h"
#include "zero/base/dtype.h"

namespace zero::kernels::detail {

// FusedAdam's shape (SPEC_DEEPSPEED.md §6.2): 64 Ki-element chunks, 512 threads, 4 elements per
// thread step; but up to 1024 chunks per launch where FusedAdam (and torch's fused AdamW) take
// 320: on the H100, 1G parameters in 320-block launches left zero at 0.95x torch's fused AdamW,
// each launch ending in a partly idle wave. The parameter block then exceeds the classic 4 KiB,
// which CUDA 12.1+ allows on Volta and newer (up to 32764 bytes).
inline constexpr int kCudaThreadsPerBlock = 512;
inline constexpr int kCudaMaxTensorsPerLaunch = 24;
inline constexpr int kCudaMaxBlocksPerLaunch = 1024;
inline constexpr long long kCudaChunkElems = 65536;

struct CudaTensorSlot {
  float* master;
  const void* grad;
  void* state0;
  void* state1;
  void* param_out;
  long long numel;
};

// The kernel parameter, passed by value (__grid_constant__: read in place, never copied).
struct CudaLaunchArgs {
  math::StepCoeffs coeffs;
  CudaTensorSlot tensors[kCudaMaxTensorsPerLaunch];
  std::int32_t block_slot[kCudaMaxBlocksPerLaunch];
  std::int32_t block_chunk[kCudaMaxBlocksPerLaunch];
  long long chunk_elems;
  DType grad_dtype;
  DType state_dtype;
  DType param_out_dtype;
  bool has_param_out;
  bool vectorized;  // every array 16-byte aligned: 4 elements per access
};
static_assert(sizeof(CudaLaunchArgs) <= 32764, "kernel parameters are limited to 32764 bytes");

struct CudaLaunchStatus {
  const char* kernel;  // name of the kernel launched
  const char* error;   // null on success, else cudaGetErrorString of cudaGetLastError()
};

// Launches one multi-tensor step over `blocks` blocks on `stream` (a cudaStream_t).
CudaLaunchStatus launch_multi_tensor_step(const CudaLaunchArgs& args, int blocks, int state_count,
                                          void* stream);
// The same launch with one add per array in place of the update (the traffic probe).
CudaLaunchStatus launch_multi_tensor_probe(const CudaLaunchArgs& args, int blocks, int state_count,
                                           void* stream);

}  // namespace zero::kernels::detail
