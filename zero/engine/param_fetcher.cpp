#include "zero/engine/param_fetcher.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "zero/base/error.h"
#include "zero/base/timer.h"
#include "kernels/compute.h"
#include "kernels/quantize.h"

namespace zero::engine_detail {
namespace {

std::uint64_t order_hash(const std::vector<int>& order) {
  std::uint64_t h = 0xcbf29ce484222325ull ^ order.size();
  for (int u : order) h = (h ^ static_cast<std::uint64_t>(u + 1)) * 0x100000001b3ull;
  return h;
}

}  // namespace

ParamFetcher::ParamFetcher(Communicator& comm, Device& device, const FlatLayout& layout,
                           std::size_t units, DType dtype, const std::byte* partition,
                           const FetchOptions& options, EngineTimings& timings, SliceSource source)
    : comm_(comm),
      control_(options.control != nullptr ? *options.control : comm),
      device_(device),
      layout_(layout),
      dtype_(dtype),
      partition_(partition),
      source_(std::move(source)),
      options_(options),
      timings_(timings),
      units_(units) {
  // Persistence by unit, walking units in order (DeepSpeed walks parameters in order).
  std::size_t persistent_total = 0;
  for (std::size_t u = 0; u < layout_.num_units() && u < units; ++u) {
    const UnitLayout& ul = layout_.unit(static_cast<int>(u));
    units_[u].elems = ul.padded_elems;
    if (ul.padded_elems == 0) continue;
    std::size_t numel = 0;
    bool small = true;
    for (std::size_t p : ul.params) {
      numel += layout_.param(p).numel;
      small = small && layout_.param(p).numel <= options_.param_persistence_threshold_elems;
    }
    if (small && persistent_total + numel <= options_.model_persistence_threshold_elems) {
      units_[u].persistent = true;
      persistent_total += numel;
    }
  }
  // The persistent units' copies share one block, so that even the small ones lie where a host
  // block's peers can reach it (a ShmComm rank's shared host arena takes blocks of 64 KiB and
  // more) and a step can write them there (EngineImpl::ModelPush).
  auto lay_out_pool = [this](bool every_unit) {
    std::size_t bytes = 0;
    for (Unit& u : units_) {
      if (u.elems == 0 || !(every_unit || u.persistent)) continue;
      u.pool_offset = bytes;
      bytes += (u.elems * dtype_size(dtype_) + kPoolAlignment - 1) / kPoolAlignment * kPoolAlignment;
    }
    return bytes;
  };
  if (options_.share_pool) {
    const std::size_t bytes = lay_out_pool(true);
    shared_pool_ = bytes > 0 ? options_.share_pool(bytes) : nullptr;
    if (shared_pool_ != nullptr) {
      // Every unit gathered for good: each rank writes its own slices into the one copy, where
      // they stay (its owner's slices from now on, written in place), the peers theirs.
      for (std::size_t i = 0; i < units_.size(); ++i) {
        Unit& u = units_[i];
        u.persistent = u.elems > 0;
        if (!u.persistent) continue;
        const UnitLayout& ul = layout_.unit(static_cast<int>(i));
        const std::size_t slice = ul.slice_elems * dtype_size(dtype_);
        device_.copy(copy_of(u) + static_cast<std::size_t>(comm_.rank()) * slice,
                     partition_ + ul.partition_offset * dtype_size(dtype_), slice);
        u.state = State::Gathered;
      }
      partition_ = nullptr;
      comm_.barrier().wait();  // every rank's slices are in
      return;
    }
  }
  const std::size_t bytes = lay_out_pool(false);
  if (bytes > 0)
    persistent_pool_ = device_.allocate(bytes, MemoryKind::Device, MemoryTag::LowPrecisionParams);
  refresh_after_step();
}

std::byte* ParamFetcher::copy_of(const Unit& u) const {
  if (u.persistent) {
    std::byte* pool =
        shared_pool_ != nullptr ? shared_pool_ : static_cast<std::byte*>(persistent_pool_.data());
    return pool + u.pool_offset;
  }
  return static_cast<std::byte*>(u.buffer.data());
}

ParamFetcher::~ParamFetcher() {
  // Buffers handed to a collective must outlive it.
  if (order_check_pending_) {
    try {
      order_check_.wait();
    } catch (...) {
    }
  }
  for (Unit& u : units_) {
    if (u.state != State::InFlight && !u.device_ordered) continue;
    try {
      u.work.wait();
    } catch (...) {
    }
  }
}

void ParamFetcher::start_gather(int unit) {
  Unit& u = units_[static_cast<std::size_t>(unit)];
  const UnitLayout& ul = layout_.unit(unit);
  // A persistent unit is refreshed in place: its parameters keep their address for the engine's
  // life, so that a framework may alias them as it aliases the model copy at stages 0-2.
  if (!u.persistent) {
    u.buffer = device_.allocate(u.elems * dtype_size(dtype_), MemoryKind::Device,
                                MemoryTag::GatherBuffers);
  }
  ++timings_.gathers;
  timings_.gathered_elems += static_cast<std::int64_t>(u.elems);
  if (!u.persistent) live_elems_ += u.elems;
  u.state = State::InFlight;
  if (!u.secondary.empty()) {
    const std::size_t block = u.elems / static_cast<std::size_t>(options_.secondary->size());
    u.work = options_.secondary->all_gather(u.secondary.data(), copy_of(u), block, dtype_);
    ++timings_.secondary_gathers;
    return;
  }
  const std::byte* slice = nullptr;
  if (!source_) {
    slice = partition_ + ul.partition_offset * dtype_size(dtype_);
  } else {
    u.source = u.staged.empty() ? copy_slice(unit) : std::move(u.staged);
    slice = static_cast<const std::byte*>(u.source.data());
  }
  if (options_.weight_bits != 0 && !u.persistent) {
    // qwZ: this rank's slice quantized into its place of the gathered payloads (the all-gather
    // moves whole 4-byte words; quantized_bytes() is a multiple of 4).
    const std::size_t qbytes = kernels::quantized_bytes(ul.slice_elems, options_.weight_bits);
    u.quantized = device_.allocate(qbytes * static_cast<std::size_t>(comm_.size()),
                                   MemoryKind::Device, MemoryTag::Staging);
    std::byte* mine = static_cast<std::byte*>(u.quantized.data()) +
                      static_cast<std::size_t>(comm_.rank()) * qbytes;
    device_.compute().quantize(slice, dtype_, ul.slice_elems, options_.weight_bits, mine,
                               options_.exec);
    u.source.reset();
    u.work = comm_.all_gather_in_place(u.quantized.data(), qbytes / 4, DType::F32);
    return;
  }
  u.work = comm_.all_gather(slice, copy_of(u), ul.slice_elems, dtype_);
}

void ParamFetcher::wait(Unit& u) {
  if (u.device_ordered) {
    u.work.wait();
    u.device_ordered = false;
    return;
  }
  if (u.state != State::InFlight) return;
  const auto start = std::chrono::steady_clock::now();
  u.work.wait();
  timings_.gather_wait_s += seconds_since(start);
  settle(u);
}

// Neither a staged slice, quantized payloads nor an hpZ copy: nothing the host must do, or free,
// once the all-gather is done.
bool ParamFetcher::can_order(const Unit& u) const {
  return u.source.empty() && u.quantized.empty() && options_.secondary == nullptr;
}

void ParamFetcher::settle(Unit& u) {
  u.source.reset();
  u.state = State::Gathered;
  if (u.prefetched) inflight_elems_ -= u.elems;
  if (!u.quantized.empty()) {
    const std::size_t slice = u.elems / static_cast<std::size_t>(comm_.size());
    const std::size_t qbytes = kernels::quantized_bytes(slice, options_.weight_bits);
    for (std::size_t q = 0; q < static_cast<std::size_t>(comm_.size()); ++q) {
      device_.compute().dequantize(
          static_cast<const std::byte*>(u.quantized.data()) + q * qbytes, slice,
          options_.weight_bits,
          copy_of(u) + q * slice * dtype_size(dtype_), dtype_,
          options_.exec);
    }
    u.quantized.reset();
  }
  if (options_.secondary != nullptr && !u.persistent && u.secondary.empty()) {
    // hpZ: keep this rank's block of the secondary partition for the unit's next gathers.
    const auto h = static_cast<std::size_t>(options_.secondary->rank());
    const std::size_t bytes =
        u.elems / static_cast<std::size_t>(options_.secondary->size()) * dtype_size(dtype_);
    u.secondary = device_.allocate(bytes, MemoryKind::Device, MemoryTag::SecondaryParams);
    device_.copy(u.secondary.data(), copy_of(u) + h * bytes, bytes);
  }
}

void ParamFetcher::free(Unit& u) {
  if (u.state == State::Released) return;
  if (u.device_ordered) {
    // No host wait: compute()'s stream, and every later collective with it, comes after the
    // consumer's stream, which comes after the all-gather.
    device_.order_after_native_stream(u.consumer);
    u.device_ordered = false;
    u.work = Work();
  } else {
    wait(u);
  }
  u.buffer.reset();
  u.state = State::Released;
  u.prefetched = false;
  if (!u.persistent) live_elems_ -= u.elems;
}

void ParamFetcher::gather(int unit) {
  gather_impl(unit, std::nullopt);
}

void ParamFetcher::gather_for_stream(int unit, void* native_stream) {
  gather_impl(unit, native_stream);
}

void ParamFetcher::gather_impl(int unit, std::optional<void*> native_stream) {
  Unit& u = units_[static_cast<std::size_t>(unit)];
  if (u.elems == 0) return;
  if (u.persistent) {
    ZERO_ASSERT(u.state == State::Gathered);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  if (mode_ == Trace::Complete &&
      (current_.size() >= trace_.size() || trace_[current_.size()] != unit)) {
    invalidate_trace();
  }
  current_.push_back(unit);
  if (u.state == State::Released) {
    make_room(unit);
    start_gather(unit);
  }
  if (native_stream && u.state == State::InFlight && can_order(u) &&
      u.work.order_stream(*native_stream)) {
    settle(u);
    u.device_ordered = true;
    u.consumer = *native_stream;
  } else if (!(native_stream && u.device_ordered && u.consumer == *native_stream)) {
    wait(u);
  }
  u.prefetched = false;
  if (mode_ == Trace::Complete && options_.prefetch_bucket_elems > 0) prefetch();
  timings_.gather_s += seconds_since(start);
}

// Frees prefetched-but-unused units until `unit` fits under max_live; fails if it cannot.
void ParamFetcher::make_room(int unit) {
  const Unit& want = units_[static_cast<std::size_t>(unit)];
  for (std::size_t i = units_.size();
       i-- > 0 && live_elems_ + want.elems > options_.max_live_elems;) {
    if (units_[i].prefetched) free(units_[i]);
  }
  if (live_elems_ + want.elems <= options_.max_live_elems) return;
  std::vector<int> held;
  for (std::size_t i = 0; i < units_.size(); ++i) {
    if (!units_[i].persistent && units_[i].state != State::Released)
      held.push_back(static_cast<int>(i));
  }
  throw Error(fmt::format(
      "gather({}): rank {} would hold {} gathered elements, over stage3_max_live_parameters = {} "
      "(unit {} has {}; units {} are gathered): release units before gathering more, or raise "
      "the limit",
      unit, comm_.rank(), live_elems_ + want.elems, options_.max_live_elems, unit, want.elems,
      fmt::join(held, ", ")));
}

// Starts all-gathers of the next units of the trace, within the prefetch and live budgets.
void ParamFetcher::prefetch() {
  for (std::size_t k = current_.size(); k < trace_.size(); ++k) {
    Unit& v = units_[static_cast<std::size_t>(trace_[k])];
    if (v.persistent || v.elems == 0 || v.state != State::Released) continue;
    if (inflight_elems_ + v.elems > options_.prefetch_bucket_elems) break;
    if (live_elems_ + v.elems > options_.max_live_elems) break;
    start_gather(trace_[k]);
    ++timings_.prefetches;
    v.prefetched = true;
    inflight_elems_ += v.elems;
  }
}

void ParamFetcher::invalidate_trace() {
  for (Unit& u : units_) {
    if (u.prefetched) free(u);
  }
  mode_ = Trace::Invalid;
}

bool ParamFetcher::release(int unit) {
  Unit& u = units_[static_cast<std::size_t>(unit)];
  if (u.elems == 0 || u.persistent) return true;
  ZERO_CHECK(u.state != State::Released,
             "release: unit {} is not gathered on rank {} (release without gather)", unit,
             comm_.rank());
  if (mode_ == Trace::Complete) {
    // Kept when the trace uses it again within max_reuse_distance elements of other units.
    std::size_t distance = 0;
    for (std::size_t k = current_.size(); k < trace_.size(); ++k) {
      if (trace_[k] == unit) return true;
      distance += units_[static_cast<std::size_t>(trace_[k])].elems;
      if (distance >= options_.max_reuse_distance_elems) break;
    }
  }
  free(u);
  return false;
}

const std::byte* ParamFetcher::data(int unit) const {
  const Unit& u = units_[static_cast<std::size_t>(unit)];
  return u.state == State::Gathered ? copy_of(u) : nullptr;
}

void ParamFetcher::overwrite(int unit, std::size_t offset, const std::byte* src,
                             std::size_t elems) {
  Unit& u = units_[static_cast<std::size_t>(unit)];
  wait(u);
  u.secondary.reset();  // stale now; every rank drops it (set_param is collective)
  if (u.state != State::Gathered || elems == 0) return;
  device_.copy(copy_of(u) + offset * dtype_size(dtype_), src, elems * dtype_size(dtype_));
}

void ParamFetcher::end_micro_step() {
  finish_order_check();  // the previous micro-step's, when nobody waited for it
  if (comm_.size() > 1) {
    const auto h = static_cast<double>(order_hash(current_) >> 11);  // exact in a double
    order_minmax_[0] = h;
    order_minmax_[1] = -h;
    order_check_ = control_.all_reduce(order_minmax_, order_minmax_, 2, DType::F64, ReduceOp::Max);
    order_check_pending_ = true;
    checked_ = current_;
  }
  for (Unit& u : units_) {
    if (u.prefetched) free(u);
  }
  if (mode_ == Trace::Record) {
    trace_ = current_;
    mode_ = Trace::Complete;
  } else if (mode_ == Trace::Invalid || current_ != trace_) {
    mode_ = Trace::Record;
  }
  current_.clear();
}

void ParamFetcher::refresh_after_step(const std::vector<unsigned char>* current) {
  if (shared_pool_ != nullptr) return;  // the slices are the copy: written in place
  for (Unit& u : units_) {
    if (!u.persistent) free(u);
    u.secondary.reset();
  }
  for (std::size_t i = 0; i < units_.size(); ++i) {
    if (!units_[i].persistent) continue;
    if (current != nullptr && i < current->size() && (*current)[i] != 0) {
      units_[i].staged.reset();  // nothing to gather from
      continue;
    }
    start_gather(static_cast<int>(i));
  }
  for (Unit& u : units_) wait(u);
}

std::byte* ParamFetcher::persistent_copy(int unit) {
  Unit& u = units_[static_cast<std::size_t>(unit)];
  if (!u.persistent || u.elems == 0) return nullptr;
  return copy_of(u);
}

std::byte* ParamFetcher::shared_slice(int unit) {
  const Unit& u = units_[static_cast<std::size_t>(unit)];
  if (shared_pool_ == nullptr || u.elems == 0) return nullptr;
  return copy_of(u) + static_cast<std::size_t>(comm_.rank()) * layout_.unit(unit).slice_elems *
                          dtype_size(dtype_);
}

Buffer ParamFetcher::copy_slice(int unit) {
  Buffer b = device_.allocate(layout_.unit(unit).slice_elems * dtype_size(dtype_),
                              MemoryKind::Device, MemoryTag::Staging);
  source_(unit, static_cast<std::byte*>(b.data()));
  return b;
}

void ParamFetcher::stage_refresh() {
  if (!source_) return;
  for (std::size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    if (u.persistent && u.elems > 0) u.staged = copy_slice(static_cast<int>(i));
  }
}

void ParamFetcher::drop_staged() {
  for (Unit& u : units_) u.staged.reset();
}

void ParamFetcher::finish_order_check() {
  if (!order_check_pending_) return;
  order_check_pending_ = false;
  order_check_.wait();
  if (order_minmax_[0] != -order_minmax_[1]) explain_order_difference();
}

// Collective, entered by every rank once the ranks' orders are known to differ: shares the
// orders of the ended micro-step (checked_) to say where, then throws.
void ParamFetcher::explain_order_difference() {
  const auto W = static_cast<std::size_t>(comm_.size());
  double len = static_cast<double>(checked_.size());
  control_.all_reduce(&len, &len, 1, DType::F64, ReduceOp::Max).wait();
  const auto n = static_cast<std::size_t>(len);
  std::vector<double> mine(n + 1, -1.0), all(W * (n + 1));
  for (std::size_t i = 0; i < checked_.size(); ++i) mine[i] = checked_[i];
  mine[n] = static_cast<double>(checked_.size());
  control_.all_gather(mine.data(), all.data(), n + 1, DType::F64).wait();
  std::string detail;
  for (std::size_t k = 0; k < n && detail.empty(); ++k) {
    for (std::size_t r = 1; r < W; ++r) {
      if (all[r * (n + 1) + k] == all[k]) continue;
      auto name = [](double u) {
        return u < 0 ? std::string("nothing") : fmt::format("unit {}", u);
      };
      detail = fmt::format("gather #{}: rank 0 gathered {}, rank {} gathered {}", k, name(all[k]),
                           r, name(all[r * (n + 1) + k]));
      break;
    }
  }
  throw CommError(fmt::format(
      "stage 3: the ranks gathered units in different orders this micro-step (first difference "
      "at {}); every rank must gather the same units in the same order",
      detail.empty() ? std::string("the number of gathers") : detail));
}

}  // namespace zero::engine_detail
