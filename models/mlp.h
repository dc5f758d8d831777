// The model zero-train trains (and zero-bench step and the engine tests): an MLP (IN, H1, ...,
// OUT) with ReLU between layers, fitted with a mean-squared error to a fixed "teacher" MLP of the
// same shape. Everything is a function of the seed, so any rank can produce its share of any
// step's batch without talking to the others.
#pragma once

#include <cstddef>
#include <cstdint>
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
// from N(0, 1) keyed on (seed, t, j) and targets = teacher(inputs).
struct Batch {
  std::size_t rows = 0;
  std::vector<float> inputs;   // rows × IN
  std::vector<float> targets;  // rows × OUT
};

class TeacherStudentData {
 public:
  TeacherStudentData(const MlpShape& shape, std::uint64_t seed);
  // Samples [first, first + rows) of step t's global batch.
  Batch batch(std::uint64_t step, std::uint64_t first, std::size_t rows) const;

 private:
  MlpShape shape_;
  std::uint64_t seed_;
  std::vector<std::vector<float>> teacher_;  // teacher parameters, mlp_params order
};

// Forward and backward over one batch, in fp32 with a fixed summation order (results do not
// depend on threads or on the rank that computes them).
//   weights[i]: parameter i as fp32, mlp_params order.
//   grads[i]:   receives d(loss × loss_scale)/d(param i); overwritten, not accumulated.
// Returns the unscaled loss: mean over rows and outputs of (y - target)^2 / 2.
double forward_backward(const MlpShape& shape, std::span<const std::span<const float>> weights,
                        const Batch& batch, float loss_scale,
                        std::span<const std::span<float>> grads);

// Forward only; returns the same loss as forward_backward.
double forward_loss(const MlpShape& shape, std::span<const std::span<const float>> weights,
                    const Batch& batch);

}  // namespace zero::models
