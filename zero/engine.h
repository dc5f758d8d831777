// The ZeRO engine: one rank's optimizer backend for a data-parallel trainer (DESIGN.md §1, §3, §4).
//
// A trainer registers its parameters (ParamSpec), reads the low-precision model copy through
// param(), writes each parameter's gradient into the slot grad() hands out, calls grad_ready(),
// and calls step() once per micro-batch. The engine owns sharding (ZeRO stages 0–3 as the
// ds_config says), precision (fp32 master weights, fp16 loss scaling, bf16), gradient
// accumulation, bucketed reduction, clipping, the optimizer and the LR schedule.
//
// One micro-step, on every rank, in the same order:
//   for each unit in forward order: gather(u); read param(i) of its parameters; release(u)
//   loss ×= backward_scale()                      (loss scale / gradient_accumulation_steps)
//   for each trainable parameter as its gradient is ready: write grad(i); grad_ready(i)
//   step()                                        (the optimizer runs at the accumulation boundary)
//
// Collectives: gather() (stage 3), grad_ready() (stage 2/3: a full bucket is reduced), step(),
// gather_master() and create() are collective — every rank calls them in the same order with the
// same arguments. The engine checks at create() that every rank registered the same parameters
// with the same config, and refuses to start otherwise.
//
// Thread safety: an Engine is used by one thread (the rank's thread). Different ranks' engines
// run on different threads (InProcComm) or processes (MpiComm).
//
// Failure: an exception from step() leaves master weights, optimizer states, the loss scaler and
// the schedule as they were before the call (every collective that can fail runs before the
// first write). A failed collective leaves the group unusable (Communicator contract).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zero/base/dtype.h"
#include "zero/comm/communicator.h"
#include "zero/device/device.h"
#include "zero/engine_timings.h"

namespace zero {

namespace config {
struct DsConfig;  // config/ds_config.h
}

// One parameter as the trainer registers it.
struct ParamSpec {
  std::string name;                 // unique; checkpoints and dumps use it
  std::vector<std::int64_t> shape;  // numel = product (a scalar has shape {})
  // The model copy's dtype. REQUIRES: the config's training dtype (fp16 / bf16 / fp32).
  DType dtype = DType::F32;
  int group = 0;          // param group: index into EngineOptions::groups (own lr / weight decay)
  int unit = 0;           // what stage 3 gathers together (a layer); units are 0..U-1
  bool trainable = true;  // frozen: kept whole on every rank, never updated, no gradient
  // Other names of this same tensor (tied weights, e.g. an output layer sharing the embedding):
  // registered once, under `name`; checkpoints record the aliases and zero_to_fp32 writes the
  // tensor once and lists them.
  std::vector<std::string> tied_names = {};
};

// Overrides of the config's optimizer values for one param group.
struct ParamGroupOptions {
  std::optional<double> lr;            // the group's base lr (schedules scale from it)
  std::optional<double> weight_decay;  // 0 for "no decay" groups (biases, norms)
};

struct EngineOptions {
  // groups[g] overrides group g; groups beyond the list use the config's values.
  std::vector<ParamGroupOptions> groups;
  // OpenMP threads of the CPU kernels on this rank; 0 = every core the process may use.
  int kernel_threads = 0;
  // Their instruction set: "" or "auto" (the best this CPU has, or the ZERO_ISA environment
  // variable), "scalar", "avx2", "avx512". Every choice gives bitwise the same results.
  std::string kernel_isa;
  // The communicator for the engine's small host-memory collectives (agreement checks, the
  // overflow flag, the gradient norm, initial values, checkpoint checksums), with the same ranks
  // as `comm`. Null: `comm` itself. Required when `comm` takes device memory only (NcclComm):
  // pass the host communicator NcclComm::create was given.
  Communicator* control_comm = nullptr;
};

// Fills `out` (numel elements) with the initial fp32 value of parameter `index`. Called on rank 0
// only; the engine broadcasts the values, as DeepSpeed broadcasts from data-parallel rank 0.
using InitFn = std::function<void(std::size_t index, std::span<float> out)>;

// What one step() call did.
struct StepResult {
  bool boundary = false;  // this micro-step closed an accumulation window: an optimizer step ran
  bool skipped = false;  // ... and was skipped on overflow (fp16, or bf16 with check_grad_overflow)
  std::int64_t global_steps = 0;   // optimizer steps so far, skipped ones included
  std::int64_t skipped_steps = 0;  // of those, skipped
  double lr = 0;                   // lr of group 0 used by this optimizer step
  // Global L2 norm of the unscaled gradients before clipping (DeepSpeed's global_grad_norm: the
  // norm of the scaled gradients divided by the scale they were produced with). NaN when skipped
  // or not a boundary.
  double grad_norm = 0;
  double loss_scale = 1;  // the scale this window's gradients were produced with
};

class Engine {
 public:
  // Builds the engine for this rank. Collective. Throws ConfigError listing every reason the
  // config cannot run (not supported yet, values still to be supplied, a world size that
  // disagrees with comm.size()), zero::Error for bad specs (duplicate names, dtypes other than
  // the config's, negative units or groups, groups without options where the config has none),
  // CommError when ranks disagree on config or specs.
  // REQUIRES: comm and device outlive the engine.
  static std::unique_ptr<Engine> create(const config::DsConfig& config, Communicator& comm,
                                        Device& device, std::span<const ParamSpec> params,
                                        const InitFn& init, const EngineOptions& options = {});
  virtual ~Engine() = default;

