// The three streams a rank's work runs on, and the one way work moves between them.
//
//   compute  — forward/backward kernels and the optimizer step;
//   comm     — collectives (NCCL enqueues on it) and the packing around them;
//   offload  — D2H gradient copies, H2D parameter copies, host optimizer work.
//
// handoff(from, to) records an event at the current end of `from` and makes `to` wait for it, so
// everything enqueued on `to` afterwards sees everything enqueued on `from` before, without
// blocking the host. Each role has its own event, re-recorded by each handoff from it (CUDA event
// semantics: a wait binds to the point recorded at the time of the wait).
//
// Device-agnostic: on a CpuDevice the streams are worker threads, on a CudaDevice CUDA streams,
// so the ordering logic is tested on the host.
// Thread safety: one thread uses a StreamSet at a time (the rank's thread).
#pragma once

#include <array>
#include <memory>
#include <string_view>

#include "zero/device/device.h"

namespace zero {

enum class StreamRole { Compute, Comm, Offload };
inline constexpr std::size_t kNumStreamRoles = 3;
std::string_view stream_role_name(StreamRole role);  // "compute", "comm", "offload"

class StreamSet {
 public:
  // Creates the three streams and their events on `device`. REQUIRES: `device` outlives the set.
  explicit StreamSet(Device& device);

  Stream& stream(StreamRole role) { return *streams_[index(role)]; }

  // Work enqueued on `to` after this call starts after all work enqueued on `from` before it.
  // Does not block. from == to is a no-op.
  void handoff(StreamRole from, StreamRole to);
  // The event `from`'s last handoff recorded (complete if it never handed off), for a host
  // thread that needs to wait for that point.
  Event& last_handoff(StreamRole from) { return *events_[index(from)]; }
  // Blocks until every stream has drained; rethrows the first stream error (compute, comm,
  // offload order).
  void synchronize_all();

 private:
  static std::size_t index(StreamRole role) { return static_cast<std::size_t>(role); }

  std::array<std::unique_ptr<Stream>, kNumStreamRoles> streams_;
  std::array<std::unique_ptr<Event>, kNumStreamRoles> events_;
};

}  // namespace zero
