// optimizer_step_cuda and traffic_probe_cuda (optimizer_cuda.h) on the host: check the
// arguments, plan the multi-tensor launches and turn a failed launch into zero::CudaError. Plain
// C++, no CUDA code.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/multi_tensor.h"
#include "kernels/optimizer_cuda.h"
#include "kernels/optimizer_cuda_launch.h"
#include "zero/base/error.h"

namespace zero::kernels {

namespace {

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// Plans and launches the multi-tensor kernels over `tensors` (checked alike by the caller):
// the optimizer's step, or with `probe` the traffic probe.
void launch_all(const math::StepCoeffs& coeffs, std::span<const OptimizerTensors> tensors,
                int states, bool probe, const char* what, const CudaExec& exec) {
  const OptimizerTensors& first = tensors.front();
  std::vector<std::size_t> numels;
  numels.reserve(tensors.size());
  bool vectorized = true;
  for (const OptimizerTensors& t : tensors) {
    numels.push_back(t.numel);
    const void* arrays[] = {t.master, t.grad, states > 0 ? t.state0 : nullptr,
                            states > 1 ? t.state1 : nullptr, t.param_out};
    for (const void* a : arrays) vectorized = vectorized && aligned16(a);
  }
  const MultiTensorLimits limits{static_cast<std::size_t>(detail::kCudaChunkElems),
                                 detail::kCudaMaxTensorsPerLaunch, detail::kCudaMaxBlocksPerLaunch};
  for (const MultiTensorLaunch& plan : plan_multi_tensor_launches(numels, limits)) {
    detail::CudaLaunchArgs args{};
    args.coeffs = coeffs;
    args.chunk_elems = detail::kCudaChunkElems;
    args.grad_dtype = first.grad_dtype;
    args.state_dtype = first.state_dtype;
    args.param_out_dtype = first.param_out_dtype;
    args.has_param_out = first.param_out != nullptr;
    args.vectorized = vectorized;
    for (std::size_t slot = 0; slot < plan.tensors.size(); ++slot) {
      const OptimizerTensors& t = tensors[plan.tensors[slot]];
      args.tensors[slot] = {t.master, t.grad,      t.state0,
                            t.state1, t.param_out, static_cast<long long>(t.numel)};
    }
    for (std::size_t b = 0; b < plan.blocks.size(); ++b) {
      args.block_slot[b] = plan.blocks[b].slot;
      args.block_chunk[b] = plan.blocks[b].chunk;
    }
    const int blocks = static_cast<int>(plan.blocks.size());
    const detail::CudaLaunchStatus status =
        probe ? detail::launch_multi_tensor_probe(args, blocks, states, exec.stream)
              : detail::launch_multi_tensor_step(args, blocks, states, exec.stream);
    ZERO_CHECK_AS(CudaError, status.error == nullptr, "{} ({} blocks, {}): {}", status.kernel,
                  blocks, what, status.error ? status.error : "");
  }
}

}  // namespace

void optimizer_step_cuda(const OptimizerHyper& hyper, const StepScalars& scalars,
                         std::span<const OptimizerTensors> tensors, const CudaExec& exec) {
  const math::StepCoeffs coeffs = make_step_coeffs(hyper, scalars);
  if (tensors.empty()) return;
  const int states = optimizer_state_count(hyper);
  const OptimizerTensors& first = tensors.front();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const OptimizerTensors& t = tensors[i];
    validate_tensors(hyper, t);
    ZERO_CHECK(t.grad_dtype == first.grad_dtype && t.state_dtype == first.state_dtype,
               "{} on cuda: tensor {} has grad/state dtypes {}/{}, tensor 0 has {}/{}",
               optimizer_name(hyper.kind), i, dtype_name(t.grad_dtype), dtype_name(t.state_dtype),
               dtype_name(first.grad_dtype), dtype_name(first.state_dtype));
    ZERO_CHECK((t.param_out == nullptr) == (first.param_out == nullptr) &&
                   (t.param_out == nullptr || t.param_out_dtype == first.param_out_dtype),
               "{} on cuda: tensor {} differs from tensor 0 in its param_out",
               optimizer_name(hyper.kind), i);
  }
  launch_all(coeffs, tensors, states, false, std::string(optimizer_name(hyper.kind)).c_str(), exec);
}

void traffic_probe_cuda(const OptimizerTensors& tensors, int state_count, const CudaExec& exec) {
  traffic_probe_cuda(std::span(&tensors, 1), state_count, exec);
}

void traffic_probe_cuda(std::span<const OptimizerTensors> tensors, int state_count,
                        const CudaExec& exec) {
  ZERO_CHECK(state_count >= 0 && state_count <= 2, "traffic probe on cuda: {} states (0 to 2)",
             state_count);
  if (tensors.empty()) return;
  const OptimizerTensors& first = tensors.front();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const OptimizerTensors& t = tensors[i];
    ZERO_CHECK(
        t.master != nullptr && t.grad != nullptr && (state_count < 1 || t.state0 != nullptr) &&
            (state_count < 2 || t.state1 != nullptr),
        "traffic probe on cuda: tensor {}: an array the {} states need is null", i, state_count);
    ZERO_CHECK(t.grad_dtype == first.grad_dtype && t.state_dtype == first.state_dtype &&
                   (t.param_out == nullptr) == (first.param_out == nullptr) &&
                   (t.param_out == nullptr || t.param_out_dtype == first.param_out_dtype),
               "traffic probe on cuda: tensor {} differs from tensor 0 in its dtypes or param_out",
               i);
  }
  launch_all(math::StepCoeffs{}, tensors, state_count, true, "traffic probe", exec);
}

}  // namespace zero::kernels