  virtual int stage() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual int gradient_accumulation_steps() const = 0;
  virtual std::size_t num_params() const = 0;
  virtual const ParamSpec& spec(std::size_t param) const = 0;
  virtual std::size_t num_units() const = 0;

  // --- forward ---
  // Stage 3: makes the unit's parameters readable (all-gathers it unless already gathered).
  // Other stages: only checks the unit id. Collective at stage 3.
  virtual void gather(int unit) = 0;
  // gather(), for a framework whose forward reads the copy on `native_stream` (a cudaStream_t;
  // null: CUDA's legacy default stream): where the all-gather runs on a CUDA stream (NCCL), that
  // stream waits for it on the GPU and the call returns without the host waiting, so the forward
  // keeps running ahead of the GPU. Only work enqueued on that stream after the call may read the
  // copy; release() orders the engine's later work after that stream's, so the stream must live
  // until then. Elsewhere it is gather().
  virtual void gather_on_stream(int unit, void* native_stream) = 0;
  // Stage 3: the unit's gathered copy may be freed. REQUIRES: gathered. Returns whether it was
  // kept (stage3_max_reuse_distance: gathered again soon): param() of the unit's parameters then
  // stays valid at the same addresses until a later release() that returns false, or the next
  // optimizer step or checkpoint load, and the unit may be released again without a gather. Other
  // stages: checks, and returns true.
  virtual bool release(int unit) = 0;
  // Stage 3: whether the unit stays gathered for the engine's life (the persistence thresholds):
  // gather() and release() of it do nothing, and param() of its parameters keeps its address
  // (each optimizer step refreshes the values in place). False at stages 0-2, where every
  // parameter keeps its address anyway. Throws for an unknown unit.
  virtual bool unit_persistent(int unit) const = 0;
  // The low-precision model copy of `param` (spec dtype, numel elements, row-major).
  // Throws when the parameter's unit is not gathered (stage 3) or the id is unknown. At stages
  // 1/2 over ShmComm processes the ranks may share one copy (rank 0's, in its shared host arena;
  // off with ZERO_SHARED_MODEL=0): every rank reads the same bytes, and destroying
  // the engine is then a barrier, so that rank 0 frees the copy only once no rank reads it.
  virtual std::span<const std::byte> param(std::size_t param) const = 0;

