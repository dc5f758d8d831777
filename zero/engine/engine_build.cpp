// The engine's construction (zero/engine.h, engine_impl.h): the parameter specs checked and agreed
// between ranks, the config's options read into the three parts' options, the flat layout built,
// and the initial values broadcast from rank 0 into what each rank keeps at its stage.
#include "zero/engine.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string_view>

#include "zero/base/shape.h"
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
      mics_(make_mics_comm(cfg, comm)),
      mics_control_(make_mics_control(cfg, mics_.get(), options)),
      comm_(mics_ ? *mics_ : comm),
      control_(mics_control_               ? *mics_control_
               : options.control_comm != nullptr ? *options.control_comm
                                                 : comm_),
      host_memory_(device.host_addressable()),
      device_(device),
      compute_(device.compute()),
      exec_(exec_of(options)),
      specs_(params.begin(), params.end()) {}

EngineImpl::~EngineImpl() { release_shared_model(); }

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
    if (world_ > 1) {
      fetch.share_pool = [this](std::size_t bytes) {
        return share_host_block(may_share_model(), bytes, MemoryTag::LowPrecisionParams,
                                model_pool_);
      };
    }
    fetcher_ = std::make_unique<ParamFetcher>(comm_, device_, *layout_, num_units_, model_dtype_,
                                              static_cast<const std::byte*>(model_part_.data()),
                                              fetch, timings_, std::move(source));
    // One copy for every rank: the slices live in it from now on (own_slice()).
    if (fetcher_->shares_pool()) model_part_.reset();
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
  // Read once: grad_ready() asks may_fuse_reduction() for every unit.
  const char* fused_env = std::getenv("ZERO_FUSED_REDUCTION");
  fused_.off = fused_env != nullptr && std::string_view(fused_env) == "0";
  const char* in_backward_env = std::getenv("ZERO_STEP_IN_BACKWARD");
  in_backward_.off = in_backward_env != nullptr && std::string_view(in_backward_env) == "0";
  parts_ = part_options(cfg_, rank_, world_, exec_);
  parts_.reducer.quantize_bits = qgz_bits(cfg_, comm_, mics_ != nullptr, notes_);
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
  // Units are numbered over every parameter: frozen ones have units too (LoRA's base layers).
  layout_ = FlatLayout::build(descs, {world_, 1, kSliceAlignElems, specs_.size()});
  layout_units_ = layout_->num_units();
  units_.resize(num_units_);
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    if (params_[i].layout_index)
      units_[static_cast<std::size_t>(specs_[i].unit)].trainable.push_back(i);
  }
}

void EngineImpl::allocate_model_copies() {
  // Each copy starts on a cache line of its own.
  const std::size_t align = std::max<std::size_t>(64 / dtype_size(model_dtype_), 1);
  std::vector<std::size_t> offsets(layout_units_);
  std::size_t total = 0;
  for (std::size_t u = 0; u < layout_units_; ++u) {
    offsets[u] = total;
    total += (layout_->unit(static_cast<int>(u)).padded_elems + align - 1) / align * align;
  }
  if (total == 0) return;
  const std::size_t msize = dtype_size(model_dtype_);
  std::byte* pool = gathers_model() ? share_host_block(may_share_model(), total * msize,
                                                      MemoryTag::LowPrecisionParams, model_pool_)
                                    : nullptr;
  if (pool == nullptr) {
    model_pool_ = alloc(total, model_dtype_, MemoryTag::LowPrecisionParams);
    pool = static_cast<std::byte*>(model_pool_.data());
  }
  for (std::size_t u = 0; u < layout_units_; ++u) {
    if (layout_->unit(static_cast<int>(u)).padded_elems == 0) continue;
    units_[u].model = pool + offsets[u] * msize;
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
  if (stage_ != 3) allocate_model_copies();
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
    // With master_in_model the model copy written below is the master weights already.
    if (!optimizer_->master_in_model())
      optimizer_->set_master(static_cast<int>(u), {host_step_ ? flat.data() : values, flat.size()});
    if (stage_ == 3) {
      const std::size_t mine = static_cast<std::size_t>(rank_) * ul.slice_elems;
      std::byte* slice = ul.slice_elems > 0 ? own_slice(static_cast<int>(u), 0) : nullptr;
      if (slice != nullptr && params_offloaded_) {  // host memory, whatever the device
        host_combine(slice, model_dtype_, flat.data() + mine, DType::F32, ul.slice_elems);
      } else if (slice != nullptr) {
        combine(slice, model_dtype_, values + mine, DType::F32, ul.slice_elems);
      }
    } else if (!shared_model_ || rank_ == 0) {  // a shared copy: rank 0's writes (see below)
      combine(units_[u].model, model_dtype_, values, DType::F32, ul.padded_elems);
    }
  }
  if (shared_model_) comm_.barrier().wait();  // the peers read rank 0's initial copy from here
  optimizer_->store().flush();  // the last NVMe sub-group set, to its swap file
  if (param_store_) param_store_->flush();
  reducer_ = std::make_unique<GradientReducer>(comm_, device_, compute_, *layout_, parts_.reducer,
                                               slices, timings_);
  // Frozen parameters: whole on every rank, or (zero_quantized_nontrainable_weights, above the
  // persistence threshold) this rank's int8 shard, gathered with the unit.
  const auto& z = cfg_.zero_optimization;
  const bool quantize_frozen = stage_ == 3 && z.zero_quantized_nontrainable_weights;
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    if (params_[i].layout_index) continue;
    flat.assign(params_[i].numel, 0.0f);
    if (rank_ == 0) init(i, flat);
    if (world_ > 1 && !flat.empty())
      control_.broadcast(flat.data(), flat.size(), DType::F32, 0).wait();
    if (quantize_frozen &&
        static_cast<std::int64_t>(params_[i].numel) > z.param_persistence_threshold_elems) {
      std::vector<std::byte> rounded(params_[i].numel * dtype_size(model_dtype_));
      host_combine(rounded.data(), model_dtype_, flat.data(), DType::F32, flat.size());
      params_[i].quantized =
          std::make_unique<QuantizedFrozen>(device_, comm_, model_dtype_, params_[i].numel);
      params_[i].quantized->set(rounded.data());
      units_[static_cast<std::size_t>(specs_[i].unit)].quantized_frozen.push_back(i);
      continue;
    }
    params_[i].frozen = alloc(params_[i].numel, model_dtype_, MemoryTag::LowPrecisionParams);
    combine(params_[i].frozen.data(), model_dtype_, readable(flat), DType::F32, flat.size());
  }
  for (UnitState& u : units_) u.pending = u.trainable.size();
  upload_.reset();
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
