#include "zero/engine/gradient_reducer.h"

#include <algorithm>
#include <optional>

#include "zero/base/error.h"
#include "zero/base/timer.h"

namespace zero::engine_detail {
GradientReducer::GradientReducer(Communicator& comm, Device& device,
                                 const kernels::ComputeKernels& compute, const FlatLayout& layout,
                                 const ReducerOptions& options, SliceMap& target,
                                 EngineTimings& timings)
    : comm_(comm),
      device_(device),
      compute_(compute),
      layout_(layout),
      options_(options),
      target_(target),
      timings_(timings),
      rank_(comm.rank()),
      world_(comm.size()),
      domains_{rank_, world_, options.stage == 0},
      units_(layout.num_units()),
      slots_(options.overlap_comm ? 2 : 1) {
  ZERO_CHECK(layout.world_size() == world_,
             "GradientReducer: the layout is for {} ranks but the communicator has {}",
             layout.world_size(), world_);
  ZERO_CHECK(options.host_landing == nullptr || options.stage >= 1,
             "GradientReducer: host landing is for stages 1-3 (stage {})", options.stage);
  // A bucket holds reduce_bucket_size elements, never more than the whole model needs.
  const std::size_t total = layout.total_padded_elems();
  const std::size_t bucket = std::max<std::size_t>(options.bucket_elems, 1);
  chunk_capacity_ =
      std::max<std::size_t>(1, std::min(bucket, total) / static_cast<std::size_t>(world_));
  if (options_.stage == 0) {
    for (std::size_t u = 0; u < units_.size(); ++u) {
      const std::size_t n = layout.unit(static_cast<int>(u)).padded_elems;
      units_[u].accum = alloc(n, options_.accum_dtype);
      compute_.fill_zero(units_[u].accum.data(), options_.accum_dtype, n, options_.exec);
    }
  }
}

std::size_t GradientReducer::bucket_bytes() const {
  const bool recv = options_.stage != 0 && options_.reduce_scatter;  // as flush_bucket()
  const std::size_t chunks = static_cast<std::size_t>(world_) + (recv ? 1 : 0);
  return slots_.size() * chunks * chunk_capacity_ * dtype_size(options_.comm_dtype);
}

GradientReducer::~GradientReducer() {
  // A reduction may still read or write the slot and staging buffers (or the target).
  const auto quietly_wait = [](Work& w) {
    try {
      w.wait();
    } catch (...) {
    }
  };
  for (Slot& s : slots_) {
    if (s.in_flight) quietly_wait(s.work);
  }
  for (Alone& a : alone_) quietly_wait(a.work);
  if (feedback_bytes_ > 0)
    device_.ledger().release(MemoryKind::Device, MemoryTag::Gradients, feedback_bytes_);
}

Buffer GradientReducer::alloc(std::size_t elems, DType dtype) {
  return device_.allocate(elems * dtype_size(dtype), MemoryKind::Device, MemoryTag::Gradients);
}

std::byte* GradientReducer::staging(int unit) {
  UnitBuffers& ub = units_[static_cast<std::size_t>(unit)];
  const std::size_t n = layout_.unit(unit).padded_elems;
  if (n == 0) return nullptr;
  ZERO_ASSERT(ub.lent == nullptr);  // a lent unit's one parameter is ready already
  if (ub.staging.empty()) {
    ub.staging = alloc(n, options_.grad_dtype);
    // Only what no parameter covers: the parameters' ranges are written (or zeroed) by the engine.
    std::size_t covered = 0;
    const auto zero_until = [&](std::size_t end) {
      if (end > covered) {
        compute_.fill_zero(element_at(ub.staging, options_.grad_dtype, covered),
                           options_.grad_dtype, end - covered, options_.exec);
      }
    };
    for (std::size_t param : layout_.unit(unit).params) {
      const ParamPlacement& pl = layout_.placement(param);
      zero_until(pl.offset);
      covered = std::max(covered, pl.offset + pl.numel);
    }
    zero_until(n);
  }
  return static_cast<std::byte*>(ub.staging.data());
}

bool GradientReducer::lendable(int unit, const std::byte* data) const {
  const UnitBuffers& ub = units_[static_cast<std::size_t>(unit)];
  const UnitLayout& ul = layout_.unit(unit);
  if (!goes_alone(unit) || ul.params.size() != 1 || !ub.staging.empty() || ub.lent != nullptr ||
      reinterpret_cast<std::uintptr_t>(data) % kLentAlignment != 0) {
    return false;
  }
  const ParamPlacement& pl = layout_.placement(ul.params.front());
  return pl.offset == 0 && pl.numel == ul.padded_elems;
}

bool GradientReducer::lend(int unit, std::byte* data) {
  if (!lendable(unit, data)) return false;
  units_[static_cast<std::size_t>(unit)].lent = data;
  return true;
}

bool GradientReducer::lend_own_slice(int unit, std::byte* data) {
  if (!lendable(unit, data)) return false;
  UnitBuffers& ub = units_[static_cast<std::size_t>(unit)];
  const UnitLayout& ul = layout_.unit(unit);
  const std::size_t esize = dtype_size(options_.grad_dtype);
  const std::size_t own_begin = static_cast<std::size_t>(rank_) * ul.slice_elems * esize;
  const std::size_t own_end = own_begin + ul.slice_elems * esize;
  ub.staging = alloc(ul.padded_elems, options_.grad_dtype);
  auto* staging = static_cast<std::byte*>(ub.staging.data());
  device_.copy(staging, data, own_begin);
  device_.copy(staging + own_end, data + own_end, ul.padded_elems * esize - own_end);
  ub.lent = data;
  return true;
}

const std::byte* GradientReducer::local_view(int unit) const {
  const UnitBuffers& ub = units_[static_cast<std::size_t>(unit)];
  return split(ub) ? ub.lent : staged(ub);
}

std::byte* GradientReducer::accumulated(int rank, int unit, std::size_t slice_offset) const {
  const std::size_t S = layout_.unit(unit).slice_elems;
  return element_at(units_[static_cast<std::size_t>(unit)].accum, options_.accum_dtype,
                    static_cast<std::size_t>(rank) * S + slice_offset);
}

void GradientReducer::unit_complete(int unit, bool hold) {
  if (static_cast<std::size_t>(unit) >= units_.size()) return;
  UnitBuffers& ub = units_[static_cast<std::size_t>(unit)];
  if (layout_.unit(unit).padded_elems == 0) return;
  if (goes_alone(unit)) {
    reduce_alone(unit, hold);
    return;
  }
  // Into the buckets; the staging buffer is freed once every piece is packed.
  submit_unit(unit, ub.staging.data(), options_.grad_dtype);
}

bool GradientReducer::goes_alone(int unit) const {
  return options_.comm_dtype == options_.grad_dtype && options_.pack_scale == 1.0f &&
         options_.host_landing == nullptr &&
         layout_.unit(unit).slice_elems >= kAloneMinSliceElems;
}

std::byte* GradientReducer::straight_target(const Alone& alone) {
  if (alone.accumulate || options_.consume_scale != 1.0f ||
      options_.accum_dtype != options_.comm_dtype || world_ == 1) {
    return nullptr;
  }
  if (scatters()) return target_.gradient(0, alone.unit, 0);
  if (domains_.count() != world_) return nullptr;  // all-reduced, but only the own slice kept
  // Every rank's slice, as the all-reduce leaves them: domain d's right after domain d-1's.
  const std::size_t slice_bytes =
      layout_.unit(alone.unit).slice_elems * dtype_size(options_.comm_dtype);
  std::byte* first = target_.gradient(0, alone.unit, 0);
  for (int d = 1; d < domains_.count(); ++d) {
    if (target_.gradient(d, alone.unit, 0) != first + static_cast<std::size_t>(d) * slice_bytes)
      return nullptr;
  }
  return first;
}

void GradientReducer::reduce_alone(int unit, bool hold) {
  ++timings_.buckets;
  ++timings_.units_alone;
  const UnitLayout& ul = layout_.unit(unit);
  // Up to a bucket's elements per slot (two with overlap_comm) of all ranks' slices wait or are
  // in flight: the staging buffers they hold are what the buckets would hold.
  const std::size_t slot_budget = std::max<std::size_t>(options_.bucket_elems, 1);
  const std::size_t budget = slot_budget * slots_.size();
  while (!alone_.empty() && alone_elems_ + ul.padded_elems > budget) {
    finish(alone_.front());
    alone_elems_ -= layout_.unit(alone_.front().unit).padded_elems;
    alone_.pop_front();
  }
  alone_elems_ += ul.padded_elems;
  alone_.push_back(Alone{unit, Work(), false, false, !window_first_micro_});
  // Without overlap_comm the reduction starts when the budget or the end of the micro-step asks
  // for it, so backward has the cores to itself.
  if (!options_.overlap_comm) return;
  // With overlap_comm it runs while backward goes on: at once, or (hold) once newer units than
  // it hold a slot's budget. The newest units, a slot's budget at most, are then still waiting
  // when backward ends, for the caller to leave late.
  if (!hold) {
    issue(alone_.back());
    return;
  }
  // The units issued are a prefix of alone_ (in completion order); those waiting, the rest.
  std::size_t first = alone_.size();
  std::size_t waiting = 0;
  while (first > 0 && !alone_[first - 1].issued) {
    waiting += layout_.unit(alone_[--first].unit).padded_elems;
  }
  for (; waiting > slot_budget; ++first) {
    issue(alone_[first]);
    waiting -= layout_.unit(alone_[first].unit).padded_elems;
  }
}

void GradientReducer::issue(Alone& alone) {
  const UnitLayout& ul = layout_.unit(alone.unit);
  UnitBuffers& ub = units_[static_cast<std::size_t>(alone.unit)];
  if (split(ub)) {
    // A collective reads the whole buffer: this rank's own slice joins the others in staging.
    const std::size_t bytes = ul.slice_elems * dtype_size(options_.grad_dtype);
    const std::size_t own = static_cast<std::size_t>(rank_) * bytes;
    device_.copy(static_cast<std::byte*>(ub.staging.data()) + own, ub.lent + own, bytes);
    ub.lent = nullptr;
  }
  std::byte* staging = staged(ub);
  std::byte* straight = straight_target(alone);
  alone.issued = true;
  alone.landed = straight != nullptr;
  const DType dtype = options_.comm_dtype;
  if (world_ == 1) {
    alone.work = Work();  // the sum over one rank is the staging buffer itself
  } else if (scatters()) {
    QuantizationFeedback* fb = feedback(unit_feedback_, static_cast<std::size_t>(alone.unit));
    alone.work =
        straight ? comm_.reduce_scatter(staging, straight, ul.slice_elems, dtype, options_.op,
                                        options_.quantize_bits, fb)
                 : comm_.reduce_scatter_in_place(staging, ul.slice_elems, dtype, options_.op,
                                                 options_.quantize_bits, fb);
  } else {
    alone.work = comm_.all_reduce(staging, straight ? straight : staging, ul.padded_elems, dtype,
                                  options_.op);
  }
}

void GradientReducer::finish(Alone& alone) {
  Alone* one[] = {&alone};
  finish(one);
}

// Every reduction is waited for first, then every landing is one call (one wait on a GPU) per
// accumulate flag: the units' targets are disjoint, so the order of their landings is moot.
void GradientReducer::finish(std::span<Alone* const> done) {
  for (Alone* a : done) {
    if (!a->issued) issue(*a);
  }
  {
    ScopedTimer timer(timings_.reduce_wait_s);
    for (Alone* a : done) a->work.wait();
  }
  {
    ScopedTimer timer(timings_.unpack_s);
    std::vector<kernels::CombineRef> unpack;
    for (const bool accumulate : {false, true}) {
      unpack.clear();
      for (const Alone* a : done) {
        if (a->landed || a->accumulate != accumulate) continue;
        const UnitBuffers& ub = units_[static_cast<std::size_t>(a->unit)];
        const std::size_t S = layout_.unit(a->unit).slice_elems;
        for (int d = 0; d < domains_.count(); ++d) {
          const auto q = static_cast<std::size_t>(domains_.rank_of(d));
          unpack.push_back({target_.gradient(d, a->unit, 0), options_.accum_dtype,
                            staged(ub) + q * S * dtype_size(options_.comm_dtype),
                            options_.comm_dtype, S});
        }
      }
      if (!unpack.empty()) {
        compute_.combine_many(unpack, options_.consume_scale, accumulate, options_.exec);
      }
    }
  }
  for (const Alone* a : done) {
    UnitBuffers& ub = units_[static_cast<std::size_t>(a->unit)];
    ub.staging.reset();
    ub.lent = nullptr;
  }
}

void GradientReducer::end_micro_step(bool leave_late) {
  drain(leave_late && may_be_late());
  window_first_micro_ = false;
  buckets_this_micro_ = 0;
  account_feedback();
}

void GradientReducer::account_feedback() {
  std::size_t bytes = 0;
  for (const auto* states : {&unit_feedback_, &bucket_feedback_}) {
    for (const QuantizationFeedback& f : *states) bytes += f.state.size();
  }
  MemoryLedger& ledger = device_.ledger();
  if (bytes > feedback_bytes_) {
    ledger.reserve(MemoryKind::Device, MemoryTag::Gradients, bytes - feedback_bytes_);
  } else if (bytes < feedback_bytes_) {
    ledger.release(MemoryKind::Device, MemoryTag::Gradients, feedback_bytes_ - bytes);
  }
  feedback_bytes_ = bytes;
}

QuantizationFeedback* GradientReducer::feedback(std::deque<QuantizationFeedback>& states,
                                                std::size_t index) {
  if (!loco()) return nullptr;
  if (states.size() <= index) {
    QuantizationFeedback fresh;
    fresh.beta = options_.loco_beta;
    states.resize(index + 1, fresh);
  }
  return &states[index];
}

void GradientReducer::after_step(bool skipped, double scale_ratio) {
  if (!loco()) return;
  const bool reset = skipped || ++steps_since_reset_ >= options_.loco_reset_steps;
  for (auto* states : {&unit_feedback_, &bucket_feedback_}) {
    for (QuantizationFeedback& f : *states) {
      if (reset) {
        f.clear();
      } else if (scale_ratio != 1.0) {
        f.rescale(static_cast<float>(scale_ratio));
      }
    }
  }
  if (reset) {
    steps_since_reset_ = 0;
    account_feedback();
  }
}

void GradientReducer::start_window() {
  window_first_micro_ = true;
}

// Submits the unit's slices in pieces no larger than a bucket's per-rank capacity.
void GradientReducer::submit_unit(int unit, const void* buffer, DType dtype) {
  const std::size_t S = layout_.unit(unit).slice_elems;
  for (std::size_t b = 0; b < S; b += chunk_capacity_)
    ++units_[static_cast<std::size_t>(unit)].unpacked;
  for (std::size_t b = 0; b < S; b += chunk_capacity_) {
    submit({{unit, b, std::min(S, b + chunk_capacity_)}, buffer, dtype});
  }
}

void GradientReducer::submit(const Source& source) {
  if (open_elems_ + source.piece.size() > chunk_capacity_) flush_bucket();
  open_.push_back(source);
  open_elems_ += source.piece.size();
}

// Packs the open bucket as W rank chunks in the communication dtype and starts its reduction.
void GradientReducer::flush_bucket(bool draining) {
  if (open_.empty()) return;
  Slot& slot = slots_[next_slot_];
  next_slot_ = (next_slot_ + 1) % slots_.size();
  if (slot.in_flight) finish(slot);
  ++timings_.buckets;
  std::optional<ScopedTimer> pack_timer(std::in_place, timings_.pack_s);
  const auto W = static_cast<std::size_t>(world_);
  const DType comm_dtype = options_.comm_dtype;
  const std::size_t chunk = open_elems_;
  if (slot.send.empty()) {
    slot.send = device_.allocate(W * chunk_capacity_ * dtype_size(comm_dtype), MemoryKind::Device,
                                 MemoryTag::Buckets);
    if (options_.stage != 0 && options_.reduce_scatter) {
      slot.recv = device_.allocate(chunk_capacity_ * dtype_size(comm_dtype), MemoryKind::Device,
                                   MemoryTag::Buckets);
    }
  }
  slot.pieces.clear();
  // Every piece of every rank's chunk in one call (one wait on a GPU).
  std::vector<kernels::CombineRef> pack;
  pack.reserve(W * open_.size());
  for (std::size_t q = 0; q < W; ++q) {
    std::size_t off = q * chunk;
    for (const Source& s : open_) {
      const std::size_t S = layout_.unit(s.piece.unit).slice_elems;
      const auto* src = static_cast<const std::byte*>(s.unit_buffer) +
                        (q * S + s.piece.begin) * dtype_size(s.dtype);
      pack.push_back(
          {element_at(slot.send, comm_dtype, off), comm_dtype, src, s.dtype, s.piece.size()});
      off += s.piece.size();
    }
  }
  compute_.combine_many(pack, options_.pack_scale, false, options_.exec);
  for (const Source& s : open_) {
    slot.pieces.push_back(s.piece);
    UnitBuffers& ub = units_[static_cast<std::size_t>(s.piece.unit)];
    if (--ub.unpacked == 0) ub.staging.reset();
  }
  slot.chunk_elems = chunk;
  slot.accumulate = !window_first_micro_;
  pack_timer.reset();
  // Waited for at once without overlap_comm and at the drain: the communicator may run it on
  // this thread (CollectiveArgs::waited).
  const bool waited = !options_.overlap_comm || draining;
  if (W == 1) {
    slot.work = Work();  // the sum over one rank is the bucket itself
  } else if (options_.stage != 0 && options_.reduce_scatter) {
    CollectiveArgs args{Collective::ReduceScatter, slot.send.data(), slot.recv.data(), chunk,
                        comm_dtype, options_.op, 0, false, options_.quantize_bits,
                        feedback(bucket_feedback_, buckets_this_micro_++)};
    args.waited = waited;
    ScopedTimer timer(timings_.reduce_wait_s);  // the op itself where it runs right here
    slot.work = comm_.start(args);
  } else {
    CollectiveArgs args{Collective::AllReduce, slot.send.data(), slot.send.data(), W * chunk,
                        comm_dtype, options_.op, 0, true};
    args.waited = waited;
    ScopedTimer timer(timings_.reduce_wait_s);  // the op itself where it runs right here
    slot.work = comm_.start(args);
  }
  slot.in_flight = true;
  open_.clear();
  open_elems_ = 0;
  if (!options_.overlap_comm) finish(slot);
}

// Waits for a bucket's reduction and lands the reduced values in the target.
void GradientReducer::finish(Slot& slot) {
  {
    ScopedTimer timer(timings_.reduce_wait_s);
    slot.work.wait();
  }
  slot.in_flight = false;
  ScopedTimer timer(timings_.unpack_s);
  const DType comm_dtype = options_.comm_dtype;
  const kernels::ComputeKernels& land = options_.host_landing ? *options_.host_landing : compute_;
  std::vector<kernels::CombineRef> unpack;
  for (int d = 0; d < domains_.count(); ++d) {
    const auto q = static_cast<std::size_t>(domains_.rank_of(d));
    const std::byte* chunk = scatters() ? static_cast<const std::byte*>(slot.recv.data())
                                        : element_at(slot.send, comm_dtype, q * slot.chunk_elems);
    if (options_.host_landing != nullptr) {
      const std::size_t bytes = slot.chunk_elems * dtype_size(comm_dtype);
      Buffer& landing = landings_[next_landing_];
      next_landing_ = (next_landing_ + 1) % landings_.size();
      if (landing.size_bytes() < bytes) {
        landing.reset();
        landing = device_.allocate(chunk_capacity_ * dtype_size(comm_dtype),
                                   MemoryKind::PinnedHost, MemoryTag::Buckets);
      }
      {
        ScopedTimer landing_timer(timings_.land_s);
        device_.copy(landing.data(), chunk, bytes);
      }
      ++timings_.landings;
      timings_.landed_bytes += static_cast<std::int64_t>(bytes);
      chunk = static_cast<const std::byte*>(landing.data());
    }
    // A domain's pieces in one call (the landing buffers are reused by the next domains).
    unpack.clear();
    std::size_t off = 0;
    for (const Piece& p : slot.pieces) {
      unpack.push_back({target_.gradient(d, p.unit, p.begin), options_.accum_dtype,
                        chunk + off * dtype_size(comm_dtype), comm_dtype, p.size()});
      off += p.size();
    }
    land.combine_many(unpack, options_.consume_scale, slot.accumulate, options_.exec);
  }
}

void GradientReducer::drain(bool leave_late) {
  flush_bucket(true);
  for (Slot& s : slots_) {
    if (s.in_flight) finish(s);
  }
  // Every waiting reduction is issued before the first wait, so they run back to back.
  std::vector<Alone*> waiting;
  for (Alone& a : alone_) {
    if (leave_late && !a.issued) {
      late_.push_back({a.unit, staged(units_[static_cast<std::size_t>(a.unit)]), a.accumulate});
    } else {
      waiting.push_back(&a);
    }
  }
  finish(waiting);
  alone_.clear();
  alone_elems_ = 0;
}

bool GradientReducer::holds_lone_units() const {
  if (!may_be_late()) return false;
  std::size_t lone = 0;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (goes_alone(static_cast<int>(u))) lone += layout_.unit(static_cast<int>(u)).padded_elems;
  }
  return lone <= std::max<std::size_t>(options_.bucket_elems, 1);
}

