// CudaDevice on a GPU: tagged allocation through the caching allocator, async copies ordered by
// streams and events, host functions and their errors, and the compute table it hands out.
// Exits 77, reported as skipped, on a machine without a CUDA device.
#define CATCH_CONFIG_RUNNER
#include "zero/device/cuda_device.h"

#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "kernels/compute.h"
#include "kernels/cuda_device_count.h"
#include "zero/base/error.h"
#include "zero/device/stream_set.h"

using zero::Buffer;
using zero::MemoryKind;
using zero::MemoryTag;

TEST_CASE("device memory is tagged in the ledger and reused after it is freed") {
  zero::CudaDevice dev(0, 0);
  void* first = nullptr;
  {
    Buffer b = dev.allocate(3 << 20, MemoryKind::Device, MemoryTag::Gradients);
    first = b.data();
    REQUIRE(dev.ledger().usage(MemoryKind::Device, MemoryTag::Gradients).current_bytes == 3 << 20);
  }
  REQUIRE(dev.ledger().total(MemoryKind::Device).current_bytes == 0);
  Buffer again = dev.allocate(3 << 20, MemoryKind::Device, MemoryTag::Buckets);
  REQUIRE(again.data() == first);
}

TEST_CASE("a budget over the GPU's free memory is refused, and over budget is OutOfMemory") {
  const zero::CudaMemoryInfo info = zero::CudaDevice(0, 0).memory_info();
  REQUIRE(info.total_bytes > 0);
  zero::DeviceOptions too_much;
  too_much.device_budget_bytes = info.total_bytes * 2;
  REQUIRE_THROWS_WITH(zero::CudaDevice(0, 0, too_much), Catch::Contains("free"));
  zero::DeviceOptions small;
  small.device_budget_bytes = 1 << 20;
  zero::CudaDevice dev(0, 0, small);
  REQUIRE_THROWS_AS(dev.allocate(2 << 20, MemoryKind::Device, MemoryTag::MasterParams),
                    zero::OutOfMemory);
}

TEST_CASE("H2D, D2D and D2H copies on two streams ordered by an event round-trip the data") {
  zero::CudaDevice dev(0, 0);
  constexpr std::size_t kElems = 1 << 20;
  Buffer src = dev.allocate(kElems * 4, MemoryKind::PinnedHost, MemoryTag::Staging);
  Buffer dst = dev.allocate(kElems * 4, MemoryKind::PinnedHost, MemoryTag::Staging);
  Buffer a = dev.allocate(kElems * 4, MemoryKind::Device, MemoryTag::Other);
  Buffer b = dev.allocate(kElems * 4, MemoryKind::Device, MemoryTag::Other);
  auto s = src.as<std::uint32_t>();
  std::iota(s.begin(), s.end(), 11u);
  std::memset(dst.data(), 0, dst.size_bytes());
  zero::StreamSet streams(dev);
  auto& compute = streams.stream(zero::StreamRole::Compute);
  auto& offload = streams.stream(zero::StreamRole::Offload);
  dev.copy_async(a.data(), src.data(), kElems * 4, offload);
  dev.copy_async(b.data(), a.data(), kElems * 4, offload);
  streams.handoff(zero::StreamRole::Offload, zero::StreamRole::Compute);
  dev.copy_async(dst.data(), b.data(), kElems * 4, compute);
  compute.synchronize();
  REQUIRE(std::memcmp(dst.data(), src.data(), kElems * 4) == 0);
}

// A framework's gradient copy on its own stream (zero_engine_grad_copy_on_stream): the compute
// table's next kernel, on the legacy default stream, must read the copied bytes. The side stream
// is kept busy first (device-to-device copies, several milliseconds), so a kernel not ordered
// after the copy would read the destination before the bytes arrive.
TEST_CASE("a copy on a native stream orders the compute table's later kernels after it") {
  zero::CudaDevice dev(0, 0);
  constexpr std::size_t kElems = 1 << 20;
  constexpr std::size_t kBusyBytes = std::size_t{64} << 20;
  Buffer host = dev.allocate(kElems * 4, MemoryKind::PinnedHost, MemoryTag::Staging);
  Buffer src = dev.allocate(kElems * 4, MemoryKind::Device, MemoryTag::Other);
  Buffer dst = dev.allocate(kElems * 4, MemoryKind::Device, MemoryTag::Other);
  Buffer out = dev.allocate(kElems * 4, MemoryKind::Device, MemoryTag::Other);
  Buffer busy_a = dev.allocate(kBusyBytes, MemoryKind::Device, MemoryTag::Other);
  Buffer busy_b = dev.allocate(kBusyBytes, MemoryKind::Device, MemoryTag::Other);
  auto h = host.as<float>();
  for (std::size_t i = 0; i < kElems; ++i) h[i] = static_cast<float>(i % 1000) + 0.5f;
  REQUIRE(cudaMemset(dst.data(), 0, kElems * 4) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

  cudaStream_t side = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
  for (int i = 0; i < 100; ++i) {
    REQUIRE(cudaMemcpyAsync(busy_b.data(), busy_a.data(), kBusyBytes, cudaMemcpyDeviceToDevice,
                            side) == cudaSuccess);
  }
  REQUIRE(cudaMemcpyAsync(src.data(), host.data(), kElems * 4, cudaMemcpyHostToDevice, side) ==
          cudaSuccess);
  dev.copy_on_native_stream(dst.data(), src.data(), kElems * 4, side);
  // The compute table on the legacy default stream (it waits for its stream before returning).
  dev.compute().combine(out.data(), zero::DType::F32, dst.data(), zero::DType::F32, kElems, 1.0f,
                        false, zero::kernels::CpuExec{});
  std::vector<float> back(kElems, -1.0f);
  dev.copy(back.data(), out.data(), kElems * 4);
  REQUIRE(std::memcmp(back.data(), h.data(), kElems * 4) == 0);
  REQUIRE(cudaStreamSynchronize(side) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(side) == cudaSuccess);

  // The legacy default stream itself (null) needs no ordering, and copies there too.
  std::vector<float> again(kElems, -1.0f);
  dev.copy_on_native_stream(out.data(), src.data(), kElems * 4, nullptr);
  dev.copy(again.data(), out.data(), kElems * 4);
  REQUIRE(std::memcmp(again.data(), h.data(), kElems * 4) == 0);
}

TEST_CASE("a host function's exception is reported by the stream's synchronize") {
  zero::CudaDevice dev(0, 0);
  auto stream = dev.create_stream();
  auto event = dev.create_event();
  int ran = 0;
  dev.launch_host(*stream, [&] { ++ran; });
  dev.launch_host(*stream, [] { throw std::runtime_error("host step failed"); });
  stream->record(*event);
  REQUIRE_THROWS_WITH(event->synchronize(), Catch::Contains("host step failed"));
  REQUIRE_THROWS_WITH(stream->synchronize(), Catch::Contains("host step failed"));
  REQUIRE(ran == 1);
  stream->synchronize();  // reported once
}

TEST_CASE("the device hands out the CUDA compute table") {
  zero::CudaDevice dev(0, 0);
  REQUIRE(dev.compute().backend == "cuda");
  REQUIRE(zero::make_device("cuda", 0)->name() == "cuda");
}

int main(int argc, char** argv) {
  if (zero::kernels::cuda_device_count() == 0) {
    std::fprintf(stderr, "cuda_device_test: no CUDA device, skipped\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
