// Stage 3's own slices of the model copy: in param_kind memory, or, under offload_param nvme, in
// a SubgroupStore with one two-slot record per unit, or, where the ranks share one model copy,
// in it (EngineImpl, engine_impl.h).
#include <algorithm>
#include <cstring>

#include "zero/base/error.h"
#include "zero/engine/engine_impl.h"

namespace zero::engine_detail {

// Stage 3: the own slices in param_kind memory, or one NVMe record per unit (offload_param nvme:
// no unit slice may exceed buffer_size, DeepSpeed's rule for its swap buffers). As many records
// as max_in_cpu elements hold, at least one, stay cached in host memory.
void EngineImpl::make_param_store() {
  if (!parts_.param_nvme) {
    model_part_ =
        alloc(partition_elems(), model_dtype_, MemoryTag::LowPrecisionParams, parts_.param_kind);
    return;
  }
  offload::StoreOptions so;
  so.total_elems = partition_elems();
  so.ratio = 1.0;
  so.nvme = parts_.param_nvme;
  std::size_t largest = 1;
  for (std::size_t u = 0; u < layout_units_; ++u) {
    const UnitLayout& ul = layout_->unit(static_cast<int>(u));
    if (ul.slice_elems == 0) continue;
    if (ul.slice_elems > parts_.param_buffer_elems) {
      throw ConfigError("zero_optimization.offload_param.buffer_size",
                        fmt::format("{} elements is smaller than unit {}'s slice of {} on rank {}: "
                                    "raise buffer_size to at least {}",
                                    parts_.param_buffer_elems, u, ul.slice_elems, rank_,
                                    ul.slice_elems));
    }
    so.boundaries.push_back(ul.partition_offset);
    largest = std::max(largest, ul.slice_elems);
  }
  if (!so.boundaries.empty()) so.boundaries.front() = 0;
  so.cache_records = static_cast<int>(std::clamp<std::size_t>(
      parts_.param_cache_elems / largest, 1, std::max<std::size_t>(so.boundaries.size(), 1)));
  param_store_ = std::make_unique<offload::SubgroupStore>(
      device_, std::vector<offload::StoreTensor>{{model_dtype_, MemoryTag::LowPrecisionParams, 0.0f}},
      so);
}

std::byte* EngineImpl::own_slice(int unit, std::size_t slice_offset) {
  if (shared_model_) {  // the slices lie in the one copy every rank shares (ParamFetcher)
    std::byte* slice = fetcher_->shared_slice(unit);
    return slice != nullptr ? slice + slice_offset * dtype_size(model_dtype_) : nullptr;
  }
  const std::size_t at = layout_->unit(unit).partition_offset + slice_offset;
  if (!param_store_) return element_at(model_part_, model_dtype_, at);
  std::byte* out = nullptr;
  param_store_->modify(at, at + 1, [&](const offload::SubgroupStore::View& v) {
    out = v.tensors[0] + (at - v.begin) * dtype_size(model_dtype_);
  });
  return out;
}

void EngineImpl::copy_own_slice(int unit, std::byte* out) {
  const UnitLayout& ul = layout_->unit(unit);
  const std::size_t begin = ul.partition_offset;
  if (!param_store_) {
    if (ul.slice_elems > 0)
      device_.copy(out, own_slice(unit, 0), ul.slice_elems * dtype_size(model_dtype_));
    return;
  }
  param_store_->read(begin, begin + ul.slice_elems, [&](const offload::SubgroupStore::View& v) {
    const std::size_t lo = std::max(begin, v.begin);
    const std::size_t hi = std::min(begin + ul.slice_elems, v.end);
    device_.copy(out + (lo - begin) * dtype_size(model_dtype_),
                 v.tensors[0] + (lo - v.begin) * dtype_size(model_dtype_),
                 (hi - lo) * dtype_size(model_dtype_));
  });
}

}  // namespace zero::engine_detail
