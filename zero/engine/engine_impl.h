// The engine's private class, shared by engine.cpp (stages, steps) and engine_checkpoint.cpp
// (save and load). Not a public header: embeddings use zero/engine.h.
#pragma once

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/optimizer.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/engine.h"
#include "zero/engine/elementwise.h"
#include "zero/engine/optimizer_setup.h"
#include "zero/engine/param_fetcher.h"
#include "zero/base/error.h"
#include "zero/layout/flat_layout.h"
#include "zero/schedule/loss_scaler.h"
#include "zero/schedule/lr_schedule.h"

namespace zero::engine_detail {



// Every unit is padded so each rank's slice is a multiple of 16 elements (64 bytes of fp32):
// slices, and so partitions, start cache-line aligned.
constexpr std::size_t kSliceAlignElems = 16;

inline std::size_t numel_of(const ParamSpec& spec) {
  std::size_t n = 1;
  for (std::int64_t d : spec.shape) {
    ZERO_CHECK(d >= 0, "parameter '{}': negative dimension {} in its shape", spec.name, d);
    n *= static_cast<std::size_t>(d);
  }
  return n;
}

inline std::byte* at(const Buffer& b, DType t, std::size_t elem) {
  return static_cast<std::byte*>(b.data()) + elem * dtype_size(t);
}

// A run [begin, end) of a unit's slice, the same on every rank (offsets inside the slice).
struct Piece {
  int unit = 0;
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const { return end - begin; }
};

// A run of one rank's slice of a unit that belongs to one param group (alignment gaps and
// padding join a neighbouring run; their master and gradient values are zero and stay zero).
struct OptimizerRun {
  int domain = 0;  // whose partition: the rank itself, or any rank at stage 0
  int unit = 0;
  std::size_t begin = 0;
  std::size_t end = 0;
  int group = 0;
};

// Where a gradient bucket's pieces come from on this rank.
struct BucketSource {
  Piece piece;
  const void* unit_buffer = nullptr;  // the unit's flat gradient buffer (W slices)
  DType dtype = DType::F32;
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(const config::DsConfig& cfg, Communicator& comm, Device& device,
             std::span<const ParamSpec> params, const EngineOptions& options)
      : cfg_(cfg), comm_(comm), device_(device), exec_(options.exec),
        specs_(params.begin(), params.end()) {}

  void build(const InitFn& init, const EngineOptions& options);

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
  void release(int unit) override;
  std::span<const std::byte> param(std::size_t param) const override;

  double backward_scale() const override { return scaler_->scale() / gas_; }
  double loss_scale() const override { return scaler_->scale(); }
  std::span<std::byte> grad(std::size_t param) override;
  void grad_ready(std::size_t param) override;
  StepResult step() override;

  std::vector<float> gather_master(std::size_t param) override;
  std::vector<std::byte> gather_model(std::size_t param) override;
  std::int64_t global_steps() const override { return global_steps_; }
  double current_lr(int group) const override;
  MemorySnapshot memory() const override { return device_.ledger().snapshot(); }
  void save_checkpoint(const std::string& dir, const std::string& tag,
                       const nlohmann::json& client_state, std::optional<bool> model_16bit) override;
  nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag) override;
  EngineTimings timings() const override { return timings_; }
  void reset_timings() override { timings_ = {}; }

 private:
  struct ParamState {
    std::size_t numel = 0;
    std::optional<std::size_t> layout_index;  // trainable: index in layout_
    Buffer frozen;                            // frozen: the whole model copy
    bool ready = false;                       // grad_ready() seen this micro-step
    bool slot_out = false;                    // grad() handed out this micro-step
  };
  struct UnitState {
    std::vector<std::size_t> trainable;  // spec indices, ascending
    std::size_t pending = 0;             // trainable params not yet ready this micro-step
    Buffer staging;                      // this micro-step's gradients, unit-flat, model dtype
    Buffer model;                        // stages 0–2: the full model copy, unit-flat
    Buffer accum;                        // stages 0/1: the window's accumulated gradients
    std::size_t unpacked = 0;            // stage 2/3: pieces submitted but not yet packed
  };
  // One in-flight bucket reduction.
  struct BucketSlot {
    Buffer send;
    Buffer recv;
    std::vector<Piece> pieces;
    std::size_t chunk_elems = 0;  // per-rank elements of the reduction in flight
    Work work;
    bool in_flight = false;
    bool accumulate = false;
  };

  void check_param(std::size_t param, const char* what) const {
    ZERO_CHECK(param < specs_.size(), "{}: unknown parameter id {} (the engine has {} parameters)",
               what, param, specs_.size());
  }
  void check_unit(int unit, const char* what) const {
    ZERO_CHECK(unit >= 0 && static_cast<std::size_t>(unit) < num_units_,
               "{}: unknown unit {} (the engine has units 0..{}) on rank {}", what, unit,
               static_cast<long long>(num_units_) - 1, rank_);
  }
  const UnitLayout* layout_unit(int unit) const {
    return static_cast<std::size_t>(unit) < layout_units_ ? &layout_->unit(unit) : nullptr;
  }
  std::size_t partition_elems() const { return layout_->partition_elems(); }
  // Elements of domain d's partition start here in master_/states_/grads_.
  std::size_t domain_offset(int domain) const {
    return stage_ == 0 ? static_cast<std::size_t>(domain) * partition_elems() : 0;
  }
  int num_domains() const { return stage_ == 0 ? world_ : 1; }
  // The reduced gradient of domain d's slice of `unit`, from `slice_offset` on. Stage 0 reduces
  // in place in the full accumulation buffers; other stages into the partition buffer.
  std::byte* grad_at(int domain, int unit, std::size_t slice_offset) const {
    const UnitLayout& ul = layout_->unit(unit);
    if (stage_ == 0) {
      return at(units_[static_cast<std::size_t>(unit)].accum, accum_dtype_,
                static_cast<std::size_t>(domain) * ul.slice_elems + slice_offset);
    }
    return at(grads_, accum_dtype_, ul.partition_offset + slice_offset);
  }
  int domain_rank(int domain) const { return stage_ == 0 ? domain : rank_; }

