// The step half of the engine: one rank's optimizer partition (DESIGN.md §3, "Step at the
// accumulation boundary").
//
// Owns the master weights (fp32, or bf16 with bf16.bf16_master_weights_and_grads), the optimizer
// states (fp32, or bf16 with bf16.bf16_optimizer_states) and, at stages 1–3, the reduced gradient
// partition (accumulation dtype). Master and states live in an offload::SubgroupStore, which
// decides per sub-group where they are (the device, pinned/pageable host memory or NVMe under
// offload_optimizer); the gradient partition stays in memory of the store's resident kind. A partition is one rank's slice of every unit in unit order
// (FlatLayout); at stage 0 the optimizer holds every rank's partition (domains = world size), which
// is what makes stages 0–3 bitwise comparable.
//
// The partition is walked as *runs*: for each domain and unit, the stretches of the slice whose
// parameters share a param group (alignment gaps and padding join a neighbouring run; their master
// and gradient values are zero and stay zero). step() runs the optimizer kernel once per run with
// its group's coefficients and writes the low-precision model copy in the same pass (the fused
// write); with 16-bit master weights it steps fp32 tiles and stores them rounded. Runs are cut at
// sub-group edges (the kernels are elementwise, so the bits do not depend on where). When the
// store throws IoError mid-step, the model copy of the sub-groups already stepped is restored
// from an undo copy — or, when the model copy itself lives in a swap store (stage 3's parameters
// on NVMe), that store's batch is aborted — so master, states and model copy all stay at the
// previous step. The overflow
// check and the squared norm walk the rank's own slices unit by unit, so every stage sums the same
// numbers in the same order; step() can sum that norm in its own walk over the gradients (its
// own_sumsq), with the same bits.
//
// With `master_in_model` (an fp32 model whose master weights stay in memory where the kernels
// compute) the master weights are no tensor of their own: they *are* the model copy, reached through
// the SliceMap, and step() updates it in place. That saves the master's 4 bytes a parameter (of
// every domain) and one write pass a step (AdamW moves 28 bytes an element instead of 36), with the
// same bits: an fp32 model copy holds the master's bits either way. The store then holds the
// optimizer states only; the checkpoint accessors read and replace tensor 0 in the model copy.
//
// Gradients are read, and the model copy written, through the engine's SliceMap. Nothing here is
// collective. Thread safety: the rank's thread only.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/compute.h"
#include "kernels/norm.h"
#include "offload/subgroup_store.h"
#include "zero/base/dtype.h"
#include "zero/device/device.h"
#include "zero/engine/slice_map.h"
#include "zero/layout/flat_layout.h"

namespace zero::engine_detail {

struct PartitionOptions {
  int rank = 0;
  bool every_domain = false;  // stage 0: hold and step every rank's partition
  bool own_gradients = true;  // stages 1–3: the reduced gradient partition lives here
  DType master_dtype = DType::F32;
  DType state_dtype = DType::F32;
  DType grad_dtype = DType::F32;         // the accumulation dtype
  DType model_dtype = DType::F32;        // the low-precision copy step() writes
  // The master weights are the model copy itself (see above). REQUIRES: fp32 master and model,
  // no offloaded sub-group (no NVMe tier; ratio 0 or no other kind), and the SliceMap's model() in
  // memory the kernels compute on, that nothing but this class writes between steps.
  bool master_in_model = false;
  MemoryKind kind = MemoryKind::Device;  // where gradients and resident sub-groups live
  // Sub-groups, ratio, host offload kind and NVMe tier of master and states (total_elems is
  // filled in here).
  offload::StoreOptions store;
  // The optimizer of every group (param groups share a kind, so its state count and initial
  // values come from here); hyper-parameters of each step come with step().
  kernels::OptimizerHyper optimizer;
  kernels::CpuExec exec;
};

class PartitionOptimizer {
 public:
  // Allocates the partition; states hold their initial value, gradients zero, master weights
  // are set by set_master(). REQUIRES: device, compute, layout and slices outlive it.
  PartitionOptimizer(Device& device, const kernels::ComputeKernels& compute,
                     const FlatLayout& layout, const PartitionOptions& options, SliceMap& slices);

  int domains() const { return domains_.count(); }
  // The rank whose partition domain `domain` is.
  int domain_rank(int domain) const { return domains_.rank_of(domain); }
  // This rank's own domain.
  int own_domain() const { return domains_.own(); }
  std::size_t partition_elems() const { return partition_elems_; }
  DType master_dtype() const { return options_.master_dtype; }
  bool master_in_model() const { return options_.master_in_model; }
  int state_count() const { return static_cast<int>(store_->tensors().size()) - first_state(); }
  // Master weights and states, or (master_in_model) the states only.
  offload::SubgroupStore& store() { return *store_; }

