// models/gemm.h on oneDNN's matmul primitive: the build's choice where oneDNN is found
// (models/CMakeLists.txt). A bf16 product oneDNN cannot build on this CPU (oneDNN 2.x has no bf16
// matmul without AVX-512) runs on the portable C++ products (gemm_portable.h) instead.
#include "models/gemm.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>

#include "models/gemm_checks.h"
#include "models/gemm_portable.h"
#include "zero/base/error.h"

namespace zero::models {

namespace {

using dnnl::memory;
using Dims = memory::dims;

// The CPU engine; oneDNN's engines are safe to share between threads, its streams are not.
dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

memory::data_type onednn_type(DType t) {
  return t == DType::BF16 ? memory::data_type::bf16 : memory::data_type::f32;
}

// Everything a primitive depends on: shape, layouts, precisions, the sum post-op and the threads
// it was built for (oneDNN splits the work for the thread count of its creation).
struct Key {
  std::size_t m, n, k;
  bool a_transposed, b_transposed, accumulate;
  DType inputs, output;
  int threads;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  std::size_t operator()(const Key& key) const {
    std::size_t h = std::hash<std::size_t>{}(key.m);
    for (const std::size_t v :
         {key.n, key.k, static_cast<std::size_t>(key.a_transposed),
          static_cast<std::size_t>(key.b_transposed), static_cast<std::size_t>(key.accumulate),
          static_cast<std::size_t>(key.inputs), static_cast<std::size_t>(key.output),
          static_cast<std::size_t>(key.threads)}) {
      h = h * 1000003u ^ std::hash<std::size_t>{}(v);
    }
    return h;
  }
};

struct Product {
  memory::desc a, b, c;
  dnnl::matmul primitive;
  std::string kernel;     // oneDNN's name for the implementation it chose
  bool portable = false;  // oneDNN has none for these precisions on this CPU: gemm_portable
};

constexpr const char* kPortableKernel = "portable C++ (oneDNN has no bf16 matmul on this CPU)";

// A row-major m × k matrix, or its transpose stored k × m, as oneDNN strides.
memory::desc matrix(std::size_t rows, std::size_t cols, bool transposed, DType type) {
  const auto r = static_cast<memory::dim>(rows), c = static_cast<memory::dim>(cols);
  return {Dims{r, c}, onednn_type(type), transposed ? Dims{1, r} : Dims{c, 1}};
}

Product build(const Key& key) {
  Product p;
  p.a = matrix(key.m, key.k, key.a_transposed, key.inputs);
  p.b = matrix(key.k, key.n, key.b_transposed, key.inputs);
  p.c = matrix(key.m, key.n, false, key.output);
  dnnl::primitive_attr attr;
  if (key.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p.a, p.b, p.c), attr, cpu_engine());
    p.primitive = dnnl::matmul(pd);
    p.kernel = pd.impl_info_str();
  } catch (const dnnl::error&) {
    // No implementation: oneDNN 2.x builds bf16 matmuls on AVX-512 cores only. An fp32 product
    // it refuses is an error (gemm() names it).
    if (key.inputs != DType::BF16 && key.output != DType::BF16) throw;
    p.portable = true;
    p.kernel = kPortableKernel;
  }
  return p;
}

// The calling thread's OpenMP team size for oneDNN, restored on leaving: oneDNN sizes its work
// from omp_get_max_threads() when it builds a primitive and when it runs one.
class TeamSize {
 public:
  explicit TeamSize(int threads) : saved_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~TeamSize() { omp_set_num_threads(saved_); }
  TeamSize(const TeamSize&) = delete;
  TeamSize& operator=(const TeamSize&) = delete;

 private:
  int saved_;
};

// This thread's primitives and stream.
struct ThreadProducts {
  dnnl::stream stream{cpu_engine()};
  std::unordered_map<Key, Product, KeyHash> products;
};

const Product& product_for(ThreadProducts& mine, const Key& key) {
  auto it = mine.products.find(key);
  if (it == mine.products.end()) it = mine.products.emplace(key, build(key)).first;
  return it->second;
}

ThreadProducts& thread_products() {
  thread_local ThreadProducts mine;
  return mine;
}

}  // namespace

void gemm(const Gemm& g, int threads) {
  if (!gemm_needs_product(g, threads)) return;
  const Key key{.m = g.m,
                .n = g.n,
                .k = g.k,
                .a_transposed = g.a_transposed,
                .b_transposed = g.b_transposed,
                .accumulate = g.beta == 1.0f,
                .inputs = g.inputs,
                .output = g.output,
                .threads = threads};
  const TeamSize team(threads);
  ThreadProducts& mine = thread_products();
  try {
    const Product& p = product_for(mine, key);
    if (p.portable) {
      gemm_portable(g, threads);
      return;
    }
    // oneDNN takes non-const handles; it only reads the operands.
    memory a(p.a, cpu_engine(), const_cast<void*>(g.a));
    memory b(p.b, cpu_engine(), const_cast<void*>(g.b));
    memory c(p.c, cpu_engine(), g.c);
    p.primitive.execute(mine.stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    mine.stream.wait();
  } catch (const dnnl::error& e) {
    throw Error(fmt::format("gemm: oneDNN refused a {}x{}x{} {} product (A{}, B{}, C in {}): {}",
                            g.m, g.n, g.k, dtype_name(g.inputs), g.a_transposed ? "ᵀ" : "",
                            g.b_transposed ? "ᵀ" : "", dtype_name(g.output), e.what()));
  }
}

std::string gemm_description() {
  const dnnl_version_t* v = dnnl_version();
  const auto kernel = [](DType inputs) {
    const Key key{.m = 16, .n = 64, .k = 64, .a_transposed = false, .b_transposed = true,
                  .accumulate = false, .inputs = inputs, .output = DType::F32, .threads = 1};
    const TeamSize team(1);
    return product_for(thread_products(), key).kernel;
  };
  return fmt::format("oneDNN {}.{}.{} (fp32: {}, bf16: {})", v->major, v->minor, v->patch,
                     kernel(DType::F32), kernel(DType::BF16));
}

}  // namespace zero::models
