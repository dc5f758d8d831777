#include "zero/device/cuda_device.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <utility>

#include "kernels/compute.h"
#include "zero/base/cuda_error.h"
#include "zero/base/error.h"

namespace zero {

namespace {

// Makes `ordinal` the calling thread's current GPU for every CUDA call after it.
void make_current(int ordinal) {
  ZERO_CUDA_CHECK(cudaSetDevice(ordinal));
}

class CudaMallocSource final : public BlockSource {
 public:
  explicit CudaMallocSource(int ordinal) : ordinal_(ordinal) {}
  void* allocate(std::size_t bytes) noexcept override {
    void* p = nullptr;
    if (cudaSetDevice(ordinal_) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();  // an out-of-memory is not sticky; do not let it leak into later checks
      return nullptr;
    }
    return p;
  }
  void free(void* data, std::size_t /*bytes*/) noexcept override {
    cudaSetDevice(ordinal_);
    cudaFree(data);
  }

 private:
  const int ordinal_;
};

class PinnedHostSource final : public BlockSource {
 public:
  void* allocate(std::size_t bytes) noexcept override {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void free(void* data, std::size_t /*bytes*/) noexcept override { cudaFreeHost(data); }
};

class PageableHostSource final : public BlockSource {
 public:
  void* allocate(std::size_t bytes) noexcept override {
    constexpr std::size_t kPage = 4096;
    if (bytes > SIZE_MAX - kPage) return nullptr;
    return std::aligned_alloc(kPage, (bytes + kPage - 1) / kPage * kPage);
  }
  void free(void* data, std::size_t /*bytes*/) noexcept override { std::free(data); }
};

CachePolicy gpu_cache_policy(std::size_t total_bytes) {
  CachePolicy policy;  // 512 B / 2 MiB classes, 1.25 fit
  policy.max_cached_bytes = total_bytes / 8;
  return policy;
}

CachePolicy host_cache_policy(std::size_t min_cached_bytes) {
  CachePolicy policy;
  policy.small_granule_bytes = 4096;
  policy.min_cached_bytes = min_cached_bytes;
  return policy;
}

// Errors of host functions run by a stream, kept until the stream or an event reports them.
struct HostErrors {
  std::mutex mu;
  std::exception_ptr first;

  void set(std::exception_ptr e) {
    std::lock_guard lock(mu);
    if (!first) first = std::move(e);
  }
  std::exception_ptr take() {
    std::lock_guard lock(mu);
    return std::exchange(first, nullptr);
  }
  std::exception_ptr peek() {
    std::lock_guard lock(mu);
    return first;
  }
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int ordinal) : ordinal_(ordinal) {
    make_current(ordinal_);
    ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~CudaEvent() override {
    cudaSetDevice(ordinal_);
    cudaEventDestroy(event_);
  }

  bool query() const override {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) return false;
    ZERO_CUDA_CHECK(status);
    return true;
  }
  void synchronize() override {
    ZERO_CUDA_CHECK(cudaEventSynchronize(event_));
    if (recorded_errors_) {
      if (auto e = recorded_errors_->peek()) std::rethrow_exception(e);
    }
  }

  cudaEvent_t handle() const { return event_; }
  // The stream's host-function errors that precede the recorded point.
  void set_recorded_errors(std::shared_ptr<HostErrors> errors) {
    recorded_errors_ = std::move(errors);
  }

 private:
  const int ordinal_;
  cudaEvent_t event_ = nullptr;
  std::shared_ptr<HostErrors> recorded_errors_;
};

class CudaStream final : public Stream {
 public:
  explicit CudaStream(int ordinal) : ordinal_(ordinal) {
    make_current(ordinal_);
    ZERO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaStream() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);  // host functions hold pointers to errors_; let them finish
    cudaStreamDestroy(stream_);
  }

  void record(Event& event) override {
    auto& e = checked(event);
    ZERO_CUDA_CHECK(cudaEventRecord(e.handle(), stream_));
    e.set_recorded_errors(errors_);
  }
  void wait(const Event& event) override {
    ZERO_CUDA_CHECK(cudaStreamWaitEvent(stream_, checked(event).handle(), 0));
  }
  void synchronize() override {
    ZERO_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (auto e = errors_->take()) std::rethrow_exception(e);
  }

  cudaStream_t handle() const { return stream_; }
  const std::shared_ptr<HostErrors>& errors() const { return errors_; }

 private:
  static CudaEvent& checked(const Event& event) {
    auto* e = dynamic_cast<const CudaEvent*>(&event);
    ZERO_CHECK(e != nullptr, "CudaDevice stream: the event was not created by a CudaDevice");
    return const_cast<CudaEvent&>(*e);
  }

  const int ordinal_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<HostErrors> errors_ = std::make_shared<HostErrors>();
};

CudaStream& as_cuda(Stream& stream) {
  auto* s = dynamic_cast<CudaStream*>(&stream);
  ZERO_CHECK(s != nullptr, "CudaDevice: the stream was not created by a CudaDevice");
  return *s;
}

// What cudaLaunchHostFunc runs: owns the function and where its error goes.
struct HostCall {
  std::function<void()> fn;
  std::shared_ptr<HostErrors> errors;

