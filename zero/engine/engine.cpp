// The ZeRO engine (zero/engine.h). One flat layout serves every stage (DESIGN.md §3); the stages
// differ only in what a rank keeps and when gradients are reduced:
//
//   stage | model copy | gradients before the step                      | master + states
//   0     | full       | full, all-reduced at the boundary              | every rank's slices
//   1     | full       | full locally, reduce-scattered at the boundary | own slices
//   2     | full       | reduce-scattered per bucket during backward    | own slices
//   3     | own slices | as stage 2                                     | own slices
//
// Every stage keeps the master weights, optimizer states and reduced gradients as *partitions*:
// the concatenation of one rank's slice of every unit. Stage 0 simply holds all W partitions.
// The global gradient norm is always summed per partition and all-reduced in rank order, and the
// optimizer is elementwise, so with InProcComm's rank-order reductions stages 0–3 give bitwise
// identical parameters when they reduce the same sums (gradient_accumulation_steps = 1, or stages
// 0/1 against each other and 2/3 against each other).
//
// This file sequences a micro-step over the three parts (engine_impl.h); the parts do the work.
// Construction is engine_build.cpp; checkpoints, devices, MiCS/hpZ and whole-parameter access
// have files of their own (engine_*.cpp).
#include "zero/engine.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "zero/base/shape.h"
#include "zero/base/stream_copy.h"
#include "zero/base/timer.h"
#include "zero/engine/engine_impl.h"
#include "zero/engine/part_options.h"
#include "zero/schedule/from_config.h"

