// Device on the host: every memory kind is ordinary 64-byte aligned host memory.
//
// Freed blocks of at least 64 KiB are kept (up to 1 GiB in all) and handed out again for an
// allocation of exactly the same size (a CachingAllocator, caching_allocator.h, with exact size
// classes): buffers the engine allocates every step then cost no page faults. The ledger counts
// buffers in use; cached blocks are not in it.
//
// Streams: by default each Stream owns one worker thread that runs its operations in order, so a
// copy or host function enqueued on a stream overlaps with the enqueuing thread, as on a GPU.
// With DeviceOptions::synchronous_streams every operation runs inline in the enqueuing thread
// before the call returns (events are then complete as soon as they are recorded).
//
// Not final: a test may give it another name(), so that the engine treats its memory as a
// GPU's (reached from the host only through copy()) while it still computes on the CPU.
#pragma once

#include <memory>

#include "zero/device/caching_allocator.h"
#include "zero/device/device.h"

namespace zero {

class CpuDevice : public Device {
 public:
  explicit CpuDevice(int rank, const DeviceOptions& options = {});
  ~CpuDevice() override;

  std::string_view name() const override { return "cpu"; }
  const kernels::ComputeKernels& compute() const override;

 protected:
  void* allocate_impl(std::size_t bytes, MemoryKind kind) override;
  void free_impl(void* data, std::size_t bytes, MemoryKind kind) noexcept override;
  std::unique_ptr<Stream> create_stream_impl() override;
  std::unique_ptr<Event> create_event_impl() override;
  void copy_async_impl(void* dst, const void* src, std::size_t bytes, Stream& stream) override;
  void copy_impl(void* dst, const void* src, std::size_t bytes) override;
  void launch_host_impl(Stream& stream, std::function<void()> fn) override;

 private:
  const bool synchronous_streams_;
  std::unique_ptr<BlockSource> source_;
  std::unique_ptr<CachingAllocator> cache_;
};

}  // namespace zero
