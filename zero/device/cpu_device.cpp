#include "zero/device/cpu_device.h"

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "kernels/compute.h"
#include "zero/base/error.h"
#include "zero/device/shared_host_arena.h"

namespace zero {

namespace {

// Completion of recorded points is tracked by generation numbers: record() bumps `recorded`, the
// stream bumps `completed` when it reaches that point. Anyone waiting for generation g waits for
// completed >= g, so re-recording never confuses an earlier waiter.
struct CpuEventState {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t recorded = 0;
  std::uint64_t completed = 0;
  std::exception_ptr error;  // first stream error that preceded the completed point

  void complete(std::uint64_t generation, std::exception_ptr stream_error) {
    {
      std::lock_guard lock(mu);
      if (generation > completed) completed = generation;
      if (stream_error && !error) error = stream_error;
    }
    cv.notify_all();
  }
  void wait_for(std::uint64_t generation) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return completed >= generation; });
  }
};

class CpuEvent final : public Event {
 public:
  bool query() const override {
    std::lock_guard lock(state_->mu);
    return state_->completed >= state_->recorded;
  }
  void synchronize() override {
    std::uint64_t target;
    {
      std::lock_guard lock(state_->mu);
      target = state_->recorded;
    }
    state_->wait_for(target);
    std::lock_guard lock(state_->mu);
    if (state_->error) std::rethrow_exception(state_->error);
  }

  std::shared_ptr<CpuEventState> state_ = std::make_shared<CpuEventState>();
};

class CpuStream final : public Stream {
 public:
  explicit CpuStream(bool synchronous) : synchronous_(synchronous) {
    if (!synchronous_) worker_ = std::thread([this] { run(); });
  }

  ~CpuStream() override {
    if (synchronous_) return;
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    worker_.join();
  }

  void enqueue(std::function<void()> fn) {
    if (synchronous_) {
      execute(fn);
      return;
    }
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(fn));
    }
    work_cv_.notify_one();
  }

  void record(Event& event) override {
    auto state = checked(event).state_;
    std::uint64_t generation;
    {
      std::lock_guard lock(state->mu);
      generation = ++state->recorded;
      state->error = nullptr;
    }
    enqueue([this, state, generation] {
      std::exception_ptr err;
      {
        std::lock_guard lock(mu_);
        err = error_;
      }
      state->complete(generation, err);
    });
  }

  void wait(const Event& event) override {
    auto state = checked(event).state_;
    std::uint64_t target;
    {
      std::lock_guard lock(state->mu);
      target = state->recorded;
    }
    enqueue([state, target] { state->wait_for(target); });
  }

  void synchronize() override {
    std::unique_lock lock(mu_);
    idle_cv_.wait(lock, [&] { return queue_.empty() && !running_; });
    if (error_) {
      auto err = error_;
      error_ = nullptr;
      std::rethrow_exception(err);
    }
  }

 private:
  static const CpuEvent& checked(const Event& event) {
    auto* e = dynamic_cast<const CpuEvent*>(&event);
    ZERO_CHECK(e != nullptr, "CpuDevice stream: the event was not created by a CpuDevice");
    return *e;
  }
  static CpuEvent& checked(Event& event) {
    return const_cast<CpuEvent&>(checked(static_cast<const Event&>(event)));
  }

  void execute(const std::function<void()>& fn) {
    try {
      fn();
    } catch (...) {
      std::lock_guard lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }

  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything enqueued has run
      auto fn = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      lock.unlock();
      execute(fn);
      lock.lock();
      running_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }

  const bool synchronous_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

CpuStream& as_cpu(Stream& stream) {
  auto* s = dynamic_cast<CpuStream*>(&stream);
  ZERO_CHECK(s != nullptr, "CpuDevice: the stream was not created by a CpuDevice");
  return *s;
}

// Aligned host memory. Large blocks are page aligned so they can later be registered for DMA or
// O_DIRECT I/O, and come from the process's shared host arena while it is enabled (ShmComm
// peers then read them without a kernel copy).
class AlignedHostSource final : public BlockSource {
 public:
  void* allocate(std::size_t bytes) noexcept override {
    constexpr std::size_t kPage = 4096;
    if (bytes >= SharedHostArena::kMinBytes) {
      if (SharedHostArena* arena = SharedHostArena::get()) {
        if (void* p = arena->allocate(bytes)) return p;
      }
    }
    const std::size_t alignment = bytes >= kPage ? kPage : Device::kMinAlignment;
    if (bytes > SIZE_MAX - alignment) return nullptr;
    const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    return std::aligned_alloc(alignment, rounded);
  }
  void free(void* data, std::size_t bytes) noexcept override {
    // Any arena, not get(): a block may outlive a fork, and a child's arena is not its
    // parent's.
    if (SharedHostArena* arena = SharedHostArena::any_containing(data)) {
      arena->free(data, bytes);
    } else {
      std::free(data);
    }
  }
};

// Exact sizes: a block is reused only by an allocation of the same size, so the engine's
// per-step buffers find their own blocks again and nothing else is pinned.
CachePolicy cpu_cache_policy() {
  CachePolicy policy;
  policy.small_granule_bytes = 1;
  policy.large_granule_bytes = 1;
  policy.min_cached_bytes = std::size_t{64} << 10;
  policy.max_cached_bytes = std::size_t{1} << 30;
  policy.max_fit_ratio = 1.0;
  return policy;
}

}  // namespace

CpuDevice::CpuDevice(int rank, const DeviceOptions& options)
    : Device(rank),
      synchronous_streams_(options.synchronous_streams),
      source_(std::make_unique<AlignedHostSource>()),
      cache_(std::make_unique<CachingAllocator>(*source_, cpu_cache_policy())) {
  ledger().set_budget(MemoryKind::Device, options.device_budget_bytes);
  ledger().set_budget(MemoryKind::PinnedHost, options.pinned_host_budget_bytes);
  ledger().set_budget(MemoryKind::Host, options.host_budget_bytes);
}

CpuDevice::~CpuDevice() {
  log_live_buffers();
}

void* CpuDevice::allocate_impl(std::size_t bytes, MemoryKind /*kind*/) {
  return cache_->allocate(bytes);
}

void CpuDevice::free_impl(void* data, std::size_t /*bytes*/, MemoryKind /*kind*/) noexcept {
  cache_->free(data);
}

std::unique_ptr<Stream> CpuDevice::create_stream_impl() {
  return std::make_unique<CpuStream>(synchronous_streams_);
}

std::unique_ptr<Event> CpuDevice::create_event_impl() {
  return std::make_unique<CpuEvent>();
}

void CpuDevice::copy_async_impl(void* dst, const void* src, std::size_t bytes, Stream& stream) {
  as_cpu(stream).enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
}

void CpuDevice::copy_impl(void* dst, const void* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
}

void CpuDevice::launch_host_impl(Stream& stream, std::function<void()> fn) {
  as_cpu(stream).enqueue(std::move(fn));
}

const kernels::ComputeKernels& CpuDevice::compute() const {
  return kernels::cpu_compute_kernels();
}

}  // namespace zero
