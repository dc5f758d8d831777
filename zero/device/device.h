// Memory, streams, events and copies for one rank: the seam between the runtime and the hardware.
//
// A Device allocates tagged memory (every byte is counted in its MemoryLedger), moves bytes with
// asynchronous copies ordered on Streams, and orders streams against each other and the host with
// Events, with CUDA's semantics. CpuDevice implements it on the host, CudaDevice implements
// it on a GPU (cuda_device.h). make_device() is the only place that chooses between them.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "zero/base/dtype.h"
#include "zero/device/memory_ledger.h"

namespace zero {

namespace kernels {
struct ComputeKernels;
}

class Device;

// Bytes owned by one allocation. Move-only; frees the memory and updates the ledger when
// destroyed or reset(). A default-constructed or zero-byte Buffer owns nothing (data() is null).
// REQUIRES: the Device that allocated it outlives it.
// Thread safety: a Buffer is a value; distinct Buffers may be freed concurrently.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void* data() const { return data_; }
  std::size_t size_bytes() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }
  MemoryKind kind() const { return kind_; }
  MemoryTag tag() const { return tag_; }

  // The bytes viewed as elements of T. REQUIRES: size_bytes() is a multiple of sizeof(T), and
  // the memory is host-addressable (not MemoryKind::Device on a GPU).
  template <typename T>
  std::span<T> as() const {
    return {static_cast<T*>(data_), bytes_ / sizeof(T)};
  }

  void reset() noexcept;

 private:
  friend class Device;
  Buffer(Device* owner, void* data, std::size_t bytes, MemoryKind kind, MemoryTag tag)
      : owner_(owner), data_(data), bytes_(bytes), kind_(kind), tag_(tag) {}

  Device* owner_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::Host;
  MemoryTag tag_ = MemoryTag::Other;
};

// Element `elem` of `buffer` viewed as an array of `dtype`. REQUIRES: host-addressable memory, or
// a pointer only handed to the device's own kernels and copies.
inline std::byte* element_at(const Buffer& buffer, DType dtype, std::size_t elem) {
  return static_cast<std::byte*>(buffer.data()) + elem * dtype_size(dtype);
}

// A point in a stream's work. Semantics follow CUDA events: an event never recorded counts as
// complete; recording it again replaces the point it marks.
// Thread safety: query() and synchronize() may be called from any thread.
class Event {
 public:
  virtual ~Event() = default;
  // True once all work enqueued on the stream before the last record() has finished.
  virtual bool query() const = 0;
  // Blocks the calling thread until query() would return true. Rethrows the error of a failed
  // operation that preceded the recorded point on its stream.
  virtual void synchronize() = 0;
};

// An ordered queue of work. Work enqueued on one stream runs in order; work on different streams
// may overlap unless ordered with record()/wait().
// Thread safety: one thread enqueues on a given stream at a time.
class Stream {
 public:
  virtual ~Stream() = default;
  // `event` completes when every operation enqueued on this stream so far has completed.
  // REQUIRES: `event` was created by the same Device.
  virtual void record(Event& event) = 0;
  // Operations enqueued on this stream after this call start only once `event` has completed
  // (as recorded at the time of this call). Does not block the caller.
  virtual void wait(const Event& event) = 0;
  // Blocks the caller until every operation enqueued so far has completed. Rethrows the first
  // error any of them raised (the stream then continues with later work).
  virtual void synchronize() = 0;
};

struct DeviceOptions {
  // Per-rank byte budgets, checked on every allocation of that kind (nullopt: unlimited).
  std::optional<std::size_t> device_budget_bytes;
  std::optional<std::size_t> pinned_host_budget_bytes;
  std::optional<std::size_t> host_budget_bytes;
  // CpuDevice only: run stream work inline in the enqueuing thread instead of on a worker thread
  // per stream. Useful when debugging; results are the same.
  bool synchronous_streams = false;
  // CudaDevice only: the GPU to use (cudaSetDevice ordinal); -1 picks rank % visible devices.
  int cuda_ordinal = -1;
};

// Thread safety: allocate(), create_stream(), create_event() and copy() may be called from any
// thread; each Stream has its own rule (above).
class Device {
 public:
  // Every allocation is at least this aligned.
  static constexpr std::size_t kMinAlignment = 64;

  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // "cpu", "cuda".
  virtual std::string_view name() const = 0;
  // The GPU this device computes on (its CUDA ordinal), or -1 for the host.
  virtual int gpu_ordinal() const { return -1; }
  // Whether host code may read and write its MemoryKind::Device memory (the CPU device's is host
  // memory); otherwise such memory is reached only through copy() and the device's kernels.
  bool host_addressable() const { return name() == "cpu"; }
  // The kernels that compute on this device's memory (kernels/compute.h): the engine's one way to
  // run an optimizer step, a norm, an unscale or a cast. Valid for the device's lifetime.
  virtual const kernels::ComputeKernels& compute() const = 0;
  // Makes this device the one compute() runs on for the calling thread, for a thread the device's
  // own methods have not run on (a communicator's thread): CUDA's current device. Nothing on the
  // host.
  virtual void bind_thread() const {}
  int rank() const { return ledger_.rank(); }