namespace zero::engine_detail {

std::byte* EngineImpl::gradient(int domain, int unit, std::size_t slice_offset) {
  if (stage_ != 0) return optimizer_->gradient(unit, slice_offset);
  return reducer_->accumulated(domain_rank(domain), unit, slice_offset);
}

std::byte* EngineImpl::model(int domain, int unit, std::size_t slice_offset) {
  const UnitLayout& ul = layout_->unit(unit);
  if (stage_ == 3) return own_slice(unit, slice_offset);
  return units_[static_cast<std::size_t>(unit)].model +
         (static_cast<std::size_t>(domain_rank(domain)) * ul.slice_elems + slice_offset) *
             dtype_size(model_dtype_);
}

// ---------------------------------------------------------------------------------------------
// forward

void EngineImpl::gather(int unit) {
  check_unit(unit, "gather");
  if (fetcher_) fetcher_->gather(unit);
  for (std::size_t i : units_[static_cast<std::size_t>(unit)].quantized_frozen)
    params_[i].quantized->gather();
}

void EngineImpl::gather_on_stream(int unit, void* native_stream) {
  check_unit(unit, "gather");
  ZERO_CHECK(native_stream == nullptr || !device_.host_addressable(),
             "gather_on_stream: stream {} given, but the engine runs on the {} device, which has "
             "no native streams (pass null)",
             native_stream, device_.name());
  if (!fetcher_ || !units_[static_cast<std::size_t>(unit)].quantized_frozen.empty()) {
    gather(unit);
    return;
  }
  fetcher_->gather_for_stream(unit, native_stream);
}

bool EngineImpl::release(int unit) {
  check_unit(unit, "release");
  const bool kept = fetcher_ == nullptr || fetcher_->release(unit);
  const auto& quantized = units_[static_cast<std::size_t>(unit)].quantized_frozen;
  for (std::size_t i : quantized) params_[i].quantized->release();
  return kept && quantized.empty();
}

bool EngineImpl::unit_persistent(int unit) const {
  check_unit(unit, "unit_persistent");
  // A unit with int8 frozen parameters is gathered per use whatever the thresholds say.
  return fetcher_ != nullptr && static_cast<std::size_t>(unit) < layout_units_ &&
         fetcher_->persistent(unit) &&
         units_[static_cast<std::size_t>(unit)].quantized_frozen.empty();
}

std::span<const std::byte> EngineImpl::param(std::size_t param) const {
  check_param(param, "param");
  const ParamState& ps = params_[param];
  const std::size_t bytes = ps.numel * dtype_size(model_dtype_);
  if (ps.quantized) {
    ZERO_CHECK(ps.quantized->gathered(),
               "param: frozen parameter '{}' is kept as int8 shards "
               "(zero_quantized_nontrainable_weights): gather its unit {} first",
               specs_[param].name, specs_[param].unit);
    return {ps.quantized->gather(), bytes};
  }
  if (!ps.layout_index) return {static_cast<const std::byte*>(ps.frozen.data()), bytes};
  const ParamPlacement& pl = layout_->placement(*ps.layout_index);
  if (ps.numel == 0) return {};
  if (!fetcher_)
    return {units_[static_cast<std::size_t>(pl.unit)].model + pl.offset * dtype_size(model_dtype_),
            bytes};
  const std::byte* data = fetcher_->data(pl.unit);
  ZERO_CHECK(data != nullptr,
             "param: parameter '{}' (unit {}) is not gathered on rank {}: call gather({}) first",
             specs_[param].name, pl.unit, rank_, pl.unit);
  return {data + pl.offset * dtype_size(model_dtype_), bytes};
}

// ---------------------------------------------------------------------------------------------
// backward

std::span<std::byte> EngineImpl::grad(std::size_t param) {
  check_param(param, "grad");
  ParamState& ps = params_[param];
  ZERO_CHECK(ps.layout_index.has_value(), "grad: parameter '{}' is frozen (trainable = false)",
             specs_[param].name);
  ZERO_CHECK(!ps.ready, "grad: parameter '{}' is already ready in this micro-step",
             specs_[param].name);
  ps.slot_out = true;
  if (ps.numel == 0) return {};
  const ParamPlacement& pl = layout_->placement(*ps.layout_index);
  std::byte* staging = reducer_->staging(pl.unit);
  return {staging + pl.offset * dtype_size(model_dtype_), ps.numel * dtype_size(model_dtype_)};
}

bool EngineImpl::grad_in_place(std::size_t param, std::byte* data) {
  check_param(param, "grad_in_place");
  ParamState& ps = params_[param];
  ZERO_CHECK(ps.layout_index.has_value(),
             "grad_in_place: parameter '{}' is frozen (trainable = false)", specs_[param].name);
  ZERO_CHECK(!ps.ready, "grad_in_place: parameter '{}' is already ready in this micro-step",
             specs_[param].name);
  if (ps.numel == 0 || device_.gpu_ordinal() >= 0) return false;
  const int unit = layout_->placement(*ps.layout_index).unit;
  // Units left to the fused step are read by the peers, which cannot read this process's memory
  // in other backends: only the slices they read are copied, where each reads only its own.
  if (expects_late_units() && !comm_.shares_address_space()) {
    if (!(num_domains() == 1 || optimizer_->own_domain_only())) return false;
    if (!reducer_->lend_own_slice(unit, data)) return false;
  } else if (!reducer_->lend(unit, data)) {
    return false;
  }
  ps.slot_out = true;
  grad_ready(param);
  return true;
}

void EngineImpl::grad_ready(std::size_t param) {
  check_param(param, "grad_ready");
  ParamState& ps = params_[param];
  ZERO_CHECK(ps.layout_index.has_value(), "grad_ready: parameter '{}' is frozen",
             specs_[param].name);
  ZERO_CHECK(!ps.ready, "grad_ready: parameter '{}' is ready twice in one micro-step (rank {})",
             specs_[param].name, rank_);
  ZERO_CHECK(ps.slot_out, "grad_ready: parameter '{}' has no gradient written: call grad({}) first",
             specs_[param].name, param);
  ps.ready = true;
  const int unit = specs_[param].unit;
  if (--units_[static_cast<std::size_t>(unit)].pending == 0) {
    reducer_->unit_complete(unit, expects_late_units());
    unit_completed_in_backward(unit);
  }
}

// Closes the micro-step's gradients: missing ones count as zero (or are an error), then the
// reducer ends the micro-step (what is left in the buckets is reduced).
void EngineImpl::finish_micro_step(bool leave_late) {
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    if (params_[i].layout_index && !params_[i].ready) missing.push_back(specs_[i].name);
  }
  if (!missing.empty() && !ignore_unused_) {
    throw Error(
        fmt::format("step: no gradient this micro-step for {} parameter(s) on rank {}: {} (set "
                    "zero_optimization.ignore_unused_parameters to true to count them as zero)",
                    missing.size(), rank_, fmt::join(missing, ", ")));
  }
  // Units with missing gradients complete now, in backward (descending) order.
  for (std::size_t u = num_units_; u-- > 0;) {
    UnitState& us = units_[u];
    if (us.pending == 0) continue;
    if (u < layout_units_) {
      std::byte* staging = reducer_->staging(static_cast<int>(u));
      for (std::size_t i : us.trainable) {
        if (params_[i].ready || params_[i].numel == 0) continue;
        // No gradient this micro-step: a slot handed out but never marked ready holds partial
        // data, one never handed out holds whatever the buffer held; either counts as zero.
        const ParamPlacement& pl = layout_->placement(*params_[i].layout_index);
        compute_.fill_zero(staging + pl.offset * dtype_size(model_dtype_), model_dtype_, pl.numel,
                           exec_);
      }
    }
    us.pending = 0;
    reducer_->unit_complete(static_cast<int>(u), expects_late_units());
  }
  reducer_->end_micro_step(leave_late);
}

