// Device on the host: every memory kind is ordinary 64-byte aligned host memory.
//
// Streams: by default each Stream owns one worker thread that runs its operations in order, so a
// copy or host function enqueued on a stream overlaps with the enqueuing thread, as on a GPU.
// With DeviceOptions::synchronous_streams every operation runs inline in the enqueuing thread
// before the call returns (events are then complete as soon as they are recorded).
#pragma once

#include <memory>

#include "zero/device/device.h"

namespace zero {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int rank, const DeviceOptions& options = {});
  ~CpuDevice() override;

  std::string_view name() const override { return "cpu"; }

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
};

}  // namespace zero
