// The backward half of the engine: a rank's gradients from the trainer's slots to the reduced
// partition gradients (DESIGN.md §3, SPEC_DEEPSPEED.md §3.2–3.3).
//
// Per micro-step, each unit's gradients are written into a unit-flat staging buffer (model dtype,
// all ranks' slices). When a unit is complete, its slices are cut into pieces of at most one
// bucket's per-rank capacity and packed into the open bucket; a full bucket is packed as W rank
// chunks (chunk q = every piece's slice of rank q) in the communication dtype and reduce-scattered
// (all-reduced at stage 0 or with reduce_scatter off) while the trainer goes on.
// With overlap_comm two bucket slots alternate, so one bucket is reduced while the next fills.
//
// A unit whose slice holds at least kAloneMinSliceElems elements skips the buckets when its
// gradients need no cast or scale on the way in (comm dtype = gradient dtype, pack_scale 1, no host
// landing): it is reduced alone, straight from its staging buffer (already W rank slices), so
// nothing is packed; in the first micro-step of a window, when the landing would be a plain copy
// (consume_scale 1, accumulation dtype = comm dtype), the collective writes straight into the
// target and nothing is landed either. A lone unit of one parameter may even be reduced in the
// trainer's own gradient memory (lend()), so that nothing is copied into a staging buffer at all.
// Lone units wait or stay in flight (with their staging buffers) up to a bucket's elements per
// slot, and the drain reduces the rest (or, asked to, leaves them late: their sums are then the
// caller's to form, as the engine's optimizer step does, see end_micro_step()). With
// overlap_comm a lone unit's reduction starts at once, during backward, or, in a micro-step
// meant to leave units late (unit_complete()'s `hold`), once newer units hold a slot's budget,
// so that the newest ones are left late and the older ones still overlap with backward; without
// overlap_comm it starts when the whole budget or the drain asks for it, so backward keeps the
// cores (as a bucket waits until it is full). Each reduced element is the same sum over ranks
// in rank order whichever way it travels, so both ways give bitwise the same gradients.
// A finished reduction lands in the SliceMap the engine passes in: domain d's reduced chunk is
// written to gradients(d, unit, offset), added to what is there for all but the first micro-step
// of a window. Packing scales by pack_scale before the sum, landing by consume_scale after it
// (prescale_gradients, gradient_predivide_factor).
//
// Every stage reduces every micro-step and accumulates the reduced values, so a window's gradient
// is formed in one order at every stage — sum over micro-steps of (sum over ranks) — and stages
// 0-3 stay bitwise equal with gradient accumulation. (DeepSpeed accumulates locally and reduces
// once per window at stages 0/1, which rounds differently from its stages 2/3.) The price is one
// reduction per micro-step at stages 0/1 instead of one per window; it overlaps with backward.
//
// Collectives: unit_complete() (a full bucket) and end_micro_step() issue reductions; every rank
// must complete the same units in the same order (the engine's micro-step contract). Thread safety: the rank's thread only. Buffers handed to a reduction
// stay alive until it completes, also when the reducer is destroyed with one in flight.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "kernels/compute.h"
#include "zero/base/dtype.h"
#include "zero/comm/communicator.h"
#include "zero/device/device.h"
#include "zero/engine/slice_map.h"
#include "zero/engine_timings.h"
#include "zero/layout/flat_layout.h"

