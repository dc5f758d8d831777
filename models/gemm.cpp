#include "models/gemm.h"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>

#include "zero/base/error.h"

namespace zero::models {

namespace {

// How this process calls OpenBLAS, settled at the first product.
struct BlasMode {
  // Debian's serial build of 0.3.21 corrupts products when unrelated threads call it at once (its
  // packing buffers are not guarded for that; measured with 3 and more callers); the pthread build
  // locks them. The OpenMP build passed the same check but is not made for callers outside its
  // own OpenMP team. Anything but the pthread build is called under this lock.
  bool serialise = false;
  std::mutex lock;
};

BlasMode& blas_mode() {
  static BlasMode mode;
  static std::once_flag once;
  std::call_once(once, [] {
    constexpr int kPthreadBuild = 1;  // openblas_get_parallel(): 0 serial, 1 pthreads, 2 OpenMP
    if (openblas_get_parallel() == kPthreadBuild) {
      // Its own threads would multiply with the ranks; the caller's thread runs the product.
      openblas_set_num_threads(1);
    } else {
      mode.serialise = true;
    }
  });
  return mode;
}

// The block of C at rows [row, row + rows) and columns [col, col + cols), on this thread.
// REQUIRES: g checked by gemm().
void gemm_block_impl(const Gemm& g, std::size_t row, std::size_t rows, std::size_t col,
                     std::size_t cols) {
  // Leading dimensions are the whole operands'; OpenBLAS rejects 0 even for an empty side.
  const blasint lda = static_cast<blasint>(std::max<std::size_t>(1, g.a_transposed ? g.m : g.k));
  const blasint ldb = static_cast<blasint>(std::max<std::size_t>(1, g.b_transposed ? g.k : g.n));
  const blasint ldc = static_cast<blasint>(std::max<std::size_t>(1, g.n));
  const float* a = g.a_transposed ? g.a + row : g.a + row * g.k;
  const float* b = g.b_transposed ? g.b + col * g.k : g.b + col;
  BlasMode& mode = blas_mode();
  std::unique_lock<std::mutex> serialised(mode.lock, std::defer_lock);
  if (mode.serialise) serialised.lock();
  cblas_sgemm(CblasRowMajor, g.a_transposed ? CblasTrans : CblasNoTrans,
              g.b_transposed ? CblasTrans : CblasNoTrans, static_cast<blasint>(rows),
              static_cast<blasint>(cols), static_cast<blasint>(g.k), 1.0f, a, lda, b, ldb, g.beta,
              g.c + row * g.n + col, ldc);
}

}  // namespace

void gemm(const Gemm& g, int threads) {
  constexpr auto kMaxDim = static_cast<std::size_t>(std::numeric_limits<blasint>::max());
  ZERO_CHECK(g.m <= kMaxDim && g.n <= kMaxDim && g.k <= kMaxDim && g.m * g.k <= kMaxDim &&
                 g.k * g.n <= kMaxDim && g.m * g.n <= kMaxDim,
             "gemm: {}x{}x{} exceeds OpenBLAS's {}-bit index", g.m, g.n, g.k, sizeof(blasint) * 8);
  ZERO_CHECK(threads >= 1, "gemm: threads = {}, expected at least 1", threads);
  ZERO_CHECK(g.beta == 0.0f || g.beta == 1.0f, "gemm: beta = {}, expected 0 or 1", g.beta);
  if (g.m == 0 || g.n == 0) return;
  ZERO_CHECK(g.c != nullptr && (g.k == 0 || (g.a != nullptr && g.b != nullptr)),
             "gemm: null operand for a {}x{}x{} product", g.m, g.n, g.k);

  // Threads split C's longer side, so each packs only its share of the larger operand.
  const bool by_rows = g.m >= g.n;
  const std::size_t split = by_rows ? g.m : g.n;
  const auto team =
      static_cast<int>(std::min<std::size_t>(split, static_cast<std::size_t>(threads)));
  if (team <= 1) {
    gemm_block_impl(g, 0, g.m, 0, g.n);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(team)
  for (int t = 0; t < team; ++t) {
    const std::size_t first = split * static_cast<std::size_t>(t) / static_cast<std::size_t>(team);
    const std::size_t last =
        split * static_cast<std::size_t>(t + 1) / static_cast<std::size_t>(team);
    if (by_rows) {
      gemm_block_impl(g, first, last - first, 0, g.n);
    } else {
      gemm_block_impl(g, 0, g.m, first, last - first);
    }
  }
}

std::string blas_description() {
  return fmt::format("{} ({} kernels{})", openblas_get_config(), openblas_get_corename(),
                     blas_mode().serialise ? ", calls serialised" : "");
}

}  // namespace zero::models
