// Device on one NVIDIA GPU through the CUDA runtime. Built only in a build with CUDA
// (ZERO_HAVE_CUDA); <cuda_runtime.h> stays out of this header.
//
// Memory: MemoryKind::Device is cudaMalloc'd, PinnedHost cudaHostAlloc'd (page-locked, so copies
// to and from it run asynchronously by DMA), Host ordinary aligned host memory. Each kind has a
// CachingAllocator (caching_allocator.h): GPU blocks in size classes of 512 B below 1 MiB and
// 2 MiB above, at most 1/8 of the GPU's memory idle, pinned blocks likewise up to 1 GiB. Tags,
// ledger and budgets are the Device's, as on CpuDevice. A failed cudaMalloc returns the idle
// blocks to the driver and retries once, then throws OutOfMemory naming the tag.
//
// REQUIRES (unlike CpuDevice, where it is merely wasteful): a Buffer is not destroyed while work
// enqueued on a stream may still read or write it. Its block may be handed out again at once and
// written by work on another stream. Synchronize the stream (or an event after the last use)
// first.
//
// Streams are CUDA streams (non-blocking with respect to the legacy default stream), events are
// CUDA events without timing; record/wait/synchronize map onto cudaEventRecord,
// cudaStreamWaitEvent and cudaStreamSynchronize. launch_host runs its function through
// cudaLaunchHostFunc on a CUDA-owned thread: it must not call CUDA itself; an exception it throws
// is reported by the stream's next synchronize() and by events recorded after it.
//
// Every CUDA failure throws CudaError naming the call, file and line (zero/base/cuda_error.h).
// Each method makes the device's GPU current on the calling thread first, so ranks running as
// threads of one process may share a process with different GPUs.
#pragma once

#include <memory>
#include <mutex>

#include "zero/device/caching_allocator.h"
#include "zero/device/device.h"
#include "zero/device/device_choice.h"

namespace zero {

class CudaDevice final : public Device {
 public:
  // Uses GPU `ordinal` (see DeviceOptions::cuda_ordinal). Throws CudaError when the GPU cannot
  // be used, and zero::Error when options.device_budget_bytes exceeds its free memory
  // (check_device_budget).
  CudaDevice(int rank, int ordinal, const DeviceOptions& options = {});
  ~CudaDevice() override;

  std::string_view name() const override { return "cuda"; }
  const kernels::ComputeKernels& compute() const override;
  void bind_thread() const override;

  int ordinal() const { return ordinal_; }
  int gpu_ordinal() const override { return ordinal_; }
  // cudaMemGetInfo for this GPU now.
  CudaMemoryInfo memory_info() const;
  // cudaMemGetInfo's free bytes plus what the caching allocator holds unused.
  std::optional<std::size_t> free_device_bytes() const override;
  // Idle blocks of every kind back to the driver (e.g. before handing memory to another library).
  void release_cached();

 protected:
  void* allocate_impl(std::size_t bytes, MemoryKind kind) override;
  void free_impl(void* data, std::size_t bytes, MemoryKind kind) noexcept override;
  std::unique_ptr<Stream> create_stream_impl() override;
  std::unique_ptr<Event> create_event_impl() override;
  void copy_async_impl(void* dst, const void* src, std::size_t bytes, Stream& stream) override;
  void copy_impl(void* dst, const void* src, std::size_t bytes) override;
  void order_after_native_stream_impl(void* native_stream) override;
  void copy_on_native_stream_impl(void* dst, const void* src, std::size_t bytes,
                                  void* native_stream) override;
  void launch_host_impl(Stream& stream, std::function<void()> fn) override;

 private:
  CachingAllocator& cache(MemoryKind kind);

  const int ordinal_;
  std::unique_ptr<BlockSource> device_source_;
  std::unique_ptr<BlockSource> pinned_source_;
  std::unique_ptr<BlockSource> host_source_;
  std::unique_ptr<CachingAllocator> device_cache_;
  std::unique_ptr<CachingAllocator> pinned_cache_;
  std::unique_ptr<CachingAllocator> host_cache_;
  // Orders the legacy default stream after a copy on another native stream; recorded under
  // order_mutex_ (cudaStreamWaitEvent takes the event's state at the call).
  std::mutex order_mutex_;
  void* order_event_ = nullptr;  // cudaEvent_t
};

}  // namespace zero
