#include "kernels/isa.h"

#include <omp.h>

#include <cstdlib>

#include "zero/base/error.h"

namespace zero::kernels {

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Auto: return "auto";
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view name) {
  for (Isa isa : {Isa::Auto, Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (name == isa_name(isa)) return isa;
  }
  return std::nullopt;
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::Auto:
    case Isa::Scalar: return true;
    case Isa::Avx2:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
#else
      return false;
#endif
    case Isa::Avx512:
#if defined(__x86_64__)
      return isa_supported(Isa::Avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
      return false;
#endif
  }
  return false;
}

Isa best_isa() {
  if (isa_supported(Isa::Avx512)) return Isa::Avx512;
  if (isa_supported(Isa::Avx2)) return Isa::Avx2;
  return Isa::Scalar;
}

Isa resolve_isa(Isa requested) {
  if (requested == Isa::Auto) {
    const char* env = std::getenv("ZERO_ISA");
    if (env == nullptr || *env == '\0') return best_isa();
    const auto parsed = parse_isa(env);
    ZERO_CHECK(parsed.has_value(), "ZERO_ISA={} is not an ISA; use auto, scalar, avx2 or avx512",
               env);
    if (*parsed == Isa::Auto) return best_isa();
    requested = *parsed;
  }
  ZERO_CHECK(isa_supported(requested), "isa {} is not supported by this CPU (best: {})",
             isa_name(requested), isa_name(best_isa()));
  return requested;
}

int resolve_threads(int requested) {
  ZERO_CHECK(requested >= 0, "threads must be >= 0 (0 = all cores), got {}", requested);
  return requested == 0 ? omp_get_num_procs() : requested;
}

}  // namespace zero::kernels
