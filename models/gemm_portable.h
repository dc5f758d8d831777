// The products of models/gemm.h in plain C++ (gemm_portable.cpp): fp32 sums over k in ascending
// order, bf16 operands widened to fp32, so a product is bitwise the same for any `threads` and any
// grouping of rows. 5-15x slower than oneDNN for the MLP's shapes.
#pragma once

#include "models/gemm.h"

namespace zero::models {

// gemm() on plain C++, with gemm()'s contract.
void gemm_portable(const Gemm& g, int threads);

}  // namespace zero::models
