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

// ---------------------------------------------------------------------------------------------
// construction

namespace {

std::string spec_fingerprint(const ParamSpec& p) {
  return fmt::format("{}|{}|{}|{}|{}|{}|{};", p.name, fmt::join(p.shape, "x"), dtype_name(p.dtype),
                     p.group, p.unit, p.trainable, fmt::join(p.tied_names, ","));
}

std::string specs_fingerprint(std::span<const ParamSpec> specs) {
  std::string s;
  for (const ParamSpec& p : specs) s += spec_fingerprint(p);
  return s;
}

// Collective: every rank registered the same specs. When they did not, the error on every rank
// also names the first parameter that differs, as this rank registered it (one more agreement
// check per parameter up to it: the failure path only).
void check_specs_agree(Communicator& comm, std::span<const ParamSpec> specs) {
  constexpr std::string_view kWhat =
      "the parameter specs (name, shape, dtype, group, unit, trainable)";
  try {
    check_agreement(comm, kWhat, specs_fingerprint(specs));
    return;
  } catch (const CommError& e) {
    std::array<double, 2> counts{static_cast<double>(specs.size()),
                                 -static_cast<double>(specs.size())};
    comm.all_reduce(counts.data(), counts.data(), counts.size(), DType::F64, ReduceOp::Max).wait();
    const auto common = static_cast<std::size_t>(-counts[1]);
    for (std::size_t i = 0; i < common; ++i) {
      try {
        check_agreement(comm, "a parameter spec", spec_fingerprint(specs[i]));
      } catch (const CommError&) {
        const ParamSpec& p = specs[i];
        throw CommError(fmt::format(
            "{}. The first that differs is parameter {}, on rank {} '{}' of shape [{}], {}{}: "
            "build the same model on every rank",
            e.what(), i, comm.rank(), p.name, fmt::join(p.shape, ", "), dtype_name(p.dtype),
            p.trainable ? "" : ", frozen"));
      }
    }
    throw CommError(fmt::format(
        "{}. Ranks register different numbers of parameters (this rank, "
        "{}, has {}; between {} and {} across ranks)",
        e.what(), comm.rank(), specs.size(), common, static_cast<std::size_t>(counts[0])));
  }
}

kernels::CpuExec exec_of(const EngineOptions& options) {
  kernels::CpuExec exec;
  exec.threads = options.kernel_threads;
  if (!options.kernel_isa.empty()) {
    const std::optional<kernels::Isa> isa = kernels::parse_isa(options.kernel_isa);
    ZERO_CHECK(isa.has_value(), "EngineOptions::kernel_isa '{}': use auto, scalar, avx2 or avx512",
               options.kernel_isa);
    exec.isa = *isa;
  }
  return exec;
}

}  // namespace

EngineImpl::EngineImpl(const config::DsConfig& cfg, Communicator& comm, Device& device,
                       std::span<const ParamSpec> params, const EngineOptions& options)
    : cfg_(cfg),
      mics_(make_mics_comm(cfg, comm, options)),
      comm_(mics_ ? *mics_ : comm),
      control_(options.control_comm != nullptr ? *options.control_comm : comm_),
      host_memory_(device.host_addressable()),
      device_(device),
      compute_(device.compute()),
      exec_(exec_of(options)),
      specs_(params.begin(), params.end()) {}

EngineImpl::~EngineImpl() = default;

void EngineImpl::build(const InitFn& init, const EngineOptions& options) {
  rank_ = comm_.rank();
  world_ = comm_.size();
  ZERO_CHECK(control_.rank() == rank_ && control_.size() == world_,
             "Engine::create: EngineOptions::control_comm is rank {} of {}, the engine's "
             "communicator rank {} of {}: pass the host communicator of the same ranks",
             control_.rank(), control_.size(), rank_, world_);
  // Under MiCS the config's world is every replica's ranks, the engine's the shard group's.
  refuse_blockers(cfg_, mics_ ? world_ * mics_->replicas() : world_);
  read_options(options);
  refuse_on_device();
  register_specs(options);
  check_agreement(control_, "the resolved ds_config", cfg_.to_json().dump());
  check_specs_agree(control_, specs_);
  init_state(init);
  check_bucket_room();
  if (stage_ == 3) {
    ParamFetcher::SliceSource source;
    // Slices the device's collectives cannot read in place are copied to it for each gather.
    if (param_store_ || (params_offloaded_ && !host_memory_))
      source = [this](int unit, std::byte* out) { copy_own_slice(unit, out); };
    FetchOptions fetch = parts_.fetch;
    fetch.control = &control_;
    hpz_comm_ = make_hpz_comm(cfg_, comm_, mics_ != nullptr);
    fetch.secondary = hpz_comm_.get();
    fetch.exec = exec_;
    if (fetch.weight_bits != 0 && !host_memory_) {
      throw ConfigError("zero_optimization.zero_quantized_weights",
                        "quantized weight gathers run on engines in host memory (the CPU) in this "
                        "version; on a GPU set it to false");
    }
    fetcher_ = std::make_unique<ParamFetcher>(comm_, device_, *layout_, num_units_, model_dtype_,
                                              static_cast<const std::byte*>(model_part_.data()),
                                              fetch, timings_, std::move(source));
  }
}