const std::byte* GradientReducer::waiting_alone(int unit, bool* accumulate) const {
  // The unit completed last is at the back.
  for (auto it = alone_.rbegin(); it != alone_.rend(); ++it) {
    if (it->unit != unit) continue;
    if (it->issued) return nullptr;
    *accumulate = it->accumulate;
    return staged(units_[static_cast<std::size_t>(unit)]);
  }
  return nullptr;
}

// A late unit's target is the rank-order sum landed with no scale: no quantization, no error
// feedback.
bool GradientReducer::may_be_late() const {
  return world_ > 1 && options_.quantize_bits == 0 && options_.consume_scale == 1.0f &&
         options_.op != ReduceOp::Max;
}

void GradientReducer::reduce_late(std::span<const int> units) {
  std::deque<Alone> again;
  for (const int unit : units) {
    const auto it = std::find_if(late_.begin(), late_.end(),
                                 [&](const LateUnit& l) { return l.unit == unit; });
    ZERO_ASSERT(it != late_.end());
    again.push_back(Alone{unit, Work(), false, false, it->accumulate});
  }
  std::vector<Alone*> waiting;
  for (Alone& a : again) waiting.push_back(&a);
  finish(waiting);  // drops the units' buffers: they leave late_ as well
  std::erase_if(late_, [&](const LateUnit& l) {
    return std::find(units.begin(), units.end(), l.unit) != units.end();
  });
}

void GradientReducer::release_late() {
  for (const LateUnit& l : late_) {
    UnitBuffers& ub = units_[static_cast<std::size_t>(l.unit)];
    ub.staging.reset();
    ub.lent = nullptr;
  }
  late_.clear();
}

}  // namespace zero::engine_detail