void EngineImpl::reset_micro_step() {
  for (ParamState& p : params_) p.ready = p.slot_out = false;
  for (UnitState& u : units_) u.pending = u.trainable.size();
}

// ---------------------------------------------------------------------------------------------
// step

// Every collective that can fail runs here, before anything is written: the overflow vote and the
// norm (over this rank's own slices, the same order at every stage), then every group's
// coefficients are validated. When nothing reads the norm before the step (no overflow check, no
// clipping) the step takes it instead, in its own walk over the gradients (norm_after_step()).
EngineImpl::StepPlan EngineImpl::plan_step() {
  StepPlan plan;
  if (!norm_after_step()) {
    ScopedTimer timer(timings_.norm_s);
    // One pass over this rank's gradients serves both: their sum of squares in double is finite
    // exactly when every gradient is (a finite fp32 value's square is below 1.2e77, so no count of
    // them a rank holds can overflow the sum), so the overflow vote reads the local sum.
    double sumsq = optimizer_->squared_norm();
    fused_.own_formed = fused_.active;  // squared_norm() formed this rank's late slices
    float overflow = 0.0f;
    if (check_overflow_) {
      overflow = std::isfinite(sumsq) ? 0.0f : 1.0f;
      if (world_ > 1)
        control_.all_reduce_now(&overflow, &overflow, 1, DType::F32, ReduceOp::Max);
    }
    plan.overflow = overflow != 0.0f;
    if (plan.overflow) {
      sumsq = 0.0;
    } else if (world_ > 1) {
      control_.all_reduce_now(&sumsq, &sumsq, 1, DType::F64, ReduceOp::Sum);
    }
    plan.norm = std::sqrt(sumsq);
  }
  plan.scaler_after = *scaler_;
  plan.scaler_after->update(plan.overflow);  // throws at min scale, state unchanged
  if (plan.overflow) return plan;
  double clip_coef = 1.0;
  if (clip_ > 0 && std::isfinite(plan.norm)) {
    clip_coef = std::max(1.0, (plan.norm / plan.scaler_after->scale() + 1e-6) / clip_);
  }
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    GroupBase base{groups_[g].base_lr, std::nullopt};
    const kernels::OptimizerHyper& h = groups_[g].hyper;
    if (h.kind == kernels::OptimizerKind::Adam || h.kind == kernels::OptimizerKind::AdamW ||
        h.kind == kernels::OptimizerKind::Lion) {
      base.betas = std::array<double, 2>{h.beta1, h.beta2};
    }
    const ScheduledValues v = scheduled_values(schedule_, base, g, last_batch_iteration_);
    kernels::OptimizerHyper hyper = h;
    if (v.betas) {
      hyper.beta1 = (*v.betas)[0];
      hyper.beta2 = (*v.betas)[1];
    }
    kernels::StepScalars sc{v.lr, applied_steps_ + 1,
                            1.0 / (plan.scaler_after->scale() * clip_coef)};
    (void)kernels::make_step_coeffs(hyper, sc);  // validates
    plan.hypers.push_back(hyper);
    plan.scalars.push_back(sc);
  }
  return plan;
}

