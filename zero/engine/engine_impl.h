// The engine's private class, shared by engine_build.cpp (construction), engine.cpp (micro-step
// sequencing, the step), engine_checkpoint.cpp (save) and engine_checkpoint_load.cpp (load). Not
// a public header: embeddings use zero/engine.h.
//
// EngineImpl keeps the API, the specs, the order of a step ("every collective that can fail runs
// before the first write"), the loss scaler, the LR schedule and the checkpoints; the data flow
// lives in three parts, each usable alone:
//   forward   ParamFetcher        (stage 3: units gathered on demand, prefetched by trace)
//   backward  GradientReducer     (staging, accumulation, buckets, reduce-scatter)
//   step      PartitionOptimizer  (master weights, optimizer states, partition gradients)
// The engine owns the model copy and maps (domain, unit, offset) to it and to the gradients for
// the other two (SliceMap).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/ds_config.h"
#include "kernels/compute.h"
#include "zero/base/error.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/comm/mics_comm.h"
#include "zero/engine.h"
#include "zero/engine/gradient_reducer.h"
#include "zero/engine/host_model_mirror.h"
#include "zero/engine/optimizer_setup.h"
#include "zero/engine/param_fetcher.h"
#include "zero/engine/part_options.h"
#include "zero/engine/partition_optimizer.h"
#include "zero/engine/quantized_frozen.h"
#include "zero/engine/slice_map.h"
#include "zero/layout/flat_layout.h"
#include "zero/schedule/loss_scaler.h"
#include "zero/schedule/lr_schedule.h"

namespace zero::engine_detail {

// Every unit is padded so each rank's slice is a multiple of 16 elements (64 bytes of fp32):
// slices, and so partitions, start cache-line aligned.
constexpr std::size_t kSliceAlignElems = 16;

// The MiCS view of `comm` the engine runs over (engine_mics.cpp): null unless the config asks
// for MiCS at stage 3 with shard groups smaller than the world. Collective over `comm`. Throws
// ConfigError naming the key for a shard size that does not divide the world size and for what
// MiCS cannot be combined with here.
std::unique_ptr<MicsComm> make_mics_comm(const config::DsConfig& cfg, Communicator& comm);
// The same shard groups over EngineOptions::control_comm, for the host-memory collectives of an
// engine whose own communicator takes device memory: null without MiCS or without a control
// communicator (the engine's MiCS view is then its control communicator too). Collective over
// the control communicator.
std::unique_ptr<MicsComm> make_mics_control(const config::DsConfig& cfg, const MicsComm* mics,
                                            const EngineOptions& options);

// qgZ (engine_mics.cpp): the bits gradients cross nodes in (4), or 0 when the config does not ask
// for it or `comm` is not a HierarchicalComm of several nodes of several ranks (what carries the
// topology; on a GPU, make_device_nodes builds one for qgZ), with a note in `notes` saying so.
// Throws ConfigError naming the key with MiCS.
int qgz_bits(const config::DsConfig& cfg, Communicator& comm, bool mics,
             std::vector<std::string>& notes);

// hpZ's secondary group (engine_mics.cpp): zero_hpz_partition_size consecutive ranks of `comm`,
// or null when the config asks for none (or for all ranks, which is plain stage 3). Collective
// over `comm`. Throws ConfigError naming the key for a size that does not divide the world size,
// and with MiCS (`mics`).
std::unique_ptr<Communicator> make_hpz_comm(const config::DsConfig& cfg, Communicator& comm,
                                            bool mics);

// The names a checkpoint gives the optimizer states of `h` (torch's: exp_avg, exp_avg_sq, sum,
// momentum_buffer), in the kernels' order (engine_checkpoint.cpp).
std::vector<std::string> checkpoint_state_names(const kernels::OptimizerHyper& h);

class EngineImpl final : public Engine, private SliceMap {
 public:
  EngineImpl(const config::DsConfig& cfg, Communicator& comm, Device& device,
             std::span<const ParamSpec> params, const EngineOptions& options);
  ~EngineImpl() override;

