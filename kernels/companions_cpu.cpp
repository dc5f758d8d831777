#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/array_checks.h"
#include "kernels/cast.h"
#include "kernels/cpu_kernels.h"
#include "kernels/cpu_parallel.h"
#include "kernels/norm.h"
#include "kernels/reduce.h"
#include "kernels/unscale.h"
#include "zero/base/error.h"
#include "zero/base/stream_copy.h"

namespace zero::kernels {

bool unscale_and_check_cpu(void* data, DType dtype, std::size_t numel, float scale,
                           const CpuExec& exec) {
  detail::check_float_array("unscale", "data", data, dtype, numel);
  ZERO_CHECK(std::isfinite(scale), "unscale: scale must be finite, got {}", scale);
  const int threads = resolve_threads(exec.threads);
  const auto& kernels = detail::cpu_kernels(resolve_isa(exec.isa));
  std::atomic<bool> nonfinite{false};
  detail::for_each_tile(numel, detail::kTileElems, threads,
                        [&](std::size_t begin, std::size_t end) {
                          if (kernels.unscale(data, dtype, scale, begin, end))
                            nonfinite.store(true, std::memory_order_relaxed);
                        });
  return nonfinite.load();
}

double squared_l2_norm_cpu(const void* data, DType dtype, std::size_t numel, const CpuExec& exec) {
  detail::check_float_array("squared_l2_norm", "data", data, dtype, numel);
  const int threads = resolve_threads(exec.threads);
  const auto& kernels = detail::cpu_kernels(resolve_isa(exec.isa));
  const std::size_t blocks = (numel + detail::kNormBlockElems - 1) / detail::kNormBlockElems;
  std::vector<double> block_sums(blocks);
  detail::for_each_tile(blocks, detail::kNormBlocksAtOnce, threads,
                        [&](std::size_t first, std::size_t end) {
                          detail::norm_block_sums(kernels, data, dtype, numel, first, end - first,
                                                  &block_sums[first]);
                        });
  double sum = 0.0;
  for (double s : block_sums) sum += s;
  return sum;
}

double sum_norm_blocks(std::span<const double> block_sums, std::span<const std::size_t> first) {
  ZERO_ASSERT(!first.empty() && first.back() <= block_sums.size());
  double sum = 0.0;
  for (std::size_t a = 0; a + 1 < first.size(); ++a) {
    double array_sum = 0.0;
    for (std::size_t b = first[a]; b < first[a + 1]; ++b) array_sum += block_sums[b];
    sum += array_sum;
  }
  return sum;
}

void cast_cpu(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t numel,
              const CpuExec& exec) {
  detail::check_float_array("cast", "src", src, src_dtype, numel);
  detail::check_float_array("cast", "dst", dst, dst_dtype, numel);
  ZERO_CHECK(src_dtype == DType::F32 || dst_dtype == DType::F32,
             "cast: one side must be fp32, got {} -> {}", dtype_name(src_dtype),
             dtype_name(dst_dtype));
  if (numel > 0) {
    const auto s = reinterpret_cast<std::uintptr_t>(src);
    const auto d = reinterpret_cast<std::uintptr_t>(dst);
    ZERO_CHECK(s + numel * dtype_size(src_dtype) <= d || d + numel * dtype_size(dst_dtype) <= s,
               "cast: src and dst overlap");
  }
  const int threads = resolve_threads(exec.threads);
  const auto& kernels = detail::cpu_kernels(resolve_isa(exec.isa));
  detail::for_each_tile(numel, detail::kTileElems, threads,
                        [&](std::size_t begin, std::size_t end) {
                          kernels.cast(src, src_dtype, dst, dst_dtype, begin, end);
                        });
}

void reduce_cpu(void* dst, const void* const* srcs, int nsrc, std::size_t elems, DType dtype,
                ReduceKind kind, float divisor, Isa isa, Stores stores) {
  ZERO_CHECK(nsrc >= 1, "reduce: needs at least one source, got {}", nsrc);
  detail::check_float_array("reduce", "dst", dst, dtype, elems);
  for (int k = 0; k < nsrc; ++k)
    detail::check_float_array("reduce", "a source", srcs[k], dtype, elems);
  if (elems == 0) return;
  const bool streaming = stores == Stores::Streaming;
  detail::cpu_kernels(resolve_isa(isa))
      .reduce(dst, srcs, nsrc, dtype, kind == ReduceKind::Max, divisor, 0, elems, streaming);
  if (streaming) streaming_fence();
}

}  // namespace zero::kernels