// The config's precision, schedule and scaler, and what it asks of the parts.
void EngineImpl::read_options(const EngineOptions& options) {
  stage_ = cfg_.zero_optimization.stage;
  gas_ = static_cast<int>(cfg_.gradient_accumulation_steps.value_or(1));
  model_dtype_ = cfg_.model_dtype;
  check_overflow_ = cfg_.fp16.enabled || (cfg_.bf16.enabled && cfg_.bf16.check_grad_overflow);
  ignore_unused_ = cfg_.zero_optimization.ignore_unused_parameters;
  clip_ = cfg_.gradient_clipping;
  parts_ = part_options(cfg_, rank_, world_, exec_);
  parts_.reducer.quantize_bits = qgz_bits(cfg_, comm_, options, mics_ != nullptr, notes_);
  if (const auto& loco = cfg_.zero_optimization.zeropp_loco_param; loco && stage_ == 3) {
    if (parts_.reducer.quantize_bits != 0) {
      parts_.reducer.loco_beta = static_cast<float>(loco->err_beta);
      parts_.reducer.loco_reset_steps = loco->reset_T;
    } else if (cfg_.zero_optimization.zero_quantized_gradients) {
      notes_.push_back("zeropp_loco_param: gradients are reduced exactly here (see the note on "
                       "zero_quantized_gradients), so there is no quantization error to feed back");
    }
  }
  PartitionOptions& p = parts_.partition;
  params_offloaded_ = stage_ == 3 && (parts_.param_nvme || parts_.param_kind != MemoryKind::Device);
  host_step_ = !host_memory_ && stage_ >= 1 && (p.store.nvme || p.kind != MemoryKind::Device) &&
               p.store.ratio >= 1.0;
  if (host_step_) {
    // Everything the CPU kernels touch is host memory: gradients and, with NVMe, the sub-groups'
    // buffers too (on the CPU device the kinds only name the ledger's columns).
    p.kind = p.store.offload_kind;
    parts_.reducer.host_landing = &kernels::cpu_compute_kernels();
  }
  std::vector<GroupOverrides> overrides;
  for (const ParamGroupOptions& g : options.groups) overrides.push_back({g.lr, g.weight_decay});
  groups_ = group_optimizers(cfg_, overrides);
  parts_.partition.optimizer = groups_[0].hyper;
  schedule_ = lr_schedule_from_config(cfg_);
  scaler_.emplace(loss_scaler_from_config(cfg_));
}

void EngineImpl::register_specs(const EngineOptions& options) {
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
                 "parameter '{}': tied name '{}' is empty or already a parameter or alias", s.name,
                 alias);
    }
    ZERO_CHECK(s.dtype == model_dtype_,
               "parameter '{}' has dtype {} but the config trains in {} (fp16/bf16 blocks); "
               "register it as {}",
               s.name, dtype_name(s.dtype), dtype_name(model_dtype_), dtype_name(model_dtype_));
    ZERO_CHECK(s.unit >= 0, "parameter '{}': unit {} is negative", s.name, s.unit);
    ZERO_CHECK(s.group >= 0 && static_cast<std::size_t>(s.group) < groups_.size(),
               "parameter '{}': param group {} has no options (EngineOptions::groups has {})",
               s.name, s.group, options.groups.size());
    for (std::int64_t d : s.shape) {
      ZERO_CHECK(d >= 0, "parameter '{}': negative dimension {} in its shape", s.name, d);
    }
    params_[i].numel = static_cast<std::size_t>(numel_of(s.shape));
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
    if (params_[i].layout_index)
      units_[static_cast<std::size_t>(specs_[i].unit)].trainable.push_back(i);
  }
}