  // --- backward ---
  // Multiply the loss by this before backward: the current loss scale divided by
  // gradient_accumulation_steps (DeepSpeed scales the loss by the scale and divides the output
  // gradient by GAS).
  virtual double backward_scale() const = 0;
  virtual double loss_scale() const = 0;
  // The slot for d(loss · backward_scale())/d(param) of this micro-step, spec dtype, numel
  // elements; the trainer overwrites it, then calls grad_ready(). Valid until grad_ready(param).
  // Throws for a frozen or unknown parameter, or one already ready in this micro-step.
  virtual std::span<std::byte> grad(std::size_t param) = 0;
  // The gradient in grad(param) is complete. Stage 2/3: may start a bucket reduction (collective).
  // In a window's last micro-step it may also step the optimizer for the units whose gradients
  // every rank has completed (the step in backward, set_step_in_backward()): their parameters'
  // model copy then holds the new values before step() returns, which the trainer sees only if
  // it reads a parameter after its gradient was handed in.
  virtual void grad_ready(std::size_t param) = 0;
  // Instead of grad(), a copy and grad_ready(): the trainer's own memory at `data` holding the
  // gradient (spec dtype, numel elements, host memory) is reduced where it is, when the engine is
  // on the host and the parameter's unit is that one parameter alone (unpadded, reduced without a
  // bucket). Returns true when so: the gradient is then ready (as after grad_ready(); collective
  // likewise), and the engine reads and may overwrite those bytes until step() returns or the
  // engine is destroyed, so the trainer keeps them alive and leaves them alone until then.
  // Returns false, having done nothing, otherwise (the trainer copies into grad()). Throws as
  // grad() does.
  virtual bool grad_in_place(std::size_t param, std::byte* data) = 0;
  // Ends the micro-step. At the accumulation boundary: reduce (stage 0/1), overflow vote, loss
  // scale update, clip by the global norm, optimizer, refresh of the low-precision copy,
  // LR schedule. A trainable parameter without grad_ready() this micro-step counts as a zero
  // gradient when zero_optimization.ignore_unused_parameters is true (the default), else it is an
  // error naming it. Collective.
  virtual StepResult step() = 0;

  // --- checkpoints (zero/checkpoint/checkpoint.h describes the format) ---
  // Writes this run to <dir>/<tag>: every rank its own file of partitions, rank 0 the manifest;
  // crash-safe (a temporary directory renamed into place, `latest` replaced last), so an
  // interrupted save never damages an earlier checkpoint; a failed one (e.g. ENOSPC) removes its
  // temporary directory. `model_16bit` (default: the config's
  // stage3_gather_16bit_weights_on_model_save) also writes the whole low-precision model.
  // Collective. REQUIRES: at an accumulation boundary (after the last micro-step's step()).
  // Throws IoError naming the file on failure, on every rank.
  // `client_state` (any JSON value; null: none) comes back from load_checkpoint.
  virtual void save_checkpoint(const std::string& dir, const std::string& tag,
                               const nlohmann::json& client_state,
                               std::optional<bool> model_16bit = std::nullopt) = 0;
  // The same with an empty client state.
  void save_checkpoint(const std::string& dir, const std::string& tag);
  // Loads <dir>/<tag> (tag empty: the one <dir>/latest names) at this engine's world size and
  // stage, whatever they were at save time: master weights, optimizer states, step counters,
  // loss scaler and schedule position; the model copy is refreshed from the master. Reads into
  // new memory, verifying the manifest and every tensor's checksum on the way, and replaces the
  // engine's state only once every rank succeeded: changes nothing when anything is wrong
  // (IoError naming the file and tensor). Holds a second copy of the rank's master weights and
  // optimizer states while it runs (host staging where a memory budget has no room for it).
  // Returns the client state saved with it. Collective.
  // A DeepSpeed checkpoint directory (ZeRO 1/2/3, read without executing its pickles) is
  // imported the same way: fp32 master weights, Adam moments, step counters, loss scaler and
  // LR-schedule position, matched to the registered parameters by name.
  virtual nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag = {}) = 0;

