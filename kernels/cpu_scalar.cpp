// The scalar instantiation of the CPU range functions; compiled with this ISA's flags only
// (kernels/CMakeLists.txt) and entered only after isa_supported() said yes.
#include "kernels/cpu_impl.h"

namespace zero::kernels::detail {

const CpuKernels& cpu_kernels_scalar() {
  static constexpr CpuKernels kKernels = math::make_cpu_kernels<math::ScalarOps>();
  return kKernels;
}

}  // namespace zero::kernels::detail
