// CPU instruction-set selection and the execution knobs every CPU kernel takes.
#pragma once

#include <optional>
#include <string_view>

namespace zero::kernels {

// Auto picks the best path this CPU supports, unless the environment variable ZERO_ISA names one
// (scalar, avx2, avx512). Every path gives bitwise identical results.
enum class Isa { Auto, Scalar, Avx2, Avx512 };

std::string_view isa_name(Isa isa);  // "auto", "scalar", "avx2", "avx512"
std::optional<Isa> parse_isa(std::string_view name);

// Scalar and Auto are always supported; Avx2 needs AVX2+FMA+F16C; Avx512 needs AVX-512 F/BW/VL.
bool isa_supported(Isa isa);
Isa best_isa();

// Turns Auto into a concrete ISA (ZERO_ISA, else best_isa()). Throws zero::Error when the request
// (or ZERO_ISA) names an ISA this CPU lacks or an unknown name.
Isa resolve_isa(Isa requested);

struct CpuExec {
  int threads = 0;  // OpenMP threads; 0 = every core the process may use
  Isa isa = Isa::Auto;
  // The stream the CUDA compute table enqueues on (a cudaStream_t; null = the legacy default
  // stream). The CPU kernels ignore it.
  void* cuda_stream = nullptr;
};

// The thread count a kernel will use for `requested` (0 → all cores). Throws when negative.
int resolve_threads(int requested);

}  // namespace zero::kernels