// Rank 0 initialises each unit in full, broadcasts it, and every rank keeps what its stage needs.
void EngineImpl::init_state(const InitFn& init) {
  SliceMap& slices = *this;
  if (host_step_ && !params_offloaded_) {  // the model copy is the device's: write a mirror
    mirror_ = std::make_unique<HostModelMirror>(
        device_, *layout_, Domains{rank_, world_, stage_ == 0}, model_dtype_, slices, timings_);
  }
  optimizer_ = std::make_unique<PartitionOptimizer>(
      device_, host_step_ ? kernels::cpu_compute_kernels() : compute_, *layout_, parts_.partition,
      mirror_ ? static_cast<SliceMap&>(*mirror_) : slices);
  if (stage_ == 3) make_param_store();
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
    if (world_ > 1 && !flat.empty())
      control_.broadcast(flat.data(), flat.size(), DType::F32, 0).wait();
    const float* values = readable(flat);
    optimizer_->set_master(static_cast<int>(u), {host_step_ ? flat.data() : values, flat.size()});
    if (stage_ == 3) {
      const std::size_t mine = static_cast<std::size_t>(rank_) * ul.slice_elems;
      std::byte* slice = ul.slice_elems > 0 ? own_slice(static_cast<int>(u), 0) : nullptr;
      if (slice != nullptr && params_offloaded_) {  // host memory, whatever the device
        host_combine(slice, model_dtype_, flat.data() + mine, DType::F32, ul.slice_elems);
      } else if (slice != nullptr) {
        combine(slice, model_dtype_, values + mine, DType::F32, ul.slice_elems);
      }
    } else {
      units_[u].model = alloc(ul.padded_elems, model_dtype_, MemoryTag::LowPrecisionParams);
      combine(units_[u].model.data(), model_dtype_, values, DType::F32, ul.padded_elems);
    }
  }
  optimizer_->store().flush();  // the last NVMe sub-group set, to its swap file
  if (param_store_) param_store_->flush();
  reducer_ = std::make_unique<GradientReducer>(comm_, device_, compute_, *layout_, parts_.reducer,
                                               slices, timings_);
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    if (params_[i].layout_index) continue;
    flat.assign(params_[i].numel, 0.0f);
    if (rank_ == 0) init(i, flat);
    if (world_ > 1 && !flat.empty())
      control_.broadcast(flat.data(), flat.size(), DType::F32, 0).wait();
    params_[i].frozen = alloc(params_[i].numel, model_dtype_, MemoryTag::LowPrecisionParams);
    combine(params_[i].frozen.data(), model_dtype_, readable(flat), DType::F32, flat.size());
  }
  for (UnitState& u : units_) u.pending = u.trainable.size();
  upload_.reset();
}

std::byte* EngineImpl::gradient(int domain, int unit, std::size_t slice_offset) {
  if (stage_ != 0) return optimizer_->gradient(unit, slice_offset);
  return reducer_->accumulated(domain_rank(domain), unit, slice_offset);
}

std::byte* EngineImpl::model(int domain, int unit, std::size_t slice_offset) {
  const UnitLayout& ul = layout_->unit(unit);
  if (stage_ == 3) return own_slice(unit, slice_offset);
  return element_at(units_[static_cast<std::size_t>(unit)].model, model_dtype_,
                    static_cast<std::size_t>(domain_rank(domain)) * ul.slice_elems + slice_offset);
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
  if (!fetcher_)
    return {element_at(units_[static_cast<std::size_t>(pl.unit)].model, model_dtype_, pl.offset),
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
  if (--units_[static_cast<std::size_t>(unit)].pending == 0) reducer_->unit_complete(unit);
}

// Closes the micro-step's gradients: missing ones count as zero (or are an error), then the
// reducer ends the micro-step (what is left in the buckets is reduced).
void EngineImpl::finish_micro_step() {
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
    reducer_->unit_complete(static_cast<int>(u));
  }
  reducer_->end_micro_step();
}

void EngineImpl::reset_micro_step() {
  for (ParamState& p : params_) p.ready = p.slot_out = false;
  for (UnitState& u : units_) u.pending = u.trainable.size();
}

// ---------------------------------------------------------------------------------------------
// step

