// The companion drivers of companions_cuda.h on the host: argument checks (the CPU's, from
// array_checks.h), the choice between copy, cast and combine, and launch errors as CudaError.
// No CUDA runtime calls besides cudaMemsetAsync and cudaMemcpyAsync.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/array_checks.h"
#include "kernels/companions_cuda.h"
#include "kernels/companions_cuda_launch.h"
#include "kernels/cpu_kernels.h"
#include "kernels/cuda_geometry.h"
#include "zero/base/cuda_error.h"
#include "zero/base/error.h"

namespace zero::kernels {

namespace {

void check_launch(const detail::CudaLaunchStatus& status, std::size_t numel, DType dtype) {
  ZERO_CHECK_AS(CudaError, status.error == nullptr, "{} over {} {} elements: {}", status.kernel,
                numel, dtype_name(dtype), status.error ? status.error : "");
}

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

void unscale_and_check_cuda_async(void* data, DType dtype, std::size_t numel, float scale,
                                  int* nonfinite_flag, void* stream) {
  detail::check_float_array("unscale (cuda)", "data", data, dtype, numel);
  ZERO_CHECK(std::isfinite(scale), "unscale (cuda): scale must be finite, got {}", scale);
  ZERO_CHECK(nonfinite_flag != nullptr, "unscale (cuda): the flag is null");
  if (numel == 0) return;
  check_launch(detail::launch_unscale(data, dtype, static_cast<long long>(numel), scale,
                                      nonfinite_flag, stream),
               numel, dtype);
}

std::size_t squared_norm_cuda_block_count(std::size_t numel) {
  return detail::norm_geometry(numel, detail::kNormBlockElems).norm_blocks;
}

void squared_norm_blocks_cuda_async(const void* data, DType dtype, std::size_t numel,
                                    double* block_sums, void* stream) {
  detail::check_float_array("squared_l2_norm (cuda)", "data", data, dtype, numel);
  if (numel == 0) return;
  ZERO_CHECK(block_sums != nullptr, "squared_l2_norm (cuda): block_sums is null");
  check_launch(detail::launch_squared_norm_blocks(data, dtype, static_cast<long long>(numel),
                                                  block_sums, stream),
               numel, dtype);
}

void squared_norm_blocks_many_cuda_async(std::span<const ArrayRef> arrays, double* block_sums,
                                         void* stream) {
  std::vector<std::size_t> numels(arrays.size());
  std::vector<std::size_t> first(arrays.size() + 1, 0);  // each array's first block sum
  for (std::size_t a = 0; a < arrays.size(); ++a) {
    detail::check_float_array("squared_l2_norm (cuda)", "data", arrays[a].data, arrays[a].dtype,
                              arrays[a].numel);
    numels[a] = arrays[a].numel;
    first[a + 1] = first[a] + squared_norm_cuda_block_count(numels[a]);
  }
  if (first.back() == 0) return;
  ZERO_CHECK(block_sums != nullptr, "squared_l2_norm (cuda): block_sums is null");
  const auto tables = detail::plan_norm_tables(numels, detail::kNormBlockElems);
  std::vector<bool> in_table(arrays.size(), false);
  for (const std::vector<std::size_t>& members : tables) {
    detail::CudaNormTable table{};
    table.count = static_cast<int>(members.size());
    for (int s = 0; s < table.count; ++s) {
      const ArrayRef& a = arrays[members[s]];
      table.data[s] = a.data;
      table.numel[s] = static_cast<long long>(a.numel);
      table.dtype[s] = a.dtype;
      table.out_offset[s] = static_cast<long long>(first[members[s]]);
      table.first_block[s + 1] =
          table.first_block[s] + static_cast<long long>(squared_norm_cuda_block_count(a.numel));
      in_table[members[s]] = true;
    }
    check_launch(detail::launch_squared_norm_table(table, block_sums, stream),
                 static_cast<std::size_t>(table.first_block[table.count]) * detail::kNormBlockElems,
                 arrays[members[0]].dtype);
  }
  for (std::size_t a = 0; a < arrays.size(); ++a) {
    if (!in_table[a] && arrays[a].numel > 0) {
      squared_norm_blocks_cuda_async(arrays[a].data, arrays[a].dtype, arrays[a].numel,
                                     block_sums + first[a], stream);
    }
  }
}

void combine_cuda_async(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                        std::size_t numel, float scale, bool accumulate, void* stream) {
  detail::check_float_array("combine (cuda)", "dst", dst, dst_dtype, numel);
  detail::check_float_array("combine (cuda)", "src", src, src_dtype, numel);
  if (numel == 0) return;
  ZERO_CHECK(!overlaps(dst, numel * dtype_size(dst_dtype), src, numel * dtype_size(src_dtype)),
             "combine (cuda): src and dst overlap");
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  // The branches of combine_cpu, so each case rounds exactly as there.
  if (!accumulate && scale == 1.0f && dst_dtype == src_dtype) {
    ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, numel * dtype_size(dst_dtype),
                                    cudaMemcpyDeviceToDevice, cuda_stream));
    return;
  }
  detail::CudaCombineArgs args{};
  args.dst = dst;
  args.src = src;
  args.numel = static_cast<long long>(numel);
  args.dst_dtype = dst_dtype;
  args.src_dtype = src_dtype;
  args.scale = scale;
  args.accumulate = accumulate;
  args.plain_cast =
      !accumulate && scale == 1.0f && (dst_dtype == DType::F32 || src_dtype == DType::F32);
  check_launch(detail::launch_combine(args, stream), numel, dst_dtype);
}

void reduce_cuda_async(void* dst, const void* const* srcs, int nsrc, std::size_t numel, DType dtype,
                       ReduceKind kind, float divisor, void* stream) {
  ZERO_CHECK(nsrc >= 1 && nsrc <= kCudaReduceMaxSources,
             "reduce (cuda): takes 1 to {} sources, got {}", kCudaReduceMaxSources, nsrc);
  detail::check_float_array("reduce (cuda)", "dst", dst, dtype, numel);
  for (int k = 0; k < nsrc; ++k)
    detail::check_float_array("reduce (cuda)", "a source", srcs[k], dtype, numel);
  if (numel == 0) return;
  detail::CudaReduceArgs args{};
  args.dst = dst;
  for (int k = 0; k < nsrc; ++k) args.srcs[k] = srcs[k];
  args.nsrc = nsrc;
  args.numel = static_cast<long long>(numel);
  args.dtype = dtype;
  args.max = kind == ReduceKind::Max;
  args.divisor = divisor;
  check_launch(detail::launch_reduce(args, stream), numel, dtype);
}

void fill_zero_cuda_async(void* dst, DType dtype, std::size_t numel, void* stream) {
  if (numel == 0) return;
  ZERO_CHECK(dst != nullptr, "fill_zero (cuda): dst is null");
  ZERO_CUDA_CHECK(
      cudaMemsetAsync(dst, 0, numel * dtype_size(dtype), static_cast<cudaStream_t>(stream)));
}

}  // namespace zero::kernels