  void init_state(const InitFn& init);
  // Where an optimizer run's slice of the low-precision model copy lives.
  std::byte* model_at(const OptimizerRun& run) const;
  std::byte* master_at(std::size_t elem) const { return at(master_, master_dtype_, elem); }
  std::byte* state_at(std::size_t k, std::size_t elem) const { return at(states_[k], state_dtype_, elem); }
  // One optimizer run; with 16-bit master weights, in fp32 tiles written back rounded.
  void optimizer_run(const OptimizerRun& run, const kernels::OptimizerHyper& hyper,
                     const kernels::StepScalars& scalars);
  std::vector<float> master_tile_;
  // Checkpoints (engine_checkpoint.cpp).
  ckpt::Manifest describe(const std::string& tag) const;
  void refresh_model_from_master();
  // Collective: when any rank's `local_error` is non-empty, every rank throws IoError with the
  // first failing rank's message.
  void agree_on_failure(const std::string& local_error);
  void build_runs();
  Buffer alloc(std::size_t elems, DType dtype, MemoryTag tag, MemoryKind kind = MemoryKind::Device) {
    return device_.allocate(elems * dtype_size(dtype), kind, tag);
  }

  void unit_complete(int unit);
  void submit_unit(int unit, const void* unit_buffer, DType dtype);
  void submit(const BucketSource& source);
  void flush_bucket();
  void finish_slot(BucketSlot& slot);
  void drain_buckets();
  void finish_micro_step();
  void all_gather_model();
  void reset_micro_step();

  const config::DsConfig cfg_;
  Communicator& comm_;
  Device& device_;
  kernels::CpuExec exec_;
  std::vector<ParamSpec> specs_;

  int stage_ = 0;
  int rank_ = 0;
  int world_ = 1;
  int gas_ = 1;
  DType model_dtype_ = DType::F32;
  DType accum_dtype_ = DType::F32;
  DType comm_dtype_ = DType::F32;
  // fp32, or bf16 with bf16.bf16_master_weights_and_grads / bf16.bf16_optimizer_states.
  DType master_dtype_ = DType::F32;
  DType state_dtype_ = DType::F32;
  bool check_overflow_ = false;
  bool overlap_comm_ = false;
  bool reduce_scatter_ = true;
  bool ignore_unused_ = true;
  // Where the optimizer's partition (master, states, reduced gradients) and, at stage 3, the
  // model copy's own slices live: the device, or host memory with offload ("cpu"; "nvme" at
  // stages 1/2 too, as DeepSpeed does). On a CpuDevice both are host memory; the ledger says which.
  MemoryKind optimizer_kind_ = MemoryKind::Device;
  MemoryKind param_kind_ = MemoryKind::Device;
  double clip_ = 0;
  ReduceOp reduce_op_ = ReduceOp::Avg;
  float pack_scale_ = 1.0f;     // prescale_gradients / gradient_predivide_factor, before the sum
  float consume_scale_ = 1.0f;  // ... and after it

  std::optional<FlatLayout> layout_;
  std::size_t num_units_ = 0;
  std::size_t layout_units_ = 0;
  std::vector<ParamState> params_;
  std::vector<UnitState> units_;
  std::vector<std::size_t> layout_to_spec_;
  std::vector<OptimizerRun> runs_;

  Buffer master_;
  std::vector<Buffer> states_;
  Buffer grads_;       // stages 1–3: reduced gradients of the partition, accum dtype
  Buffer model_part_;  // stage 3: own slices of the model copy
  std::unique_ptr<engine_detail::ParamFetcher> fetcher_;  // stage 3

  std::size_t bucket_chunk_capacity_ = 0;  // per-rank elements a bucket holds
  std::vector<BucketSource> open_bucket_;
  std::size_t open_bucket_elems_ = 0;
  std::vector<BucketSlot> slots_;
  std::size_t next_slot_ = 0;
  bool window_first_reduction_ = true;  // stage 2/3: first micro-step of the window assigns

  std::vector<engine_detail::GroupOptimizer> groups_;
  LrScheduleParams schedule_;
  std::optional<LossScaler> scaler_;
  std::int64_t micro_in_window_ = 0;
  std::int64_t global_steps_ = 0;
  std::int64_t skipped_steps_ = 0;
  std::int64_t applied_steps_ = 0;
  std::int64_t last_batch_iteration_ = -1;
  EngineTimings timings_;
};

// Adds the wall time of its scope to one EngineTimings field.
class ScopedTimer {
 public:
  explicit ScopedTimer(double& into) : into_(into), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() {
    into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double& into_;
  std::chrono::steady_clock::time_point start_;
};


}  // namespace zero::engine_detail
