#include "kernels/combine.h"
#include "kernels/compute.h"
#include "kernels/norm.h"
#include "kernels/reduce.h"
#include "kernels/traffic_probe.h"
#include "kernels/unscale.h"

namespace zero::kernels {

namespace {

// One thread, as the communicators' reductions (zero/comm/reduce_math.cpp): the caller is a
// communication thread.
void reduce(void* dst, const void* const* srcs, int nsrc, std::size_t numel, DType dtype,
            ReduceKind kind, float divisor, const CpuExec& exec) {
  reduce_cpu(dst, srcs, nsrc, numel, dtype, kind, divisor, exec.isa);
}

}  // namespace

const ComputeKernels& cpu_compute_kernels() {
  static const ComputeKernels table{
      .backend = "cpu",
      .optimizer_step = &optimizer_step_cpu,
      .unscale_and_check = &unscale_and_check_cpu,
      .squared_l2_norm = &squared_l2_norm_cpu,
      .combine = &combine_cpu,
      .fill_zero = &fill_zero_cpu,
      .reduce = &reduce,
      .traffic_probe = &traffic_probe_cpu,
  };
  return table;
}

}  // namespace zero::kernels
