// Stage 3's parameter fetching: which units' model copies are gathered on this rank, when they are
// all-gathered from the rank slices, and when they are freed (SPEC_DEEPSPEED.md §4.1–4.2, by
// unit instead of by module).
//
//   * Persistent units (every parameter ≤ stage3_param_persistence_threshold, the total bounded by
//     stage3_model_persistence_threshold) stay gathered, all in one block; they are refreshed
//     after each optimizer step, in place (a persistent unit's data() keeps its address for the
//     fetcher's life), or left as they are where the step wrote every rank's copy itself
//     (refresh_after_step's `current`, EngineImpl::ModelPush).
//   * One copy per host (FetchOptions::share_pool): where the ranks are processes of one host
//     that can all address one block of rank 0's, every unit is persistent and their copies lie
//     in that block, one for all the ranks. The constructor writes each rank's slices into it;
//     from then on they are the rank's slices (the owner writes them in place, own_slice()), so
//     nothing is all-gathered or refreshed, and every rank computes from the same bytes. The host
//     then holds one model copy, where the ranks' slices and gathered copies would hold more.
//   * Trace-based prefetch: the first micro-step records the order of gather() calls; later
//     micro-steps follow it and all-gather upcoming units asynchronously, up to
//     stage3_prefetch_bucket_size elements in flight. A gather() that does not match the trace
//     drops the prefetches, falls back to on-demand gathers and records the trace again.
//   * stage3_max_live_parameters bounds the gathered (and in-flight) non-persistent elements: a
//     prefetch never exceeds it, a demand gather first frees units prefetched but not yet used,
//     and otherwise fails with an Error naming the units holding the memory.
//   * release() keeps a unit gathered when the trace uses it again within
//     stage3_max_reuse_distance elements of other units, and says so; the kept copy stays at its
//     address until a release() that frees it or the next refresh_after_step().
//   * qwZ (FetchOptions::weight_bits 8): a non-persistent unit's all-gather carries each rank's
//     slice quantized to int8 blocks (kernels/quantize.h) from the model dtype, and every rank,
//     its own slice included, dequantizes all of them into the gathered copy, so the ranks compute
//     with the same weights. Persistent units and the rank slices themselves stay exact; the
//     master weights are never quantized. On any device: its compute table quantizes and
//     dequantizes (the same bytes on the CPU and a GPU).
//   * hpZ (FetchOptions::secondary, a group of H consecutive ranks): the first all-gather of a
//     unit after a step leaves each rank its block of the unit (1/H of it, in the group's order)
//     as a secondary partition; later gathers of the unit within the step all-gather those
//     blocks inside the group instead (the same bytes, so the same values bit for bit). The
//     secondary partitions are dropped at refresh_after_step() (after every optimizer step and
//     checkpoint load) and by overwrite() (set_param: GatheredParameters writes).
//   * At the end of every micro-step all ranks compare the sequence of units they gathered; a
//     difference is a CommError naming the first differing gather, the units and the ranks.
//
// Every collective is issued in the same order on every rank as long as the ranks gather the same
// units in the same order, which the end-of-micro-step check enforces.
// Thread safety: the rank's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "zero/base/dtype.h"
#include "zero/comm/communicator.h"
#include "zero/device/device.h"
#include "zero/engine_timings.h"
#include "kernels/isa.h"
#include "zero/layout/flat_layout.h"