  void build(const InitFn& init, const EngineOptions& options);

  // The NVMe I/O of the optimizer state's and of stage 3's parameter store (null where a store
  // has no NVMe tier): tests install faults through them.
  offload::AsyncIo* optimizer_io() { return optimizer_->store().io(); }
  offload::AsyncIo* param_io() { return param_store_ ? param_store_->io() : nullptr; }
  // The write() calls of this rank's checkpoint files (io::SafetensorsStreamWriter's fault
  // injection; null: none): tests fail a save with ENOSPC through it.
  void set_checkpoint_write_fault(io::WriteFault fault) {
    checkpoint_write_fault_ = std::move(fault);
  }

  int stage() const override { return stage_; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int gradient_accumulation_steps() const override { return gas_; }
  std::size_t num_params() const override { return specs_.size(); }
  const ParamSpec& spec(std::size_t param) const override {
    check_param(param, "spec");
    return specs_[param];
  }
  std::size_t num_units() const override { return num_units_; }

  void gather(int unit) override;
  void gather_on_stream(int unit, void* native_stream) override;
  bool release(int unit) override;
  bool unit_persistent(int unit) const override;
  bool grad_in_place(std::size_t param, std::byte* data) override;
  std::span<const std::byte> param(std::size_t param) const override;

  double backward_scale() const override { return scaler_->scale() / gas_; }
  double loss_scale() const override { return scaler_->scale(); }
  std::span<std::byte> grad(std::size_t param) override;
  void grad_ready(std::size_t param) override;
  StepResult step() override;

  std::vector<float> gather_master(std::size_t param) override;
  std::vector<std::byte> gather_model(std::size_t param) override;
  void set_param(std::size_t param, std::span<const float> values, int root) override;
  std::int64_t global_steps() const override { return global_steps_; }
  double current_lr(int group) const override;
  void set_lr(int group, double lr) override;
  void set_accumulation_boundary(bool boundary) override;
  void clear_accumulation_boundary() override;
  MemorySnapshot memory() const override { return device_.ledger().snapshot(); }
  void save_checkpoint(const std::string& dir, const std::string& tag,
                       const nlohmann::json& client_state,
                       std::optional<bool> model_16bit) override;
  nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag) override;
  EngineTimings timings() const override { return timings_; }
  std::vector<std::string> notes() const override { return notes_; }
  void reset_timings() override { timings_ = {}; }

 private:
  struct ParamState {
    std::size_t numel = 0;
    std::optional<std::size_t> layout_index;  // trainable: index in layout_
    Buffer frozen;                            // frozen: the whole model copy, or
    std::unique_ptr<QuantizedFrozen> quantized;  // its int8 shard (zero_quantized_nontrainable_weights)
    bool ready = false;                       // grad_ready() seen this micro-step
    bool slot_out = false;                    // grad() handed out this micro-step
  };
  struct UnitState {
    std::vector<std::size_t> trainable;  // spec indices, ascending
    std::size_t pending = 0;             // trainable params not yet ready this micro-step
    std::vector<std::size_t> quantized_frozen;  // spec indices gathered with the unit
    std::byte* model = nullptr;          // stages 0–2: the full model copy, unit-flat
  };

  // SliceMap: stage 0 lands in the reducer's buffers of every rank's reduced gradients (domain d
  // at d·S), stages 1–3 in the optimizer's partition. The model copy is the unit's full buffer
  // at stages 0–2 and this rank's slice of it at stage 3.
  std::byte* gradient(int domain, int unit, std::size_t slice_offset) override;
  std::byte* model(int domain, int unit, std::size_t slice_offset) override;

