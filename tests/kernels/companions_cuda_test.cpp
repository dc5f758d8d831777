// The CUDA compute table against the CPU table (the oracle), bitwise: unscale with the overflow
// check, the squared norm, combine in every dtype pair, the communicators' reduce, fill, and the
// optimizer step through the table, block quantization (ZeRO++). Exits 77, reported as skipped, on a machine without a CUDA
// device.
#define CATCH_CONFIG_RUNNER
#include "kernels/companions_cuda.h"

#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/compute.h"
#include "kernels/cpu_kernels.h"
#include "kernels/cuda_geometry.h"
#include "kernels/cuda_device_count.h"
#include "kernels/quantize.h"
#include "tests/kernels/test_util.h"

namespace zk = zero::kernels;
using zero::DType;

namespace {

// Sizes straddle the norm block (4096), the element-wise grid (256 × 4096) and the lanes (8).
const std::vector<std::size_t> kSizes = {1, 7, 4096, 4096 * 3 + 5, 256 * 4096 + 4099};

struct DeviceBytes {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBytes(const std::vector<std::byte>& host) : bytes(host.size()) {
    REQUIRE(cudaMalloc(&ptr, bytes) == cudaSuccess);
    REQUIRE(cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceBytes() { cudaFree(ptr); }
  std::vector<std::byte> download() const {
    std::vector<std::byte> host(bytes);
    REQUIRE(cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }
};

// n elements of `dtype`, from fp32 values in [lo, hi), stored with the CPU's own cast.
std::vector<std::byte> random_array(std::size_t n, DType dtype, std::uint32_t seed, float lo,
                                    float hi) {
  const std::vector<float> values = zk::test::random_floats(n, seed, lo, hi);
  std::vector<std::byte> out(n * zero::dtype_size(dtype));
  zk::cpu_compute_kernels().combine(out.data(), dtype, values.data(), DType::F32, n, 1.0f, false,
                                    {});
  return out;
}

const zk::ComputeKernels& cpu() {
  return zk::cpu_compute_kernels();
}
const zk::ComputeKernels& gpu() {
  return zk::cuda_compute_kernels();
}

}  // namespace

TEST_CASE("unscale_and_check on the GPU gives the CPU's bits and the same overflow verdict") {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (std::size_t n : kSizes) {
      for (bool poison : {false, true}) {
        INFO(zero::dtype_name(dtype) << " n=" << n << " poison=" << poison);
        std::vector<std::byte> host = random_array(n, dtype, 3, -100.0f, 100.0f);
        if (poison) {
          const float inf = std::numeric_limits<float>::infinity();
          cpu().combine(host.data() + (n / 2) * zero::dtype_size(dtype), dtype, &inf, DType::F32, 1,
                        1.0f, false, {});
        }
        DeviceBytes device(host);
        const bool gpu_bad = gpu().unscale_and_check(device.ptr, dtype, n, 0.125f, {});
        const bool cpu_bad = cpu().unscale_and_check(host.data(), dtype, n, 0.125f, {});
        REQUIRE(gpu_bad == poison);
        REQUIRE(cpu_bad == poison);
        REQUIRE(device.download() == host);
      }
    }
  }
}

TEST_CASE("the squared norm on the GPU equals the CPU's bitwise") {
  // Both kernels: the staged one below kCudaNormLanesMinBlocks norm blocks, the lanes one from
  // there on (kernels/cuda_geometry.h), each at its edge and with a ragged tail.
  const std::size_t lanes_from = zk::detail::kCudaNormLanesMinBlocks * zk::detail::kNormBlockElems;
  std::vector<std::size_t> sizes = kSizes;
  for (std::size_t n : {lanes_from - zk::detail::kNormBlockElems, lanes_from, lanes_from + 4099}) {
    sizes.push_back(n);
  }
  REQUIRE(zk::detail::norm_geometry(sizes.back(), zk::detail::kNormBlockElems).kernel ==
          zk::detail::NormKernel::Lanes);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (std::size_t n : sizes) {
      INFO(zero::dtype_name(dtype) << " n=" << n);
      const std::vector<std::byte> host = random_array(n, dtype, 5, -2.0f, 2.0f);
      DeviceBytes device(host);
      const double expected = cpu().squared_l2_norm(host.data(), dtype, n, {});
      REQUIRE(expected > 0.0);  // not vacuous
      const double got = gpu().squared_l2_norm(device.ptr, dtype, n, {});
      REQUIRE(std::memcmp(&got, &expected, sizeof got) == 0);
    }
  }
}

TEST_CASE("the _many entries on the GPU give the CPU's bits with one wait for every array") {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    INFO(zero::dtype_name(dtype));
    std::vector<std::vector<std::byte>> host;
    std::vector<std::unique_ptr<DeviceBytes>> device;
    std::vector<zk::ArrayRef> host_refs;
    std::vector<zk::ArrayRef> device_refs;
    // The fourth array takes the lanes norm kernel, the others the staged one.
    const std::vector<std::size_t> sizes = {
        4099, 0, 1, zk::detail::kCudaNormLanesMinBlocks * 4096 + 4099, 4096, 7};
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      host.push_back(
          random_array(sizes[k], dtype, static_cast<std::uint32_t>(20 + k), -2.0f, 2.0f));
      device.push_back(std::make_unique<DeviceBytes>(host.back()));
    }
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      host_refs.push_back({host[k].data(), dtype, sizes[k]});
      device_refs.push_back({device[k]->ptr, dtype, sizes[k]});
    }
    const double expected = cpu().squared_l2_norm_many(host_refs, {});
    REQUIRE(expected > 0.0);  // not vacuous
    const double got = gpu().squared_l2_norm_many(device_refs, {});
    REQUIRE(std::memcmp(&got, &expected, sizeof got) == 0);

    REQUIRE_FALSE(gpu().unscale_and_check_many(device_refs, 0.25f, {}));
    REQUIRE_FALSE(cpu().unscale_and_check_many(host_refs, 0.25f, {}));
    const float inf = std::numeric_limits<float>::infinity();
    cpu().combine(host[4].data() + 100 * zero::dtype_size(dtype), dtype, &inf, DType::F32, 1, 1.0f,
                  false, {});
    REQUIRE(cudaMemcpy(device[4]->ptr, host[4].data(), host[4].size(), cudaMemcpyHostToDevice) ==
            cudaSuccess);
    REQUIRE(gpu().unscale_and_check_many(device_refs, 0.5f, {}));
    REQUIRE(cpu().unscale_and_check_many(host_refs, 0.5f, {}));
    for (std::size_t k = 0; k < sizes.size(); ++k) REQUIRE(device[k]->download() == host[k]);

    // combine_many into fp32 buffers, accumulating: each pair as the CPU's combine.
    std::vector<std::vector<std::byte>> dst_host;
    std::vector<std::unique_ptr<DeviceBytes>> dst_device;
    std::vector<zk::CombineRef> host_pairs, device_pairs;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      dst_host.push_back(
          random_array(sizes[k], DType::F32, static_cast<std::uint32_t>(60 + k), -1.0f, 1.0f));
      dst_device.push_back(std::make_unique<DeviceBytes>(dst_host.back()));
    }
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      host_pairs.push_back({dst_host[k].data(), DType::F32, host[k].data(), dtype, sizes[k]});
      device_pairs.push_back({dst_device[k]->ptr, DType::F32, device[k]->ptr, dtype, sizes[k]});
    }
    const std::vector<std::byte> before = dst_host[3];
    cpu().combine_many(host_pairs, 0.75f, true, {});
    REQUIRE(dst_host[3] != before);  // not vacuous
    gpu().combine_many(device_pairs, 0.75f, true, {});
    for (std::size_t k = 0; k < sizes.size(); ++k)
      REQUIRE(dst_device[k]->download() == dst_host[k]);
  }
}