  // --- state ---
  // The full fp32 master value of `param` (frozen: its model copy widened). Collective at stages
  // 1–3: every rank calls it for the same parameters in the same order.
  virtual std::vector<float> gather_master(std::size_t param) = 0;
  // The full low-precision model copy of `param` (spec dtype, numel elements): what
  // stage3_gather_16bit_weights_on_model_save writes. Collective at stage 3 (gathers the unit's
  // slices; the unit's gather state is left as it was).
  virtual std::vector<std::byte> gather_model(std::size_t param) = 0;
  // Replaces the value of `param` with `values` (numel fp32, read on rank `root` only): the master
  // weights become them, the model copy (and at stage 3 any gathered copy) their rounding, as an
  // optimizer step would leave them; optimizer states are kept. Collective: every rank calls it
  // for the same parameters in the same order. Frozen parameters: their model copy.
  virtual void set_param(std::size_t param, std::span<const float> values, int root) = 0;
  virtual std::int64_t global_steps() const = 0;
  virtual double current_lr(int group = 0) const = 0;
  // The lr of group `group` from the next optimizer step on, as a client LR scheduler sets it
  // (torch's param_groups[g]["lr"]): replaces the group's base lr, which checkpoints keep and
  // load_checkpoint restores (from zero's checkpoints with as many groups).
  // Throws zero::Error when the config has a "scheduler" block (it sets the lr; the two would
  // fight), for an unknown group, and for an lr that is negative or not finite.
  // A step already begun in backward (step_begun_in_backward()) keeps the lr it began with; the
  // new one applies from the next step.
  virtual void set_lr(int group, double lr) = 0;
  // Whether a window's last micro-step may step the optimizer during backward, unit by unit as
  // every rank's gradients of a unit complete (default: yes, unless ZERO_STEP_IN_BACKWARD=0):
  // the same bits as a step after backward, with the step's memory traffic overlapped with
  // backward and its gradients read while they are in cache. It happens only where the
  // reduction is fused into the step (host memory, several ranks that read each other's
  // buffers, no NVMe tier, no MiCS), nothing reads the gradient norm before the step (no
  // clipping, no overflow check: not fp16, not bf16's check_grad_overflow), every lone unit of
  // the model waits for the end of backward (reduce_bucket_size at least the model's lone units),
  // and from the second optimizer step on. The step's coefficients (lr, betas) are fixed when
  // the first unit of that micro-step's backward is complete (grad_ready of its last parameter),
  // on every rank, whether or not the rank then steps a unit before step(). Applies from the
  // next micro-step; every rank passes the same.
  virtual void set_step_in_backward(bool on) = 0;
  // Whether the current micro-step's optimizer step has begun in backward: it steps in backward
  // and a unit of it is complete, so its coefficients are fixed and a peer may have stepped a
  // unit. The same on every rank between backward and step(), whatever each has stepped.
  virtual bool step_begun_in_backward() const = 0;
  // Whether the micro-steps that step() ends from now on close the accumulation window, as
  // DeepSpeed's set_gradient_accumulation_boundary (Hugging Face Accelerate sets it every
  // micro-step, true at the last micro-batch of a window or of the data): true, the next step()
  // runs the optimizer whatever the count; false, it does not. Until called, and after
  // clear_accumulation_boundary(), the count of gradient_accumulation_steps decides. The loss
  // scale keeps 1/gradient_accumulation_steps either way, as DeepSpeed's does.
  // Throws zero::Error for false once the micro-step's step has begun in backward.
  virtual void set_accumulation_boundary(bool boundary) = 0;
  virtual void clear_accumulation_boundary() = 0;
  // This rank's memory ledger.
  virtual MemorySnapshot memory() const = 0;
  virtual EngineTimings timings() const = 0;
  virtual void reset_timings() = 0;
  // What the engine decided from its config and topology that a user should hear once (a
  // setting that has no effect here and why), one sentence each, the same on every rank.
  virtual std::vector<std::string> notes() const { return {}; }
};

}  // namespace zero