namespace zero::engine_detail {

struct FetchOptions {
  std::size_t prefetch_bucket_elems = 50'000'000;  // 0: no prefetch
  std::size_t max_live_elems = 1'000'000'000;
  std::size_t max_reuse_distance_elems = 1'000'000'000;
  std::size_t param_persistence_threshold_elems = 100'000;
  std::size_t model_persistence_threshold_elems = SIZE_MAX;
  // The communicator of the order checks (host memory), with the ranks of the fetcher's; null:
  // the fetcher's own.
  Communicator* control = nullptr;
  // hpZ: the secondary group, H consecutive ranks of the fetcher's communicator (this rank is
  // its rank() of them), H dividing its size; null: no secondary partitions.
  Communicator* secondary = nullptr;
  // qwZ: 8 to all-gather non-persistent units in int8 blocks; 0: exact.
  int weight_bits = 0;
  // Kernel threads of the quantization.
  kernels::CpuExec exec;
  // One copy per host: called once by the constructor on every rank (a collective) with the bytes
  // of a pool holding every unit; returns this rank's address of one block every rank of the
  // communicator reads and writes, or null on every rank alike (the units then follow the
  // persistence thresholds, each rank with copies of its own). Null: no sharing asked for.
  std::function<std::byte*(std::size_t bytes)> share_pool;
};

class ParamFetcher {
 public:
  // Where a gather reads this rank's slice of a unit from: copies it into `out` (slice_elems of
  // the model dtype). Used when the slices are not in addressable memory (NVMe).
  using SliceSource = std::function<void(int unit, std::byte* out)>;

  // `partition` is this rank's slices of the model copy (layout order), read by every gather;
  // with a `source` instead (partition null) each gather first copies the slice out of it.
  // `units` may exceed layout.num_units(): the extra units hold no trainable parameter.
  ParamFetcher(Communicator& comm, Device& device, const FlatLayout& layout, std::size_t units,
               DType dtype, const std::byte* partition, const FetchOptions& options,
               EngineTimings& timings, SliceSource source = nullptr);
  ~ParamFetcher();
  ParamFetcher(const ParamFetcher&) = delete;
  ParamFetcher& operator=(const ParamFetcher&) = delete;

  // Gathers the unit and waits on the host for its all-gather.
  void gather(int unit);
  // gather(), for work on `native_stream` (a cudaStream_t; null: CUDA's legacy default stream):
  // where the all-gather completes on a CUDA stream (NCCL), that stream waits for it on the GPU
  // and the host goes on (Work::order_stream), so a framework's forward keeps running ahead of the
  // GPU; only work enqueued on that stream afterwards may read the copy. Elsewhere (host memory,
  // in-process device ranks, hpZ, qwZ, slices read from NVMe) it is gather(). A later gather()
  // of the unit, or one for another stream, waits on the host. When the unit is freed, compute()'s
  // stream is ordered after `native_stream` (Device::order_after_native_stream), so neither the
  // engine's kernels nor a later collective (which waits for compute()'s stream) touch the memory
  // before that stream's reads of it are done.
  void gather_for_stream(int unit, void* native_stream);
  // Whether the unit is still gathered afterwards: true when kept (the trace uses it again within
  // max_reuse_distance, or it is persistent or empty). A kept unit's copy stays where it is until
  // a later release() frees it or refresh_after_step(); it may be released again.
  bool release(int unit);
  // The unit's gathered flat buffer, or null when it is not gathered (or holds nothing).
  const std::byte* data(int unit) const;
  // Writes `elems` elements at `offset` of the unit's gathered copy (waiting for an all-gather in
  // flight first), so a copy gathered before its slices changed stays true; nothing when the
  // unit is not gathered.
  void overwrite(int unit, std::size_t offset, const std::byte* src, std::size_t elems);

  // End of a micro-step: starts the check that every rank gathered the same units in the same
  // order (collective, asynchronous), closes the trace recording, frees prefetches that were
  // never used.
  void end_micro_step();
  // Waits for the check end_micro_step() started and throws a CommError naming the first
  // difference (collective when they differ). The check's all-reduce is issued before the
  // micro-step's last gradient buckets, so a caller that drained those first waits for nothing:
  // the check adds no rendezvous of its own. Nothing when no check is pending (the next
  // end_micro_step() also finishes a pending one first).
  void finish_order_check();
  // After an optimizer step changed the slices: every gathered copy is stale. Frees them and
  // re-gathers the persistent units (collective), from the slices stage_refresh() read if it
  // ran since; a unit marked in `current` (per unit, nonzero: every rank's copy already holds the
  // step's values, written there by the ranks themselves) is not re-gathered. Every rank passes
  // the same marks. Nothing with a shared pool: its owners wrote the slices in place, and the
  // caller orders those writes before anyone reads them (a barrier).
  void refresh_after_step(const std::vector<unsigned char>* current = nullptr);
  // With a shared pool: this rank's slice of `unit` in it, where its owner keeps it; else null.
  std::byte* shared_slice(int unit);
  // A persistent unit's gathered copy (its elems, every rank's slice at rank · slice_elems),
  // which keeps its address for the fetcher's life; null for any other unit.
  std::byte* persistent_copy(int unit);
  // Reads the persistent units' slices for the next refresh_after_step() now (from the slice
  // source: with the slices in a swap store, before the step that wrote them commits, so a
  // failed read fails that step instead of one already committed). drop_staged() forgets them
  // (the step failed). Nothing without a slice source.
  void stage_refresh();
  void drop_staged();

