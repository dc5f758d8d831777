// models/gemm_portable.h: the products of models/gemm.h in plain C++. The build's gemm() where
// oneDNN is not found (gemm_plain.cpp; e.g. a build from the offline dependencies of
// scripts/install-deps.sh --from), and gemm_onednn.cpp's for the bf16 products oneDNN cannot
// build on a CPU without AVX-512 (oneDNN 2.x has no bf16 matmul for AVX2 alone).
//
// C is computed in tiles of kRowTile × kColTile elements, each tile by one thread: op(A)'s rows and
// op(B)'s columns of the tile are widened to fp32 and packed kDepthTile at a time (so bf16 and
// transposed operands cost one pass each), and every element of the tile is summed in fp32 over k
// in ascending order, one multiply and one add per term (the build compiles with
// -ffp-contract=off). A product is therefore bitwise the same for any `threads` and any grouping of
// rows, a stronger promise than gemm.h makes. The inner loop runs along a row of C, which compilers
// vectorise without reordering any sum.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "models/gemm_portable.h"

#include "models/gemm_checks.h"
#include "zero/base/half.h"

namespace zero::models {

namespace {

// A tile of C (64 × 256 fp32 accumulators, 64 KiB) and the packed operands of one depth step
// (64 × 256 of A, 256 × 256 of B: 64 and 256 KiB) stay in a core's L2.
constexpr std::size_t kRowTile = 64;
constexpr std::size_t kColTile = 256;
constexpr std::size_t kDepthTile = 256;

float widen(float x) {
  return x;
}
float widen(std::uint16_t x) {
  return half::bf16_to_float(x);
}

// out[r * cols + c] = src[(row0 + r) * stride + col0 + c] widened to fp32, for r < rows, c < cols.
template <typename T>
void pack(const void* src, std::size_t stride, std::size_t row0, std::size_t col0, std::size_t rows,
          std::size_t cols, float* out) {
  const T* in = static_cast<const T*>(src);
  for (std::size_t r = 0; r < rows; ++r) {
    const T* row = in + (row0 + r) * stride + col0;
    for (std::size_t c = 0; c < cols; ++c) out[r * cols + c] = widen(row[c]);
  }
}

// out[r * cols + c] = src[(row0 + c) * stride + col0 + r] widened to fp32 (the transpose), in
// blocks of kBlock × kBlock so that both the reads and the writes stay within a few cache lines.
template <typename T>
void pack_transposed(const void* src, std::size_t stride, std::size_t row0, std::size_t col0,
                     std::size_t rows, std::size_t cols, float* out) {
  constexpr std::size_t kBlock = 16;
  const T* in = static_cast<const T*>(src);
  for (std::size_t c0 = 0; c0 < cols; c0 += kBlock) {
    for (std::size_t r0 = 0; r0 < rows; r0 += kBlock) {
      const std::size_t c_end = std::min(cols, c0 + kBlock), r_end = std::min(rows, r0 + kBlock);
      for (std::size_t c = c0; c < c_end; ++c) {
        const T* line = in + (row0 + c) * stride + col0;
        for (std::size_t r = r0; r < r_end; ++r) out[r * cols + c] = widen(line[r]);
      }
    }
  }
}

// The rows × cols block at (row0, col0) of the op_rows × op_cols matrix op(X), widened into out
// (row-major). X is stored row-major, op_rows × op_cols, or op_cols × op_rows when transposed.
void pack_operand(const void* x, bool transposed, std::size_t op_rows, std::size_t op_cols,
                  DType type, std::size_t row0, std::size_t col0, std::size_t rows,
                  std::size_t cols, float* out) {
  // Transposed: op(X)[row0 + r][col0 + c] = X[col0 + c][row0 + r].
  if (type == DType::BF16) {
    transposed ? pack_transposed<std::uint16_t>(x, op_rows, col0, row0, rows, cols, out)
               : pack<std::uint16_t>(x, op_cols, row0, col0, rows, cols, out);
  } else {
    transposed ? pack_transposed<float>(x, op_rows, col0, row0, rows, cols, out)
               : pack<float>(x, op_cols, row0, col0, rows, cols, out);
  }
}

// One thread's packing buffers and accumulators, kept between products.
struct Scratch {
  std::vector<float> a;    // rows × depth of op(A), row-major
  std::vector<float> b;    // depth × cols of op(B), row-major
  std::vector<float> acc;  // rows × cols of C, row-major
};

// The tile of C at rows [i0, i0 + rows), columns [j0, j0 + cols).
void compute_tile(const Gemm& g, std::size_t i0, std::size_t rows, std::size_t j0, std::size_t cols,
                  Scratch& s) {
  s.acc.assign(rows * cols, 0.0f);
  s.a.resize(rows * kDepthTile);
  s.b.resize(kDepthTile * cols);
  for (std::size_t p0 = 0; p0 < g.k; p0 += kDepthTile) {
    const std::size_t depth = std::min(kDepthTile, g.k - p0);
    pack_operand(g.a, g.a_transposed, g.m, g.k, g.inputs, i0, p0, rows, depth, s.a.data());
    pack_operand(g.b, g.b_transposed, g.k, g.n, g.inputs, p0, j0, depth, cols, s.b.data());
    // Four rows of C per pass over the packed B, each row's sums in ascending p.
    std::size_t i = 0;
    for (; i + 4 <= rows; i += 4) {
      float* c0 = &s.acc[i * cols];
      float* c1 = c0 + cols;
      float* c2 = c1 + cols;
      float* c3 = c2 + cols;
      for (std::size_t p = 0; p < depth; ++p) {
        const float a0 = s.a[i * depth + p], a1 = s.a[(i + 1) * depth + p],
                    a2 = s.a[(i + 2) * depth + p], a3 = s.a[(i + 3) * depth + p];
        const float* b = &s.b[p * cols];
        for (std::size_t j = 0; j < cols; ++j) {
          c0[j] += a0 * b[j];
          c1[j] += a1 * b[j];
          c2[j] += a2 * b[j];
          c3[j] += a3 * b[j];
        }
      }
    }
    for (; i < rows; ++i) {
      float* c = &s.acc[i * cols];
      for (std::size_t p = 0; p < depth; ++p) {
        const float a = s.a[i * depth + p];
        const float* b = &s.b[p * cols];
        for (std::size_t j = 0; j < cols; ++j) c[j] += a * b[j];
      }
    }
  }
  // C = sum (+ C's old value for beta 1), rounded once to C's type.
  for (std::size_t i = 0; i < rows; ++i) {
    const float* acc = &s.acc[i * cols];
    const std::size_t first = (i0 + i) * g.n + j0;
    if (g.output == DType::BF16) {
      auto* c = static_cast<std::uint16_t*>(g.c) + first;
      for (std::size_t j = 0; j < cols; ++j) {
        const float old = g.beta == 1.0f ? half::bf16_to_float(c[j]) : 0.0f;
        c[j] = half::float_to_bf16(g.beta == 1.0f ? acc[j] + old : acc[j]);
      }
    } else {
      float* c = static_cast<float*>(g.c) + first;
      for (std::size_t j = 0; j < cols; ++j) c[j] = g.beta == 1.0f ? acc[j] + c[j] : acc[j];
    }
  }
}

Scratch& thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

}  // namespace

void gemm_portable(const Gemm& g, int threads) {
  if (!gemm_needs_product(g, threads)) return;
  const std::size_t row_tiles = (g.m + kRowTile - 1) / kRowTile;
  const std::size_t col_tiles = (g.n + kColTile - 1) / kColTile;
  const auto tiles = static_cast<std::int64_t>(row_tiles * col_tiles);
  const int team = static_cast<int>(std::min<std::int64_t>(threads, tiles));
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
  for (std::int64_t t = 0; t < tiles; ++t) {
    const std::size_t i0 = static_cast<std::size_t>(t) / col_tiles * kRowTile;
    const std::size_t j0 = static_cast<std::size_t>(t) % col_tiles * kColTile;
    compute_tile(g, i0, std::min(kRowTile, g.m - i0), j0, std::min(kColTile, g.n - j0),
                 thread_scratch());
  }
}


}  // namespace zero::models
