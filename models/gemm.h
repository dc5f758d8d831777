// Row-major matrix products for the MLP (models/mlp.h), on oneDNN's matmul primitive (Debian's
// libdnnl, its OpenMP build; gemm_onednn.cpp) where the build finds oneDNN, and in plain C++
// otherwise (gemm_portable.cpp: the same contract and fp32 sums, 5–15× slower than oneDNN for
// the MLP's shapes on this project's machines).
//
// Precisions: fp32 × fp32, and bf16 × bf16 with fp32 accumulation (AVX-512 BF16 instructions where
// the CPU has them, oneDNN's emulation on other AVX-512 cores, the portable C++ products of
// gemm_portable.h on a CPU with AVX2 alone, where oneDNN 2.x has no bf16 matmul); the result C in fp32 or bf16 (rounded once, from
// the fp32 sum). On this project's machines oneDNN's products are 1.1–2× OpenBLAS's sgemm speed in
// fp32 and 2–4× in bf16 for the MLP's shapes (16 × 2048 × 2048, one thread).
//
// Threads: a product runs on the calling thread plus up to `threads` - 1 OpenMP workers of its own
// team, so every rank's thread may call gemm at once, each with its own `threads`. Primitives are
// built once per calling thread and shape (a thread-local cache).
//
// Determinism: a product is bitwise the same for the same operands, shape, precision and `threads`
// on the same CPU instruction set (oneDNN's choice, see gemm_description()). It is NOT the same when
// C is computed in another grouping of rows: the kernels block rows differently, so the rows of a
// 16-row product may differ in the last bits from the same rows computed 8 at a time. Callers that
// need results independent of grouping (the teacher's targets) call it on fixed blocks of rows.
#pragma once

#include <cstddef>
#include <string>

#include "zero/base/dtype.h"

namespace zero::models {

// C = op(A) · op(B) + beta · C, all row-major and densely packed:
//   op(A) is m × k: A is m × k (a_transposed false) or k × m (true);
//   op(B) is k × n: B is k × n (b_transposed false) or n × k (true);
//   C is m × n; beta 0 ignores C's old contents (NaN included), beta 1 adds to them.
// `inputs` is the element type of A and B (F32 or BF16), `output` that of C (F32 or BF16).
struct Gemm {
  std::size_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  bool a_transposed = false;
  const void* b = nullptr;
  bool b_transposed = false;
  void* c = nullptr;
  float beta = 0.0f;
  DType inputs = DType::F32;
  DType output = DType::F32;
};

// Computes g on the calling thread and, for threads > 1, up to threads - 1 OpenMP workers. Throws
// zero::Error for a null pointer with a non-empty matrix, threads < 1, beta other than 0 or 1, a
// precision other than those above, or a product oneDNN refuses (naming the shape).
// Thread-safe: any number of threads may call it concurrently on disjoint C.
void gemm(const Gemm& g, int threads = 1);

// The library and the kernels it picked for an fp32 and a bf16 product, e.g.
// "oneDNN 2.6.3 (fp32: brg:avx512_core, bf16: brg:avx512_core_bf16)", or "portable C++ (...)".
std::string gemm_description();

}  // namespace zero::models