  bool persistent(int unit) const { return units_[static_cast<std::size_t>(unit)].persistent; }
  // Whether the persistent units' copies lie in the one block every rank shares (share_pool).
  bool shares_pool() const { return shared_pool_ != nullptr; }
  std::size_t live_elems() const { return live_elems_; }

 private:
  enum class State { Released, InFlight, Gathered };
  struct Unit {
    State state = State::Released;
    bool persistent = false;
    bool prefetched = false;  // gathered ahead of its use and not yet asked for
    std::size_t elems = 0;    // padded flat size (0: nothing to gather)
    Buffer buffer;  // the gathered copy of a unit that is not persistent (copy_of())
    std::size_t pool_offset = 0;  // a persistent unit's copy in persistent_pool_
    Buffer source;  // the slice copied out of `source_` while its all-gather runs
    Buffer staged;  // stage_refresh()'s copy of the slice, for the next refresh
    Buffer secondary;  // hpZ: this rank's block of the gathered unit, until the next step
    Buffer quantized;  // qwZ: every rank's quantized slice, while the all-gather runs
    Work work;
    // Gathered for a stream that waits for `work` on the GPU; the host has not waited for it.
    bool device_ordered = false;
    void* consumer = nullptr;  // that stream
  };
  enum class Trace { Record, Complete, Invalid };

  static constexpr std::size_t kPoolAlignment = 256;  // bytes, each persistent copy's start
  std::byte* copy_of(const Unit& u) const;  // the unit's gathered copy
  void gather_impl(int unit, std::optional<void*> native_stream);  // nullopt: the host waits
  void start_gather(int unit);
  Buffer copy_slice(int unit);  // the unit's slice out of source_, in a staging buffer
  void wait(Unit& u);     // on the host
  void settle(Unit& u);   // the bookkeeping once an all-gather is waited for (or ordered)
  bool can_order(const Unit& u) const;
  void free(Unit& u);
  void prefetch();
  void invalidate_trace();
  void make_room(int unit);
  void explain_order_difference();

  Communicator& comm_;
  Communicator& control_;  // FetchOptions::control
  Device& device_;
  const FlatLayout& layout_;
  const DType dtype_;
  const std::byte* partition_;  // null once a shared pool holds the slices
  const SliceSource source_;
  const FetchOptions options_;
  EngineTimings& timings_;
  std::vector<Unit> units_;
  Buffer persistent_pool_;  // every persistent unit's gathered copy, at its pool_offset
  std::byte* shared_pool_ = nullptr;  // in place of persistent_pool_: the block share_pool gave
  std::size_t live_elems_ = 0;      // gathered or in flight, persistent units excluded
  std::size_t inflight_elems_ = 0;  // prefetches not yet waited for
  Trace mode_ = Trace::Record;
  std::vector<int> trace_;    // the recorded order
  std::vector<int> current_;  // this micro-step's gathers so far
  // The order check in flight: the ended micro-step's gathers and {hash, -hash}, max-reduced.
  std::vector<int> checked_;
  double order_minmax_[2] = {0, 0};
  Work order_check_;
  bool order_check_pending_ = false;
};

}  // namespace zero::engine_detail