TEST_CASE("the norm of more small arrays than one launch's table, of mixed dtypes, is the CPU's") {
  // 150 arrays as a model's slices: many tiny ones (biases, norms), odd sizes, empties, one for
  // the lanes kernel; dtypes mixed within each table launch.
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};
  std::vector<std::vector<std::byte>> host;
  std::vector<std::unique_ptr<DeviceBytes>> device;
  std::vector<zk::ArrayRef> host_refs, device_refs;
  for (std::size_t k = 0; k < 150; ++k) {
    const std::size_t n = k == 77 ? zk::detail::kCudaNormLanesMinBlocks * 4096 + 5
                          : k % 29 == 4 ? 0
                          : k % 3 == 0  ? 1 + k
                                        : k * 1531 + 4093;
    const DType dtype = dtypes[k % 3];
    host.push_back(random_array(n, dtype, static_cast<std::uint32_t>(300 + k), -3.0f, 3.0f));
    device.push_back(std::make_unique<DeviceBytes>(host.back()));
    host_refs.push_back({host.back().data(), dtype, n});
    device_refs.push_back({device.back()->ptr, dtype, n});
  }
  std::vector<std::size_t> numels;
  for (const auto& r : host_refs) numels.push_back(r.numel);
  REQUIRE(zk::detail::plan_norm_tables(numels, zk::detail::kNormBlockElems).size() >= 3);
  const double expected = cpu().squared_l2_norm_many(host_refs, {});
  REQUIRE(expected > 0.0);  // not vacuous
  const double got = gpu().squared_l2_norm_many(device_refs, {});
  REQUIRE(std::memcmp(&got, &expected, sizeof got) == 0);
  // Each array alone, too: the table's block sums land where the array's own would.
  for (std::size_t k = 0; k < host_refs.size(); k += 7) {
    INFO("array " << k);
    const double one = cpu().squared_l2_norm_many(std::span(&host_refs[k], 1), {});
    const double one_gpu = gpu().squared_l2_norm_many(std::span(&device_refs[k], 1), {});
    REQUIRE(std::memcmp(&one, &one_gpu, sizeof one) == 0);
  }
  // A changed element of the last table's last array changes the norm alike: its blocks are read.
  std::size_t last = host_refs.size() - 1;
  while (host_refs[last].numel == 0) --last;  // 149 is one of the empties
  REQUIRE(last >= 140);
  const float big = 1000.0f;
  cpu().combine(host[last].data(), host_refs[last].dtype, &big, DType::F32, 1, 1.0f, false, {});
  REQUIRE(cudaMemcpy(device[last]->ptr, host[last].data(), host[last].size(),
                     cudaMemcpyHostToDevice) == cudaSuccess);
  const double changed = cpu().squared_l2_norm_many(host_refs, {});
  REQUIRE(changed > expected + 1e5);
  const double changed_gpu = gpu().squared_l2_norm_many(device_refs, {});
  REQUIRE(std::memcmp(&changed, &changed_gpu, sizeof changed) == 0);
}

