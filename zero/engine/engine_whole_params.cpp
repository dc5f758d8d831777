// Whole parameters outside a micro-step: reading one parameter's full master or model value, and
// replacing it (what `zero.GatheredParameters(..., modifier_rank=r)` does on exit). Each is
// collective where the value is spread over ranks: every rank calls it for the same parameters
// in the same order. Values cross between the device and the host with device_.copy; the
// collectives on host vectors go through the control communicator.
#include <algorithm>
#include <cstring>

#include "zero/engine/engine_impl.h"

namespace zero::engine_detail {

std::vector<std::byte> EngineImpl::gather_master_unit(int unit) {
  const UnitLayout& ul = layout_->unit(unit);
  const DType master_dtype = optimizer_->master_dtype();
  std::vector<std::byte> flat(ul.padded_elems * dtype_size(master_dtype));
  const std::size_t slice_bytes = ul.slice_elems * dtype_size(master_dtype);
  // Domain d's slice of the unit, from whichever tier holds it.
  auto read_slice = [&](int d, std::byte* dst) {
    optimizer_->read_tensor(0, d, ul.partition_offset, ul.slice_elems,
                            [&](const std::byte* data, std::size_t n) {
                              const std::size_t bytes = n * dtype_size(master_dtype);
                              device_.copy(dst, data, bytes);
                              dst += bytes;
                            });
  };
  if (stage_ == 0) {
    for (int d = 0; d < world_; ++d) {
      read_slice(d, flat.data() + static_cast<std::size_t>(d) * slice_bytes);
    }
  } else if (ul.slice_elems > 0) {
    std::vector<std::byte> mine(slice_bytes);
    read_slice(0, mine.data());
    control_.all_gather(mine.data(), flat.data(), ul.slice_elems, master_dtype).wait();
  }
  return flat;
}

std::vector<float> EngineImpl::gather_master(std::size_t param) {
  check_param(param, "gather_master");
  const ParamState& ps = params_[param];
  std::vector<float> out(ps.numel);
  if (!ps.layout_index) {
    const std::vector<std::byte> raw =
        ps.quantized ? ps.quantized->read()
                     : to_host(ps.frozen.data(), ps.numel * dtype_size(model_dtype_));
    host_combine(out.data(), DType::F32, raw.data(), model_dtype_, ps.numel);
    return out;
  }
  const ParamPlacement& pl = layout_->placement(*ps.layout_index);
  const DType master_dtype = optimizer_->master_dtype();
  const std::vector<std::byte> flat = gather_master_unit(pl.unit);
  host_combine(out.data(), DType::F32, flat.data() + pl.offset * dtype_size(master_dtype),
               master_dtype, ps.numel);
  return out;
}

std::vector<std::byte> EngineImpl::gather_model(std::size_t param) {
  check_param(param, "gather_model");
  const ParamState& ps = params_[param];
  const std::size_t bytes = ps.numel * dtype_size(model_dtype_);
  if (ps.quantized) return ps.quantized->read();
  std::vector<std::byte> out(bytes);
  if (!ps.layout_index || !fetcher_) {
    if (bytes > 0) device_.copy(out.data(), this->param(param).data(), bytes);
    return out;
  }
  const ParamPlacement& pl = layout_->placement(*ps.layout_index);
  const UnitLayout& ul = layout_->unit(pl.unit);
  if (ul.slice_elems == 0) return out;
  Buffer flat = alloc(ul.padded_elems, model_dtype_, MemoryTag::Staging);
  Buffer mine = alloc(ul.slice_elems, model_dtype_, MemoryTag::Staging);
  copy_own_slice(pl.unit, static_cast<std::byte*>(mine.data()));
  comm_.all_gather(mine.data(), flat.data(), ul.slice_elems, model_dtype_).wait();
  device_.copy(out.data(), element_at(flat, model_dtype_, pl.offset), bytes);
  return out;
}

void EngineImpl::set_param(std::size_t param, std::span<const float> values, int root) {
  check_param(param, "set_param");
  check_not_begun_in_backward("set_param");
  ZERO_CHECK(root >= 0 && root < world_, "set_param: root {} is not a rank (the world has {})",
             root, world_);
  const ParamState& ps = params_[param];
  ZERO_CHECK(rank_ != root || values.size() == ps.numel,
             "set_param: parameter '{}' has {} elements, but {} values were given on rank {}",
             specs_[param].name, ps.numel, values.size(), root);
  std::vector<float> v(ps.numel);
  if (rank_ == root && !v.empty()) std::memcpy(v.data(), values.data(), v.size() * sizeof(float));
  if (world_ > 1 && !v.empty()) control_.broadcast(v.data(), v.size(), DType::F32, root).wait();

  // The model copy's new value, rounded from the new master value as a step would.
  std::vector<std::byte> rounded(ps.numel * dtype_size(model_dtype_));
  host_combine(rounded.data(), model_dtype_, v.data(), DType::F32, v.size());
  if (!ps.layout_index) {  // frozen: only its model copy (or its quantized shard)
    if (ps.quantized) {
      ps.quantized->set(rounded.data());
    } else if (!rounded.empty()) {
      device_.copy(ps.frozen.data(), rounded.data(), rounded.size());
    }
    return;
  }
  const ParamPlacement& pl = layout_->placement(*ps.layout_index);
  const UnitLayout& ul = layout_->unit(pl.unit);
  // The master weights: the unit's whole value with this parameter replaced, set on every
  // domain (set_master takes a whole unit; padding and the other parameters keep their bits).
  const DType master_dtype = optimizer_->master_dtype();
  const std::vector<std::byte> unit_master = gather_master_unit(pl.unit);
  std::vector<float> flat(ul.padded_elems);
  host_combine(flat.data(), DType::F32, unit_master.data(), master_dtype, flat.size());
  std::memcpy(flat.data() + pl.offset, v.data(), v.size() * sizeof(float));
  optimizer_->set_master(pl.unit, {optimizer_input(flat), flat.size()});
  upload_.reset();
  optimizer_->store().flush();

  if (!fetcher_) {
    device_.copy(
        units_[static_cast<std::size_t>(pl.unit)].model + pl.offset * dtype_size(model_dtype_),
        rounded.data(), rounded.size());
    return;
  }
  // Stage 3: this rank's slice (the part of [offset, offset + numel) it owns), then any gathered
  // copy, so a parameter read inside GatheredParameters shows the new value at once.
  const std::size_t lo = static_cast<std::size_t>(rank_) * ul.slice_elems;
  const std::size_t begin = std::max(lo, pl.offset);
  const std::size_t end = std::min(lo + ul.slice_elems, pl.offset + ps.numel);
  const std::size_t es = dtype_size(model_dtype_);
  if (begin < end) {
    device_.copy(own_slice(pl.unit, begin - lo), rounded.data() + (begin - pl.offset) * es,
                 (end - begin) * es);
    if (param_store_) param_store_->flush();
  }
  fetcher_->overwrite(pl.unit, pl.offset, rounded.data(), ps.numel);
}

}  // namespace zero::engine_detail
