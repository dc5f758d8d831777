// The caching allocator's bookkeeping over a fake source, and a Device built on it (the shape of
// CudaDevice) for tags, ledger and budgets: everything about GPU memory that does not need a GPU.
#include "zero/device/caching_allocator.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include "zero/base/error.h"
#include "zero/device/device.h"

using zero::BlockSource;
using zero::CachePolicy;
using zero::CachingAllocator;
using zero::MemoryKind;
using zero::MemoryTag;

namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * kKiB;

// "GPU memory" of a fixed capacity: hands out distinct fake addresses, counts calls, and fails
// when the capacity would be exceeded.
class FakeSource final : public BlockSource {
 public:
  explicit FakeSource(std::size_t capacity) : capacity_(capacity) {}
  ~FakeSource() override { CHECK(blocks_.empty()); }

  void* allocate(std::size_t bytes) noexcept override {
    ++allocations;
    if (in_use_ + bytes > capacity_) return nullptr;
    in_use_ += bytes;
    void* p = reinterpret_cast<void*>(next_);
    next_ += (bytes + 4095) / 4096 * 4096 + 4096;
    blocks_[p] = bytes;
    return p;
  }
  void free(void* data, std::size_t bytes) noexcept override {
    ++frees;
    auto it = blocks_.find(data);
    REQUIRE(it != blocks_.end());
    REQUIRE(it->second == bytes);
    in_use_ -= bytes;
    blocks_.erase(it);
  }

  std::size_t in_use() const { return in_use_; }
  int allocations = 0;
  int frees = 0;

 private:
  std::size_t capacity_;
  std::size_t in_use_ = 0;
  std::uintptr_t next_ = 1 << 20;
  std::map<void*, std::size_t> blocks_;
};

CachePolicy gpu_like() {
  return CachePolicy{};  // 512 B / 2 MiB classes, fit 1.25, 1 GiB idle at most
}

}  // namespace

TEST_CASE("requests round up to 512-byte classes below 1 MiB and 2 MiB classes above") {
  const CachePolicy p = gpu_like();
  REQUIRE(CachingAllocator::size_class(1, p) == 512);
  REQUIRE(CachingAllocator::size_class(512, p) == 512);
  REQUIRE(CachingAllocator::size_class(513, p) == 1024);
  REQUIRE(CachingAllocator::size_class(kMiB - 1, p) == kMiB);
  REQUIRE(CachingAllocator::size_class(kMiB, p) == 2 * kMiB);
  REQUIRE(CachingAllocator::size_class(5 * kMiB + 1, p) == 6 * kMiB);
  CachePolicy exact;
  exact.small_granule_bytes = exact.large_granule_bytes = 1;
  REQUIRE(CachingAllocator::size_class(12345, exact) == 12345);
}

TEST_CASE("a freed block is handed out again to a request of its class without the source") {
  FakeSource source(64 * kMiB);
  CachingAllocator cache(source, gpu_like());
  void* a = cache.allocate(3 * kMiB);
  REQUIRE(a != nullptr);
  REQUIRE(source.allocations == 1);
  cache.free(a);
  REQUIRE(cache.stats().cached_bytes == 4 * kMiB);
  void* b = cache.allocate(3 * kMiB + 100);  // same 4 MiB class
  REQUIRE(b == a);
  REQUIRE(source.allocations == 1);
  const auto stats = cache.stats();
  REQUIRE(stats.hits == 1);
  REQUIRE(stats.misses == 1);
  REQUIRE(stats.live_bytes == 4 * kMiB);
  REQUIRE(stats.cached_bytes == 0);
  cache.free(b);
}

TEST_CASE("an idle block serves a smaller class only within the fit ratio") {
  FakeSource source(64 * kMiB);
  CachingAllocator cache(source, gpu_like());
  void* big = cache.allocate(8 * kMiB);
  cache.free(big);
  void* small = cache.allocate(2 * kMiB);  // 8 MiB > 1.25 × 2 MiB: not this block
  REQUIRE(small != big);
  REQUIRE(source.allocations == 2);
  void* close = cache.allocate(7 * kMiB);  // class 8 MiB: the idle block
  REQUIRE(close == big);
  cache.free(small);
  cache.free(close);
}

TEST_CASE("blocks below the minimum and beyond the idle cap go back to the source") {
  FakeSource source(64 * kMiB);
  CachePolicy p = gpu_like();
  p.min_cached_bytes = 64 * kKiB;
  p.max_cached_bytes = 4 * kMiB;
  CachingAllocator cache(source, p);
  void* tiny = cache.allocate(1000);
  cache.free(tiny);
  REQUIRE(source.frees == 1);
  void* a = cache.allocate(4 * kMiB);
  void* b = cache.allocate(4 * kMiB);
  cache.free(a);  // fits the 4 MiB cap
  cache.free(b);  // would exceed it
  REQUIRE(cache.stats().cached_bytes == 4 * kMiB);
  REQUIRE(source.frees == 2);
  cache.release_cached();
  REQUIRE(source.in_use() == 0);
}

