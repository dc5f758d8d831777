// EngineTimings: where one rank's engine spent its time (zero/engine.h, Engine::timings()). Its
// own header so the engine's parts (zero/engine/) can count into it without the public API.
#pragma once

#include <cstdint>

namespace zero {

// Where this rank's time went since create() (or the last reset_timings()), wall-clock seconds
// on the rank's thread. Communication that overlapped with compute shows only as the time spent
// waiting for it.
struct EngineTimings {
  double pack_s = 0;            // gradients into buckets (cast to the communication dtype)
  double reduce_wait_s = 0;     // waiting for bucket reductions
  double unpack_s = 0;          // reduced buckets into the partition gradients
  double norm_s = 0;            // overflow check, squared norm and their all-reduces
  double optimizer_s = 0;       // the optimizer kernels (with the low-precision write)
  double all_gather_s = 0;      // stages 1/2: the updated model copy to every rank
  double gather_s = 0;          // stage 3: time inside gather() (issuing prefetches included)
  double gather_wait_s = 0;     // stage 3: waiting for all-gathers to complete, in gather() and
                                // when persistent units are re-gathered after a step
  std::int64_t buckets = 0;     // bucket reductions issued (units reduced alone included)
  std::int64_t units_alone = 0;  // of which units reduced alone, with nothing packed
  // Of those, units whose ranks' gradients the optimizer step summed itself, tile by tile, with no
  // collective (the reduction fused into the step; its time is part of optimizer_s).
  std::int64_t units_fused = 0;
  // Of those, units this rank stepped during backward, as soon as every rank's gradients of them
  // were complete (the step in backward, Engine::set_step_in_backward()); the time is
  // step_in_backward_s, not optimizer_s.
  std::int64_t units_stepped_in_backward = 0;
  double step_in_backward_s = 0;
  std::int64_t gathers = 0;     // stage 3 unit all-gathers issued (prefetches included)
  std::int64_t prefetches = 0;  // of which issued ahead of their gather() by the trace
  std::int64_t gathered_elems = 0;  // stage 3: elements those all-gathers filled (padded units)
  std::int64_t secondary_gathers = 0;  // of the gathers, hpZ's inside the secondary group
  // Stages 1/2: bytes of this rank's new slices the optimizer step wrote into the peers' model
  // copies itself (EngineImpl::ModelPush; the time is part of optimizer_s), so that those units
  // were not all-gathered. all_gather_s then holds the barrier after the step and the
  // all-gathers of the other units. Stage 3: likewise into the peers' gathered copies of the
  // persistent units, which are then not re-gathered after the step (nor counted in gathers).
  std::int64_t pushed_bytes = 0;
  // Stages 1/2 over ShmComm processes with a shared model (one model copy for every rank, rank
  // 0's, EngineImpl's shared model): bytes of this rank's slices of it its steps wrote, with
  // nothing pushed or all-gathered (all_gather_s then holds the barrier after the step).
  std::int64_t shared_model_bytes = 0;
  // offload_optimizer on a GPU (the partition stepped on the host): each reduced gradient chunk is
  // copied to pinned host memory (synchronous; the time is part of unpack_s), and each stretch of
  // the updated model copy is uploaded to the device on a stream of its own while the next one is
  // stepped; upload_wait_s is the time the step then waited for those uploads.
  std::int64_t landings = 0;
  std::int64_t landed_bytes = 0;
  double land_s = 0;
  std::int64_t uploads = 0;
  std::int64_t uploaded_bytes = 0;
  double upload_wait_s = 0;
};

}  // namespace zero