  // Sets every domain's slice of `unit` from the unit's whole flat fp32 value
  // (layout.unit(unit).padded_elems elements).
  void set_master(int unit, std::span<const float> unit_flat);

  // Stages 1–3: the reduced gradient of this rank's slice of `unit` from `slice_offset` on.
  std::byte* gradient(int unit, std::size_t slice_offset) const;

  // Σ g² over the rank's own slices, unit by unit in unit order, in double: every slice in one
  // call of the compute table (one wait on a device). Not finite exactly when a gradient is ±inf
  // or NaN, which makes it the overflow check too. Own slices whose gradients are late
  // (SliceMap::gradient_late) are summed from the ranks' buffers where they can be as they are
  // (late_sources, left late for the step to sum again), else formed on the way
  // (settle_gradient), with the same bits.
  double squared_norm() const;

  // One optimizer step of every run: hypers[g] and scalars[g] for param group g (validated by
  // the caller). Writes the master weights, states and the model copy.
  // `agree` is the store's (offload::SubgroupStore::update_all): ranks agree that every NVMe
  // write succeeded before anything is committed. Throws IoError with nothing changed.
  // `model_store`: the store the SliceMap's model copy lives in, if any; its writes form a batch
  // written back before the ranks agree and committed with the step. Resident sub-groups (ratio
  // < 1, or the optimizer state in memory) then write their model copy before the agreement as
  // well, from a step on copies of their state, and step the state itself after it without
  // writing the model copy again; so nothing after the agreement does I/O, and a failure anywhere
  // leaves the previous step. `before_commit`, if given, runs after the model store's batch is
  // written back and before the agreement (e.g. reading back what the step wrote); an IoError
  // from it fails the step like the store's own.
  // `own_sumsq`, if given, receives bitwise what squared_norm() gives for the gradients the step
  // consumed (the step reads them only), for a caller that needs no norm before the step: where
  // the compute table has optimizer_step_norm, each own-slice run that starts on a norm block
  // sums the blocks it steps in the same walk over memory (the gradient read once); the blocks
  // no such run covered whole (where a param group or sub-group edge cuts a block, a 16-bit
  // master, a device) are summed after the step.
  void step(std::span<const kernels::OptimizerHyper> hypers,
            std::span<const kernels::StepScalars> scalars,
            const offload::SubgroupStore::Agree& agree = nullptr,
            offload::SubgroupStore* model_store = nullptr,
            const std::function<void()>& before_commit = nullptr, double* own_sumsq = nullptr);
  // The step in backward (EngineImpl's StepInBackward): the units of one step stepped one at a
  // time, as their gradients complete, before step() steps the rest. begin_early() opens such a
  // step (before its first step_unit(); `own_sumsq`: step() will be asked for the norm, so the
  // kernels sum its blocks as they go, as step() would), step_unit() steps every domain's runs
  // of `unit` (master, states and model copy) with the hypers and scalars step() will get, and
  // step() then steps only the units not stepped yet and ends it: the same bits as one step() of
  // them all (the kernels are elementwise, and the norm's blocks land where step()'s would).
  // end_early() ends an open one without a step (nothing is undone). REQUIRES: no NVMe
  // sub-group, no model store (step()'s model_store null), each unit stepped at most once.
  void begin_early(bool own_sumsq);
  void step_unit(int unit, std::span<const kernels::OptimizerHyper> hypers,
                 std::span<const kernels::StepScalars> scalars);
  bool stepped_early(int unit) const {
    return early_.open && early_.stepped[static_cast<std::size_t>(unit)] != 0;
  }
  void end_early();
  // Stage 0 with its step shared out (EngineImpl's ModelPush at stage 0): from now on step() and
  // step_unit() step only the rank's own domain, each peer stepping its own and writing it into
  // this rank's model copy, which is the master (master_in_model). The other domains' optimizer
  // states then stay where they were; nothing reads them but a step (a checkpoint saves the own
  // domain, a load writes every domain anew). For the rest of the optimizer's life.
  // REQUIRES: every domain held, master_in_model, no NVMe sub-group.
  void step_own_domain_only();
  bool own_domain_only() const { return own_domain_only_; }
  // The model copy ← master weights, rounded (nothing to do with master_in_model).
  void write_model();
  class Replacement;  // new values of a checkpoint tensor (below)
  // What the model copy becomes with the master weights of `master` (a replacement of tensor 0,
  // every element written): domains() × partition_elems() elements in the model dtype, domain
  // after domain. Reads NVMe sub-groups back (IoError). With write_model(model) after the
  // replacement is adopted, the same bits as write_model(), without reading the store.
  std::vector<std::byte> model_from(Replacement& master);
  // The model copy ← `model` (as model_from() returns it), through the SliceMap.
  void write_model(std::span<const std::byte> model);
  // The model copy at elements [offset, offset + count) of `domain`'s partition ← `master`
  // (count master weights in the master dtype, e.g. a replacement's values while they are still in
  // cache), rounded as write_model() rounds them. The partition's padding has no model copy.
  // `echo`, if given, sees each piece written, while it is in cache: echo(unit, slice_offset,
  // model, n) for n model-dtype elements of `domain`'s slice of `unit` from slice_offset on.
  using ModelEcho = std::function<void(int unit, std::size_t slice_offset, const std::byte* model,
                                       std::size_t count)>;
  void write_model_range(int domain, std::size_t offset, std::size_t count, const std::byte* master,
                         const ModelEcho& echo = nullptr);

