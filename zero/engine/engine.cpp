// The ZeRO engine (zero/engine.h). One flat layout serves every stage (DESIGN.md §3); the stages
// differ only in what a rank keeps and when gradients are reduced:
//
//   stage | model copy        | gradients before the step            | master + states
//   0     | full              | full, all-reduced at the boundary    | full (every rank's slices)
//   1     | full              | full locally, reduce-scattered at the boundary | own slices
//   2     | full              | reduce-scattered per bucket during backward   | own slices
//   3     | own slices        | as stage 2                           | own slices
//
// Every stage keeps the master weights, optimizer states and reduced gradients as *partitions*:
// the concatenation of one rank's slice of every unit. Stage 0 simply holds all W partitions.
// The global gradient norm is always summed per partition and all-reduced in rank order, and the
// optimizer is elementwise, so with InProcComm's rank-order reductions stages 0–3 give bitwise
// identical parameters when they reduce the same sums (gradient_accumulation_steps = 1, or stages
// 0/1 against each other and 2/3 against each other).
#include "zero/engine.h"

#include "zero/engine/engine_impl.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <set>

#include "kernels/cast.h"
#include "kernels/norm.h"
#include "kernels/optimizer.h"
#include "kernels/unscale.h"
#include "zero/engine/elementwise.h"
#include "zero/engine/optimizer_setup.h"
#include "zero/engine/param_fetcher.h"
#include "zero/base/error.h"
#include "zero/layout/flat_layout.h"
#include "zero/base/log.h"
#include "zero/schedule/from_config.h"
#include "zero/schedule/loss_scaler.h"
#include "zero/schedule/lr_schedule.h"

