// CudaMlp (models/mlp_cuda.h) against the CPU model (models::forward_backward), the oracle: the
// loss, every gradient and the order of the sink's calls, in fp32, bf16 and fp16. Exits 77,
// reported as skipped, on a machine without a CUDA device.
#define CATCH_CONFIG_RUNNER
#include "models/mlp_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda_device_count.h"
#include "models/mlp.h"
#include "zero/base/error.h"
#include "zero/base/half.h"

namespace zm = zero::models;
using zero::DType;

namespace {

// Tolerances relative to the largest |CPU value| of each tensor (and to the CPU loss). Sized by
// an emulation of the GPU's rounding on the CPU (operands rounded as the GPU rounds them, sums in
// double), which lands within 2.2e-7 (fp32), 0 (bf16) and 7.1e-4 (fp16) of the CPU model on the
// case below.
// fp32: the same fp32 operands summed in another order by cuBLAS and oneDNN (sums of 16 to 128
// products), each layer's difference carried into the next in backward.
constexpr double kF32Tolerance = 1e-5;
// bf16: the same bf16 operands on both sides, but an fp32 sum that differs in its last bits can
// round to the neighbouring bf16 value (2^-8 relative) in the next layer's operand or in a bf16
// slot: a budget of about two such steps of the largest value.
constexpr double kBf16Tolerance = 1e-2;
// fp16: the GPU rounds activations and output gradients to fp16 (2^-11 relative each) where the
// CPU keeps them in fp32, and both round the gradients into fp16 slots: a few fp16 roundings in
// every product, through two layers.
constexpr double kF16Tolerance = 5e-3;

struct Case {
  DType weights;
  DType slots;
  double tolerance;
};

std::vector<std::byte> to_dtype(const std::vector<float>& v, DType t) {
  std::vector<std::byte> out(v.size() * zero::dtype_size(t));
  for (std::size_t e = 0; e < v.size(); ++e) {
    if (t == DType::F32) {
      std::memcpy(out.data() + 4 * e, &v[e], 4);
    } else {
      const std::uint16_t h =
          t == DType::BF16 ? zero::half::float_to_bf16(v[e]) : zero::half::float_to_f16(v[e]);
      std::memcpy(out.data() + 2 * e, &h, 2);
    }
  }
  return out;
}

std::vector<double> widen(const std::vector<std::byte>& bytes, DType t) {
  std::vector<double> out(bytes.size() / zero::dtype_size(t));
  for (std::size_t e = 0; e < out.size(); ++e) {
    if (t == DType::F32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * e, 4);
      out[e] = f;
    } else {
      std::uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * e, 2);
      out[e] = t == DType::BF16 ? zero::half::bf16_to_float(h) : zero::half::f16_to_float(h);
    }
  }
  return out;
}