  void check_param(std::size_t param, const char* what) const {
    ZERO_CHECK(param < specs_.size(), "{}: unknown parameter id {} (the engine has {} parameters)",
               what, param, specs_.size());
  }
  void check_unit(int unit, const char* what) const {
    ZERO_CHECK(unit >= 0 && static_cast<std::size_t>(unit) < num_units_,
               "{}: unknown unit {} (the engine has units 0..{}) on rank {}", what, unit,
               static_cast<long long>(num_units_) - 1, rank_);
  }
  std::size_t partition_elems() const { return layout_->partition_elems(); }
  int num_domains() const { return optimizer_->domains(); }
  int domain_rank(int domain) const { return optimizer_->domain_rank(domain); }
  // Elements of domain d's partition start here in the optimizer's tensors.
  std::size_t domain_offset(int domain) const {
    return static_cast<std::size_t>(domain) * partition_elems();
  }
  void allocate_model_copies();  // stages 0–2: model_pool_ and each unit's place in it
  Buffer alloc(std::size_t elems, DType dtype, MemoryTag tag,
               MemoryKind kind = MemoryKind::Device) {
    return device_.allocate(elems * dtype_size(dtype), kind, tag);
  }
  void combine(void* dst, DType dst_dtype, const void* src, DType src_dtype,
               std::size_t numel) const {
    compute_.combine(dst, dst_dtype, src, src_dtype, numel, 1.0f, false, exec_);
  }
  // The same between two host arrays, on the CPU whatever the device (the same bits: the CPU and
  // CUDA kernels share their element math).
  void host_combine(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                    std::size_t numel) const;
  // `host` where the device's kernels can read it: `host` itself on a host-memory device, else a
  // copy in device staging memory, valid until the next call.
  const float* readable(std::span<const float> host);
  // Where the optimizer partition reads `host` from: host memory when it is stepped on the host,
  // else readable(host).
  const float* optimizer_input(std::span<const float> host) {
    return host_step_ ? host.data() : readable(host);
  }
  // The bytes of engine memory `src` in a host vector.
  std::vector<std::byte> to_host(const void* src, std::size_t bytes);