StepResult EngineImpl::step() {
  // The step in backward: what the peers post until they are in step() too, then its end
  // however step() ends (the optimizer's step below steps what is left).
  struct EndInBackward {
    EngineImpl& engine;
    ~EndInBackward() { engine.end_step_in_backward(); }
  } end_in_backward{*this};
  step_posted_units_until_arrived();
  const bool in_backward = in_backward_.armed;
  if (fetcher_) fetcher_->end_micro_step();
  const bool boundary = at_boundary();
  // A window's last micro-step may leave its lone units' reductions to the step (FusedReduction).
  finish_micro_step(boundary && may_fuse_reduction());
  // The late units' buffers go back to the reducer however step() ends; on success after the
  // norm's all-reduce, which no rank leaves before every rank's step has read them.
  struct EndFused {
    EngineImpl& engine;
    ~EndFused() { engine.end_fused_reduction(); }
  } end_fused{*this};
  if (fetcher_) fetcher_->finish_order_check();
  StepResult result;
  result.loss_scale = scaler_->scale();
  result.global_steps = global_steps_;
  result.skipped_steps = skipped_steps_;
  result.lr = current_lr(0);
  result.grad_norm = std::numeric_limits<double>::quiet_NaN();
  if (!boundary) {
    ++micro_in_window_;
    reset_micro_step();
    return result;
  }
  result.boundary = true;
  // After every rank's backward (a collective): the late units' buffers exchanged. The norm
  // below forms this rank's own slices of them; the step forms the rest (stage 0's other domains).
  const bool fused = set_up_fused_reduction();
  // A step begun in backward keeps the coefficients it took at its first completed unit.
  const StepPlan plan = in_backward_.plan ? *in_backward_.plan : plan_step();

  // A new window starts whatever happens below: a failed step discards its gradients.
  micro_in_window_ = 0;
  reducer_->start_window();
  reset_micro_step();
  double own_sumsq = 0.0;  // with norm_after_step(): the step's Σ g² over this rank's slices
  bool push = !plan.overflow && may_push_model();
  if (push) {
    set_up_model_push();
    push = push_.pushed_units > 0;  // agreed on by every rank
  }
  // Every peer is in step() now, past its backward: nobody reads a copy while it is written (the
  // exchange of the late units' buffers was such a barrier).
  if ((push || (shared_model_ && !plan.overflow)) && !fused) comm_.barrier_now();
  if (!plan.overflow) {
    ScopedTimer timer(timings_.optimizer_s);
    // Ranks agree that every NVMe write went through before any of them commits; an IoError
    // leaves parameters, master, states, scaler, counters and schedule at the previous step.
    offload::SubgroupStore::Agree agree;
    if (world_ > 1 && (optimizer_->store().nvme_count() > 0 || param_store_)) {
      agree = [this](bool ok) {
        float failed = ok ? 0.0f : 1.0f;
        control_.all_reduce_now(&failed, &failed, 1, DType::F32, ReduceOp::Max);
        return failed == 0.0f;
      };
    }
    // Stage 3 with its slices in a swap store: the persistent units' new slices are read back
    // before the step commits, so that refresh_after_step() below does no I/O.
    std::function<void()> before_commit;
    if (fetcher_ && param_store_) before_commit = [this] { fetcher_->stage_refresh(); };
    push_.active = push;
    try {
      optimizer_->step(plan.hypers, plan.scalars, agree, param_store_.get(), before_commit,
                       norm_after_step() ? &own_sumsq : nullptr);
    } catch (...) {
      end_push();
      if (fetcher_) fetcher_->drop_staged();
      throw;
    }
    end_push();
    if (shared_model_) {
      timings_.shared_model_bytes +=
          static_cast<std::int64_t>(partition_elems() * dtype_size(model_dtype_));
    }
    // No rank leaves step() (and stages into its buffers again) while a peer may still read its
    // late units' buffers: the norm's all-reduce after the step orders that, as does the barrier
    // after a push; where the norm came first, only stage 0's other domains were read since its
    // all-reduce, and a barrier of its own follows them.
    if (fused && !norm_after_step() && !push && num_domains() > 1) comm_.barrier_now();
  }

  // Commit.
  const double prev_scale = scaler_->scale();
  *scaler_ = *plan.scaler_after;
  reducer_->after_step(plan.overflow, scaler_->scale() / prev_scale);
  ++global_steps_;
  result.global_steps = global_steps_;
  result.grad_norm = plan.norm / prev_scale;
  if (plan.overflow) {
    ++skipped_steps_;
    result.skipped = true;
    result.skipped_steps = skipped_steps_;
    result.grad_norm = std::numeric_limits<double>::quiet_NaN();
    return result;
  }
  result.lr = plan.scalars[0].lr;
  ++applied_steps_;
  ++last_batch_iteration_;
  // The norm's all-reduce after the step is every rank's step done: the barrier a push or a
  // shared model needs after it (the same communicator, so the same memory it orders).
  bool stepped_everywhere = false;
  if (norm_after_step()) {
    // After the commit, as the model all-gather: a collective that fails here leaves the step
    // taken (nothing half-written), only its norm unknown.
    ScopedTimer timer(timings_.norm_s);
    if (world_ > 1) {
      control_.all_reduce_now(&own_sumsq, &own_sumsq, 1, DType::F64, ReduceOp::Sum);
      stepped_everywhere = &control_ == &comm_;
    }
    result.grad_norm = std::sqrt(own_sumsq) / prev_scale;
  }
  all_gather_model(push, stepped_everywhere);
  // Stage 3: the pushed persistent units are current on every rank (all_gather_model's barrier).
  if (fetcher_) fetcher_->refresh_after_step(push ? &push_.pushed : nullptr);
  // From the next window on, its last micro-step may step in backward (every rank alike).
  if (!in_backward && !in_backward_.set_up && may_step_in_backward()) set_up_step_in_backward();
  return result;
}