  // Checkpoint access. Tensor 0 is the master weights, tensor k + 1 optimizer state k; each is
  // domains() × partition_elems() elements, domain after domain, in tensor_dtype(t).
  int tensors() const { return 1 + state_count(); }
  DType tensor_dtype(int tensor) const;
  // Visits elements [offset, offset + count) of domain `domain` of a tensor in order, as
  // stretches of tensor_dtype(tensor) values (from whichever tier holds them).
  using TensorVisit = std::function<void(const std::byte* data, std::size_t elems)>;
  void read_tensor(int tensor, int domain, std::size_t offset, std::size_t count,
                   const TensorVisit& visit);
  // Replacing the tensors (a checkpoint load) without a second copy: replacement() hands out new
  // memory for one (the old values untouched; NVMe sub-groups write their spare slots),
  // write_replacement() visits elements [offset, offset + count) of domain `domain` of it as
  // writable stretches — visit(data, first, elems): data holds elements [offset + first, offset +
  // first + elems), in tensor_dtype(tensor) — and adopt() makes them the tensors (the store's
  // through SubgroupStore::Replacement; master_in_model's tensor 0 waits in memory of its own and
  // adopt() copies it into the model copy). The caller writes every element of every domain, in
  // increasing domain and offset order, and adopts one replacement of every tensor at once.
  // `echo`, if given (host memory only), sees master_in_model's new master weights as adopt()
  // copies them into the model copy, a piece at a time while it is in cache (write_model_range's
  // convention).
  class Replacement {
   public:
    int tensor() const { return tensor_; }
    DType dtype() const { return dtype_; }

   private:
    friend class PartitionOptimizer;
    int tensor_ = 0;
    DType dtype_ = DType::F32;
    std::optional<offload::SubgroupStore::Replacement> stored_;  // a tensor of the store
    Buffer master_;  // master_in_model's tensor 0: every domain's partition, in memory
  };
  Replacement replacement(int tensor);
  using TensorWrite = std::function<void(std::byte* data, std::size_t first, std::size_t elems)>;
  void write_replacement(Replacement& r, int domain, std::size_t offset, std::size_t count,
                         const TensorWrite& visit) const;
  void adopt(std::vector<Replacement>&& all, const ModelEcho& echo = nullptr);