  void read_options(const EngineOptions& options);
  void refuse_on_device() const;
  void register_specs(const EngineOptions& options);
  void init_state(const InitFn& init);
  // Throws ConfigError naming reduce_bucket_size when the device has no room left for the
  // reduction buckets (checked once the model and optimizer state are allocated, so that a GPU
  // too small for the configured buckets is an error before training, not in the first backward).
  void check_bucket_room() const;
  // Device bytes the two-level collectives of comm_ will still take as scratch between the
  // levels for the largest reduction and gather this engine issues, beyond what they hold (0 on
  // one level or on the host).
  std::size_t level_scratch_bytes() const;
  // Stage 3: the model copy's own slices in memory, or in the NVMe param store.
  void make_param_store();
  std::byte* own_slice(int unit, std::size_t slice_offset);  // valid until the next call
  void copy_own_slice(int unit, std::byte* out);
  // leave_late: GradientReducer::end_micro_step's (the reduction fused into the step).
  void finish_micro_step(bool leave_late = false);
  void reset_micro_step();
  // Collective, before any write: overflow vote, squared norm and every group's coefficients.
  struct StepPlan {
    bool overflow = false;
    double norm = 0;  // of the scaled gradients; with norm_after_step() the step's, not this
    std::optional<LossScaler> scaler_after;
    std::vector<kernels::OptimizerHyper> hypers;
    std::vector<kernels::StepScalars> scalars;
  };
  StepPlan plan_step();
  // Nothing reads the norm before the step (no overflow check, no clipping): the step sums it
  // in the same walk over the gradients (PartitionOptimizer::step's own_sumsq) and the norm is
  // all-reduced after the commit, with the same bits.
  bool norm_after_step() const { return !check_overflow_ && clip_ <= 0; }
  // Whether every rank's model copy needs the other ranks' slices after a step (stages 1 and 2,
  // more than one rank, each rank with a copy of its own: not a shared model).
  bool gathers_model() const {
    return world_ > 1 && (stage_ == 1 || stage_ == 2) && !shared_model_;
  }
  // after_push: the step pushed the units ModelPush covers, at least one (a barrier instead of
  // their gathers). With a shared model, only the barrier: every rank's slices are in place.
  // stepped_everywhere: a collective over comm_ since every rank's step (the norm's) stands for
  // that barrier.
  void all_gather_model(bool after_push = false, bool stepped_everywhere = false);
  // Starts all_gather_model()'s collectives, waiting on the oldest while more than
  // `window_elems` elements would be in flight; returns those still in flight (in place: no
  // memory of their own). Nothing when !gathers_model().
  // skip_pushed: not the units ModelPush covers.
  std::vector<Work> start_all_gather_model(std::size_t window_elems, bool skip_pushed = false);
  // Starts the in-place all-gather of `unit`'s model copy (every rank's slice to every rank).
  // REQUIRES: gathers_model(), the unit's padded_elems > 0.
  Work start_model_gather(std::size_t unit);
  // What the all-gather of the model copy does, done by each rank as it writes its own slices:
  // a ModelEcho (PartitionOptimizer::write_model_range) that writes each piece of this rank's
  // slices into every peer's model copy at the same place. Collective over comm_ (exchanges the
  // model copies' addresses). The caller orders the writes before any peer reads its model copy
  // (a collective over comm_ after the last write), and keeps the peers from writing their
  // model copies meanwhile.
  // REQUIRES: gathers_model(), num_domains() == 1, comm_.shares_address_space().
  PartitionOptimizer::ModelEcho push_model_to_peers();
  // Stages 1/2, and stage 3's persistent units, where the communicator lets this rank write the
  // peers' copies (Communicator::peer_memory(): in-process ranks, and ShmComm processes for
  // copies in the shared host arena): the optimizer step writes each new stretch of this rank's
  // slices into every peer's copy as well (at stage 3 into its own gathered copy too), while it
  // is in cache (model_written()), and those units are not all-gathered after the step. The
  // ranks meet at a barrier before the step (every peer is past its backward and in step(), so
  // nobody reads a copy being written) and after it (every push has landed before anyone leaves
  // step()). Units some peer's copy of which cannot be written (a block outside the arena) are
  // all-gathered as before. Off with ZERO_MODEL_PUSH=0, on an NVMe tier or a swapped stage-3
  // partition (a failed step restores only this rank's copy), under MiCS, and where the model
  // copy is not host memory.
  // At stage 0 (every rank holds every domain) with an fp32 master in the model copy, the push
  // shares the step out: each rank steps only its own domain and pushes it, so a step moves
  // 1/world of the optimizer's bytes and every rank's model copy, its master, is whole after it
  // (PartitionOptimizer::step_own_domain_only). Only where every unit is pushed, and then for
  // the engine's life (ZERO_MODEL_PUSH is read until the first step).
  struct ModelPush {
    bool set_up = false;
    // [q·units + u]: rank q's copy of unit u, writable here (the rank's own: stage 3 only)
    std::vector<std::byte*> peers;
    std::vector<unsigned char> pushed;  // per unit: written into every peer's copy by the step
    std::size_t pushed_units = 0;
    bool active = false;  // inside the optimizer step
  };
  bool may_push_model() const;
  // The pushing step is over (push_.active cleared): its streamed stores fenced, so that the
  // barrier or all-reduce after it orders them for the peers.
  void end_push();
  // The shared model (engine_shared_model.cpp). At stages 1/2 over ShmComm processes, every
  // rank's model copy is one block: rank 0's model_pool_, in its shared host arena, which the
  // peers map (Communicator::peer_memory()). Each rank's step writes its slices there and nothing
  // is pushed or all-gathered: the step's model traffic is the kernel's own write. The ranks meet
  // at a barrier before a step writes the copy (every peer is past its backward) and after it
  // (every slice is in place before anyone's next forward); a checkpoint load writes it only
  // after the ranks agree, then meets them likewise. Rank 0 alone writes the initial copy, and
  // every rank's set_param() the same bytes. Destroying the engine is a barrier, so that rank 0
  // frees the block only after every peer has let go of it. Not for in-process ranks (ModelPush
  // serves them), an NVMe tier, a copy outside host memory, or one rank 0's arena does not hold
  // (below 64 KiB); off with ZERO_SHARED_MODEL=0.
  // At stage 3 the same block (model_pool_ again) holds every unit's gathered copy
  // (ParamFetcher's share_pool, every unit then persistent) and is where the rank's own slices
  // live (own_slice(); each rank writes its initial slices there): the step writes them in place,
  // nothing is pushed or gathered, and no rank holds a partition of its own (model_part_ is
  // dropped). Only where the host's ranks may hold the whole model gathered anyway
  // (stage3_max_live_parameters × ranks ≥ the model's elements), and not with offload_param,
  // MiCS, hpZ, qwZ or int8 frozen weights.
  bool may_share_model() const;
  // Collective over comm_: rank 0 allocates `owner` of `bytes`; returns that block, mapped here,
  // on every rank, or where some rank may not (`wanted` false) or cannot map it, null on every
  // rank, rank 0's block freed. Sets shared_model_.
  std::byte* share_host_block(bool wanted, std::size_t bytes, MemoryTag tag, Buffer& owner);
  void release_shared_model() noexcept;  // the destructor's barrier
  // The copy of `unit` that the step pushes into (the model copy at stages 1/2, the fetcher's
  // gathered copy of a persistent unit at stage 3), or null.
  std::byte* pushed_copy(std::size_t unit);
  // Collective over comm_ (exchanges the model copies' addresses), once.
  void set_up_model_push();
  // SliceMap: inside a pushing step, the stretch of this rank's slice also goes to every peer.
  void model_written(int domain, int unit, std::size_t slice_offset, std::size_t count) override;

