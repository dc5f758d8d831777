// The argument checks and the arithmetic-free cases of models::gemm (models/gemm.h), shared by its
// two implementations (gemm_onednn.cpp, gemm_portable.cpp) so both accept the same products and
// refuse the same ones with the same messages.
#pragma once

#include "models/gemm.h"

namespace zero::models {

// Throws zero::Error for the arguments gemm() refuses (threads < 1, beta other than 0 or 1, a
// precision other than fp32 or bf16, a null pointer with a non-empty matrix). Does the products
// that need no arithmetic itself: nothing when C is empty, C = beta · C when k is 0. Returns true
// when the caller still has to compute op(A) · op(B).
bool gemm_needs_product(const Gemm& g, int threads);

}  // namespace zero::models
