#include "zero/device/device.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "zero/base/error.h"
#include "zero/device/cpu_device.h"

using zero::Buffer;
using zero::CpuDevice;
using zero::Device;
using zero::MemoryKind;
using zero::MemoryTag;

namespace {
constexpr std::size_t kMiB = 1 << 20;
}

TEST_CASE("ledger counts bytes per tag and memory kind and frees them when buffers die") {
  CpuDevice dev(3);
  {
    Buffer grads = dev.allocate(3 * kMiB, MemoryKind::Host, MemoryTag::Gradients);
    Buffer master = dev.allocate(kMiB, MemoryKind::Host, MemoryTag::MasterParams);
    Buffer pinned = dev.allocate(100, MemoryKind::PinnedHost, MemoryTag::Staging);
    REQUIRE(dev.ledger().usage(MemoryKind::Host, MemoryTag::Gradients).current_bytes == 3 * kMiB);
    REQUIRE(dev.ledger().usage(MemoryKind::Host, MemoryTag::MasterParams).current_bytes == kMiB);
    REQUIRE(dev.ledger().usage(MemoryKind::PinnedHost, MemoryTag::Staging).current_bytes == 100);
    REQUIRE(dev.ledger().total(MemoryKind::Host).current_bytes == 4 * kMiB);
    REQUIRE(dev.ledger().total(MemoryKind::Host).live_allocations == 2);
    REQUIRE(dev.ledger().total(MemoryKind::Device).current_bytes == 0);
    const auto snap = dev.ledger().snapshot();
    REQUIRE(snap.rank == 3);
    REQUIRE(snap.at(MemoryKind::Host, MemoryTag::Gradients).current_bytes == 3 * kMiB);
    INFO(snap.to_string());
    REQUIRE(snap.to_string().find("gradients 3.0 MiB") != std::string::npos);
  }
  for (auto kind : {MemoryKind::Host, MemoryKind::PinnedHost, MemoryKind::Device}) {
    REQUIRE(dev.ledger().total(kind).current_bytes == 0);
    REQUIRE(dev.ledger().total(kind).live_allocations == 0);
  }
  REQUIRE(dev.ledger().total(MemoryKind::Host).total_allocations == 2);
}

TEST_CASE("high-water marks keep the peak per tag and per kind until reset") {
  CpuDevice dev(0);
  Buffer a = dev.allocate(1000, MemoryKind::Device, MemoryTag::Buckets);
  {
    Buffer b = dev.allocate(5000, MemoryKind::Device, MemoryTag::Buckets);
    Buffer c = dev.allocate(700, MemoryKind::Device, MemoryTag::GatherBuffers);
  }
  Buffer d = dev.allocate(200, MemoryKind::Device, MemoryTag::GatherBuffers);
  const auto buckets = dev.ledger().usage(MemoryKind::Device, MemoryTag::Buckets);
  REQUIRE(buckets.current_bytes == 1000);
  REQUIRE(buckets.peak_bytes == 6000);
  REQUIRE(dev.ledger().usage(MemoryKind::Device, MemoryTag::GatherBuffers).peak_bytes == 700);
  REQUIRE(dev.ledger().total(MemoryKind::Device).current_bytes == 1200);
  REQUIRE(dev.ledger().total(MemoryKind::Device).peak_bytes == 6700);
  dev.ledger().reset_peaks();
  REQUIRE(dev.ledger().total(MemoryKind::Device).peak_bytes == 1200);
  REQUIRE(dev.ledger().usage(MemoryKind::Device, MemoryTag::Buckets).peak_bytes == 1000);
}

TEST_CASE("allocation over the per-rank budget throws OutOfMemory naming tag, size and usage") {
  zero::DeviceOptions opts;
  opts.host_budget_bytes = 10'000;
  auto dev = zero::make_device("cpu", 2, opts);
  Buffer states = dev->allocate(6000, MemoryKind::Host, MemoryTag::OptimizerStates);
  try {
    (void)dev->allocate(5000, MemoryKind::Host, MemoryTag::MasterParams);
    FAIL("expected OutOfMemory");
  } catch (const zero::OutOfMemory& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.find("master_params") != std::string::npos);
    REQUIRE(msg.find("5000 bytes") != std::string::npos);
    REQUIRE(msg.find("rank 2") != std::string::npos);
    REQUIRE(msg.find("6000 bytes in use") != std::string::npos);
    REQUIRE(msg.find("optimizer_states 6000 bytes") != std::string::npos);
    REQUIRE(msg.find("10000") != std::string::npos);
  }
  // The failed request left nothing behind, and exactly the budget still fits.
  REQUIRE(dev->ledger().total(MemoryKind::Host).current_bytes == 6000);
  Buffer fits = dev->allocate(4000, MemoryKind::Host, MemoryTag::MasterParams);
  REQUIRE(dev->ledger().total(MemoryKind::Host).current_bytes == 10'000);
  // Other kinds have their own (absent) budget.
  Buffer other = dev->allocate(1 << 20, MemoryKind::PinnedHost, MemoryTag::Staging);
  REQUIRE(other.size_bytes() == 1 << 20);
}

