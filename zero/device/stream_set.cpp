#include "zero/device/stream_set.h"

#include <exception>

namespace zero {

std::string_view stream_role_name(StreamRole role) {
  switch (role) {
    case StreamRole::Compute: return "compute";
    case StreamRole::Comm: return "comm";
    case StreamRole::Offload: return "offload";
  }
  return "?";
}

StreamSet::StreamSet(Device& device) {
  for (std::size_t i = 0; i < kNumStreamRoles; ++i) {
    streams_[i] = device.create_stream();
    events_[i] = device.create_event();
  }
}

void StreamSet::handoff(StreamRole from, StreamRole to) {
  if (from == to) return;
  stream(from).record(*events_[index(from)]);
  stream(to).wait(*events_[index(from)]);
}

void StreamSet::synchronize_all() {
  std::exception_ptr first;
  for (auto& s : streams_) {
    try {
      s->synchronize();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace zero