  // The reduction fused into the step (engine_fused_reduction.cpp). Where every rank can read
  // its peers' gradient buffers (Communicator::peer_readable(): in-process ranks, and ShmComm
  // processes for buffers in the shared host arena), the lone units whose reductions had not
  // started when backward ended (GradientReducer::late_units(): all of them without
  // overlap_comm, the newest reduce_bucket_size elements of them with it, the older ones reduced
  // during backward) are not reduced by a collective: the optimizer step sums the ranks'
  // buffers itself, in the communicators' rank order, so the bits are the collective's. A plain
  // sum (late_sources(): nothing added to earlier micro-steps, no cast) is summed by the kernel
  // as it steps each element, the gradient never stored; any other unit's tile is formed in the
  // target right before the step reads it (settle_gradient()). That saves the collective's sync,
  // the comm thread's hand-offs and the step's read of the target from memory. When the norm is
  // read before the step (clipping, an overflow check), the norm's pass sums the plain ones'
  // squares from the buffers as well (the step sums them again) and forms the rank's own slices
  // of the others (PartitionOptimizer::squared_norm), each tile's norm blocks summed from cache.
  // Only at a window's boundary (in a window of several micro-steps the earlier ones are reduced
  // and accumulated as before, and the late sums are added to that as a collective's would be),
  // on host memory without an NVMe tier, swapped stage-3 partition or MiCS; off with
  // ZERO_FUSED_REDUCTION=0. The exchange of the buffers' addresses (after every rank's backward)
  // orders the reads after the peers' writes; the norm's all-reduce after the step, a push's
  // barrier, or else a barrier of its own orders them before anyone's next backward writes the
  // buffers again.
  struct FusedReduction {
    bool active = false;            // inside a step that forms the late units' gradients
    bool own_formed = false;  // the norm formed this rank's own slices of them (not summable ones)
    bool off = false;         // ZERO_FUSED_REDUCTION=0 when the engine was built
    // No rank could read a late unit's buffers of some peer (a backend without peer views, e.g.
    // MPI): fusing is given up for good, every rank agreeing.
    bool unreadable = false;
    std::vector<int> late;          // per layout unit: its row in `sources`, or -1
    std::vector<const std::byte*> sources;  // [row·W + q]: rank q's buffer, readable here
    std::vector<unsigned char> adds;        // per row: added to the target (LateUnit::accumulate)
    Buffer scratch;  // kSettleElems sums on their way into the target, when not a plain copy
    std::vector<const void*> tile_sources;  // late_buffers()'s W pointers
  };
  // The W ranks' buffers of a late unit's `domain` slice from `slice_offset` on (valid until the
  // next call), and the divisor their sum takes (the reduce-scatter's).
  const void* const* late_buffers(int domain, int unit, std::size_t slice_offset);
  float late_divisor() const;
  // A late unit's gradient is a plain sum of the ranks' buffers that the compute kernels can
  // take as they step it or sum its norm (late_sources()): nothing added to earlier micro-steps,
  // no cast, at most GradSources::kMaxCount ranks.
  bool late_summable(bool adds) const;
  static constexpr std::size_t kSettleElems = std::size_t{1} << 14;
  bool may_fuse_reduction() const;
  // This micro-step is expected to leave its lone units late (may_fuse_reduction(), the window's
  // last micro-step; with overlap_comm the newest of them, see GradientReducer::unit_complete()'s
  // `hold`): their gradients had better be in memory the peers can read, so grad_in_place()
  // lends them whole only to a backend that shares the address space. Elsewhere, where each rank
  // reads only its own slices of the peers' buffers (one domain, or stage 0's step shared out),
  // it lends them with only the peers' slices copied into a staging buffer, which lies in
  // ShmComm's shared arena (GradientReducer::lend_own_slice); else it refuses (copied whole).
  bool expects_late_units() const;
  // Collective over comm_: exchanges the late units' buffers and has the units some rank cannot
  // read reduced the usual way. Returns whether any unit is left for the step to form.
  bool set_up_fused_reduction();
  void end_fused_reduction();  // the late units' buffers given back to the reducer
  // SliceMap: the late units' gradients, formed tile by tile as the optimizer reaches them.
  bool gradient_late(int domain, int unit) const override;
  void settle_gradient(int domain, int unit, std::size_t slice_offset, std::size_t count) override;
  bool late_sources(int domain, int unit, std::size_t slice_offset,
                    kernels::GradSources* out) override;

