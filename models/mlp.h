// The model zero-train trains (and zero-bench step and the engine tests): an MLP (IN, H1, ...,
// OUT) with ReLU between layers, fitted with a mean-squared error to a fixed "teacher" MLP of the
// same shape. Everything is a function of the seed, so any rank can produce its share of any
// step's batch without talking to the others. Matrix products run on oneDNN (models/gemm.h);
// models/mlp_cuda.h runs the same model on a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "zero/base/dtype.h"

namespace zero::models {

struct MlpShape {
  std::vector<std::size_t> widths;  // IN, H1, ..., OUT; at least two entries, all positive

  // Parses "mlp:IN,H1,...,OUT" (or just "IN,H1,...,OUT"); throws zero::Error naming the text.
  static MlpShape parse(const std::string& text);
  std::string to_string() const;
  std::size_t layers() const { return widths.size() - 1; }
};

struct MlpParam {
  std::string name;  // "layers.<k>.weight" [out, in] or "layers.<k>.bias" [out]
  std::vector<std::size_t> shape;
  std::size_t numel() const;
};

// Parameters in registration (forward) order: layer 0 weight, layer 0 bias, layer 1 weight, ...
std::vector<MlpParam> mlp_params(const MlpShape& shape);

// Deterministic initial value of every element of parameter `index` (uniform in ±1/sqrt(fan_in),
// PyTorch's Linear default range), from (seed, index) only. `stream` separates the student (0)
// from the teacher (1).
// `first`: out holds elements [first, first + out.size()) of the parameter.
void init_param(const MlpShape& shape, std::size_t index, std::uint64_t seed, int stream,
                std::span<float> out, std::size_t first = 0);

// One batch of teacher-student samples: global sample j of optimizer step t has inputs drawn
// from N(0, 1) keyed on (seed, t, j) and targets = teacher(inputs). Both are bitwise functions of
// (seed, t, j) on a given CPU: the teacher runs on fixed blocks of kTeacherBlockRows
// global samples, so neither the share asked for nor `threads` changes a target.
struct Batch {
  std::size_t rows = 0;
  std::vector<float> inputs;   // rows × IN
  std::vector<float> targets;  // rows × OUT
};

inline constexpr std::size_t kTeacherBlockRows = 16;
// A teacher larger than this is not kept in memory: batch() makes its layers one at a time
// (the same targets, bit for bit, at the cost of generating every teacher parameter per call),
// so a model larger than RAM can be trained with its optimizer state on NVMe.
inline constexpr std::size_t kResidentTeacherBytes = std::size_t{1} << 30;

class TeacherStudentData {
 public:
  // `threads`: OpenMP threads computing teacher blocks in batch() (at least 1). A teacher of
  // more than `resident_limit_bytes` is made anew in every batch() (kResidentTeacherBytes).
  TeacherStudentData(const MlpShape& shape, std::uint64_t seed, int threads = 1,
                     std::size_t resident_limit_bytes = kResidentTeacherBytes);
  // Samples [first, first + rows) of step t's global batch. Costs the teacher forward of every
  // block the share touches. Thread-safe (const).
  Batch batch(std::uint64_t step, std::uint64_t first, std::size_t rows) const;

 private:
  void fill_inputs(std::uint64_t step, std::uint64_t first, std::size_t rows, float* out) const;
  std::vector<float> teacher_param(std::size_t index) const;  // made anew, threads_ at a time

  MlpShape shape_;
  std::uint64_t seed_;
  int threads_;
  std::vector<std::vector<float>> teacher_;  // teacher parameters, mlp_params order; empty when
                                             // larger than kResidentTeacherBytes
};

// One tensor's elements as the engine holds them: F32, BF16 or F16, densely packed.
struct ParamView {
  std::span<const std::byte> bytes;
  DType dtype = DType::F32;
};
struct GradView {
  std::span<std::byte> bytes;
  DType dtype = DType::F32;
};

// Where backward writes, and whom it tells.
struct GradSink {
  // Called once per parameter, in backward order (layer k's bias, then its weight, from the last
  // layer down), right before that gradient is written; returns where to write it (numel
  // elements of any of the three dtypes). Required.
  std::function<GradView(std::size_t param)> slot = nullptr;
  // Called as soon as layer k's two gradients are written and its weights are read no more, for
  // k = layers - 1 down to 0, so a trainer can hand them on (and let a gathered layer go) while
  // backward goes on with the layers below. It must not change the weights of layers below k.
  // An exception from either callback leaves forward_backward.
  std::function<void(std::size_t layer)> on_layer_grads = nullptr;
  // Called right after layer k's forward, for k = 0 up. With `backward_weight` set, layer k's
  // weights are not read again until backward asks for layer k's weight, so a trainer can let
  // the layer go in between (ZeRO stage 3 releases a gathered unit, and gathers it again).
  // Optional.
  std::function<void(std::size_t layer)> on_layer_forward = nullptr;
  // Backward's view of layer k's weight (parameter 2k, the same dtype and size as forward's),
  // asked right before the input gradient of layer k reads it (k = layers - 1 down to 1). The
  // values must be those forward used; only the memory may differ. Null: forward's view, which
  // must then stay valid throughout. (fp16 weights are widened to fp32 before forward and
  // backward reads the widened copy: this is not called for them.)
  std::function<ParamView(std::size_t layer)> backward_weight = nullptr;
};

// Forward and backward over one batch. The products run in the weights' precision: fp32 for F32,
// bf16 with fp32 accumulation for BF16 (operands rounded to bf16: activations and output
// gradients, as a bf16 framework keeps them), fp32 for F16 (weights widened first; the CPU has no
// fp16 product). Activations, the loss and bias gradients are fp32 sums (rows in ascending order);
// a weight gradient is rounded once into the slot's dtype. Bitwise deterministic for the same
// weights, batch, loss scale and threads on the same CPU; not across batch splits (models/gemm.h).
//   weights[i]: parameter i, mlp_params order, all of one dtype; read until the call returns.
//   sink.slot(i) receives d(loss × loss_scale)/d(param i), overwritten, not accumulated.
// Returns the unscaled loss: mean over rows and outputs of (y - target)^2 / 2.
// Throws zero::Error when the counts, sizes or dtypes of weights, slots or the batch do not fit.
double forward_backward(const MlpShape& shape, std::span<const ParamView> weights,
                        const Batch& batch, float loss_scale, const GradSink& sink,
                        int threads = 1);

struct BackwardOptions {
  // OpenMP threads of each matrix product (models/gemm.h); results depend on it.
  int threads = 1;
  // As GradSink::on_layer_grads, for grads[2k] and grads[2k + 1].
  std::function<void(std::size_t layer)> on_layer_grads = nullptr;
};

// The same in fp32 throughout, for fp32 weights and gradient buffers.
double forward_backward(const MlpShape& shape, std::span<const std::span<const float>> weights,
                        const Batch& batch, float loss_scale,
                        std::span<const std::span<float>> grads,
                        const BackwardOptions& options = {});

// Forward only; returns the same loss as forward_backward with the same threads.
double forward_loss(const MlpShape& shape, std::span<const std::span<const float>> weights,
                    const Batch& batch, int threads = 1);

}  // namespace zero::models
