// The model copy of an optimizer partition stepped on the host for a device whose memory the host
// cannot address: a GPU under offload_optimizer (ZeRO-Offload's schedule, DESIGN.md §3).
//
// Master weights, optimizer states and the reduced gradient partition live in host memory (the
// GradientReducer lands each reduced chunk there with ReducerOptions::host_landing); the CPU
// kernels step them and write the updated low-precision copy into this mirror, pinned host memory
// laid out like the partition. Each stretch the optimizer says it wrote (model_written) starts
// its host-to-device copy at once on the mirror's own stream, so the copy of one run overlaps the
// step of the next; model_settled() waits for them all. The device's model copy — what the
// all-gathers and the stage-3 fetcher read — is the engine's SliceMap, passed in as `device_map`,
// which also still answers gradient(). The bytes uploaded and the time model_settled() waits go to
// the engine's timings (uploaded_bytes, upload_wait_s).
// Thread safety: the rank's thread only.
#pragma once

#include <cstddef>
#include <memory>

#include "zero/base/dtype.h"
#include "zero/device/device.h"
#include "zero/engine/slice_map.h"
#include "zero/engine_timings.h"
#include "zero/layout/flat_layout.h"

namespace zero::engine_detail {

class HostModelMirror final : public SliceMap {
 public:
  // REQUIRES: device, layout, device_map and timings outlive the mirror.
  HostModelMirror(Device& device, const FlatLayout& layout, Domains domains, DType model_dtype,
                  SliceMap& device_map, EngineTimings& timings);
  ~HostModelMirror() override;  // waits for copies in flight
  HostModelMirror(const HostModelMirror&) = delete;
  HostModelMirror& operator=(const HostModelMirror&) = delete;

  std::byte* gradient(int domain, int unit, std::size_t slice_offset) override {
    return device_map_.gradient(domain, unit, slice_offset);
  }
  // The mirror's element at the same position, in host memory.
  std::byte* model(int domain, int unit, std::size_t slice_offset) override;
  void model_written(int domain, int unit, std::size_t slice_offset, std::size_t count) override;
  // Rethrows the error of a failed copy (CudaError on a GPU).
  void model_settled() override;

 private:
  Device& device_;
  const FlatLayout& layout_;
  const Domains domains_;
  const DType model_dtype_;
  SliceMap& device_map_;
  EngineTimings& timings_;
  Buffer mirror_;
  std::unique_ptr<Stream> stream_;
  bool pending_ = false;
};

}  // namespace zero::engine_detail