namespace zero::engine_detail {

struct ReducerOptions {
  int stage = 0;
  DType grad_dtype = DType::F32;           // the trainer's gradients: the model dtype
  DType accum_dtype = DType::F32;          // data_types.grad_accum_dtype (default: the model dtype)
  DType comm_dtype = DType::F32;           // communication_data_type
  std::size_t bucket_elems = 500'000'000;  // reduce_bucket_size: elements of all ranks' chunks
  bool overlap_comm = false;
  bool reduce_scatter = true;  // false: all-reduce, and each rank takes its own chunk
  ReduceOp op = ReduceOp::Avg;
  // qgZ: reduce-scatters ask the communicator to cross nodes in blocks of this many bits
  // (CollectiveArgs::quantize_bits; 0: exact).
  int quantize_bits = 0;
  // LoCo (zeropp_loco_param) on those quantized reduce-scatters: error feedback kept per unit
  // reduced alone and per bucket position in the micro-step, the share of the old error kept
  // (loco_beta), and cleared every loco_reset_steps optimizer steps (0: no LoCo). The ledger
  // counts them as device gradient memory.
  float loco_beta = 0.0f;
  std::int64_t loco_reset_steps = 0;
  float pack_scale = 1.0f;
  float consume_scale = 1.0f;
  kernels::CpuExec exec;
  // Set when the target's gradients are host memory of a device whose memory the host cannot
  // address (the partition stepped on the host under offload_optimizer, ZeRO-Offload's schedule):
  // each reduced chunk is copied into pinned host memory as its bucket finishes (during backward
  // with overlap_comm) and lands with these kernels (the CPU's). Stages 1–3 only.
  const kernels::ComputeKernels* host_landing = nullptr;
};

class GradientReducer {
 public:
  // Units with slices of at least this many elements are reduced alone (see above): below it, the
  // fixed cost of a collective outweighs the copy into a bucket.
  static constexpr std::size_t kAloneMinSliceElems = std::size_t{1} << 14;

