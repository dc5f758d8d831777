#include "models/gemm_checks.h"

#include <cstring>

#include "zero/base/error.h"

namespace zero::models {

bool gemm_needs_product(const Gemm& g, int threads) {
  ZERO_CHECK(threads >= 1, "gemm: threads = {}, expected at least 1", threads);
  ZERO_CHECK(g.beta == 0.0f || g.beta == 1.0f, "gemm: beta = {}, expected 0 or 1", g.beta);
  ZERO_CHECK(g.inputs == DType::F32 || g.inputs == DType::BF16,
             "gemm: operands in {}; expected fp32 or bf16", dtype_name(g.inputs));
  ZERO_CHECK(g.output == DType::F32 || g.output == DType::BF16,
             "gemm: result in {}; expected fp32 or bf16", dtype_name(g.output));
  if (g.m == 0 || g.n == 0) return false;
  ZERO_CHECK(g.c != nullptr && (g.k == 0 || (g.a != nullptr && g.b != nullptr)),
             "gemm: null operand for a {}x{}x{} product", g.m, g.n, g.k);
  if (g.k == 0) {  // an empty sum: C = beta · C
    if (g.beta == 0.0f) std::memset(g.c, 0, g.m * g.n * dtype_size(g.output));
    return false;
  }
  return true;
}

}  // namespace zero::models
