// The CUDA driver against the CPU driver (the oracle). Exits 77, reported as skipped, on a
// machine without a CUDA device.
#define CATCH_CONFIG_RUNNER
#include "kernels/optimizer_cuda.h"

#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <span>
#include <vector>

#include "kernels/cuda_device_count.h"
#include "kernels/optimizer.h"
#include "kernels/traffic_probe.h"
#include "tests/kernels/test_util.h"

namespace zk = zero::kernels;
using zero::DType;

namespace {

template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceArray(const std::vector<T>& host) : n(host.size()) {
    REQUIRE(cudaMalloc(&ptr, n * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  // Move-only: a vector of them reallocates, and a copy's destructor would free the original's
  // memory (as the first run on a GPU found: the kernels then wrote freed memory).
  DeviceArray(DeviceArray&& other) noexcept : ptr(other.ptr), n(other.n) { other.ptr = nullptr; }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray& operator=(DeviceArray&&) = delete;
  ~DeviceArray() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  std::vector<T> download() const {
    std::vector<T> host(n);
    REQUIRE(cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }
};

}  // namespace

TEST_CASE("the CUDA step equals the CPU step bitwise for every optimizer over several tensors") {
  // Sizes straddle chunk (65536) and vector (4) boundaries.
  const std::vector<std::size_t> sizes = {65536 * 3 + 5, 17, 100000};
  for (auto kind : {zk::OptimizerKind::Adam, zk::OptimizerKind::AdamW, zk::OptimizerKind::Adagrad,
                    zk::OptimizerKind::Lion, zk::OptimizerKind::Sgd}) {
    zk::OptimizerHyper h;
    h.kind = kind;
    h.weight_decay = 0.01;
    h.momentum = kind == zk::OptimizerKind::Sgd ? 0.9 : 0.0;
    INFO(zk::optimizer_name(kind));
    std::vector<std::vector<float>> master, grad, s0, s1;
    std::vector<std::vector<std::uint16_t>> out;
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      master.push_back(zk::test::random_floats(sizes[t], 1 + t, -1.0f, 1.0f));
      grad.push_back(zk::test::random_floats(sizes[t], 10 + t, -1.0f, 1.0f));
      s0.push_back(zk::test::random_floats(sizes[t], 20 + t, 0.0f, 0.1f));
      s1.push_back(zk::test::random_floats(sizes[t], 30 + t, 0.0f, 0.1f));
      out.emplace_back(sizes[t], 0);
    }
    std::vector<DeviceArray<float>> d_master, d_grad, d_s0, d_s1;
    std::vector<DeviceArray<std::uint16_t>> d_out;
    std::vector<zk::OptimizerTensors> d_tensors;
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      d_master.emplace_back(master[t]);
      d_grad.emplace_back(grad[t]);
      d_s0.emplace_back(s0[t]);
      d_s1.emplace_back(s1[t]);
      d_out.emplace_back(out[t]);
    }
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      d_tensors.push_back({d_master[t].ptr, d_grad[t].ptr, DType::F32, d_s0[t].ptr, d_s1[t].ptr,
                           DType::F32, d_out[t].ptr, DType::BF16, sizes[t]});
    }
    for (int step = 1; step <= 3; ++step) {
      zk::optimizer_step_cuda(h, {1e-2, step, 0.5}, d_tensors);
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        zk::optimizer_step_cpu(h, {1e-2, step, 0.5},
                               {master[t].data(), grad[t].data(), DType::F32, s0[t].data(),
                                s1[t].data(), DType::F32, out[t].data(), DType::BF16, sizes[t]});
      }
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      REQUIRE(d_master[t].download() == master[t]);
      REQUIRE(d_s0[t].download() == s0[t]);
      REQUIRE(d_out[t].download() == out[t]);
    }
  }
}

TEST_CASE("the CUDA traffic probe touches what the CPU probe touches, with the same adds") {
  // fp32 arrays, no 16-bit write (the CPU probe truncates bf16 where the GPU's rounds).
  const std::size_t n = 65536 * 2 + 7;
  for (int states = 0; states <= 2; ++states) {
    INFO(states << " states");
    std::vector<float> master = zk::test::random_floats(n, 1, -1.0f, 1.0f);
    const std::vector<float> grad = zk::test::random_floats(n, 2, -1.0f, 1.0f);
    std::vector<float> s0 = zk::test::random_floats(n, 3, 0.0f, 0.1f);
    std::vector<float> s1 = zk::test::random_floats(n, 4, 0.0f, 0.1f);
    DeviceArray<float> d_master(master), d_grad(grad), d_s0(s0), d_s1(s1);
    const std::vector<float> before = master;
    zk::traffic_probe_cuda({d_master.ptr, d_grad.ptr, DType::F32, d_s0.ptr, d_s1.ptr, DType::F32,
                            nullptr, DType::BF16, n},
                           states);
    zk::traffic_probe_cpu({master.data(), grad.data(), DType::F32, s0.data(), s1.data(),
                           DType::F32, nullptr, DType::BF16, n},
                          states);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(master != before);  // not vacuous: the probe wrote
    REQUIRE(d_master.download() == master);
    if (states > 0) REQUIRE(d_s0.download() == s0);
    if (states > 1) REQUIRE(d_s1.download() == s1);
  }
}

TEST_CASE("the CUDA traffic probe over a list of tensors touches each as the CPU probe does") {
  // The list form zero-bench kernels --tensors times: launches planned across tensors.
  const std::vector<std::size_t> sizes = {65536 * 2 + 7, 17, 100000};
  std::vector<std::vector<float>> master, grad, s0, s1, before;
  std::vector<DeviceArray<float>> d_master, d_grad, d_s0, d_s1;
  std::vector<zk::OptimizerTensors> d_tensors;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    master.push_back(zk::test::random_floats(sizes[t], 1 + t, -1.0f, 1.0f));
    grad.push_back(zk::test::random_floats(sizes[t], 10 + t, -1.0f, 1.0f));
    s0.push_back(zk::test::random_floats(sizes[t], 20 + t, 0.0f, 0.1f));
    s1.push_back(zk::test::random_floats(sizes[t], 30 + t, 0.0f, 0.1f));
    d_master.emplace_back(master[t]);
    d_grad.emplace_back(grad[t]);
    d_s0.emplace_back(s0[t]);
    d_s1.emplace_back(s1[t]);
  }
  before = master;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    d_tensors.push_back({d_master[t].ptr, d_grad[t].ptr, DType::F32, d_s0[t].ptr, d_s1[t].ptr,
                         DType::F32, nullptr, DType::BF16, sizes[t]});
    zk::traffic_probe_cpu({master[t].data(), grad[t].data(), DType::F32, s0[t].data(), s1[t].data(),
                           DType::F32, nullptr, DType::BF16, sizes[t]},
                          2);
  }
  zk::traffic_probe_cuda(std::span<const zk::OptimizerTensors>(d_tensors), 2);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    INFO("tensor " << t);
    REQUIRE(master[t] != before[t]);  // not vacuous: the probe wrote
    REQUIRE(d_master[t].download() == master[t]);
    REQUIRE(d_s0[t].download() == s0[t]);
    REQUIRE(d_s1[t].download() == s1[t]);
  }
}

int main(int argc, char** argv) {
  if (zk::cuda_device_count() == 0) {
    std::fprintf(stderr, "kernels_cuda_test: no CUDA device, skipped\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
