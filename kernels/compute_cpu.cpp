#include <algorithm>
#include <vector>

#include "kernels/array_checks.h"
#include "kernels/combine.h"
#include "kernels/compute.h"
#include "kernels/cpu_kernels.h"
#include "kernels/cpu_parallel.h"
#include "kernels/norm.h"
#include "kernels/quantize.h"
#include "kernels/reduce.h"
#include "kernels/traffic_probe.h"
#include "kernels/unscale.h"

namespace zero::kernels {

namespace {

// One thread, as the communicators' reductions (zero/comm/reduce_math.cpp): the caller is a
// communication thread.
void reduce(void* dst, const void* const* srcs, int nsrc, std::size_t numel, DType dtype,
            ReduceKind kind, float divisor, const CpuExec& exec) {
  reduce_cpu(dst, srcs, nsrc, numel, dtype, kind, divisor, exec.isa);
}

void optimizer_step_many(const OptimizerHyper& hyper, const StepScalars& scalars,
                         std::span<const OptimizerTensors> tensors, const CpuExec& exec) {
  for (const OptimizerTensors& t : tensors) optimizer_step_cpu(hyper, scalars, t, exec);
}

void combine_many(std::span<const CombineRef> pairs, float scale, bool accumulate,
                  const CpuExec& exec) {
  for (const CombineRef& p : pairs) {
    combine_cpu(p.dst, p.dst_dtype, p.src, p.src_dtype, p.numel, scale, accumulate, exec);
  }
}

bool unscale_and_check_many(std::span<const ArrayRef> arrays, float scale, const CpuExec& exec) {
  bool nonfinite = false;
  for (const ArrayRef& a : arrays) {
    nonfinite = unscale_and_check_cpu(a.data, a.dtype, a.numel, scale, exec) || nonfinite;
  }
  return nonfinite;
}

// Every array's norm blocks in one parallel loop (one fork for a step's many small slices), the
// block sums then added as squared_l2_norm_cpu adds them, array by array.
double squared_l2_norm_many(std::span<const ArrayRef> arrays, const CpuExec& exec) {
  std::vector<std::size_t> first(arrays.size() + 1, 0);
  for (std::size_t a = 0; a < arrays.size(); ++a) {
    detail::check_float_array("squared_l2_norm", "data", arrays[a].data, arrays[a].dtype,
                              arrays[a].numel);
    first[a + 1] =
        first[a] + (arrays[a].numel + detail::kNormBlockElems - 1) / detail::kNormBlockElems;
  }
  const auto& kernels = detail::cpu_kernels(resolve_isa(exec.isa));
  std::vector<double> block_sums(first.back());
  // Blocks in groups of kNormBlocksAtOnce by index over all arrays, each group's part in each
  // array summed by norm_block_sums.
  detail::for_each_tile(
      block_sums.size(), detail::kNormBlocksAtOnce, resolve_threads(exec.threads),
      [&](std::size_t b, std::size_t end) {
        while (b < end) {
          const auto a = static_cast<std::size_t>(
              std::upper_bound(first.begin(), first.end(), b) - first.begin() - 1);
          const std::size_t count = std::min(end, first[a + 1]) - b;
          detail::norm_block_sums(kernels, arrays[a].data, arrays[a].dtype, arrays[a].numel,
                                  b - first[a], count, &block_sums[b]);
          b += count;
        }
      });
  return sum_norm_blocks(block_sums, first);
}

}  // namespace

const ComputeKernels& cpu_compute_kernels() {
  static const ComputeKernels table{
      .backend = "cpu",
      .waits_per_call = false,
      .optimizer_step = &optimizer_step_cpu,
      .optimizer_step_many = &optimizer_step_many,
      .optimizer_step_norm = &optimizer_step_norm_cpu,
      .optimizer_step_summed = &optimizer_step_summed_cpu,
      .squared_norm_summed = &squared_norm_summed_cpu,
      .unscale_and_check = &unscale_and_check_cpu,
      .squared_l2_norm = &squared_l2_norm_cpu,
      .unscale_and_check_many = &unscale_and_check_many,
      .squared_l2_norm_many = &squared_l2_norm_many,
      .combine = &combine_cpu,
      .combine_many = &combine_many,
      .fill_zero = &fill_zero_cpu,
      .reduce = &reduce,
      .quantize = &quantize_cpu,
      .dequantize = &dequantize_cpu,
      .dequantize_add = &dequantize_add_cpu,
      .traffic_probe = &traffic_probe_cpu,
  };
  return table;
}

}  // namespace zero::kernels
