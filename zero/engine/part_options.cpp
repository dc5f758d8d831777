#include "zero/engine/part_options.h"

#include <algorithm>

#include "zero/base/error.h"

namespace zero::engine_detail {
namespace {

std::size_t elems(std::int64_t v) {
  return static_cast<std::size_t>(std::max<std::int64_t>(v, 0));
}

template <class Block>
bool offloaded(const std::optional<Block>& block) {
  return block && block->device != config::OffloadDevice::None;
}

offload::AioOptions aio_options(const config::Aio& aio) {
  offload::AioOptions o;
  o.block_size = elems(aio.block_size_bytes);
  o.queue_depth = static_cast<int>(aio.queue_depth);
  o.threads = static_cast<int>(aio.intra_op_parallelism);
  o.single_submit = aio.single_submit;
  o.overlap_events = aio.overlap_events;
  return o;
}

}  // namespace

void refuse_blockers(const config::DsConfig& cfg, int world) {
  std::vector<ConfigError::Problem> problems;
  for (const config::Finding& f : cfg.blockers()) {
    std::string msg = f.message;
    if (f.severity == config::Severity::Unsupported &&
        msg.find("not supported yet") == std::string::npos) {
      msg = "not supported yet: " + msg;
    }
    problems.push_back({f.path, msg});
  }
  if (cfg.world_size && *cfg.world_size != world) {
    problems.push_back({"world_size", fmt::format("the config resolves to {} ranks but the "
                                                  "communicator has {}: supply --world-size {} "
                                                  "or fix the batch sizes",
                                                  *cfg.world_size, world, world)});
  }
  if (!problems.empty()) throw ConfigError(std::move(problems));
}

PartOptions part_options(const config::DsConfig& cfg, int rank, int world,
                         const kernels::CpuExec& exec) {
  const auto& zo = cfg.zero_optimization;
  const int stage = zo.stage;
  PartOptions out;

  ReducerOptions& ro = out.reducer;
  ro.stage = stage;
  ro.grad_dtype = cfg.model_dtype;
  ro.accum_dtype = cfg.data_types.grad_accum_dtype.value_or(cfg.model_dtype);
  ro.comm_dtype = cfg.communication_data_type;
  ZERO_CHECK(ro.accum_dtype != DType::F64 && ro.comm_dtype != DType::F64,
             "fp64 gradients are not supported (data_types.grad_accum_dtype, "
             "communication_data_type)");
  ro.bucket_elems = elems(zo.reduce_bucket_elems);
  ro.overlap_comm = zo.overlap_comm;
  ro.reduce_scatter = zo.reduce_scatter;
  ro.exec = exec;
  const double f = cfg.gradient_predivide_factor;
  if (cfg.gradient_allreduce_sum) {
    ro.op = ReduceOp::Sum;
  } else if (cfg.prescale_gradients) {
    ro.op = ReduceOp::Sum;
    ro.pack_scale = static_cast<float>(1.0 / world);
  } else if (f != 1.0) {
    // DeepSpeed's "allreduce with predivide" (SPEC §3.3 a): ×1/f, sum, ×f/W.
    ro.op = ReduceOp::Sum;
    ro.pack_scale = static_cast<float>(1.0 / f);
    ro.consume_scale = static_cast<float>(f / world);
  }

  PartitionOptions& po = out.partition;
  po.rank = rank;
  po.every_domain = stage == 0;
  po.own_gradients = stage != 0;
  if (cfg.bf16.enabled && cfg.bf16.bf16_master_weights_and_grads) po.master_dtype = DType::BF16;
  if (cfg.bf16.enabled && cfg.bf16.bf16_optimizer_states) po.state_dtype = DType::BF16;
  po.grad_dtype = ro.accum_dtype;
  po.model_dtype = cfg.model_dtype;
  po.exec = exec;
  // Offload (stages 1-3): the first `ratio` of the sub-groups of master weights and states go to
  // host memory ("cpu") or to swap files under nvme_path ("nvme"); the rest stays on the device.
  // Stage 0 keeps everything on the device, as DeepSpeed does.
  offload::StoreOptions& so = po.store;
  so.sub_group_elems = std::max<std::size_t>(elems(zo.sub_group_elems), 1);
  if (offloaded(zo.offload_optimizer) && stage > 0) {
    const config::OffloadOptimizer& oo = *zo.offload_optimizer;
    so.ratio = oo.ratio;
    so.offload_kind = oo.pin_memory ? MemoryKind::PinnedHost : MemoryKind::Host;
    if (oo.device == config::OffloadDevice::Nvme) {
      offload::NvmeTier t;
      t.paths = oo.nvme_paths;
      t.key = "zero_optimization.offload_optimizer.nvme_path";
      t.buffer_count = static_cast<int>(oo.buffer_count);
      t.pipeline_read = oo.pipeline_read;
      t.pipeline_write = oo.pipeline_write;
      t.aio = aio_options(cfg.aio);
      so.nvme = std::move(t);
    } else if (oo.ratio >= 1.0) {
      po.kind = so.offload_kind;  // everything on the host: gradients too
    }
  }
  if (offloaded(zo.offload_param) && stage == 3) {
    const config::OffloadParam& op = *zo.offload_param;
    out.param_kind = op.pin_memory ? MemoryKind::PinnedHost : MemoryKind::Host;
    if (op.device == config::OffloadDevice::Nvme) {
      offload::NvmeTier t;
      t.paths = op.nvme_paths;
      t.key = "zero_optimization.offload_param.nvme_path";
      t.buffer_count = static_cast<int>(std::max<std::int64_t>(op.buffer_count, 1));
      t.file_name = "params.swp";
      t.aio = aio_options(cfg.aio);
      out.param_nvme = std::move(t);
      out.param_buffer_elems = elems(op.buffer_size_elems);
      out.param_cache_elems = elems(op.max_in_cpu_elems);
    }
  }

  // An fp32 model whose master weights stay where the kernels compute keeps them in the model copy
  // itself (PartitionOptimizer's master_in_model): no second fp32 copy, one write pass less a step.
  po.master_in_model = po.master_dtype == DType::F32 && po.model_dtype == DType::F32 &&
                       !so.nvme && (!offloaded(zo.offload_optimizer) || stage == 0) &&
                       !(stage == 3 && offloaded(zo.offload_param));

  out.allgather_bucket_elems = std::max<std::size_t>(elems(zo.allgather_bucket_elems), 1);
  FetchOptions& fo = out.fetch;
  fo.prefetch_bucket_elems = elems(zo.prefetch_bucket_elems);
  fo.max_live_elems = elems(zo.max_live_parameters_elems);
  fo.max_reuse_distance_elems = elems(zo.max_reuse_distance_elems);
  fo.param_persistence_threshold_elems = elems(zo.param_persistence_threshold_elems);
  fo.model_persistence_threshold_elems = elems(zo.model_persistence_threshold_elems);
  fo.weight_bits = stage == 3 && zo.zero_quantized_weights ? 8 : 0;
  return out;
}

}  // namespace zero::engine_detail