namespace zero::engine_detail {

// ---------------------------------------------------------------------------------------------
// construction

namespace {

std::string specs_fingerprint(std::span<const ParamSpec> specs) {
  std::string s;
  for (const ParamSpec& p : specs) {
    s += fmt::format("{}|{}|{}|{}|{}|{}|{};", p.name, fmt::join(p.shape, "x"), dtype_name(p.dtype),
                     p.group, p.unit, p.trainable, fmt::join(p.tied_names, ","));
  }
  return s;
}

void refuse_blockers(const config::DsConfig& cfg, int comm_size) {
  std::vector<ConfigError::Problem> problems;
  for (const config::Finding& f : cfg.blockers()) {
    std::string msg = f.message;
    if (f.severity == config::Severity::Unsupported &&
        msg.find("not supported yet") == std::string::npos) {
      msg = "not supported yet: " + msg;
    }
    problems.push_back({f.path, msg});
  }
  if (cfg.world_size && *cfg.world_size != comm_size) {
    problems.push_back({"world_size", fmt::format("the config resolves to {} ranks but the "
                                                  "communicator has {}: supply --world-size {} "
                                                  "or fix the batch sizes",
                                                  *cfg.world_size, comm_size, comm_size)});
  }
  if (!problems.empty()) throw ConfigError(std::move(problems));
}

}  // namespace

void EngineImpl::build(const InitFn& init, const EngineOptions& options) {
  rank_ = comm_.rank();
  world_ = comm_.size();
  refuse_blockers(cfg_, world_);
  const auto& zo = cfg_.zero_optimization;
  stage_ = zo.stage;
  gas_ = static_cast<int>(cfg_.gradient_accumulation_steps.value_or(1));
  model_dtype_ = cfg_.model_dtype;
  accum_dtype_ = cfg_.data_types.grad_accum_dtype.value_or(model_dtype_);
  comm_dtype_ = cfg_.communication_data_type;
  ZERO_CHECK(accum_dtype_ != DType::F64 && comm_dtype_ != DType::F64,
             "fp64 gradients are not supported (data_types.grad_accum_dtype, "
             "communication_data_type)");
  if (cfg_.bf16.enabled && cfg_.bf16.bf16_master_weights_and_grads) master_dtype_ = DType::BF16;
  if (cfg_.bf16.enabled && cfg_.bf16.bf16_optimizer_states) state_dtype_ = DType::BF16;
  check_overflow_ = cfg_.fp16.enabled || (cfg_.bf16.enabled && cfg_.bf16.check_grad_overflow);
  overlap_comm_ = zo.overlap_comm;
  reduce_scatter_ = zo.reduce_scatter;
  ignore_unused_ = zo.ignore_unused_parameters;
  clip_ = cfg_.gradient_clipping;
  if (zo.offload_optimizer && zo.offload_optimizer->device != config::OffloadDevice::None && stage_ > 0) {
    optimizer_kind_ = zo.offload_optimizer->pin_memory ? MemoryKind::PinnedHost : MemoryKind::Host;
  }
  if (zo.offload_param && zo.offload_param->device != config::OffloadDevice::None && stage_ == 3) {
    param_kind_ = zo.offload_param->pin_memory ? MemoryKind::PinnedHost : MemoryKind::Host;
  }
  const double f = cfg_.gradient_predivide_factor;
  if (cfg_.gradient_allreduce_sum) {
    reduce_op_ = ReduceOp::Sum;
  } else if (cfg_.prescale_gradients) {
    reduce_op_ = ReduceOp::Sum;
    pack_scale_ = static_cast<float>(1.0 / world_);
  } else if (f != 1.0) {
    // DeepSpeed's "allreduce with predivide" (SPEC §3.3 a): ×1/f, sum, ×f/W.
    reduce_op_ = ReduceOp::Sum;
    pack_scale_ = static_cast<float>(1.0 / f);
    consume_scale_ = static_cast<float>(f / world_);
  }

  std::vector<engine_detail::GroupOverrides> overrides;
  for (const ParamGroupOptions& g : options.groups) overrides.push_back({g.lr, g.weight_decay});
  groups_ = engine_detail::group_optimizers(cfg_, overrides);
  schedule_ = lr_schedule_from_config(cfg_);
  scaler_.emplace(loss_scaler_from_config(cfg_));

  // Specs.
  std::set<std::string> names;
  std::vector<ParamDesc> descs;
  params_.resize(specs_.size());
  int max_unit = -1;
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    ZERO_CHECK(!s.name.empty(), "parameter {}: empty name", i);
    ZERO_CHECK(names.insert(s.name).second, "parameter '{}' is registered twice", s.name);
    for (const std::string& alias : s.tied_names) {
      ZERO_CHECK(!alias.empty() && names.insert(alias).second,
                 "parameter '{}': tied name '{}' is empty or already a parameter or alias", s.name, alias);
    }
    ZERO_CHECK(s.dtype == model_dtype_,
               "parameter '{}' has dtype {} but the config trains in {} (fp16/bf16 blocks); "
               "register it as {}",
               s.name, dtype_name(s.dtype), dtype_name(model_dtype_), dtype_name(model_dtype_));
    ZERO_CHECK(s.unit >= 0, "parameter '{}': unit {} is negative", s.name, s.unit);
    ZERO_CHECK(s.group >= 0 && static_cast<std::size_t>(s.group) < groups_.size(),
               "parameter '{}': param group {} has no options (EngineOptions::groups has {})",
               s.name, s.group, options.groups.size());
    params_[i].numel = numel_of(s);
    max_unit = std::max(max_unit, s.unit);
    if (s.trainable) {
      params_[i].layout_index = descs.size();
      layout_to_spec_.push_back(i);
      descs.push_back({s.name, params_[i].numel, s.dtype, s.group, s.unit});
    }
  }
  num_units_ = static_cast<std::size_t>(max_unit + 1);
  layout_ = FlatLayout::build(descs, {world_, 1, kSliceAlignElems});
  layout_units_ = layout_->num_units();
  units_.resize(num_units_);
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    if (params_[i].layout_index) {
      units_[static_cast<std::size_t>(specs_[i].unit)].trainable.push_back(i);
    }
  }

  check_agreement(comm_, "the resolved ds_config", cfg_.to_json().dump());
  check_agreement(comm_, "the parameter specs (name, shape, dtype, group, unit, trainable)",
                  specs_fingerprint(specs_));

  // Buckets: reduce_bucket_size elements, never more than the whole model needs.
  const std::size_t total_padded = layout_->total_padded_elems();
  const auto bucket_elems = static_cast<std::size_t>(std::max<std::int64_t>(zo.reduce_bucket_elems, 1));
  bucket_chunk_capacity_ =
      std::max<std::size_t>(1, std::min(bucket_elems, total_padded) / static_cast<std::size_t>(world_));
  slots_.resize(overlap_comm_ ? 2 : 1);

  init_state(init);
  build_runs();
  if (stage_ == 3) {
    auto elems = [](std::int64_t v) { return static_cast<std::size_t>(std::max<std::int64_t>(v, 0)); };
    engine_detail::FetchOptions fo;
    fo.prefetch_bucket_elems = elems(zo.prefetch_bucket_elems);
    fo.max_live_elems = elems(zo.max_live_parameters_elems);
    fo.max_reuse_distance_elems = elems(zo.max_reuse_distance_elems);
    fo.param_persistence_threshold_elems = elems(zo.param_persistence_threshold_elems);
    fo.model_persistence_threshold_elems = elems(zo.model_persistence_threshold_elems);
    fetcher_ = std::make_unique<engine_detail::ParamFetcher>(
        comm_, device_, *layout_, num_units_, model_dtype_,
        static_cast<const std::byte*>(model_part_.data()), fo, timings_);
  }
}

