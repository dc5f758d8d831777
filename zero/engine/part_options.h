// What a resolved ds_config asks of the engine's parts: one place that reads the config's
// precision, reduction, offload and stage-3 keys and turns them into the options GradientReducer,
// PartitionOptimizer and ParamFetcher take (DeepSpeed's names stay at this boundary).
#pragma once

#include "config/ds_config.h"
#include "kernels/isa.h"
#include "zero/engine/gradient_reducer.h"
#include "zero/engine/param_fetcher.h"
#include "zero/engine/partition_optimizer.h"

namespace zero::engine_detail {

struct PartOptions {
  ReducerOptions reducer;
  PartitionOptions partition;  // without `optimizer`: the engine sets it from its param groups
  FetchOptions fetch;          // stage 3
  // Stages 1/2: elements of the updated model copy's all-gathers in flight (allgather_bucket_size).
  std::size_t allgather_bucket_elems = 1;
  // Where the stage-3 model copy's own slices live (offload_param): memory of param_kind, or,
  // with param_nvme, one swap record per unit (no unit slice above param_buffer_elems).
  MemoryKind param_kind = MemoryKind::Device;
  std::optional<offload::NvmeTier> param_nvme;
  std::size_t param_buffer_elems = 0;
  // With param_nvme: elements of whole unit records kept in host memory (max_in_cpu).
  std::size_t param_cache_elems = 0;
};

// Throws ConfigError listing every finding that makes the config unrunnable (not supported yet,
// values still to be supplied) and a resolved world size other than `world`.
void refuse_blockers(const config::DsConfig& cfg, int world);

// The parts' options for `rank` of `world`. Throws zero::Error for fp64 gradients.
PartOptions part_options(const config::DsConfig& cfg, int rank, int world,
                         const kernels::CpuExec& exec);

}  // namespace zero::engine_detail
