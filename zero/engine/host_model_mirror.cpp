#include "zero/engine/host_model_mirror.h"

#include "zero/base/error.h"
#include "zero/base/log.h"
#include "zero/base/timer.h"

namespace zero::engine_detail {

HostModelMirror::HostModelMirror(Device& device, const FlatLayout& layout, Domains domains,
                                 DType model_dtype, SliceMap& device_map, EngineTimings& timings)
    : device_(device),
      layout_(layout),
      domains_(domains),
      model_dtype_(model_dtype),
      device_map_(device_map),
      timings_(timings),
      mirror_(device.allocate(static_cast<std::size_t>(domains.count()) * layout.partition_elems() *
                                  dtype_size(model_dtype),
                              MemoryKind::PinnedHost, MemoryTag::LowPrecisionParams)),
      stream_(device.create_stream()) {}

HostModelMirror::~HostModelMirror() {
  if (!pending_) return;
  try {
    stream_->synchronize();
  } catch (const std::exception& e) {
    log::error("HostModelMirror: a model copy upload failed during teardown: {}", e.what());
  }
}

std::byte* HostModelMirror::model(int domain, int unit, std::size_t slice_offset) {
  ZERO_ASSERT(domain >= 0 && domain < domains_.count());
  const std::size_t at = static_cast<std::size_t>(domain) * layout_.partition_elems() +
                         layout_.unit(unit).partition_offset + slice_offset;
  return element_at(mirror_, model_dtype_, at);
}

void HostModelMirror::model_written(int domain, int unit, std::size_t slice_offset,
                                    std::size_t count) {
  if (count == 0) return;
  ZERO_ASSERT(slice_offset + count <= layout_.unit(unit).slice_elems);
  device_.copy_async(device_map_.model(domain, unit, slice_offset),
                     model(domain, unit, slice_offset), count * dtype_size(model_dtype_), *stream_);
  ++timings_.uploads;
  timings_.uploaded_bytes += static_cast<std::int64_t>(count * dtype_size(model_dtype_));
  pending_ = true;
}

void HostModelMirror::model_settled() {
  if (!pending_) return;
  pending_ = false;
  ScopedTimer wait(timings_.upload_wait_s);
  stream_->synchronize();
}

}  // namespace zero::engine_detail