// Rank 0 initialises each unit in full, broadcasts it, and every rank keeps what its stage needs.
void EngineImpl::init_state(const InitFn& init) {
  const std::size_t P = partition_elems();
  const std::size_t domains = static_cast<std::size_t>(num_domains());
  master_ = alloc(domains * P, master_dtype_, MemoryTag::MasterParams, optimizer_kind_);
  if (stage_ != 0) {
    grads_ = alloc(P, accum_dtype_, MemoryTag::Gradients, optimizer_kind_);
    fill_zero(grads_.data(), accum_dtype_, P);
  }
  const int nstates = kernels::optimizer_state_count(groups_[0].hyper);
  for (int k = 0; k < nstates; ++k) {
    states_.push_back(alloc(domains * P, state_dtype_, MemoryTag::OptimizerStates, optimizer_kind_));
    // Param groups share one optimizer kind, so the initial value is the same everywhere.
    const std::vector<float> init_value(domains * P, kernels::optimizer_state_initial_value(groups_[0].hyper, k));
    combine(states_.back().data(), state_dtype_, init_value.data(), DType::F32, init_value.size(), 1.0f, false, exec_);
  }
  if (stage_ == 3) model_part_ = alloc(P, model_dtype_, MemoryTag::LowPrecisionParams, param_kind_);

  std::vector<float> flat;
  for (std::size_t u = 0; u < layout_units_; ++u) {
    const UnitLayout& ul = layout_->unit(static_cast<int>(u));
    flat.assign(ul.padded_elems, 0.0f);
    if (rank_ == 0) {
      for (std::size_t li : ul.params) {
        const ParamPlacement& pl = layout_->placement(li);
        init(layout_to_spec_[li], std::span<float>(flat.data() + pl.offset, pl.numel));
      }
    }
    if (world_ > 1 && !flat.empty()) comm_.broadcast(flat.data(), flat.size(), DType::F32, 0).wait();
    const std::size_t S = ul.slice_elems;
    for (int d = 0; d < num_domains(); ++d) {
      const std::size_t src = static_cast<std::size_t>(domain_rank(d)) * S;
      combine(master_at(domain_offset(d) + ul.partition_offset), master_dtype_, flat.data() + src,
              DType::F32, S, 1.0f, false, exec_);
    }
    if (stage_ == 3) {
      combine(at(model_part_, model_dtype_, ul.partition_offset), model_dtype_,
              flat.data() + static_cast<std::size_t>(rank_) * S, DType::F32, S, 1.0f, false, exec_);
    } else {
      units_[u].model = alloc(ul.padded_elems, model_dtype_, MemoryTag::LowPrecisionParams);
      combine(units_[u].model.data(), model_dtype_, flat.data(), DType::F32, ul.padded_elems, 1.0f,
              false, exec_);
    }
    if (stage_ <= 1) {
      units_[u].accum = alloc(ul.padded_elems, accum_dtype_, MemoryTag::Gradients);
      fill_zero(units_[u].accum.data(), accum_dtype_, ul.padded_elems);
    }
  }
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    if (params_[i].layout_index) continue;
    flat.assign(params_[i].numel, 0.0f);
    if (rank_ == 0) init(i, flat);
    if (world_ > 1 && !flat.empty()) comm_.broadcast(flat.data(), flat.size(), DType::F32, 0).wait();
    params_[i].frozen = alloc(params_[i].numel, model_dtype_, MemoryTag::LowPrecisionParams);
    combine(params_[i].frozen.data(), model_dtype_, flat.data(), DType::F32, flat.size(), 1.0f,
            false, exec_);
  }
  for (UnitState& u : units_) u.pending = u.trainable.size();
}

