#include "zero/device/device.h"

#include <utility>

#include "zero/base/error.h"
#include "zero/base/log.h"

namespace zero {

Buffer::Buffer(Buffer&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      kind_(other.kind_),
      tag_(other.tag_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    kind_ = other.kind_;
    tag_ = other.tag_;
  }
  return *this;
}

void Buffer::reset() noexcept {
  if (owner_ != nullptr) owner_->free_buffer(*this);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

void Device::free_buffer(Buffer& buffer) noexcept {
  free_impl(buffer.data_, buffer.bytes_, buffer.kind_);
  ledger_.release(buffer.kind_, buffer.tag_, buffer.bytes_);
}

Buffer Device::allocate(std::size_t bytes, MemoryKind kind, MemoryTag tag) {
  ZERO_CHECK(kind != MemoryKind::Nvme,
             "{} device: cannot allocate {} bytes of {} as nvme memory; NVMe space is managed by "
             "the offload layer",
             name(), bytes, memory_tag_name(tag));
  if (bytes == 0) return Buffer();
  ledger_.reserve(kind, tag, bytes);  // throws OutOfMemory over budget
  void* data = allocate_impl(bytes, kind);
  if (data == nullptr) {
    ledger_.release(kind, tag, bytes);
    throw OutOfMemory(ledger_.out_of_memory_message(kind, tag, bytes, "the allocator failed"));
  }
  return Buffer(this, data, bytes, kind, tag);
}

std::unique_ptr<Stream> Device::create_stream() {
  return create_stream_impl();
}

std::unique_ptr<Event> Device::create_event() {
  return create_event_impl();
}

void Device::copy_async(void* dst, const void* src, std::size_t bytes, Stream& stream) {
  if (bytes == 0) return;
  ZERO_CHECK(dst != nullptr && src != nullptr, "{} device: copy of {} bytes with a null pointer",
             name(), bytes);
  copy_async_impl(dst, src, bytes, stream);
}

void Device::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  ZERO_CHECK(dst != nullptr && src != nullptr, "{} device: copy of {} bytes with a null pointer",
             name(), bytes);
  copy_impl(dst, src, bytes);
}

void Device::copy_on_native_stream(void* dst, const void* src, std::size_t bytes,
                                   void* native_stream) {
  if (bytes == 0) return;
  ZERO_CHECK(dst != nullptr && src != nullptr, "{} device: copy of {} bytes with a null pointer",
             name(), bytes);
  copy_on_native_stream_impl(dst, src, bytes, native_stream);
}

void Device::copy_on_native_stream_impl(void* dst, const void* src, std::size_t bytes,
                                        void* native_stream) {
  ZERO_CHECK(native_stream == nullptr,
             "{} device: a copy on native stream {} asked for, but this device has no native "
             "streams (pass null)",
             name(), native_stream);
  copy_impl(dst, src, bytes);
}

void Device::order_after_native_stream(void* native_stream) {
  if (native_stream != nullptr) order_after_native_stream_impl(native_stream);
}

void Device::order_after_native_stream_impl(void* native_stream) {
  ZERO_CHECK(native_stream == nullptr,
             "{} device: ordering after native stream {} asked for, but this device has no "
             "native streams (pass null)",
             name(), native_stream);
}

std::optional<std::size_t> Device::device_room() const {
  std::optional<std::size_t> room = free_device_bytes();
  if (const std::optional<std::size_t> budget = ledger_.budget(MemoryKind::Device)) {
    const std::size_t used = ledger_.total(MemoryKind::Device).current_bytes;
    const std::size_t left = *budget > used ? *budget - used : 0;
    room = room ? std::min(*room, left) : left;
  }
  return room;
}

void Device::log_live_buffers() const noexcept {
  for (auto kind : {MemoryKind::Device, MemoryKind::PinnedHost, MemoryKind::Host}) {
    const auto live = ledger_.total(kind);
    if (live.live_allocations != 0) {
      log::error("{} device rank {} destroyed with {} {} buffers ({} bytes) still allocated",
                 name(), rank(), live.live_allocations, memory_kind_name(kind), live.current_bytes);
    }
  }
}

void Device::launch_host(Stream& stream, std::function<void()> fn) {
  ZERO_CHECK(static_cast<bool>(fn), "{} device: launch_host with an empty function", name());
  launch_host_impl(stream, std::move(fn));
}

}  // namespace zero