  static void run(void* data) {
    std::unique_ptr<HostCall> call(static_cast<HostCall*>(data));
    try {
      call->fn();
    } catch (...) {
      call->errors->set(std::current_exception());
    }
  }
};

}  // namespace

CudaDevice::CudaDevice(int rank, int ordinal, const DeviceOptions& options)
    : Device(rank), ordinal_(ordinal) {
  make_current(ordinal_);
  const CudaMemoryInfo info = memory_info();
  check_device_budget(ordinal_, options.device_budget_bytes, info);
  ledger().set_budget(MemoryKind::Device, options.device_budget_bytes);
  ledger().set_budget(MemoryKind::PinnedHost, options.pinned_host_budget_bytes);
  ledger().set_budget(MemoryKind::Host, options.host_budget_bytes);
  device_source_ = std::make_unique<CudaMallocSource>(ordinal_);
  pinned_source_ = std::make_unique<PinnedHostSource>();
  host_source_ = std::make_unique<PageableHostSource>();
  device_cache_ =
      std::make_unique<CachingAllocator>(*device_source_, gpu_cache_policy(info.total_bytes));
  pinned_cache_ = std::make_unique<CachingAllocator>(*pinned_source_, host_cache_policy(0));
  host_cache_ =
      std::make_unique<CachingAllocator>(*host_source_, host_cache_policy(std::size_t{64} << 10));
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(ordinal_);
  log_live_buffers();
  // The caches go before their sources (member order would do it too; this states it).
  device_cache_.reset();
  pinned_cache_.reset();
  host_cache_.reset();
  if (order_event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(order_event_));
}

CudaMemoryInfo CudaDevice::memory_info() const {
  make_current(ordinal_);
  CudaMemoryInfo info;
  ZERO_CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
}

std::optional<std::size_t> CudaDevice::free_device_bytes() const {
  return memory_info().free_bytes + device_cache_->stats().cached_bytes;
}

void CudaDevice::release_cached() {
  device_cache_->release_cached();
  pinned_cache_->release_cached();
  host_cache_->release_cached();
}

CachingAllocator& CudaDevice::cache(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::Device: return *device_cache_;
    case MemoryKind::PinnedHost: return *pinned_cache_;
    case MemoryKind::Host:
    case MemoryKind::Nvme: break;
  }
  return *host_cache_;
}

void* CudaDevice::allocate_impl(std::size_t bytes, MemoryKind kind) {
  return cache(kind).allocate(bytes);
}

void CudaDevice::free_impl(void* data, std::size_t /*bytes*/, MemoryKind kind) noexcept {
  cache(kind).free(data);
}

std::unique_ptr<Stream> CudaDevice::create_stream_impl() {
  return std::make_unique<CudaStream>(ordinal_);
}

std::unique_ptr<Event> CudaDevice::create_event_impl() {
  return std::make_unique<CudaEvent>(ordinal_);
}

void CudaDevice::copy_async_impl(void* dst, const void* src, std::size_t bytes, Stream& stream) {
  make_current(ordinal_);
  // Unified addressing: the runtime tells device, pinned and pageable memory apart itself. A
  // pageable source or destination makes the copy synchronous with respect to the host.
  ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_cuda(stream).handle()));
}

void CudaDevice::copy_impl(void* dst, const void* src, std::size_t bytes) {
  make_current(ordinal_);
  ZERO_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  // cudaMemcpy returns before a copy between two device addresses completes (the first run on a
  // GPU timed such copies at 425 TB/s); copy() promises the bytes are there on return.
  ZERO_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

void CudaDevice::copy_on_native_stream_impl(void* dst, const void* src, std::size_t bytes,
                                            void* native_stream) {
  make_current(ordinal_);
  const auto stream = static_cast<cudaStream_t>(native_stream);
  ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  order_after_native_stream_impl(native_stream);
}

void CudaDevice::order_after_native_stream_impl(void* native_stream) {
  const auto stream = static_cast<cudaStream_t>(native_stream);
  if (stream == nullptr || stream == cudaStreamLegacy) return;  // compute() runs there already
  make_current(ordinal_);
  const std::lock_guard lock(order_mutex_);
  if (order_event_ == nullptr) {
    cudaEvent_t event = nullptr;
    ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    order_event_ = event;
  }
  const auto event = static_cast<cudaEvent_t>(order_event_);
  ZERO_CUDA_CHECK(cudaEventRecord(event, stream));
  ZERO_CUDA_CHECK(cudaStreamWaitEvent(cudaStreamLegacy, event, 0));
}

void CudaDevice::launch_host_impl(Stream& stream, std::function<void()> fn) {
  make_current(ordinal_);
  CudaStream& s = as_cuda(stream);
  auto call = std::make_unique<HostCall>(HostCall{std::move(fn), s.errors()});
  ZERO_CUDA_CHECK(cudaLaunchHostFunc(s.handle(), &HostCall::run, call.get()));
  call.release();  // HostCall::run owns it now
}

void CudaDevice::bind_thread() const {
  make_current(ordinal_);
}

const kernels::ComputeKernels& CudaDevice::compute() const {
  return kernels::cuda_compute_kernels();
}

}  // namespace zero