// Every collective that can fail runs here, before anything is written: the overflow vote and the
// norm (over this rank's own slices, the same order at every stage), then every group's
// coefficients are validated.
EngineImpl::StepPlan EngineImpl::plan_step() {
  StepPlan plan;
  {
    ScopedTimer timer(timings_.norm_s);
    float overflow = 0.0f;
    if (check_overflow_) {
      overflow = optimizer_->has_overflow() ? 1.0f : 0.0f;
      if (world_ > 1)
        control_.all_reduce(&overflow, &overflow, 1, DType::F32, ReduceOp::Max).wait();
    }
    plan.overflow = overflow != 0.0f;
    double sumsq = 0.0;
    if (!plan.overflow) {
      sumsq = optimizer_->squared_norm();
      if (world_ > 1) control_.all_reduce(&sumsq, &sumsq, 1, DType::F64, ReduceOp::Sum).wait();
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
  if (fetcher_) fetcher_->end_micro_step();
  finish_micro_step();
  if (fetcher_) fetcher_->finish_order_check();
  StepResult result;
  result.loss_scale = scaler_->scale();
  result.global_steps = global_steps_;
  result.skipped_steps = skipped_steps_;
  result.lr = current_lr(0);
  result.grad_norm = std::numeric_limits<double>::quiet_NaN();
  if (!forced_boundary_.value_or(micro_in_window_ + 1 >= gas_)) {
    ++micro_in_window_;
    reset_micro_step();
    return result;
  }
  result.boundary = true;
  const StepPlan plan = plan_step();

  // A new window starts whatever happens below: a failed step discards its gradients.
  micro_in_window_ = 0;
  reducer_->start_window();
  reset_micro_step();
  if (!plan.overflow) {
    ScopedTimer timer(timings_.optimizer_s);
    // Ranks agree that every NVMe write went through before any of them commits; an IoError
    // leaves parameters, master, states, scaler, counters and schedule at the previous step.
    offload::SubgroupStore::Agree agree;
    if (world_ > 1 && (optimizer_->store().nvme_count() > 0 || param_store_)) {
      agree = [this](bool ok) {
        float failed = ok ? 0.0f : 1.0f;
        control_.all_reduce(&failed, &failed, 1, DType::F32, ReduceOp::Max).wait();
        return failed == 0.0f;
      };
    }
    // Stage 3 with its slices in a swap store: the persistent units' new slices are read back
    // before the step commits, so that refresh_after_step() below does no I/O.
    std::function<void()> before_commit;
    if (fetcher_ && param_store_) before_commit = [this] { fetcher_->stage_refresh(); };
    try {
      optimizer_->step(plan.hypers, plan.scalars, agree, param_store_.get(), before_commit);
    } catch (...) {
      if (fetcher_) fetcher_->drop_staged();
      throw;
    }
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
  all_gather_model();
  if (fetcher_) fetcher_->refresh_after_step();
  return result;
}

// Stages 1/2: every rank's updated slices of the model copy to every rank, several units in
// flight up to allgather_bucket_size elements.
void EngineImpl::all_gather_model() {
  if (!gathers_model()) return;
  ScopedTimer timer(timings_.all_gather_s);
  for (Work& w : start_all_gather_model(parts_.allgather_bucket_elems)) w.wait();
}

Work EngineImpl::start_model_gather(std::size_t unit) {
  const UnitLayout& ul = layout_->unit(static_cast<int>(unit));
  return comm_.all_gather_in_place(units_[unit].model.data(), ul.slice_elems, model_dtype_);
}

PartitionOptimizer::ModelEcho EngineImpl::push_model_to_peers() {
  ZERO_ASSERT(gathers_model() && num_domains() == 1 && comm_.shares_address_space());
  std::vector<void*> mine(layout_units_);
  for (std::size_t u = 0; u < layout_units_; ++u) mine[u] = units_[u].model.data();
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

std::vector<Work> EngineImpl::start_all_gather_model(std::size_t window_elems) {
  std::deque<std::pair<Work, std::size_t>> inflight;
  std::size_t inflight_elems = 0;
  for (std::size_t u = 0; gathers_model() && u < layout_units_; ++u) {
    const UnitLayout& ul = layout_->unit(static_cast<int>(u));
    if (ul.padded_elems == 0) continue;
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

std::unique_ptr<Engine> Engine::create(const config::DsConfig& config, Communicator& comm,
                                       Device& device, std::span<const ParamSpec> params,
                                       const InitFn& init, const EngineOptions& options) {
  ZERO_CHECK(static_cast<bool>(init), "Engine::create: no InitFn given");
  auto engine = std::make_unique<engine_detail::EngineImpl>(config, comm, device, params, options);
  engine->build(init, options);
  return engine;
}

void Engine::save_checkpoint(const std::string& dir, const std::string& tag) {
  save_checkpoint(dir, tag, nlohmann::json::object());
}

}  // namespace zero
