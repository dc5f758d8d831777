#include "kernels/combine.h"
#include "kernels/compute.h"
#include "kernels/norm.h"
#include "kernels/traffic_probe.h"
#include "kernels/unscale.h"

namespace zero::kernels {

const ComputeKernels& cpu_compute_kernels() {
  static const ComputeKernels table{
      .backend = "cpu",
      .optimizer_step = &optimizer_step_cpu,
      .unscale_and_check = &unscale_and_check_cpu,
      .squared_l2_norm = &squared_l2_norm_cpu,
      .combine = &combine_cpu,
      .fill_zero = &fill_zero_cpu,
      .traffic_probe = &traffic_probe_cpu,
  };
  return table;
}

}  // namespace zero::kernels
