// Optimizer step over one flat fp32 partition: Adam, AdamW, Adagrad, Lion, SGD.
//
// The update rules match torch.optim (see the *_math.h headers for the exact form of each). The
// same element functions run in the CPU driver (scalar, AVX2, AVX-512; bitwise identical, and
// independent of the thread count) and in the CUDA driver (optimizer_cuda.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "kernels/isa.h"
#include "kernels/optimizer_kind.h"
#include "kernels/optimizer_math.h"
#include "zero/base/dtype.h"

namespace zero::kernels {

std::string_view optimizer_name(OptimizerKind kind);  // "adam", "adamw", "adagrad", "lion", "sgd"
std::optional<OptimizerKind> parse_optimizer_kind(std::string_view name);

// Hyper-parameters of one param group, with torch.optim's names and defaults. Fields that do not
// apply to `kind` are ignored. The learning rate changes per step and lives in StepScalars.
struct OptimizerHyper {
  OptimizerKind kind = OptimizerKind::AdamW;
  double beta1 = 0.9;    // Adam, AdamW, Lion
  double beta2 = 0.999;  // Adam, AdamW, Lion
  double eps = 1e-8;     // Adam, AdamW, Adagrad
  double weight_decay = 0.0;
  bool bias_correction = true;             // Adam, AdamW
  double momentum = 0.0;                   // SGD; 0 = no momentum buffer
  double dampening = 0.0;                  // SGD
  bool nesterov = false;                   // SGD; needs momentum > 0 and dampening 0
  double lr_decay = 0.0;                   // Adagrad
  double initial_accumulator_value = 0.0;  // Adagrad: initial value of state0
};

// What changes from step to step.
struct StepScalars {
  double lr = 1e-3;
  std::int64_t step = 1;    // 1-based number of the step being taken (torch's state["step"])
  double grad_scale = 1.0;  // each gradient is multiplied by it as it is read:
                            // 1 / (loss scale × clip coefficient)
};

// One contiguous partition. All arrays hold `numel` elements and are naturally aligned for their
// dtype; they must not overlap. State arrays beyond optimizer_state_count() are ignored and may
// be null.
struct OptimizerTensors {
  float* master = nullptr;     // fp32 master weights, updated in place
  const void* grad = nullptr;  // F32, BF16 or F16
  DType grad_dtype = DType::F32;
  void* state0 = nullptr;               // exp_avg | sum | exp_avg | momentum_buffer
  void* state1 = nullptr;               // exp_avg_sq (Adam, AdamW)
  DType state_dtype = DType::F32;       // F32 or BF16 (stored round-to-nearest-even)
  void* param_out = nullptr;            // optional model copy of the updated master
  DType param_out_dtype = DType::BF16;  // BF16 or F16 (rounded), or F32 (the master's bits)
  std::size_t numel = 0;
};

// 2 for Adam/AdamW, 1 for Adagrad/Lion/SGD with momentum, 0 for SGD without.
int optimizer_state_count(const OptimizerHyper& hyper);

// The value torch initialises state `index` with: initial_accumulator_value for Adagrad's sum,
// otherwise 0. (SGD's buffer is set from the gradient on step 1 whatever it holds.)
float optimizer_state_initial_value(const OptimizerHyper& hyper, int index);

// Throw zero::Error naming the argument and its value for anything torch/DeepSpeed would reject:
// non-finite or negative lr, eps, weight_decay, momentum, lr_decay, initial_accumulator_value;
// betas outside [0, 1); nesterov without momentum > 0 and dampening 0; step < 1; grad_scale not
// finite and > 0.
void validate_hyper(const OptimizerHyper& hyper);
void validate_step(const StepScalars& scalars);
// Null or misaligned arrays, unsupported dtypes, or a size that is not representable.
void validate_tensors(const OptimizerHyper& hyper, const OptimizerTensors& tensors);

// The per-step float coefficients every driver feeds the element functions, computed in double
// and rounded once. Validates hyper and scalars.
math::StepCoeffs make_step_coeffs(const OptimizerHyper& hyper, const StepScalars& scalars);

// One optimizer step on the calling thread plus exec.threads − 1 OpenMP workers; returns when
// the arrays hold the result. Bitwise identical for every ISA and thread count.
void optimizer_step_cpu(const OptimizerHyper& hyper, const StepScalars& scalars,
                        const OptimizerTensors& tensors, const CpuExec& exec = {});

// optimizer_step_cpu, and the gradient's squared norm in the same walk over memory: before each
// tile is stepped, its norm blocks are summed (norm.h: blocks of 4096 elements from the array's
// start, the last one partial), so the step reads the gradient from cache rather than memory
// again. block_sums[k] ← block k's sum of squares, bitwise what squared_l2_norm_cpu adds for it,
// for every k < ceil(numel / 4096); the step's bits are optimizer_step_cpu's. The gradient must be
// F32, BF16 or F16 and is read only, so the sums are those of the gradient the step consumed.
void optimizer_step_norm_cpu(const OptimizerHyper& hyper, const StepScalars& scalars,
                             const OptimizerTensors& tensors, double* block_sums,
                             const CpuExec& exec = {});

// A gradient not yet in memory: the elementwise sum of `count` arrays (numel elements of the
// gradient dtype each, read only, possibly overlapping), taken left to right in fp32, divided by
// `divisor` unless it is 0 and rounded to the gradient dtype — what reduce_cpu (kernels/
// reduce.h) stores, summing the ranks' gradients as the communicators do.
struct GradSources {
  static constexpr int kMaxCount = 16;
  const void* const* arrays = nullptr;
  int count = 0;
  float divisor = 0.0f;
};

// optimizer_step_cpu (block_sums null) or optimizer_step_norm_cpu (block_sums given, the summed
// gradient's blocks) of the gradient `sources` sum, each element summed as it is stepped:
// tensors.grad is not read (it may be null), and the sources are read in the step's one walk over
// memory, their streams in flight with the master's and the states'. The bits are those of
// reduce_cpu into an array and the step (with its norm) of that array.
// REQUIRES: 1 <= sources.count <= GradSources::kMaxCount; divisor finite and >= 0.
void optimizer_step_summed_cpu(const OptimizerHyper& hyper, const StepScalars& scalars,
                               const OptimizerTensors& tensors, const GradSources& sources,
                               double* block_sums, const CpuExec& exec = {});

// block_sums[k] ← block k's sum of squares (norm.h's blocks) of the gradient `sources` sum, numel
// elements of `dtype` (F32, BF16 or F16), for every k < ceil(numel / 4096), in one walk over the
// sources: bitwise squared_l2_norm_cpu's blocks of the array reduce_cpu would have stored.
void squared_norm_summed_cpu(const GradSources& sources, DType dtype, std::size_t numel,
                             double* block_sums, const CpuExec& exec = {});

}  // namespace zero::kernels
