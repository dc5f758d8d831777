// Internal: the boundary between the companion drivers (companions_cuda_host.cpp: checks, plans,
// errors) and their kernels (companions_cuda_kernels.cu: no fmt, no exceptions).
#pragma once

#include <cstddef>

#include "kernels/companions_cuda.h"
#include "kernels/cuda_geometry.h"
#include "kernels/optimizer_cuda_launch.h"
#include "zero/base/dtype.h"

namespace zero::kernels::detail {

struct CudaCombineArgs {
  void* dst;
  const void* src;
  long long numel;
  DType dst_dtype;
  DType src_dtype;
  float scale;
  bool accumulate;
  bool plain_cast;  // dst ← src converted, no multiply (combine_cpu's cast_cpu path)
};

// reduce_cuda_async's arguments, passed to the kernel by value.
struct CudaReduceArgs {
  void* dst;
  const void* srcs[kCudaReduceMaxSources];
  int nsrc;
  long long numel;
  DType dtype;
  bool max;       // ReduceKind::Max, else Sum
  float divisor;  // 0: none
};

// A table launch of the staged norm (cuda_geometry.h, plan_norm_tables), passed to the kernel by
// value: entry s sums its norm blocks into block_sums[out_offset[s] ...].
struct CudaNormTable {
  const void* data[kCudaNormTableArrays];
  long long numel[kCudaNormTableArrays];
  long long first_block[kCudaNormTableArrays + 1];  // grid block of entry s's first norm block
  long long out_offset[kCudaNormTableArrays];
  DType dtype[kCudaNormTableArrays];
  int count;
};
static_assert(sizeof(CudaNormTable) <= 4096, "a kernel's arguments take at most 4 KB");

CudaLaunchStatus launch_unscale(void* data, DType dtype, long long numel, float scale, int* flag,
                                void* stream);
// The norm's block sums by the kernel norm_geometry picks for numel; _as: by `kernel` (the
// probes and tests compare the two, whose sums are bitwise equal).
CudaLaunchStatus launch_squared_norm_blocks(const void* data, DType dtype, long long numel,
                                            double* block_sums, void* stream);
CudaLaunchStatus launch_squared_norm_blocks_as(NormKernel kernel, const void* data, DType dtype,
                                               long long numel, double* block_sums, void* stream);
CudaLaunchStatus launch_squared_norm_table(const CudaNormTable& table, double* block_sums,
                                           void* stream);
CudaLaunchStatus launch_combine(const CudaCombineArgs& args, void* stream);
CudaLaunchStatus launch_reduce(const CudaReduceArgs& args, void* stream);

}  // namespace zero::kernels::detail