TEST_CASE("an allocation the allocator cannot satisfy throws OutOfMemory, not bad_alloc") {
  CpuDevice dev(0);
  REQUIRE_THROWS_AS(dev.allocate(SIZE_MAX - 16, MemoryKind::Host, MemoryTag::Other),
                    zero::OutOfMemory);
  REQUIRE(dev.ledger().total(MemoryKind::Host).current_bytes == 0);
}

TEST_CASE("buffers are at least 64-byte aligned, move-only owners, and zero bytes own nothing") {
  CpuDevice dev(0);
  for (std::size_t bytes : {1u, 63u, 64u, 65u, 4095u, 4096u, 100000u}) {
    Buffer b = dev.allocate(bytes, MemoryKind::Host, MemoryTag::Other);
    REQUIRE(reinterpret_cast<std::uintptr_t>(b.data()) % Device::kMinAlignment == 0);
    std::memset(b.data(), 0xab, bytes);
  }
  Buffer empty = dev.allocate(0, MemoryKind::Host, MemoryTag::Other);
  REQUIRE(empty.data() == nullptr);
  REQUIRE(dev.ledger().total(MemoryKind::Host).live_allocations == 0);

  Buffer a = dev.allocate(128, MemoryKind::Host, MemoryTag::Gradients);
  void* p = a.data();
  Buffer b = std::move(a);
  REQUIRE(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  REQUIRE(b.data() == p);
  REQUIRE(dev.ledger().total(MemoryKind::Host).live_allocations == 1);
  b = dev.allocate(256, MemoryKind::Host, MemoryTag::Gradients);  // frees the 128 bytes
  REQUIRE(dev.ledger().usage(MemoryKind::Host, MemoryTag::Gradients).current_bytes == 256);
  b.reset();
  REQUIRE(dev.ledger().total(MemoryKind::Host).current_bytes == 0);
}

TEST_CASE("the host device copies on the null native stream now and refuses any other") {
  CpuDevice dev(0);
  std::vector<float> src{1.5f, -2.0f, 3.25f, 7.0f};
  std::vector<float> dst(4, 0.0f);
  dev.copy_on_native_stream(dst.data(), src.data(), 4 * sizeof(float), nullptr);
  REQUIRE(dst == src);
  int not_a_stream = 0;
  REQUIRE_THROWS_WITH(dev.copy_on_native_stream(dst.data(), src.data(), 4, &not_a_stream),
                      Catch::Contains("has no native streams (pass null)"));
}

TEST_CASE("nvme memory cannot be allocated from a device") {
  CpuDevice dev(0);
  REQUIRE_THROWS_AS(dev.allocate(10, MemoryKind::Nvme, MemoryTag::OptimizerStates), zero::Error);
}

TEST_CASE("make_device builds cpu devices and rejects cuda in a host-only build with a reason") {
  auto dev = zero::make_device("cpu", 5);
  REQUIRE(dev->name() == "cpu");
  REQUIRE(dev->rank() == 5);
#if !ZERO_TEST_HAVE_CUDA
  REQUIRE_THROWS_WITH(zero::make_device("cuda", 0), Catch::Contains("no CUDA support"));
#endif
  REQUIRE_THROWS_WITH(zero::make_device("tpu", 0), Catch::Contains("unknown device kind"));
}

namespace {

// Copies go through a chain of two streams; the second must see the first's result.
void check_async_copy_and_event_ordering(bool synchronous) {
  zero::DeviceOptions opts;
  opts.synchronous_streams = synchronous;
  CpuDevice dev(0, opts);
  constexpr std::size_t kElems = 1 << 20;
  Buffer src = dev.allocate(kElems * 4, MemoryKind::Host, MemoryTag::Other);
  Buffer mid = dev.allocate(kElems * 4, MemoryKind::PinnedHost, MemoryTag::Staging);
  Buffer dst = dev.allocate(kElems * 4, MemoryKind::Device, MemoryTag::Other);
  auto s = src.as<std::uint32_t>();
  std::iota(s.begin(), s.end(), 7u);
  std::memset(mid.data(), 0, mid.size_bytes());
  std::memset(dst.data(), 0, dst.size_bytes());

  auto first = dev.create_stream();
  auto second = dev.create_stream();
  auto copied = dev.create_event();
  REQUIRE(copied->query());  // never recorded: complete

  std::atomic<bool> release{synchronous};
  // Hold the first stream back so that, without the event, the second would run too early.
  dev.launch_host(*first, [&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  });
  dev.copy_async(mid.data(), src.data(), src.size_bytes(), *first);
  first->record(*copied);
  second->wait(*copied);
  dev.copy_async(dst.data(), mid.data(), mid.size_bytes(), *second);
  if (!synchronous) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    REQUIRE_FALSE(copied->query());
    REQUIRE(dst.as<std::uint32_t>()[kElems - 1] == 0);  // second stream is still waiting
    release = true;
  }
  second->synchronize();
  REQUIRE(copied->query());
  auto d = dst.as<std::uint32_t>();
  REQUIRE(d[0] == 7u);
  REQUIRE(d[kElems - 1] == 7u + kElems - 1);
  REQUIRE(std::equal(d.begin(), d.end(), s.begin()));
}

}  // namespace