TEST_CASE("combine on the GPU equals the CPU's for every dtype pair, scale and accumulate") {
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};
  const std::size_t n = 256 * 4096 + 4099;
  for (DType dst_t : dtypes) {
    for (DType src_t : dtypes) {
      for (float scale : {1.0f, 0.3f}) {
        for (bool accumulate : {false, true}) {
          INFO(zero::dtype_name(src_t) << " -> " << zero::dtype_name(dst_t) << " scale " << scale
                                       << " accumulate " << accumulate);
          const std::vector<std::byte> src = random_array(n, src_t, 7, -3.0f, 3.0f);
          std::vector<std::byte> dst = random_array(n, dst_t, 8, -3.0f, 3.0f);
          DeviceBytes d_src(src);
          DeviceBytes d_dst(dst);
          gpu().combine(d_dst.ptr, dst_t, d_src.ptr, src_t, n, scale, accumulate, {});
          cpu().combine(dst.data(), dst_t, src.data(), src_t, n, scale, accumulate, {});
          REQUIRE(d_dst.download() == dst);
        }
      }
    }
  }
}

TEST_CASE("reduce on the GPU equals the CPU's: sums, averages by 3, NaN-propagating max") {
  const std::size_t n = 256 * 4096 + 4099;
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (int nsrc : {1, 2, 3, 4}) {
      for (const auto kind : {zk::ReduceKind::Sum, zk::ReduceKind::Max}) {
        for (const float divisor : {0.0f, 3.0f}) {
          if (kind == zk::ReduceKind::Max && divisor != 0.0f) continue;
          INFO(zero::dtype_name(dtype) << " nsrc " << nsrc << " max "
                                       << (kind == zk::ReduceKind::Max) << " divisor " << divisor);
          std::vector<std::vector<std::byte>> host;
          for (int k = 0; k < nsrc; ++k)
            host.push_back(random_array(n, dtype, 20 + static_cast<std::uint32_t>(k), -3.0f, 3.0f));
          if (kind == zk::ReduceKind::Max) {
            // Max passes a NaN through unchanged; a sum's NaN bits are the hardware's own.
            const float nan = std::numeric_limits<float>::quiet_NaN();
            cpu().combine(host.back().data() + 5 * zero::dtype_size(dtype), dtype, &nan, DType::F32,
                          1, 1.0f, false, {});
          }
          std::vector<std::unique_ptr<DeviceBytes>> device;
          for (const auto& h : host) device.push_back(std::make_unique<DeviceBytes>(h));
          std::vector<const void*> cpu_srcs, gpu_srcs;
          for (int k = 0; k < nsrc; ++k) {
            cpu_srcs.push_back(host[static_cast<std::size_t>(k)].data());
            gpu_srcs.push_back(device[static_cast<std::size_t>(k)]->ptr);
          }
          // dst is the first source itself, as an in-place all-reduce has it.
          gpu().reduce(device[0]->ptr, gpu_srcs.data(), nsrc, n, dtype, kind, divisor, {});
          cpu().reduce(host[0].data(), cpu_srcs.data(), nsrc, n, dtype, kind, divisor, {});
          REQUIRE(device[0]->download() == host[0]);
        }
      }
    }
  }
  std::vector<const void*> too_many(zk::kCudaReduceMaxSources + 1, nullptr);
  REQUIRE_THROWS_WITH(gpu().reduce(nullptr, too_many.data(), static_cast<int>(too_many.size()), 0,
                                   DType::F32, zk::ReduceKind::Sum, 0.0f, {}),
                      Catch::Contains("takes 1 to 32 sources"));
}

