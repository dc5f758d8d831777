// models/gemm.h without oneDNN (models/CMakeLists.txt): every product on plain C++.
#include "models/gemm.h"
#include "models/gemm_portable.h"

namespace zero::models {

void gemm(const Gemm& g, int threads) {
  gemm_portable(g, threads);
}

std::string gemm_description() {
  return "portable C++ (no oneDNN in this build; fp32 sums, bf16 operands widened to fp32)";
}

}  // namespace zero::models