  // The step in backward (engine_step_in_backward.cpp). Where the reduction is fused into the
  // step (above) and nothing reads the norm before it (norm_after_step()), a window's last
  // micro-step steps each lone unit during backward, as soon as every rank's gradients of it are
  // complete: no rank waits for another. Each rank posts a completed unit on its *board* (the
  // micro-step's epoch and the address of its buffer; a block of its shared host arena, which
  // the peers map, or plain memory for in-process ranks) and, at every unit it completes, steps
  // (PartitionOptimizer::step_unit) each unit of its own that every rank has posted, summing the
  // ranks' buffers as the fused reduction does: the same kernels on the same numbers, so the
  // same bits. step() sums and steps what is left. A unit is written only once every rank's
  // backward is past it (its gradient hook has run: autograd no longer reads the parameter),
  // so a shared, pushed or stage-3 copy is never written under a peer's backward. The step's
  // coefficients are fixed when the micro-step arms, at the first unit its backward completes
  // (the lr at that moment; set_lr() afterwards applies from the next step, on every rank alike,
  // whether or not this rank has stepped a unit yet). The boards are exchanged after the first
  // step (a collective); then every window's last micro-step steps in backward where every lone
  // unit of it waits until backward ends (GradientReducer::holds_lone_units(): no unit reduced
  // during backward) and a push, if any, is set up. Off with ZERO_STEP_IN_BACKWARD=0 or set_step_in_backward(false).
  struct BoardPost {  // one unit of a rank's board; the epoch written last (release)
    std::uint64_t epoch = 0;
    std::uint64_t address = 0;  // the poster's buffer of the unit (its own address)
  };
  struct StepInBackward {
    bool off = false;          // ZERO_STEP_IN_BACKWARD=0 when the engine was built
    bool allowed = true;       // set_step_in_backward()
    bool set_up = false;       // the boards exchanged
    bool unreadable = false;   // some rank cannot read some board: never
    bool decided = false;      // this micro-step's arming, at its first completed unit
    bool armed = false;
    bool push = false;         // the armed step pushes (ModelPush, set up by an earlier step)
    std::uint64_t epoch = 0;   // this boundary's: global_steps_ + 1, the same on every rank
    Buffer board;              // this rank's posts, one per layout unit
    std::vector<const BoardPost*> boards;  // every rank's, readable here
    std::vector<int> waiting;  // units completed and posted here, not stepped yet (in order)
    std::optional<StepPlan> plan;  // fixed when armed
    int unit = -1;             // the unit being stepped: its late buffers are `sources`
    bool adds = false;         // and its sum is added to earlier micro-steps' (LateUnit's)
    std::vector<const std::byte*> sources;  // [q]: rank q's buffer of `unit`, readable here
  };
  bool may_step_in_backward() const;
  // Collective over comm_, after a step where may_step_in_backward(): the boards' addresses.
  void set_up_step_in_backward();
  // Decides (once a micro-step) whether this one steps in backward; opens the optimizer's step.
  bool arm_step_in_backward();
  // grad_ready(): `unit` is complete here; posts it when it waits as a lone unit, then steps
  // each waiting unit every rank has posted.
  void unit_completed_in_backward(int unit);
  // Steps each waiting unit every rank has posted.
  void step_posted_units();
  // step()'s start at a boundary: posts this rank's arrival, then steps the units the peers post
  // until they have all arrived (or nothing waits).
  void step_posted_units_until_arrived();
  // The micro-step's arming ends (step(), or a failed one): the optimizer's step closed.
  void end_step_in_backward();
  // Throws naming `what` while a step begun in backward waits for step(): the parameters and
  // optimizer state are half stepped.
  void check_not_begun_in_backward(const char* what) const;
  void set_step_in_backward(bool on) override { in_backward_.allowed = on; }
  bool step_begun_in_backward() const override { return in_backward_.plan.has_value(); }
  // The W ranks' buffers of `unit`'s late gradients (unit-flat): the posted ones while it is
  // stepped in backward, else its fused-reduction row's.
  const std::byte* const* late_unit_buffers(int unit) const;
  // Whether `unit`'s late sum is added to what earlier micro-steps left (LateUnit::accumulate).
  bool late_adds(int unit) const;

