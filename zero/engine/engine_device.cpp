// The engine on a device whose memory the host cannot address (a GPU): values between host code
// and engine memory (staging through Device::copy, conversions on the CPU), what such a device
// refuses by name, and whether it has room for the configured buckets (and the two-level
// collectives' scratch beside them). On the CPU device these
// are pass-throughs (host_memory_).
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/compute.h"
#include "zero/base/format.h"
#include "zero/comm/hierarchical_comm.h"
#include "zero/engine/engine_impl.h"

namespace zero::engine_detail {

void EngineImpl::host_combine(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                              std::size_t numel) const {
  kernels::cpu_compute_kernels().combine(dst, dst_dtype, src, src_dtype, numel, 1.0f, false, exec_);
}

const float* EngineImpl::readable(std::span<const float> host) {
  if (host_memory_ || host.empty()) return host.data();
  const std::size_t bytes = host.size_bytes();
  if (upload_.size_bytes() < bytes) {
    upload_.reset();
    upload_ = device_.allocate(bytes, MemoryKind::Device, MemoryTag::Staging);
  }
  device_.copy(upload_.data(), host.data(), bytes);
  return static_cast<const float*>(upload_.data());
}

std::vector<std::byte> EngineImpl::to_host(const void* src, std::size_t bytes) {
  std::vector<std::byte> out(bytes);
  if (bytes > 0) device_.copy(out.data(), src, bytes);
  return out;
}

// On a device whose memory the host cannot address (a GPU), offload_optimizer (cpu or nvme, every
// sub-group: ratio 1) steps the partition on the host (host_step_), and stage 3's offload_param
// then keeps the own slices there too (copied to the device for each gather); what does not run
// there yet is refused by name before anything is allocated: a partial offload (ratio < 1) and
// offload_param without the optimizer offloaded.
void EngineImpl::refuse_on_device() const {
  if (host_memory_) return;
  const PartitionOptions& p = parts_.partition;
  const std::string where =
      fmt::format("not supported on a \"{}\" device yet (issue 16); it runs with ZERO_DEVICE=cpu",
                  device_.name());
  std::vector<ConfigError::Problem> problems;
  const bool offloaded = p.store.nvme || p.kind != MemoryKind::Device ||
                         (p.store.ratio > 0 && p.store.offload_kind != MemoryKind::Device);
  if (offloaded && p.store.ratio < 1.0) {
    problems.push_back({"zero_optimization.offload_optimizer.ratio",
                        fmt::format("{} (part of the optimizer on the device, part on the host) is "
                                    "{}, or set the ratio to 1",
                                    p.store.ratio, where)});
  }
  if (params_offloaded_ && !host_step_) {
    problems.push_back({"zero_optimization.offload_param",
                        "without offload_optimizer (device \"cpu\" or \"nvme\", ratio 1) is " +
                            where + ", or offload the optimizer too"});
  }
  if (!problems.empty()) throw ConfigError(std::move(problems));
}

std::size_t EngineImpl::level_scratch_bytes() const {
  const auto* nodes = dynamic_cast<const HierarchicalComm*>(&comm_);
  if (nodes == nullptr) return 0;
  // A unit is gathered whole and may be reduced alone; a bucket's pieces are at most its chunk.
  std::size_t slice = 0;
  for (std::size_t u = 0; u < num_units_; ++u)
    slice = std::max(slice, layout_->unit(static_cast<int>(u)).slice_elems);
  const std::size_t chunk = std::max(slice, reducer_->bucket_chunk_capacity());
  const ReducerOptions& ro = parts_.reducer;
  const HierarchicalComm::LevelScratch reduce =
      stage_ != 0 && ro.reduce_scatter
          ? nodes->device_scratch(Collective::ReduceScatter, chunk, ro.comm_dtype, ro.op,
                                  ro.quantize_bits)
          : nodes->device_scratch(Collective::AllReduce, static_cast<std::size_t>(world_) * chunk,
                                  ro.comm_dtype, ro.op);
  const HierarchicalComm::LevelScratch gather =
      nodes->device_scratch(Collective::AllGather, slice, model_dtype_);
  const HierarchicalComm::LevelScratch held = nodes->device_scratch_held();
  std::size_t bytes = 0;
  for (std::size_t s = 0; s < reduce.size(); ++s) {
    const std::size_t want = std::max(reduce[s], gather[s]);
    bytes += want > held[s] ? want - held[s] : 0;
  }
  return bytes;
}

void EngineImpl::check_bucket_room() const {
  const std::optional<std::size_t> room = device_.device_room();
  const std::size_t buckets = reducer_->bucket_bytes();
  const std::size_t levels = level_scratch_bytes();
  if (!room || buckets + levels <= *room) return;
  const std::string scratch =
      levels == 0 ? std::string()
                  : fmt::format(", and the collectives between nodes {} of scratch for them and "
                                "the largest unit's gather",
                                format_bytes(levels));
  throw ConfigError(
      {{"zero_optimization.reduce_bucket_size",
        fmt::format("{} elements make {} of reduction buckets per rank ({} with "
                    "overlap_comm {}){}, but rank {}'s {} device has {} left after the "
                    "model and optimizer state; lower reduce_bucket_size (or raise "
                    "the device memory budget)",
                    cfg_.zero_optimization.reduce_bucket_elems, format_bytes(buckets),
                    parts_.reducer.overlap_comm ? "two slots" : "one slot",
                    parts_.reducer.overlap_comm, scratch, rank_, device_.name(),
                    format_bytes(*room))}});
}

}  // namespace zero::engine_detail
