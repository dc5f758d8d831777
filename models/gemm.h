// Row-major fp32 matrix products for the MLP (models/mlp.h), on OpenBLAS's cblas_sgemm.
//
// BLAS threading: zero links Debian's pthread build of OpenBLAS (libopenblas-pthread-dev) and sets
// its thread count to 1 at the first product, so OpenBLAS starts no work on threads of its own and
// every rank's thread may call it at once (its buffer table is locked in that build). Parallelism
// within a rank is ours: `threads` OpenMP threads each compute a block of C (rows or columns,
// whichever side is longer) with one single-threaded call. Debian's serial build is not safe for
// concurrent callers (products come out wrong: tests/models/gemm_test.cpp catches it); linked
// against it or the OpenMP build, every product runs under one process-wide lock instead, correct
// but with the ranks taking turns.
//
// Determinism: a product is bitwise the same for the same operands, shape and `threads` on the same
// OpenBLAS kernel (openblas_get_corename()). It is NOT the same when C is computed in another
// grouping of rows (or columns, as other `threads` split it): OpenBLAS's blocking changes the order
// of the fused multiply-adds, so the rows of a 16-row product differ in the last bits from the same
// rows computed 8 at a time. Callers that need results independent of grouping (the teacher's
// targets) call it on fixed blocks of rows.
#pragma once

#include <cstddef>
#include <string>

namespace zero::models {

// C = op(A) · op(B) + beta · C, all row-major and densely packed:
//   op(A) is m × k: A is m × k (a_transposed false) or k × m (true);
//   op(B) is k × n: B is k × n (b_transposed false) or n × k (true);
//   C is m × n; beta 0 ignores C's old contents (NaN included), beta 1 adds to them.
struct Gemm {
  std::size_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  bool a_transposed = false;
  const float* b = nullptr;
  bool b_transposed = false;
  float* c = nullptr;
  float beta = 0.0f;
};

// Computes g on the calling thread and, for threads > 1, up to threads - 1 OpenMP workers (C's
// longer side split evenly among them). Throws zero::Error for a dimension OpenBLAS's 32-bit index
// cannot hold, a null pointer with a non-empty matrix, threads < 1 or beta other than 0 or 1.
// Thread-safe: any number of threads may call it concurrently on disjoint C.
void gemm(const Gemm& g, int threads = 1);

// The OpenBLAS in use, e.g. "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64
// (Zen kernels)", with ", calls serialised" when the build forces one caller at a time.
std::string blas_description();

}  // namespace zero::models