 private:
  // A run whose gradients are formed late is stepped in tiles of this many elements, each summed
  // or formed right before it is stepped: 64 KiB of fp32 gradient, read back from L2. A multiple
  // of the norm block, so each tile's blocks are the run's.
  static constexpr std::size_t kLateTileElems = std::size_t{1} << 14;
  static_assert(kLateTileElems % kernels::kNormBlockElems == 0);
  // The rank's own gradient slice of every unit that has one, in unit order.
  std::vector<kernels::ArrayRef> gradient_slices() const;
  struct Run {
    int domain = 0;
    int unit = 0;
    std::size_t begin = 0;  // inside the unit's slice
    std::size_t end = 0;
    int group = 0;
    std::size_t flat = 0;  // the store element of `begin`
  };
  void build_runs();
  std::size_t partition_offset(int domain, int unit) const;
  // The store's tensor of optimizer state 0: 1, after the master weights, or 0 with master_in_model.
  int first_state() const { return options_.master_in_model ? 0 : 1; }
  // Calls fn(run, first, last) for the part [first, last) (inside the unit's slice) of every run
  // overlapping the partition elements [begin, end) (all domains, domain after domain).
  void for_runs(std::size_t begin, std::size_t end,
                const std::function<void(const Run&, std::size_t, std::size_t)>& fn) const;
  // The master weights of [first, last) of `run`'s slice: in the store's view, or (master_in_model)
  // the model copy.
  std::byte* master_at(const Run& run, std::size_t first, const offload::SubgroupStore::View& view);
  // Calls fn(run, first, last) for the part [first, last) (inside the unit's slice) of every run
  // overlapping the sub-group `view`.
  void for_runs(const offload::SubgroupStore::View& view,
                const std::function<void(const Run&, std::size_t, std::size_t)>& fn) const;
  // Full: master, states and model copy. StateOnly: master and states, not the model copy.
  // ModelOnly: the model copy, from a step on copies of master and states (left as they are).
  enum class PartMode { Full, StateOnly, ModelOnly };
  // Runs of one param group stepped by one call of the compute table (optimizer_step_many), on a
  // table that waits for a device per call: their model copies are announced after that call.
  struct StepBatch {
    int group = -1;
    std::vector<kernels::OptimizerTensors> tensors;
    struct Written {
      int domain, unit;
      std::size_t first, count;
    };
    std::vector<Written> written;
  };
  // Steps [first, last) of `run`, or adds it to `batch` when the step is one kernel call in place
  // (an fp32 master, not on copies) and `batch` is given.
  void step_part(const Run& run, std::size_t first, std::size_t last,
                 const offload::SubgroupStore::View& view, const kernels::OptimizerHyper& hyper,
                 const kernels::StepScalars& scalars, PartMode mode, StepBatch* batch);
  void flush(StepBatch& batch, std::span<const kernels::OptimizerHyper> hypers,
             std::span<const kernels::StepScalars> scalars);
  // step()'s own_sumsq: the own slices' norm blocks (kernels/norm.h), numbered slice after slice
  // in unit order (first[u] the first block of unit u's slice, first[units] the count), each
  // block's sum and whether a fused kernel has summed it in this step.
  struct NormBlocks {
    bool fusing = false;  // set for one step() with own_sumsq, where the table has the kernel
    std::vector<std::size_t> first;
    std::vector<double> sums;
    std::vector<unsigned char> summed;
  };
  // Opens step()'s (or an early step's) fused norm: every block unsummed (`own_sumsq`: asked for,
  // where the table has the kernel).
  void start_norm(bool own_sumsq);
  // Whether step_part may step [first, last) of `run` with the norm fused, and if so the kernel's
  // block sums for the run (the run's first block) after marking what it will sum whole.
  double* fused_norm_blocks(const Run& run, std::size_t first, std::size_t last);
  // Norm block `block` of the rank's own slice of `unit`: its sum of squares, alone.
  double block_sum(int unit, std::size_t block) const;
  // The fused step's Σ g²: the blocks no kernel summed are summed now, then every block added as
  // squared_norm() adds them.
  double finish_norm();
  // A late stretch the step sums as it steps it (compute's optimizer_step_summed with the
  // SliceMap's late_sources), leaving gradient() unformed; false: formed in memory first.
  bool sums_in_step(int domain, int unit, std::size_t slice_offset,
                    kernels::GradSources* sources) const;

  Device& device_;
  const kernels::ComputeKernels& compute_;
  const FlatLayout& layout_;
  const PartitionOptions options_;
  SliceMap& slices_;
  const Domains domains_;
  const std::size_t partition_elems_;
  std::unique_ptr<offload::SubgroupStore> store_;
  Buffer gradients_;  // own_gradients only
  std::vector<Run> runs_;
  // 16-bit master weights (and PartMode::ModelOnly's copies) are stepped in fp32 tiles of
  // kMasterTileElems, in memory of options_.kind, where the kernels compute.
  Buffer master_tile_;
  // PartMode::ModelOnly's copies of the states: host memory, as ModelOnly runs only with the
  // partition on the host (a model copy in a swap store needs host steps on a GPU).
  std::vector<std::byte> state_tiles_[2];
  NormBlocks norm_;
  bool own_domain_only_ = false;  // step_own_domain_only()
  // Whether step() and step_unit() step `run` (step_own_domain_only() leaves the other domains).
  bool steps(const Run& run) const { return !own_domain_only_ || run.domain == own_domain(); }
  struct Early {  // begin_early() .. step()
    bool open = false;
    std::vector<unsigned char> stepped;  // per unit
  };
  Early early_;
};

}  // namespace zero::engine_detail