  // REQUIRES: comm, device, compute, layout, target and timings outlive the reducer; the
  // layout's world size is comm.size().
  GradientReducer(Communicator& comm, Device& device, const kernels::ComputeKernels& compute,
                  const FlatLayout& layout, const ReducerOptions& options, SliceMap& target,
                  EngineTimings& timings);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Per-rank elements one bucket holds (the pieces a unit's slice is cut into).
  std::size_t bucket_chunk_capacity() const { return chunk_capacity_; }
  // Device bytes the buckets take once the first ones are reduced: per slot (two with
  // overlap_comm) W chunks to send and, when reduce-scattering, one to receive.
  std::size_t bucket_bytes() const;

  // This micro-step's gradient buffer of `unit` (layout.unit(unit).padded_elems elements of the
  // gradient dtype), allocated on first use in a micro-step with its alignment gaps and padding
  // zeroed; every parameter's range is the caller's to write, or to zero (the engine zeroes the
  // range of a parameter without a gradient this micro-step). Null for a unit with no elements.
  // REQUIRES: unit < layout.num_units(); the unit is not complete in this micro-step.
  std::byte* staging(int unit);

  // Instead of staging(unit): the caller's memory at `data` serves as the unit's staging buffer for
  // this micro-step, without a copy, when the unit is one parameter that fills it (no alignment
  // gap, no padding), it is reduced alone, `data` is aligned to kLentAlignment and the unit has no
  // staging buffer yet in this micro-step. Returns whether it does; if so the reducer reads and may
  // overwrite those bytes until the micro-step's reductions are waited for (end_micro_step()) or
  // the reducer is destroyed. REQUIRES: the memory is the device's kind, its gradient dtype.
  bool lend(int unit, std::byte* data);
  static constexpr std::size_t kLentAlignment = 64;
  // lend() for a unit whose buffer the peers read where they cannot read the caller's memory
  // (another process's), but only their own slices of it: the other ranks' slices are copied
  // into a staging buffer (where the peers read them: waiting_alone(), LateUnit::gradients),
  // this rank's own slice is read only here, from the lent memory (local_view()), and copied in
  // only if a collective reduces the unit after all. Half the
  // bytes of staging(unit)'s copy at two ranks. Same conditions and lifetime as lend().
  bool lend_own_slice(int unit, std::byte* data);

  // Every gradient of `unit` is in staging(unit) (or the lent memory) for this micro-step:
  // submitted to the buckets (a full bucket starts a reduction), or reduced alone. A unit without
  // elements, or beyond the layout, is a no-op. `hold`: this micro-step is meant to end with
  // end_micro_step(true), so with overlap_comm a lone unit's reduction waits too, until newer
  // units hold a slot's budget (the newest ones are then left late); without overlap_comm they
  // wait anyway. Every rank passes the same `hold`.
  void unit_complete(int unit, bool hold = false);

  // The end of a micro-step's backward (every unit complete): reduces the open bucket and waits
  // for every reduction; the target's gradients then hold this window's sum so far. Collective.
  // With `leave_late`, the lone units whose reductions have not started (without overlap_comm
  // all of them unless the budget started some; with it, those `hold` kept waiting) are left
  // unreduced instead, when their landing takes no scale and nothing is quantized: those are
  // late_units(), whose target gradients the caller forms itself (or hands back to
  // reduce_late()) before anything reads them. Every rank leaves the same units late.
  void end_micro_step(bool leave_late = false);

  // Whether every lone unit of the layout waits until the end of backward in a micro-step with
  // `hold` and is then left late: their elements together fit one slot's budget (so neither the
  // budget nor overlap_comm starts one during backward) and a late sum needs no scale.
  bool holds_lone_units() const;
  // `unit`'s buffer (staging or lent memory: W rank slices in the communication dtype) while it
  // waits as a lone unit, complete and not yet reduced, in this micro-step, with `accumulate`
  // (what LateUnit says of it once left late); else null.
  const std::byte* waiting_alone(int unit, bool* accumulate) const;
  // `unit`'s buffer as this rank reads it while it waits or is late: the lent memory where
  // lend_own_slice() took it (its own slice is not in the buffer the peers read), else that
  // buffer.
  const std::byte* local_view(int unit) const;

  // A unit end_micro_step(true) left unreduced: its gradients (staging buffer or lent memory: W
  // rank slices of slice_elems elements in the communication dtype), kept until release_late().
  // Its target gradients are what landing the collective's result would make of them: the sum
  // over ranks q of their buffers' slices, taken in rank order with compute.reduce and op() (Avg:
  // divided by the world size) as the communicators sum them, in the communication dtype, then
  // combined into the target (accumulation dtype, scale 1), added to what is there when
  // `accumulate` (not the window's first micro-step) — a plain copy, when the dtypes agree and
  // nothing is added, which the sum may then write straight into the target.
  struct LateUnit {
    int unit = 0;
    const std::byte* gradients = nullptr;  // as the peers read it (this rank: local_view())
    bool accumulate = false;
  };
  std::span<const LateUnit> late_units() const { return late_; }
  // The late units among `units` reduced and landed the usual way; they leave late_units().
  // Collective: every rank passes the same units in the same order.
  void reduce_late(std::span<const int> units);
  // The late units' buffers are given up (the next micro-step may stage into them again).
  // REQUIRES: no peer still reads them.
  void release_late();
  ReduceOp op() const { return options_.op; }
  DType comm_dtype() const { return options_.comm_dtype; }
  DType accum_dtype() const { return options_.accum_dtype; }

  // The next micro-step opens a new accumulation window: its results overwrite instead of add.
  void start_window();

  // After an optimizer step (at the window's end), for LoCo's errors: a skipped step (overflow)
  // clears them, a loss scale that changed by `scale_ratio` rescales them (they are errors of
  // scaled gradients), and every loco_reset_steps-th step clears them. No-op without LoCo.
  void after_step(bool skipped, double scale_ratio);

  // Stage 0: rank `rank`'s slice of unit `unit`'s reduced gradients (every rank's slices,
  // accumulation dtype), from element `slice_offset` on: the stage-0 target's gradients live here.
  std::byte* accumulated(int rank, int unit, std::size_t slice_offset) const;

 private:
  struct Piece {  // a run [begin, end) of a unit's slice, the same on every rank
    int unit = 0;
    std::size_t begin = 0;
    std::size_t end = 0;
    std::size_t size() const { return end - begin; }
  };
  struct Source {  // where a bucket piece comes from on this rank
    Piece piece;
    const void* unit_buffer = nullptr;  // the unit's flat buffer (W slices)
    DType dtype = DType::F32;
  };
  struct Slot {  // one bucket reduction in flight
    Buffer send;
    Buffer recv;
    std::vector<Piece> pieces;
    std::size_t chunk_elems = 0;
    Work work;
    bool in_flight = false;
    bool accumulate = false;
  };
  struct Alone {  // a unit reduced alone, waiting or in flight
    int unit = 0;
    Work work;
    bool issued = false;      // the collective was started
    bool landed = false;      // the collective wrote into the target: nothing to land
    bool accumulate = false;  // land by adding (not the window's first micro-step)
  };
  struct UnitBuffers {
    Buffer staging;
    std::byte* lent = nullptr;  // the caller's memory in place of staging (lend())
    Buffer accum;               // stage 0: the reduced gradients (the target's)
    std::size_t unpacked = 0;   // pieces submitted but not yet packed
  };

  bool scatters() const { return world_ > 1 && options_.stage != 0 && options_.reduce_scatter; }
  bool loco() const { return options_.loco_reset_steps > 0 && options_.quantize_bits != 0; }
  // LoCo's state for a quantized reduce-scatter, or null without LoCo.
  QuantizationFeedback* feedback(std::deque<QuantizationFeedback>& states, std::size_t index);
  Buffer alloc(std::size_t elems, DType dtype);
  bool goes_alone(int unit) const;
  bool lendable(int unit, const std::byte* data) const;  // lend()'s conditions
  // lend_own_slice()'s units: lent memory and a staging buffer both (lend() takes a unit only
  // without one), the staging buffer holding every slice but this rank's.
  static bool split(const UnitBuffers& ub) { return ub.lent != nullptr && !ub.staging.empty(); }
  std::byte* staged(const UnitBuffers& ub) const {
    return ub.lent != nullptr && !split(ub) ? ub.lent
                                            : static_cast<std::byte*>(ub.staging.data());
  }
  // Where a straight collective of the unit writes (every domain's slices, one after the other),
  // or null when the landing is more than a copy or the target's slices are not laid out so.
  std::byte* straight_target(const Alone& alone);
  void reduce_alone(int unit, bool hold);
  void issue(Alone& alone);
  void finish(Alone& alone);  // issues it first if need be
  void finish(std::span<Alone* const> done);  // issues all first, then lands them together
  void submit_unit(int unit, const void* buffer, DType dtype);
  void submit(const Source& source);
  // `draining`: the end of the micro-step, which waits for the bucket at once.
  void flush_bucket(bool draining = false);
  void finish(Slot& slot);
  void drain(bool leave_late);
  bool may_be_late() const;

  Communicator& comm_;
  Device& device_;
  const kernels::ComputeKernels& compute_;
  const FlatLayout& layout_;
  const ReducerOptions options_;
  SliceMap& target_;
  EngineTimings& timings_;
  const int rank_;
  const int world_;
  const Domains domains_;
  std::size_t chunk_capacity_ = 1;
  std::vector<UnitBuffers> units_;
  std::vector<Source> open_;
  std::size_t open_elems_ = 0;
  std::vector<Slot> slots_;
  std::deque<Alone> alone_;     // in unit-completion order (the issue order)
  std::vector<LateUnit> late_;  // left unreduced by end_micro_step(true), until release_late()
  std::size_t alone_elems_ = 0;  // their units' padded elements
  // host_landing: reduced chunks in pinned host memory, four buffers taken in turn. A device's
  // copy into the buffer whose bytes the host had just read (the unpack) ran at about half a
  // pinned copy's speed on an H100, into the other of two at 0.7 to 0.9 of it, and into four in
  // turn at 0.97 (the host's cached lines of a buffer are invalidated as the copy writes it;
  // benchmarks/probes/cuda_norm_landing_probe.cu, docs/gpu-status.md run 9).
  std::array<Buffer, 4> landings_;
  std::size_t next_landing_ = 0;
  std::size_t next_slot_ = 0;
  bool window_first_micro_ = true;  // the current micro-step opened its window
  // LoCo: per unit reduced alone, per bucket in the order of the micro-step (deques: a state
  // stays where it is while its reduction is in flight and later ones are added).
  std::deque<QuantizationFeedback> unit_feedback_, bucket_feedback_;
  std::size_t buckets_this_micro_ = 0;
  std::int64_t steps_since_reset_ = 0;
  std::size_t feedback_bytes_ = 0;  // what the ledger holds for them (device memory, gradients)
  void account_feedback();          // the ledger follows the states' sizes
};

}  // namespace zero::engine_detail