// Stages 1/2: every rank's updated slices of the model copy to every rank, several units in
// flight up to allgather_bucket_size elements; after a pushing step, a barrier (every push has
// landed) and the units not pushed; with a shared model, or after a push where nothing is
// gathered (stage 0, stage 3's persistent units), the barrier alone.
void EngineImpl::all_gather_model(bool after_push, bool stepped_everywhere) {
  if (shared_model_ || (after_push && !gathers_model())) {
    if (stepped_everywhere) return;
    ScopedTimer timer(timings_.all_gather_s);
    comm_.barrier_now();
    return;
  }
  if (!gathers_model()) return;
  ScopedTimer timer(timings_.all_gather_s);
  if (after_push && !stepped_everywhere) comm_.barrier_now();
  for (Work& w : start_all_gather_model(parts_.allgather_bucket_elems, after_push)) w.wait();
}

Work EngineImpl::start_model_gather(std::size_t unit) {
  const UnitLayout& ul = layout_->unit(static_cast<int>(unit));
  return comm_.all_gather_in_place(units_[unit].model, ul.slice_elems, model_dtype_);
}

PartitionOptimizer::ModelEcho EngineImpl::push_model_to_peers() {
  ZERO_ASSERT(gathers_model() && num_domains() == 1 && comm_.shares_address_space());
  std::vector<void*> mine(layout_units_);
  for (std::size_t u = 0; u < layout_units_; ++u) mine[u] = units_[u].model;
  // Rank q's model copy of unit u at [q·units + u].
  std::vector<void*> all = comm_.exchange_addresses(mine);
  return [this, all = std::move(all)](int unit, std::size_t slice_offset, const std::byte* values,
                                      std::size_t count) {
    const std::size_t msize = dtype_size(model_dtype_);
    const std::size_t slice = layout_->unit(unit).slice_elems;
    const std::size_t at = (static_cast<std::size_t>(rank_) * slice + slice_offset) * msize;
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      auto* peer = static_cast<std::byte*>(
          all[static_cast<std::size_t>(q) * layout_units_ + static_cast<std::size_t>(unit)]);
      copy_large(peer + at, values, count * msize, slice * msize);
    }
  };
}

std::vector<Work> EngineImpl::start_all_gather_model(std::size_t window_elems, bool skip_pushed) {
  std::deque<std::pair<Work, std::size_t>> inflight;
  std::size_t inflight_elems = 0;
  for (std::size_t u = 0; gathers_model() && u < layout_units_; ++u) {
    const UnitLayout& ul = layout_->unit(static_cast<int>(u));
    if (ul.padded_elems == 0 || (skip_pushed && push_.pushed[u])) continue;
    while (!inflight.empty() && inflight_elems + ul.padded_elems > window_elems) {
      inflight.front().first.wait();
      inflight_elems -= inflight.front().second;
      inflight.pop_front();
    }
    inflight.emplace_back(start_model_gather(u), ul.padded_elems);
    inflight_elems += ul.padded_elems;
  }
  std::vector<Work> works;
  for (auto& [work, elems] : inflight) works.push_back(std::move(work));
  return works;
}

double EngineImpl::current_lr(int group) const {
  ZERO_CHECK(group >= 0 && static_cast<std::size_t>(group) < groups_.size(),
             "current_lr: unknown group {}", group);
  GroupBase base{groups_[static_cast<std::size_t>(group)].base_lr, std::nullopt};
  return scheduled_values(schedule_, base, static_cast<std::size_t>(group), last_batch_iteration_)
      .lr;
}

void EngineImpl::set_lr(int group, double lr) {
  ZERO_CHECK(group >= 0 && static_cast<std::size_t>(group) < groups_.size(),
             "set_lr: unknown param group {} (the engine has {})", group, groups_.size());
  ZERO_CHECK(std::isfinite(lr) && lr >= 0, "set_lr: lr {} for param group {} is not a finite "
             "value >= 0", lr, group);
  ZERO_CHECK(schedule_.kind == LrScheduleKind::Constant,
             "set_lr: the config's \"scheduler\" block ({}) sets the lr of every step; a client "
             "LR scheduler cannot set it too: drop one of them",
             lr_schedule_name(schedule_.kind));
  groups_[static_cast<std::size_t>(group)].base_lr = lr;
}

}  // namespace zero::engine_detail

namespace zero {

void Engine::save_checkpoint(const std::string& dir, const std::string& tag) {
  save_checkpoint(dir, tag, nlohmann::json::object());
}

}  // namespace zero