TEST_CASE("fill_zero and the optimizer step through the table match the CPU") {
  const std::size_t n = 100003;
  std::vector<std::byte> master = random_array(n, DType::F32, 11, -1.0f, 1.0f);
  const std::vector<std::byte> grad = random_array(n, DType::BF16, 12, -1.0f, 1.0f);
  std::vector<std::byte> s0(n * 4), s1(n * 4), out(n * 2);
  DeviceBytes d_master(master), d_grad(grad), d_s0(s0), d_s1(s1), d_out(out);
  gpu().fill_zero(d_s0.ptr, DType::F32, n, {});
  gpu().fill_zero(d_s1.ptr, DType::F32, n, {});
  REQUIRE(d_s0.download() == s0);
  zk::OptimizerHyper hyper;
  hyper.weight_decay = 0.01;
  for (int step = 1; step <= 3; ++step) {
    const zk::StepScalars scalars{1e-3, step, 0.5};
    gpu().optimizer_step(hyper, scalars,
                         {static_cast<float*>(d_master.ptr), d_grad.ptr, DType::BF16, d_s0.ptr,
                          d_s1.ptr, DType::F32, d_out.ptr, DType::BF16, n},
                         {});
    cpu().optimizer_step(hyper, scalars,
                         {reinterpret_cast<float*>(master.data()), grad.data(), DType::BF16,
                          s0.data(), s1.data(), DType::F32, out.data(), DType::BF16, n},
                         {});
  }
  REQUIRE(d_master.download() == master);
  REQUIRE(d_s1.download() == s1);
  REQUIRE(d_out.download() == out);
}

// Blocks of every kind: ordinary, all zeros (scale 0), one holding an inf and one a NaN (a NaN
// scale), a value exactly halfway between two codes; sizes with a short last block, odd ones (a
// lone 4-bit nibble) and ones whose codes need padding to 4 bytes.
TEST_CASE("quantize, dequantize and dequantize_add on the GPU give the CPU's bytes") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (int bits : {8, 4}) {
      for (std::size_t n : {std::size_t{1}, std::size_t{255}, std::size_t{256},
                            std::size_t{1283}, std::size_t{256 * 4096 + 7}}) {
        INFO(zero::dtype_name(dtype) << ", " << bits << " bits, n=" << n);
        std::vector<std::byte> src = random_array(n, dtype, 21, -3.0f, 3.0f);
        auto put = [&](std::size_t i, float v) {
          if (i < n) cpu().combine(src.data() + i * zero::dtype_size(dtype), dtype, &v, DType::F32,
                                   1, 1.0f, false, {});
        };
        for (std::size_t i = 256; i < 512; ++i) put(i, 0.0f);  // block 1: all zeros
        put(512 + 3, inf);                                      // block 2: an inf
        put(768 + 9, nan);                                      // block 3: a NaN
        put(1024, 7.0f);  // block 4: max 7, so 0.5 · scale lands between two codes in 4 bits
        put(1025, 0.5f);
        const std::size_t qbytes = zk::quantized_bytes(n, bits);
        std::vector<std::byte> q_cpu(qbytes, std::byte{0xAB}), q_init(qbytes, std::byte{0xAB});
        cpu().quantize(src.data(), dtype, n, bits, q_cpu.data(), {});
        DeviceBytes d_src(src), d_q(q_init);
        gpu().quantize(d_src.ptr, dtype, n, bits, d_q.ptr, {});
        REQUIRE(d_q.download() == q_cpu);

        std::vector<std::byte> back(n * zero::dtype_size(dtype));
        cpu().dequantize(q_cpu.data(), n, bits, back.data(), dtype, {});
        DeviceBytes d_back(std::vector<std::byte>(back.size()));
        gpu().dequantize(d_q.ptr, n, bits, d_back.ptr, dtype, {});
        REQUIRE(d_back.download() == back);

        std::vector<std::byte> acc = random_array(n, DType::F32, 22, -1.0f, 1.0f);
        DeviceBytes d_acc(acc);
        cpu().dequantize_add(q_cpu.data(), n, bits, reinterpret_cast<float*>(acc.data()), {});
        gpu().dequantize_add(d_q.ptr, n, bits, static_cast<float*>(d_acc.ptr), {});
        REQUIRE(d_acc.download() == acc);
      }
    }
  }
}

int main(int argc, char** argv) {
  if (zk::cuda_device_count() == 0) {
    std::fprintf(stderr, "kernels_cuda_companions_test: no CUDA device, skipped\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