TEST_CASE("a failing source gets the idle blocks back and one more try before nullptr") {
  FakeSource source(10 * kMiB);
  CachingAllocator cache(source, gpu_like());
  void* a = cache.allocate(6 * kMiB);
  cache.free(a);                       // 6 MiB idle of 10
  void* b = cache.allocate(8 * kMiB);  // fails first, then succeeds after the flush
  REQUIRE(b != nullptr);
  auto stats = cache.stats();
  REQUIRE(stats.flushes == 1);
  REQUIRE(stats.source_failures == 1);
  REQUIRE(stats.cached_bytes == 0);
  REQUIRE(cache.allocate(4 * kMiB) == nullptr);  // nothing idle to give back: fails
  stats = cache.stats();
  REQUIRE(stats.source_failures == 2);
  REQUIRE(stats.flushes == 1);
  cache.free(b);
}

namespace {

// A Device over the caching allocator and a fake source per kind, as CudaDevice is over
// cudaMalloc and cudaHostAlloc: allocation only.
class FakeGpuDevice final : public zero::Device {
 public:
  FakeGpuDevice(std::size_t device_capacity, const zero::DeviceOptions& options)
      : Device(2), device_source_(device_capacity), host_source_(1 << 30) {
    ledger().set_budget(MemoryKind::Device, options.device_budget_bytes);
    ledger().set_budget(MemoryKind::PinnedHost, options.pinned_host_budget_bytes);
  }
  std::string_view name() const override { return "fake-gpu"; }
  const zero::kernels::ComputeKernels& compute() const override {
    throw std::logic_error("no kernels on the fake GPU");
  }
  const CachingAllocator& device_cache() const { return device_cache_; }

 protected:
  void* allocate_impl(std::size_t bytes, MemoryKind kind) override {
    return (kind == MemoryKind::Device ? device_cache_ : host_cache_).allocate(bytes);
  }
  void free_impl(void* data, std::size_t, MemoryKind kind) noexcept override {
    (kind == MemoryKind::Device ? device_cache_ : host_cache_).free(data);
  }
  std::unique_ptr<zero::Stream> create_stream_impl() override { return nullptr; }
  std::unique_ptr<zero::Event> create_event_impl() override { return nullptr; }
  void copy_async_impl(void*, const void*, std::size_t, zero::Stream&) override {}
  void copy_impl(void*, const void*, std::size_t) override {}
  void launch_host_impl(zero::Stream&, std::function<void()>) override {}

 private:
  FakeSource device_source_;
  FakeSource host_source_;
  CachingAllocator device_cache_{device_source_, CachePolicy{}};
  CachingAllocator host_cache_{host_source_, CachePolicy{}};
};

}  // namespace

TEST_CASE("the ledger counts requested bytes per tag, not class-rounded or cached blocks") {
  FakeGpuDevice dev(64 * kMiB, {});
  {
    zero::Buffer grads = dev.allocate(3 * kMiB + 7, MemoryKind::Device, MemoryTag::Gradients);
    zero::Buffer bucket = dev.allocate(1000, MemoryKind::Device, MemoryTag::Buckets);
    REQUIRE(dev.ledger().usage(MemoryKind::Device, MemoryTag::Gradients).current_bytes ==
            3 * kMiB + 7);
    REQUIRE(dev.ledger().usage(MemoryKind::Device, MemoryTag::Buckets).current_bytes == 1000);
    REQUIRE(dev.device_cache().stats().live_bytes == 4 * kMiB + 1024);
  }
  REQUIRE(dev.ledger().total(MemoryKind::Device).current_bytes == 0);
  REQUIRE(dev.ledger().total(MemoryKind::Device).peak_bytes == 3 * kMiB + 1007);
  REQUIRE(dev.device_cache().stats().cached_bytes == 4 * kMiB + 1024);
}

TEST_CASE("over the device budget the allocation throws OutOfMemory naming the tag") {
  zero::DeviceOptions options;
  options.device_budget_bytes = 8 * kMiB;
  FakeGpuDevice dev(64 * kMiB, options);
  zero::Buffer held = dev.allocate(6 * kMiB, MemoryKind::Device, MemoryTag::MasterParams);
  REQUIRE_THROWS_AS(dev.allocate(4 * kMiB, MemoryKind::Device, MemoryTag::Buckets),
                    zero::OutOfMemory);
  REQUIRE_THROWS_WITH(dev.allocate(4 * kMiB, MemoryKind::Device, MemoryTag::Buckets),
                      Catch::Contains("buckets") && Catch::Contains("device"));
  REQUIRE(dev.ledger().usage(MemoryKind::Device, MemoryTag::Buckets).current_bytes == 0);
}

TEST_CASE("when the GPU itself runs out the allocation throws OutOfMemory naming the tag") {
  FakeGpuDevice dev(4 * kMiB, {});  // no budget: the source is the limit
  zero::Buffer held = dev.allocate(3 * kMiB, MemoryKind::Device, MemoryTag::OptimizerStates);
  REQUIRE_THROWS_WITH(dev.allocate(2 * kMiB, MemoryKind::Device, MemoryTag::GatherBuffers),
                      Catch::Contains("gather_buffers") && Catch::Contains("allocator failed"));
  REQUIRE(dev.ledger().usage(MemoryKind::Device, MemoryTag::GatherBuffers).current_bytes == 0);
}
