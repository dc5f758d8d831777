// The model zero-train trains (and zero-bench step and the engine tests): an MLP (IN, H1, ...,
// OUT) with ReLU between layers, fitted with a mean-squared error to a fixed "teacher" MLP of the
// same shape. Everything is a function of the seed, so any rank can produce its share of any
// step's batch without talking to the others. Matrix products run on OpenBLAS (models/gemm.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

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
void init_param(const MlpShape& shape, std::size_t index, std::uint64_t seed, int stream,
                std::span<float> out);

// One batch of teacher-student samples: global sample j of optimizer step t has inputs drawn
// from N(0, 1) keyed on (seed, t, j) and targets = teacher(inputs). Both are bitwise functions of
// (seed, t, j) on a given OpenBLAS kernel: the teacher runs on fixed blocks of kTeacherBlockRows
// global samples, so neither the share asked for nor `threads` changes a target.
struct Batch {
  std::size_t rows = 0;
  std::vector<float> inputs;   // rows × IN
  std::vector<float> targets;  // rows × OUT
};

inline constexpr std::size_t kTeacherBlockRows = 16;

class TeacherStudentData {
 public:
  // `threads`: OpenMP threads computing teacher blocks in batch() (at least 1).
  TeacherStudentData(const MlpShape& shape, std::uint64_t seed, int threads = 1);
  // Samples [first, first + rows) of step t's global batch. Costs the teacher forward of every
  // block the share touches. Thread-safe (const).
  Batch batch(std::uint64_t step, std::uint64_t first, std::size_t rows) const;

 private:
  void fill_inputs(std::uint64_t step, std::uint64_t first, std::size_t rows, float* out) const;

  MlpShape shape_;
  std::uint64_t seed_;
  int threads_;
  std::vector<std::vector<float>> teacher_;  // teacher parameters, mlp_params order
};

struct BackwardOptions {
  // OpenMP threads of each matrix product (models/gemm.h); results depend on it.
  int threads = 1;
  // Called on the calling thread as soon as layer k's gradients (grads[2k], grads[2k + 1]) are
  // final, for k = layers - 1 down to 0, so a trainer can hand them on while backward goes on
  // with the layers below. It may read, copy or overwrite those two buffers; it must not change
  // `weights` or any other gradient buffer. An exception from it leaves forward_backward.
  std::function<void(std::size_t layer)> on_layer_grads;
};

// Forward and backward over one batch in fp32 (OpenBLAS sgemm; bias gradients summed over rows in
// ascending order). Bitwise deterministic for the same weights, batch, loss scale and threads on
// the same OpenBLAS kernel; not bitwise equal to a loop implementation or across batch splits.
//   weights[i]: parameter i as fp32, mlp_params order; read until the call returns.
//   grads[i]:   receives d(loss × loss_scale)/d(param i); overwritten, not accumulated.
// Returns the unscaled loss: mean over rows and outputs of (y - target)^2 / 2.
// Throws zero::Error when the counts or sizes of weights, grads or the batch do not fit `shape`.
double forward_backward(const MlpShape& shape, std::span<const std::span<const float>> weights,
                        const Batch& batch, float loss_scale,
                        std::span<const std::span<float>> grads,
                        const BackwardOptions& options = {});

// Forward only; returns the same loss as forward_backward with the same threads.
double forward_loss(const MlpShape& shape, std::span<const std::span<const float>> weights,
                    const Batch& batch, int threads = 1);

}  // namespace zero::models
