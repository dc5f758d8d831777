#include <cmath>

#include "kernels/array_checks.h"
#include "kernels/cpu_kernels.h"
#include "kernels/cpu_parallel.h"
#include "kernels/optimizer.h"
#include "kernels/traffic_probe.h"
#include "zero/base/error.h"

namespace zero::kernels {

namespace detail {

const CpuKernels& cpu_kernels(Isa resolved) {
  switch (resolved) {
    case Isa::Avx512: return cpu_kernels_avx512();
    case Isa::Avx2: return cpu_kernels_avx2();
    case Isa::Scalar:
    case Isa::Auto: break;
  }
  return cpu_kernels_scalar();
}

}  // namespace detail

void optimizer_step_cpu(const OptimizerHyper& hyper, const StepScalars& scalars,
                        const OptimizerTensors& tensors, const CpuExec& exec) {
  const math::StepCoeffs coeffs = make_step_coeffs(hyper, scalars);
  validate_tensors(hyper, tensors);
  const int threads = resolve_threads(exec.threads);
  const auto& kernels = detail::cpu_kernels(resolve_isa(exec.isa));
  detail::for_each_tile(
      tensors.numel, detail::kTileElems, threads,
      [&](std::size_t begin, std::size_t end) { kernels.optimizer(coeffs, tensors, begin, end); });
}

void optimizer_step_norm_cpu(const OptimizerHyper& hyper, const StepScalars& scalars,
                             const OptimizerTensors& tensors, double* block_sums,
                             const CpuExec& exec) {
  static_assert(detail::kTileElems % detail::kNormBlockElems == 0,
                "a tile is whole norm blocks, so its blocks are the array's");
  const math::StepCoeffs coeffs = make_step_coeffs(hyper, scalars);
  validate_tensors(hyper, tensors);
  ZERO_CHECK(block_sums != nullptr || tensors.numel == 0, "{}: block_sums is null",
             optimizer_name(hyper.kind));
  const int threads = resolve_threads(exec.threads);
  const auto& kernels = detail::cpu_kernels(resolve_isa(exec.isa));
  constexpr std::size_t kBlock = detail::kNormBlockElems;
  detail::for_each_tile(
      tensors.numel, detail::kTileElems, threads, [&](std::size_t begin, std::size_t end) {
        const std::size_t first = begin / kBlock;
        detail::norm_block_sums(kernels, tensors.grad, tensors.grad_dtype, tensors.numel, first,
                                (end - begin + kBlock - 1) / kBlock, block_sums + first);
        kernels.optimizer(coeffs, tensors, begin, end);
      });
}

namespace {

void check_sources(std::string_view name, const GradSources& sources) {
  ZERO_CHECK(sources.count >= 1 && sources.count <= GradSources::kMaxCount,
             "{}: a summed gradient needs 1 to {} sources, got {}", name, GradSources::kMaxCount,
             sources.count);
  ZERO_CHECK(sources.arrays != nullptr, "{}: the gradient's sources are null", name);
  ZERO_CHECK(std::isfinite(sources.divisor) && sources.divisor >= 0.0f,
             "{}: the gradient's divisor must be finite and >= 0 (0: none), got {}", name,
             sources.divisor);
}

}  // namespace

void optimizer_step_summed_cpu(const OptimizerHyper& hyper, const StepScalars& scalars,
                               const OptimizerTensors& tensors, const GradSources& sources,
                               double* block_sums, const CpuExec& exec) {
  check_sources(optimizer_name(hyper.kind), sources);
  const math::StepCoeffs coeffs = make_step_coeffs(hyper, scalars);
  // Every source is checked as the gradient array would be.
  OptimizerTensors checked = tensors;
  for (int k = 0; k < sources.count; ++k) {
    checked.grad = sources.arrays[k];
    validate_tensors(hyper, checked);
  }
  const int threads = resolve_threads(exec.threads);
  const auto& kernels = detail::cpu_kernels(resolve_isa(exec.isa));
  constexpr std::size_t kBlock = detail::kNormBlockElems;
  detail::for_each_tile(
      tensors.numel, detail::kTileElems, threads, [&](std::size_t begin, std::size_t end) {
        kernels.optimizer_summed(coeffs, tensors, sources, begin, end,
                                 block_sums != nullptr ? block_sums + begin / kBlock : nullptr);
      });
}

void squared_norm_summed_cpu(const GradSources& sources, DType dtype, std::size_t numel,
                             double* block_sums, const CpuExec& exec) {
  check_sources("squared norm", sources);
  ZERO_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
             "squared norm: the gradient must be fp32, bf16 or fp16, got {}", dtype_name(dtype));
  ZERO_CHECK(block_sums != nullptr || numel == 0, "squared norm: block_sums is null");
  for (int k = 0; k < sources.count; ++k) {
    detail::check_float_array("squared norm", "a gradient source", sources.arrays[k], dtype,
                              numel);
  }
  const int threads = resolve_threads(exec.threads);
  const auto& kernels = detail::cpu_kernels(resolve_isa(exec.isa));
  constexpr std::size_t kBlock = detail::kNormBlockElems;
  detail::for_each_tile(numel, detail::kTileElems, threads,
                        [&](std::size_t begin, std::size_t end) {
                          kernels.norm_summed(sources, dtype, begin, end,
                                              block_sums + begin / kBlock);
                        });
}

void traffic_probe_cpu(const OptimizerTensors& tensors, int state_count, const CpuExec& exec) {
  ZERO_CHECK(state_count >= 0 && state_count <= 2,
             "traffic probe: state_count must be 0, 1 or 2, got {}", state_count);
  OptimizerHyper shape;
  shape.kind = state_count == 2 ? OptimizerKind::AdamW : OptimizerKind::Sgd;
  shape.momentum = state_count == 1 ? 0.9 : 0.0;
  validate_tensors(shape, tensors);
  const int threads = resolve_threads(exec.threads);
  const auto& kernels = detail::cpu_kernels(resolve_isa(exec.isa));
  detail::for_each_tile(tensors.numel, detail::kTileElems, threads,
                        [&](std::size_t begin, std::size_t end) {
                          kernels.traffic_probe(tensors, state_count, begin, end);
                        });
}

std::size_t optimizer_bytes_per_elem(const OptimizerTensors& tensors, int state_count) {
  std::size_t bytes = 2 * sizeof(float) + dtype_size(tensors.grad_dtype);
  bytes += 2 * static_cast<std::size_t>(state_count) * dtype_size(tensors.state_dtype);
  if (tensors.param_out != nullptr) bytes += dtype_size(tensors.param_out_dtype);
  return bytes;
}

}  // namespace zero::kernels