  // Allocates `bytes` of `kind` memory for `tag`. Contents are uninitialised. Throws OutOfMemory
  // (naming the tag, the size and the current usage) when the kind's budget would be exceeded or
  // the allocator fails. REQUIRES: kind != MemoryKind::Nvme.
  Buffer allocate(std::size_t bytes, MemoryKind kind, MemoryTag tag);

  std::unique_ptr<Stream> create_stream();
  std::unique_ptr<Event> create_event();

  // Enqueues a copy of `bytes` from `src` to `dst` on `stream`; returns immediately. Both ranges
  // must stay valid, and `dst` unread and `src` unwritten by others, until the copy completes
  // (synchronize the stream or an event recorded after it). REQUIRES: the ranges do not overlap.
  void copy_async(void* dst, const void* src, std::size_t bytes, Stream& stream);
  // Copies now, on the calling thread's view of memory. Same REQUIRES as copy_async.
  void copy(void* dst, const void* src, std::size_t bytes);
  // Enqueues a copy of `bytes` from `src` to `dst` on `native_stream`, a stream of the device's
  // own runtime that a caller computes on (a cudaStream_t on CUDA; null: CUDA's legacy default
  // stream, where compute() runs), and orders compute()'s later work after it; returns without
  // waiting for it. What the caller enqueues on that stream later is ordered after it too. A
  // framework's gradient goes into an engine slot this way without the host waiting. The host
  // device copies now and takes null only. Same REQUIRES as copy_async.
  void copy_on_native_stream(void* dst, const void* src, std::size_t bytes, void* native_stream);
  // Orders compute()'s later work after what `native_stream` (as above) holds now, the host not
  // waiting: nothing for null (compute()'s own stream). The host device takes null only.
  void order_after_native_stream(void* native_stream);
  // Enqueues host code on `stream`, ordered like any other operation on it (CPU kernels on
  // CpuDevice; cudaLaunchHostFunc-style on a GPU). An exception it throws is reported by the
  // stream's or a later event's synchronize().
  void launch_host(Stream& stream, std::function<void()> fn);

  MemoryLedger& ledger() { return ledger_; }
  const MemoryLedger& ledger() const { return ledger_; }
  // Bytes of MemoryKind::Device that may still be allocated: the smaller of what the budget leaves
  // and what the hardware has free (a GPU's free memory); nullopt when neither limits it (the
  // CPU without a budget).
  std::optional<std::size_t> device_room() const;

 protected:
  explicit Device(int rank) : ledger_(rank) {}
  // For a backend's destructor: logs an error for each memory kind that still has buffers
  // allocated (their owners outlived the device, which Buffer's REQUIRES forbids).
  void log_live_buffers() const noexcept;

  // The hardware's free device memory, for device_room(); nullopt where the budget is the only
  // limit (the CPU).
  virtual std::optional<std::size_t> free_device_bytes() const { return std::nullopt; }
  // May assume: bytes > 0, kind allocatable. Returns nullptr on failure.
  virtual void* allocate_impl(std::size_t bytes, MemoryKind kind) = 0;
  virtual void free_impl(void* data, std::size_t bytes, MemoryKind kind) noexcept = 0;
  virtual std::unique_ptr<Stream> create_stream_impl() = 0;
  virtual std::unique_ptr<Event> create_event_impl() = 0;
  virtual void copy_async_impl(void* dst, const void* src, std::size_t bytes, Stream& stream) = 0;
  virtual void copy_impl(void* dst, const void* src, std::size_t bytes) = 0;
  // Default: the host's way (null only, copy_impl now).
  virtual void copy_on_native_stream_impl(void* dst, const void* src, std::size_t bytes,
                                          void* native_stream);
  // Default: the host's way (null only, nothing to order).
  virtual void order_after_native_stream_impl(void* native_stream);
  virtual void launch_host_impl(Stream& stream, std::function<void()> fn) = 0;

 private:
  friend class Buffer;
  void free_buffer(Buffer& buffer) noexcept;

  MemoryLedger ledger_;
};

// The device for `rank`: `kind` is "cpu", "cuda" or "auto" (ZERO_DEVICE if set, else CUDA when
// a GPU is visible; device_choice.h). "cpu" always works; "cuda" needs a build with CUDA, a
// driver at least as new as the toolkit and a visible GPU, and otherwise throws zero::Error
// saying which was missing and who asked for CUDA. Budgets in `options` are applied to the new
// device's ledger; a CUDA device budget larger than the GPU's free memory is an error too.
std::unique_ptr<Device> make_device(std::string_view kind, int rank,
                                    const DeviceOptions& options = {});
// The CUDA devices this process sees: 0 without a GPU, a driver, or CUDA in the build.
int visible_gpu_count();

}  // namespace zero
