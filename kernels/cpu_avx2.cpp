// The avx2 instantiation of the CPU range functions; compiled with this ISA's flags only
// (kernels/CMakeLists.txt) and entered only after isa_supported() said yes.
#include "kernels/cpu_impl.h"

namespace zero::kernels::detail {

const CpuKernels& cpu_kernels_avx2() {
#if defined(__AVX2__)
  static constexpr CpuKernels kKernels = math::make_cpu_kernels<math::Avx2Ops>();
  return kKernels;
#else
  // Not an x86-64 build: isa_supported() never selects this path.
  return cpu_kernels_scalar();
#endif
}

}  // namespace zero::kernels::detail