void EngineImpl::build_runs() {
  for (int d = 0; d < num_domains(); ++d) {
    const int r = domain_rank(d);
    for (std::size_t u = 0; u < layout_units_; ++u) {
      const std::size_t S = layout_->unit(static_cast<int>(u)).slice_elems;
      if (S == 0) continue;
      const std::vector<SliceSegment> segs = layout_->segments(static_cast<int>(u), r);
      OptimizerRun run{d, static_cast<int>(u), 0, 0, segs.empty() ? 0 : layout_->param(segs[0].param).group};
      for (const SliceSegment& s : segs) {
        const int g = layout_->param(s.param).group;
        if (g != run.group) {
          run.end = s.slice_offset;
          if (run.end > run.begin) runs_.push_back(run);
          run.begin = s.slice_offset;
          run.group = g;
        }
      }
      run.end = S;
      runs_.push_back(run);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// forward

void EngineImpl::gather(int unit) {
  check_unit(unit, "gather");
  if (fetcher_) fetcher_->gather(unit);
}

void EngineImpl::release(int unit) {
  check_unit(unit, "release");
  if (fetcher_) fetcher_->release(unit);
}

std::span<const std::byte> EngineImpl::param(std::size_t param) const {
  check_param(param, "param");
  const ParamState& ps = params_[param];
  const std::size_t bytes = ps.numel * dtype_size(model_dtype_);
  if (!ps.layout_index) return {static_cast<const std::byte*>(ps.frozen.data()), bytes};
  const ParamPlacement& pl = layout_->placement(*ps.layout_index);
  if (ps.numel == 0) return {};
  if (!fetcher_) return {at(units_[static_cast<std::size_t>(pl.unit)].model, model_dtype_, pl.offset), bytes};
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
  ZERO_CHECK(!ps.ready, "grad: parameter '{}' is already ready in this micro-step", specs_[param].name);
  const ParamPlacement& pl = layout_->placement(*ps.layout_index);
  UnitState& us = units_[static_cast<std::size_t>(pl.unit)];
  if (us.staging.empty() && ps.numel > 0) {
    const std::size_t n = layout_->unit(pl.unit).padded_elems;
    us.staging = alloc(n, model_dtype_, MemoryTag::Gradients);
    fill_zero(us.staging.data(), model_dtype_, n);
  }
  ps.slot_out = true;
  if (ps.numel == 0) return {};
  return {at(us.staging, model_dtype_, pl.offset), ps.numel * dtype_size(model_dtype_)};
}

void EngineImpl::grad_ready(std::size_t param) {
  check_param(param, "grad_ready");
  ParamState& ps = params_[param];
  ZERO_CHECK(ps.layout_index.has_value(), "grad_ready: parameter '{}' is frozen", specs_[param].name);
  ZERO_CHECK(!ps.ready, "grad_ready: parameter '{}' is ready twice in one micro-step (rank {})",
             specs_[param].name, rank_);
  ZERO_CHECK(ps.slot_out, "grad_ready: parameter '{}' has no gradient written: call grad({}) first",
             specs_[param].name, param);
  ps.ready = true;
  const int unit = specs_[param].unit;
  if (--units_[static_cast<std::size_t>(unit)].pending == 0) unit_complete(unit);
}

// Every trainable parameter of `unit` has its gradient for this micro-step in the staging buffer.
void EngineImpl::unit_complete(int unit) {
  UnitState& us = units_[static_cast<std::size_t>(unit)];
  const UnitLayout* ul = layout_unit(unit);
  if (ul == nullptr || ul->padded_elems == 0) return;
  if (stage_ <= 1) {
    ScopedTimer timer(timings_.accumulate_s);
    combine(us.accum.data(), accum_dtype_, us.staging.data(), model_dtype_, ul->padded_elems, 1.0f,
            micro_in_window_ > 0, exec_);
    us.staging.reset();
    return;
  }
  // Stage 2/3: into the bucket; the staging buffer is freed once every piece is packed.
  submit_unit(unit, us.staging.data(), model_dtype_);
}

// Submits the unit's gradients in pieces no larger than a bucket.
void EngineImpl::submit_unit(int unit, const void* unit_buffer, DType dtype) {
  const UnitLayout& ul = layout_->unit(unit);
  for (std::size_t b = 0; b < ul.slice_elems; b += bucket_chunk_capacity_) {
    ++units_[static_cast<std::size_t>(unit)].unpacked;
  }
  for (std::size_t b = 0; b < ul.slice_elems; b += bucket_chunk_capacity_) {
    submit({{unit, b, std::min(ul.slice_elems, b + bucket_chunk_capacity_)}, unit_buffer, dtype});
  }
}

void EngineImpl::submit(const BucketSource& source) {
  if (open_bucket_elems_ + source.piece.size() > bucket_chunk_capacity_) flush_bucket();
  open_bucket_.push_back(source);
  open_bucket_elems_ += source.piece.size();
}

// Packs the open bucket as W rank chunks (chunk q = every piece's slice of rank q) in the
// communication dtype and starts its reduction.
void EngineImpl::flush_bucket() {
  if (open_bucket_.empty()) return;
  BucketSlot& slot = slots_[next_slot_];
  next_slot_ = (next_slot_ + 1) % slots_.size();
  if (slot.in_flight) finish_slot(slot);
  ++timings_.buckets;
  std::optional<ScopedTimer> pack_timer(std::in_place, timings_.pack_s);
  const std::size_t W = static_cast<std::size_t>(world_);
  const std::size_t chunk = open_bucket_elems_;
  const std::size_t capacity = bucket_chunk_capacity_;
  if (slot.send.empty()) {
    slot.send = alloc(W * capacity, comm_dtype_, MemoryTag::Buckets);
    if (stage_ != 0 && reduce_scatter_) slot.recv = alloc(capacity, comm_dtype_, MemoryTag::Buckets);
  }
  slot.pieces.clear();
  for (std::size_t q = 0; q < W; ++q) {
    std::size_t off = q * chunk;
    for (const BucketSource& s : open_bucket_) {
      const std::size_t S = layout_->unit(s.piece.unit).slice_elems;
      const auto* src = static_cast<const std::byte*>(s.unit_buffer) +
                        (q * S + s.piece.begin) * dtype_size(s.dtype);
      combine(at(slot.send, comm_dtype_, off), comm_dtype_, src, s.dtype, s.piece.size(),
              pack_scale_, false, exec_);
      off += s.piece.size();
    }
  }
  for (const BucketSource& s : open_bucket_) {
    slot.pieces.push_back(s.piece);
    UnitState& us = units_[static_cast<std::size_t>(s.piece.unit)];
    if (--us.unpacked == 0 && stage_ >= 2) us.staging.reset();
  }
  slot.chunk_elems = chunk;
  slot.accumulate = stage_ >= 2 && !window_first_reduction_;
  pack_timer.reset();
  if (W == 1) {
    slot.work = Work();  // the sum over one rank is the bucket itself
  } else if (stage_ != 0 && reduce_scatter_) {
    slot.work = comm_.reduce_scatter(slot.send.data(), slot.recv.data(), chunk, comm_dtype_, reduce_op_);
  } else {
    slot.work = comm_.all_reduce(slot.send.data(), slot.send.data(), W * chunk, comm_dtype_, reduce_op_);
  }
  slot.in_flight = true;
  open_bucket_.clear();
  open_bucket_elems_ = 0;
  if (!overlap_comm_) finish_slot(slot);
}

// Waits for a bucket's reduction and moves the reduced values into the partition gradients.
void EngineImpl::finish_slot(BucketSlot& slot) {
  {
    ScopedTimer timer(timings_.reduce_wait_s);
    slot.work.wait();
  }
  slot.in_flight = false;
  ScopedTimer timer(timings_.unpack_s);
  const bool own_chunk_in_recv = world_ > 1 && stage_ != 0 && reduce_scatter_;
  for (int d = 0; d < num_domains(); ++d) {
    const std::size_t q = static_cast<std::size_t>(domain_rank(d));
    const std::byte* chunk = own_chunk_in_recv
                                 ? static_cast<const std::byte*>(slot.recv.data())
                                 : at(slot.send, comm_dtype_, q * slot.chunk_elems);
    std::size_t off = 0;
    for (const Piece& p : slot.pieces) {
      combine(grad_at(d, p.unit, p.begin), accum_dtype_, chunk + off * dtype_size(comm_dtype_),
              comm_dtype_, p.size(), consume_scale_, slot.accumulate, exec_);
      off += p.size();
    }
  }
}

void EngineImpl::drain_buckets() {
  flush_bucket();
  for (BucketSlot& s : slots_) {
    if (s.in_flight) finish_slot(s);
  }
}

// Closes the micro-step's gradients: missing ones count as zero (or are an error), stage 2/3
// reduce what is left in the bucket.
void EngineImpl::finish_micro_step() {
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    if (params_[i].layout_index && !params_[i].ready) missing.push_back(specs_[i].name);
  }
  if (!missing.empty() && !ignore_unused_) {
    throw Error(fmt::format(
        "step: no gradient this micro-step for {} parameter(s) on rank {}: {} (set "
        "zero_optimization.ignore_unused_parameters to true to count them as zero)",
        missing.size(), rank_, fmt::join(missing, ", ")));
  }
  // Units with missing gradients complete now, in backward (descending) order.
  for (std::size_t u = num_units_; u-- > 0;) {
    UnitState& us = units_[u];
    if (us.pending == 0) continue;
    const UnitLayout* ul = layout_unit(static_cast<int>(u));
    if (us.staging.empty() && ul != nullptr && ul->padded_elems > 0) {
      us.staging = alloc(ul->padded_elems, model_dtype_, MemoryTag::Gradients);
      fill_zero(us.staging.data(), model_dtype_, ul->padded_elems);
    }
    for (std::size_t i : us.trainable) {
      if (params_[i].ready || params_[i].numel == 0 || !params_[i].slot_out) continue;
      // A slot handed out but never marked ready holds partial data: count it as zero.
      const ParamPlacement& pl = layout_->placement(*params_[i].layout_index);
      fill_zero(at(us.staging, model_dtype_, pl.offset), model_dtype_, pl.numel);
    }
    us.pending = 0;
    unit_complete(static_cast<int>(u));
  }
  if (stage_ >= 2) {
    drain_buckets();
    window_first_reduction_ = false;
  }
}

void EngineImpl::reset_micro_step() {
  for (ParamState& p : params_) p.ready = p.slot_out = false;
  for (UnitState& u : units_) u.pending = u.trainable.size();
}

void EngineImpl::all_gather_model() {
  if (world_ == 1 || stage_ == 0 || stage_ == 3) return;
  ScopedTimer timer(timings_.all_gather_s);
  // Several units in flight, up to allgather_bucket_size elements.
  const auto limit = static_cast<std::size_t>(std::max<std::int64_t>(cfg_.zero_optimization.allgather_bucket_elems, 1));
  std::deque<std::pair<Work, std::size_t>> inflight;
  std::size_t inflight_elems = 0;
  for (std::size_t u = 0; u < layout_units_; ++u) {
    const UnitLayout& ul = layout_->unit(static_cast<int>(u));
    if (ul.padded_elems == 0) continue;
    while (!inflight.empty() && inflight_elems + ul.padded_elems > limit) {
      inflight.front().first.wait();
      inflight_elems -= inflight.front().second;
      inflight.pop_front();
    }
    inflight.emplace_back(comm_.all_gather_in_place(units_[u].model.data(), ul.slice_elems, model_dtype_),
                          ul.padded_elems);
    inflight_elems += ul.padded_elems;
  }
  for (auto& w : inflight) w.first.wait();
}

StepResult EngineImpl::step() {
  if (fetcher_) fetcher_->end_micro_step();
  finish_micro_step();
  StepResult result;
  result.loss_scale = scaler_->scale();
  result.global_steps = global_steps_;
  result.skipped_steps = skipped_steps_;
  result.lr = current_lr(0);
  result.grad_norm = std::numeric_limits<double>::quiet_NaN();
  if (micro_in_window_ + 1 < gas_) {
    ++micro_in_window_;
    reset_micro_step();
    return result;
  }
  result.boundary = true;
  if (stage_ <= 1) {
    for (std::size_t u = layout_units_; u-- > 0;) {
      submit_unit(static_cast<int>(u), units_[u].accum.data(), accum_dtype_);
    }
    drain_buckets();
  }

  // Every collective that can fail runs before anything is written. The overflow check and the
  // norm walk this rank's slice of each unit in unit order, whatever the stage, so every stage
  // sums the same numbers in the same order.
  const int own = stage_ == 0 ? rank_ : 0;
  std::optional<ScopedTimer> norm_timer(std::in_place, timings_.norm_s);
  float overflow = 0.0f;
  if (check_overflow_) {
    for (std::size_t u = 0; u < layout_units_ && overflow == 0.0f; ++u) {
      const std::size_t S = layout_->unit(static_cast<int>(u)).slice_elems;
      if (S > 0 && kernels::unscale_and_check_cpu(grad_at(own, static_cast<int>(u), 0), accum_dtype_,
                                                  S, 1.0f, exec_)) {
        overflow = 1.0f;
      }
    }
    if (world_ > 1) comm_.all_reduce(&overflow, &overflow, 1, DType::F32, ReduceOp::Max).wait();
  }
  double sumsq = 0.0;
  if (overflow == 0.0f) {
    for (std::size_t u = 0; u < layout_units_; ++u) {
      const std::size_t S = layout_->unit(static_cast<int>(u)).slice_elems;
      if (S > 0) sumsq += kernels::squared_l2_norm_cpu(grad_at(own, static_cast<int>(u), 0), accum_dtype_, S, exec_);
    }
    if (world_ > 1) comm_.all_reduce(&sumsq, &sumsq, 1, DType::F64, ReduceOp::Sum).wait();
  }

  norm_timer.reset();

  // Per-group coefficients, validated before any write.
  std::vector<kernels::OptimizerHyper> hypers;
  std::vector<kernels::StepScalars> scalars;
  const double prev_scale = scaler_->scale();
  LossScaler scaler_after = *scaler_;
  scaler_after.update(overflow != 0.0f);  // throws at min scale, state unchanged
  const double norm = std::sqrt(sumsq);
  double clip_coef = 1.0;
  if (clip_ > 0 && std::isfinite(norm)) {
    clip_coef = std::max(1.0, (norm / scaler_after.scale() + 1e-6) / clip_);
  }
  if (overflow == 0.0f) {
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
      kernels::StepScalars sc{v.lr, applied_steps_ + 1, 1.0 / (scaler_after.scale() * clip_coef)};
      (void)kernels::make_step_coeffs(hyper, sc);  // validates
      hypers.push_back(hyper);
      scalars.push_back(sc);
    }
  }

  // Commit.
  *scaler_ = scaler_after;
  ++global_steps_;
  micro_in_window_ = 0;
  window_first_reduction_ = true;
  reset_micro_step();
  result.global_steps = global_steps_;
  result.grad_norm = norm / prev_scale;
  if (overflow != 0.0f) {
    ++skipped_steps_;
    result.skipped = true;
    result.skipped_steps = skipped_steps_;
    result.grad_norm = std::numeric_limits<double>::quiet_NaN();
    return result;
  }
  result.lr = scalars[0].lr;
  std::optional<ScopedTimer> optimizer_timer(std::in_place, timings_.optimizer_s);
  for (const OptimizerRun& run : runs_) {
    const auto g = static_cast<std::size_t>(run.group);
    optimizer_run(run, hypers[g], scalars[g]);
  }
  optimizer_timer.reset();
  ++applied_steps_;
  ++last_batch_iteration_;
  all_gather_model();
  if (fetcher_) fetcher_->refresh_after_step();
  return result;
}

void EngineImpl::optimizer_run(const OptimizerRun& run, const kernels::OptimizerHyper& hyper,
                               const kernels::StepScalars& scalars) {
  const std::size_t off = domain_offset(run.domain) + layout_->unit(run.unit).partition_offset + run.begin;
  const std::size_t n = run.end - run.begin;
  std::byte* model_out = model_at(run);
  const std::byte* grad = grad_at(run.domain, run.unit, run.begin);
  kernels::OptimizerTensors t;
  t.grad_dtype = accum_dtype_;
  t.state_dtype = state_dtype_;
  // A 16-bit model copy is written by the kernel, rounded once from the updated master.
  if (model_dtype_ != DType::F32) t.param_out_dtype = model_dtype_;
  constexpr std::size_t kTile = 1 << 16;
  const std::size_t tile = master_dtype_ == DType::F32 ? std::max<std::size_t>(n, 1) : kTile;
  for (std::size_t b = 0; b < n; b += tile) {
    const std::size_t m = std::min(tile, n - b);
    if (master_dtype_ == DType::F32) {
      t.master = reinterpret_cast<float*>(master_at(off + b));
    } else {
      master_tile_.resize(m);
      combine(master_tile_.data(), DType::F32, master_at(off + b), master_dtype_, m, 1.0f, false, exec_);
      t.master = master_tile_.data();
    }
    t.grad = grad + b * dtype_size(accum_dtype_);
    if (!states_.empty()) t.state0 = state_at(0, off + b);
    if (states_.size() > 1) t.state1 = state_at(1, off + b);
    if (model_dtype_ != DType::F32) t.param_out = model_out + b * dtype_size(model_dtype_);
    t.numel = m;
    kernels::optimizer_step_cpu(hyper, scalars, t, exec_);
    if (model_dtype_ == DType::F32) {
      std::memcpy(model_out + b * sizeof(float), t.master, m * sizeof(float));
    }
    if (master_dtype_ != DType::F32) {
      // The master keeps what the model copy got: the update rounded once to bf16.
      combine(master_at(off + b), master_dtype_, t.master, DType::F32, m, 1.0f, false, exec_);
    }
  }
}

std::byte* EngineImpl::model_at(const OptimizerRun& run) const {
  const UnitLayout& ul = layout_->unit(run.unit);
  if (stage_ == 3) return at(model_part_, model_dtype_, ul.partition_offset + run.begin);
  return at(units_[static_cast<std::size_t>(run.unit)].model, model_dtype_,
            static_cast<std::size_t>(domain_rank(run.domain)) * ul.slice_elems + run.begin);
}

double EngineImpl::current_lr(int group) const {
  ZERO_CHECK(group >= 0 && static_cast<std::size_t>(group) < groups_.size(), "current_lr: unknown group {}",
             group);
  GroupBase base{groups_[static_cast<std::size_t>(group)].base_lr, std::nullopt};
  return scheduled_values(schedule_, base, static_cast<std::size_t>(group), last_batch_iteration_).lr;
}

std::vector<float> EngineImpl::gather_master(std::size_t param) {
  check_param(param, "gather_master");
  const ParamState& ps = params_[param];
  std::vector<float> out(ps.numel);
  if (!ps.layout_index) {
    combine(out.data(), DType::F32, ps.frozen.data(), model_dtype_, ps.numel, 1.0f, false, exec_);
    return out;
  }
  const ParamPlacement& pl = layout_->placement(*ps.layout_index);
  const UnitLayout& ul = layout_->unit(pl.unit);
  std::vector<std::byte> flat(ul.padded_elems * dtype_size(master_dtype_));
  const std::size_t slice_bytes = ul.slice_elems * dtype_size(master_dtype_);
  if (stage_ == 0) {
    for (int d = 0; d < world_; ++d) {
      std::memcpy(flat.data() + static_cast<std::size_t>(d) * slice_bytes,
                  master_at(domain_offset(d) + ul.partition_offset), slice_bytes);
    }
  } else if (ul.slice_elems > 0) {
    comm_.all_gather(master_at(ul.partition_offset), flat.data(), ul.slice_elems, master_dtype_).wait();
  }
  combine(out.data(), DType::F32, flat.data() + pl.offset * dtype_size(master_dtype_), master_dtype_,
          ps.numel, 1.0f, false, exec_);
  return out;
}

std::vector<std::byte> EngineImpl::gather_model(std::size_t param) {
  check_param(param, "gather_model");
  const ParamState& ps = params_[param];
  const std::size_t bytes = ps.numel * dtype_size(model_dtype_);
  std::vector<std::byte> out(bytes);
  if (!ps.layout_index || !fetcher_) {
    if (bytes > 0) std::memcpy(out.data(), this->param(param).data(), bytes);
    return out;
  }
  const ParamPlacement& pl = layout_->placement(*ps.layout_index);
  const UnitLayout& ul = layout_->unit(pl.unit);
  if (ul.slice_elems == 0) return out;
  Buffer flat = alloc(ul.padded_elems, model_dtype_, MemoryTag::Staging);
  comm_.all_gather(at(model_part_, model_dtype_, ul.partition_offset), flat.data(), ul.slice_elems,
                   model_dtype_)
      .wait();
  std::memcpy(out.data(), at(flat, model_dtype_, pl.offset), bytes);
  return out;
}

}  // namespace zero::engine_detail

namespace zero {

std::unique_ptr<Engine> Engine::create(const config::DsConfig& config, Communicator& comm,
                                       Device& device, std::span<const ParamSpec> params,
                                       const InitFn& init, const EngineOptions& options) {
  ZERO_CHECK(static_cast<bool>(init), "Engine::create: no InitFn given");
  auto engine = std::make_unique<engine_detail::EngineImpl>(config, comm, device, params, options);
  engine->build(init, options);
  return engine;
}

}  // namespace zero