  // The whole master value of `unit` (padded, master dtype). Collective at stages 1–3.
  std::vector<std::byte> gather_master_unit(int unit);

  // Checkpoints (engine_checkpoint.cpp saves, engine_checkpoint_load.cpp loads).
  ckpt::Manifest describe(const std::string& tag) const;
  // Collective: when any rank's `local_error` is non-empty, every rank throws IoError with the
  // first failing rank's message.
  void agree_on_failure(const std::string& local_error);
  // save_checkpoint's work on every rank of comm_ (collective over comm_).
  void save_group(const std::string& dir, const std::string& tag,
                  const nlohmann::json& client_state, std::optional<bool> model_16bit);
  // save_checkpoint's steps after <dir>/<tag>.tmp exists (collective).
  void save_into(const std::string& dir, const std::string& tag, const nlohmann::json& client_state,
                 bool with_model);
  io::WriteFault checkpoint_write_fault_;

  Buffer upload_;  // readable()'s staging memory (devices other than the host's)

  const config::DsConfig cfg_;
  // MiCS (stage 3 with mics_shard_size below the world size): the shard group's view that comm_
  // and control_ then are (engine_mics.cpp); null otherwise.
  std::unique_ptr<MicsComm> mics_;
  // MiCS on an engine with a control communicator: the shard groups of that one, which control_
  // then is (make_mics_control); null otherwise.
  std::unique_ptr<MicsComm> mics_control_;
  std::vector<std::string> notes_;  // Engine::notes()
  Communicator& comm_;
  Communicator& control_;  // host-memory collectives (EngineOptions::control_comm)
  // The device's memory is the host's (CpuDevice): host code may read and write engine buffers.
  // Otherwise every byte crosses with device_.copy.
  const bool host_memory_;
  // The optimizer partition is stepped on the host by the CPU kernels although the device's memory
  // is not the host's: offload_optimizer on a GPU (ZeRO-Offload's schedule). Gradients land in
  // host memory (ReducerOptions::host_landing) and the model copy is written through mirror_.
  bool host_step_ = false;
  // Stage 3's own slices of the model copy are host memory or NVMe records (offload_param): the
  // host writes them; on a GPU each gather copies the slice to the device first.
  bool params_offloaded_ = false;
  Device& device_;
  const kernels::ComputeKernels& compute_;
  kernels::CpuExec exec_;
  std::vector<ParamSpec> specs_;