TEST_CASE("an async copy ordered by an event is visible to the waiting stream (worker streams)") {
  check_async_copy_and_event_ordering(false);
}

TEST_CASE("an async copy ordered by an event is visible to the waiting stream (inline streams)") {
  check_async_copy_and_event_ordering(true);
}

TEST_CASE("work on a stream overlaps with the enqueuing thread") {
  CpuDevice dev(0);
  auto stream = dev.create_stream();
  auto done = dev.create_event();
  std::atomic<bool> go{false};
  std::atomic<bool> ran{false};
  dev.launch_host(*stream, [&] {
    while (!go.load()) std::this_thread::yield();
    ran = true;
  });
  stream->record(*done);
  REQUIRE_FALSE(done->query());  // the host function is blocked until we say go
  go = true;
  done->synchronize();
  REQUIRE(ran.load());
}

TEST_CASE("an error in stream work is reported by synchronize and by a later event") {
  CpuDevice dev(0);
  auto stream = dev.create_stream();
  auto after = dev.create_event();
  int later = 0;
  dev.launch_host(*stream, [] { throw std::runtime_error("kernel exploded"); });
  dev.launch_host(*stream, [&] { later = 1; });
  stream->record(*after);
  REQUIRE_THROWS_WITH(after->synchronize(), "kernel exploded");
  REQUIRE_THROWS_WITH(stream->synchronize(), "kernel exploded");
  REQUIRE(later == 1);  // the stream went on with later work
  REQUIRE_NOTHROW(stream->synchronize());
}

TEST_CASE("re-recording an event moves the point it marks") {
  CpuDevice dev(0);
  auto stream = dev.create_stream();
  auto ev = dev.create_event();
  stream->record(*ev);
  ev->synchronize();
  std::atomic<bool> go{false};
  dev.launch_host(*stream, [&] {
    while (!go.load()) std::this_thread::yield();
  });
  stream->record(*ev);
  REQUIRE_FALSE(ev->query());
  go = true;
  ev->synchronize();
  REQUIRE(ev->query());
}

TEST_CASE(
    "CpuDevice hands a freed large block back for the same size, and the ledger counts only "
    "buffers in use") {
  zero::CpuDevice device(0);
  const std::size_t bytes = std::size_t{1} << 20;
  void* first = nullptr;
  {
    zero::Buffer b = device.allocate(bytes, zero::MemoryKind::Host, zero::MemoryTag::Gradients);
    first = b.data();
    std::memset(b.data(), 1, bytes);
  }
  CHECK(device.ledger().usage(zero::MemoryKind::Host, zero::MemoryTag::Gradients).current_bytes ==
        0);
  zero::Buffer again = device.allocate(bytes, zero::MemoryKind::Host, zero::MemoryTag::Gradients);
  CHECK(again.data() == first);
  CHECK(device.ledger().usage(zero::MemoryKind::Host, zero::MemoryTag::Gradients).current_bytes ==
        bytes);
  // Another size gets its own block.
  zero::Buffer other =
      device.allocate(bytes + 4096, zero::MemoryKind::Host, zero::MemoryTag::Gradients);
  CHECK(other.data() != first);
}