// GPU memory holding a copy of some bytes.
class DeviceBytes {
 public:
  explicit DeviceBytes(const std::vector<std::byte>& host) : size_(host.size()) {
    REQUIRE(cudaMalloc(&data_, size_) == cudaSuccess);
    REQUIRE(cudaMemcpy(data_, host.data(), size_, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  DeviceBytes(DeviceBytes&& other) noexcept : data_(other.data_), size_(other.size_) {
    other.data_ = nullptr;
  }
  ~DeviceBytes() { cudaFree(data_); }

  std::span<std::byte> bytes() const { return {static_cast<std::byte*>(data_), size_}; }
  std::vector<std::byte> download() const {
    std::vector<std::byte> host(size_);
    REQUIRE(cudaMemcpy(host.data(), data_, size_, cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

// What one forward_backward produced, on host memory.
struct Result {
  double loss = 0;
  std::vector<std::vector<std::byte>> grads;  // mlp_params order, in the slots' dtype
  std::vector<std::string> calls;             // "slot 3", "layer 1", in call order
};

// The test model's weights in `t`, on the host.
std::vector<std::vector<std::byte>> host_weights(const zm::MlpShape& shape, DType t) {
  std::vector<std::vector<std::byte>> weights;
  const auto params = zm::mlp_params(shape);
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::vector<float> w(params[i].numel());
    zm::init_param(shape, i, /*seed=*/5, /*stream=*/0, w);
    weights.push_back(to_dtype(w, t));
  }
  return weights;
}

Result run_cpu(const zm::MlpShape& shape, const Case& c, const zm::Batch& batch, float loss_scale) {
  const auto weights = host_weights(shape, c.weights);
  std::vector<zm::ParamView> views;
  for (const auto& w : weights) views.push_back({w, c.weights});
  Result r;
  for (const auto& p : zm::mlp_params(shape)) {
    r.grads.emplace_back(p.numel() * zero::dtype_size(c.slots));
  }
  const zm::GradSink sink{
      .slot = [&](std::size_t i) -> zm::GradView {
        r.calls.push_back("slot " + std::to_string(i));
        return {r.grads[i], c.slots};
      },
      .on_layer_grads = [&](std::size_t k) { r.calls.push_back("layer " + std::to_string(k)); }};
  r.loss = zm::forward_backward(shape, views, batch, loss_scale, sink);
  return r;
}

// Also checks that every layer's gradients are complete in GPU memory when on_layer_grads
// announces them: nothing writes them afterwards.
Result run_gpu(zm::CudaMlp& model, const Case& c, const zm::Batch& batch, float loss_scale) {
  const zm::MlpShape& shape = model.shape();
  std::vector<DeviceBytes> weights;
  std::vector<zm::ParamView> views;
  for (const auto& w : host_weights(shape, c.weights)) weights.emplace_back(w);
  for (const auto& w : weights) views.push_back({w.bytes(), c.weights});
  std::vector<DeviceBytes> slots;
  for (const auto& p : zm::mlp_params(shape)) {
    // NaN bytes, so a gradient left unwritten cannot pass for a small one.
    slots.emplace_back(
        std::vector<std::byte>(p.numel() * zero::dtype_size(c.slots), std::byte{0xff}));
  }
  Result r;
  std::vector<std::vector<std::byte>> announced(slots.size());
  const zm::GradSink sink{.slot = [&](std::size_t i) -> zm::GradView {
                            r.calls.push_back("slot " + std::to_string(i));
                            return {slots[i].bytes(), c.slots};
                          },
                          .on_layer_grads =
                              [&](std::size_t k) {
                                r.calls.push_back("layer " + std::to_string(k));
                                announced[2 * k] = slots[2 * k].download();
                                announced[2 * k + 1] = slots[2 * k + 1].download();
                              }};
  r.loss = model.forward_backward(views, batch, loss_scale, sink);
  for (const auto& s : slots) r.grads.push_back(s.download());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    INFO("parameter " << i);
    CHECK(announced[i] == r.grads[i]);
  }
  return r;
}

}  // namespace

TEST_CASE("the GPU MLP's loss and gradients match the CPU model in fp32, bf16 and fp16") {
  const auto shape = zm::MlpShape::parse("mlp:64,128,32");
  const std::size_t rows = 16;
  // A loss scale as fp16 training uses, so fp16 output gradients are not subnormal.
  const float loss_scale = 256.0f;
  const zm::TeacherStudentData data(shape, /*seed=*/5);
  const zm::Batch batch = data.batch(/*step=*/2, /*first=*/0, rows);
  zm::CudaMlp model(shape, /*ordinal=*/0);

  for (const Case& c :
       {Case{DType::F32, DType::F32, kF32Tolerance}, Case{DType::BF16, DType::BF16, kBf16Tolerance},
        Case{DType::BF16, DType::F32, kBf16Tolerance},
        Case{DType::F16, DType::F16, kF16Tolerance}}) {
    INFO(shape.to_string() << ", " << rows << " rows, weights " << zero::dtype_name(c.weights)
                           << ", slots " << zero::dtype_name(c.slots) << ", loss scale "
                           << loss_scale << ", tolerance " << c.tolerance);
    const Result expected = run_cpu(shape, c, batch, loss_scale);
    const Result got = run_gpu(model, c, batch, loss_scale);

    REQUIRE(expected.loss > 1e-4);  // the student starts away from the teacher
    CHECK(std::abs(got.loss - expected.loss) <= c.tolerance * expected.loss);
    CHECK(got.calls == expected.calls);
    REQUIRE(got.grads.size() == expected.grads.size());
    for (std::size_t i = 0; i < expected.grads.size(); ++i) {
      const std::vector<double> want = widen(expected.grads[i], c.slots);
      const std::vector<double> have = widen(got.grads[i], c.slots);
      double largest = 0, worst = 0;
      for (std::size_t e = 0; e < want.size(); ++e) {
        largest = std::max(largest, std::abs(want[e]));
        // NaN-safe: a NaN difference counts as infinitely wrong.
        const double d = std::abs(have[e] - want[e]);
        worst = std::isnan(d) ? INFINITY : std::max(worst, d);
      }
      INFO("parameter " << i << ": largest |cpu| " << largest << ", largest |gpu - cpu| " << worst);
      REQUIRE(largest > 1e-6);  // not vacuous: the gradient is not all zero
      CHECK(worst <= c.tolerance * largest);
    }
  }
}

TEST_CASE("the GPU MLP gives the same bits when called twice with the same inputs") {
  const auto shape = zm::MlpShape::parse("mlp:64,128,32");
  const zm::TeacherStudentData data(shape, /*seed=*/9);
  const zm::Batch batch = data.batch(/*step=*/0, /*first=*/0, /*rows=*/16);
  zm::CudaMlp model(shape, /*ordinal=*/0);
  const Case c{DType::BF16, DType::BF16, 0};
  const Result first = run_gpu(model, c, batch, 1.0f);
  const Result second = run_gpu(model, c, batch, 1.0f);
  CHECK(first.loss == second.loss);
  CHECK(first.grads == second.grads);
}

TEST_CASE("the GPU MLP refuses weights that do not fit the shape, as the CPU model does") {
  const auto shape = zm::MlpShape::parse("mlp:8,4");
  zm::CudaMlp model(shape, /*ordinal=*/0);
  const zm::Batch batch = zm::TeacherStudentData(shape, 1).batch(0, 0, 2);
  const std::vector<zm::ParamView> one(1);
  const zm::GradSink sink{.slot = [](std::size_t) { return zm::GradView{}; }};
  REQUIRE_THROWS_AS(model.forward_backward(one, batch, 1.0f, sink), zero::Error);
  REQUIRE_THROWS_WITH(model.forward_backward(one, batch, 1.0f, sink),
                      Catch::Contains("expected 2 parameters, got 1"));
}

int main(int argc, char** argv) {
  if (zero::kernels::cuda_device_count() == 0) {
    std::fprintf(stderr, "mlp_cuda_test: no CUDA device, skipped\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