  int stage_ = 0;
  int rank_ = 0;
  int world_ = 1;
  int gas_ = 1;
  DType model_dtype_ = DType::F32;
  bool check_overflow_ = false;
  bool ignore_unused_ = true;
  double clip_ = 0;
  PartOptions parts_;  // what the config asks of the three parts

  std::optional<FlatLayout> layout_;
  std::size_t num_units_ = 0;
  std::size_t layout_units_ = 0;
  std::vector<ParamState> params_;
  std::vector<UnitState> units_;
  std::vector<std::size_t> layout_to_spec_;
  Buffer model_part_;  // stage 3: own slices of the model copy (none with a shared model)
  // Stages 0–2: every unit's model copy (UnitState::model), in one block, so that the small
  // units' copies lie where the peers can map them too (a ShmComm process's shared arena takes
  // blocks of 64 KiB and more) and the step writes them there (ModelPush) instead of their
  // all-gather. A shared model: rank 0's only; at stage 3, rank 0's block of every unit's shared
  // copy (the fetcher's pool).
  Buffer model_pool_;
  bool shared_model_ = false;
  // Stage 3 with offload_param nvme: the own slices in swap files instead, one record per unit.
  std::unique_ptr<offload::SubgroupStore> param_store_;

  // host_step_ with the model copy in device memory: the optimizer's SliceMap.
  std::unique_ptr<HostModelMirror> mirror_;
  std::unique_ptr<PartitionOptimizer> optimizer_;
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<Communicator> hpz_comm_;  // stage 3 with hpZ: the secondary group
  std::unique_ptr<ParamFetcher> fetcher_;  // stage 3

  std::vector<GroupOptimizer> groups_;
  LrScheduleParams schedule_;
  std::optional<LossScaler> scaler_;
  std::int64_t micro_in_window_ = 0;
  std::optional<bool> forced_boundary_;  // set_accumulation_boundary(); unset: the count decides
  // Whether the current micro-step ends its window (forced_boundary_, else the count).
  bool at_boundary() const { return forced_boundary_.value_or(micro_in_window_ + 1 >= gas_); }
  std::int64_t global_steps_ = 0;
  std::int64_t skipped_steps_ = 0;
  std::int64_t applied_steps_ = 0;
  std::int64_t last_batch_iteration_ = -1;
  EngineTimings timings_;
  ModelPush push_;
  FusedReduction fused_;
  StepInBackward in_backward_;
};

}  // namespace zero::engine_detail
