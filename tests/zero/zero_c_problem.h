// The small problem the C ABI tests train (zero/zero_c.h): two tensors pulled toward a target,
// the config text, the parameter specs and one micro-step through the C ABI.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "zero/base/dtype.h"
#include "zero/zero_c.h"

namespace zero::test {

// The trained problem: minimise 0.5 * mean((w - target)^2) over every element of two tensors.
inline constexpr std::int64_t kShape0[] = {4, 8};
inline constexpr std::int64_t kShape1[] = {8};
inline constexpr std::size_t kNumel[] = {32, 8};

inline float target(std::size_t param, std::size_t e) {
  return std::sin(0.7f * static_cast<float>(e + 13 * param));
}

inline int init_weights(void* user, std::size_t index, float* out, std::size_t numel) {
  ++*static_cast<int*>(user);
  for (std::size_t e = 0; e < numel; ++e) out[e] = 1.5f + 0.01f * static_cast<float>(e + index);
  return 0;
}

inline std::string config_text(int stage, const std::string& precision) {
  std::string dtype_block;
  if (precision == "bf16") dtype_block = R"("bf16": {"enabled": true},)";
  if (precision == "fp16") dtype_block = R"("fp16": {"enabled": true, "initial_scale_power": 12},)";
  return R"({
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 0,
  )" + dtype_block +
         R"(
  "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.0}},
  "zero_optimization": {"stage": )" +
         std::to_string(stage) + R"(}
})";
}

inline zero::DType to_zero_dtype(int d) {
  return d == ZERO_DTYPE_BF16  ? zero::DType::BF16
         : d == ZERO_DTYPE_F16 ? zero::DType::F16
                               : zero::DType::F32;
}

inline std::vector<zero_param_spec> specs_of(int dtype) {
  return {{"layer.weight", kShape0, 2, dtype, 0, 0, 1, nullptr, 0},
          {"layer.bias", kShape1, 1, dtype, 0, 1, 1, nullptr, 0}};
}

// One micro-step through the C ABI; returns the unscaled loss.
inline double micro_step(zero_engine* e, int dtype, zero_step_result* result) {
  const zero::DType dt = to_zero_dtype(dtype);
  for (int u = 0; u < 2; ++u) REQUIRE(zero_engine_gather(e, u) == ZERO_OK);
  double scale = 0;
  REQUIRE(zero_engine_backward_scale(e, &scale) == ZERO_OK);
  double loss = 0;
  std::vector<std::vector<float>> grads(2);
  const std::size_t total = kNumel[0] + kNumel[1];
  for (std::size_t p = 0; p < 2; ++p) {
    const void* data = nullptr;
    std::size_t bytes = 0;
    REQUIRE(zero_engine_param(e, p, &data, &bytes) == ZERO_OK);
    REQUIRE(bytes == kNumel[p] * zero::dtype_size(dt));
    std::vector<float> w(kNumel[p]);
    zero::kernels::cast_cpu(data, dt, w.data(), zero::DType::F32, w.size());
    grads[p].resize(kNumel[p]);
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double d = w[i] - target(p, i);
      loss += 0.5 * d * d / static_cast<double>(total);
      grads[p][i] = static_cast<float>(d / static_cast<double>(total) * scale);
    }
  }
  for (std::size_t p = 2; p-- > 0;) {
    if (p == 0) {
      // Through the one-call copies: the gradient in the model dtype, in the caller's memory,
      // in turn with and without the stream argument (null: the host's only stream).
      std::vector<std::byte> grad(kNumel[p] * zero::dtype_size(dt));
      zero::kernels::cast_cpu(grads[p].data(), zero::DType::F32, grad.data(), dt, kNumel[p]);
      static int calls = 0;
      REQUIRE((++calls % 2 == 0
                   ? zero_engine_grad_copy(e, p, grad.data(), grad.size())
                   : zero_engine_grad_copy_on_stream(e, p, grad.data(), grad.size(), nullptr)) ==
              ZERO_OK);
    } else {
      void* slot = nullptr;
      std::size_t bytes = 0;
      REQUIRE(zero_engine_grad(e, p, &slot, &bytes) == ZERO_OK);
      REQUIRE(bytes == kNumel[p] * zero::dtype_size(dt));
      zero::kernels::cast_cpu(grads[p].data(), zero::DType::F32, slot, dt, kNumel[p]);
      REQUIRE(zero_engine_grad_ready(e, p) == ZERO_OK);
    }
    REQUIRE(zero_engine_release(e, static_cast<int>(p)) == ZERO_OK);
  }
  REQUIRE(zero_engine_step(e, result) == ZERO_OK);
  return loss;
}
}  // namespace zero::test
