// zero-bench kernels: every optimizer × gradient dtype × state dtype × fused bf16 param write,
// each next to its roofline measured in the same run: kernels::traffic_probe_cpu moves the same
// bytes in the same pattern (same arrays, tiles, threads) with no optimizer arithmetic.
// The result is validated against the scalar path before timing. With --tensors K the --params
// elements are K tensors of mixed sizes (tensor_sizes below), stepped as one list. With --cold
// (CPU) every timed pass, kernel and probe alike, starts from caches that hold none of its arrays,
// as in training, where forward and backward evict the optimizer's states between two steps;
// without, repeated passes find what the last-level cache kept of them.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "benchmarks/bench_flags.h"
#include "benchmarks/commands.h"
#include "benchmarks/kernels_bench_cuda.h"
#include "cli/flags.h"
#include "kernels/cpu_kernels.h"
#include "kernels/cpu_parallel.h"
#include "kernels/isa.h"
#include "kernels/optimizer.h"
#include "kernels/traffic_probe.h"
#include "zero/base/error.h"
#include "zero/base/half.h"
#include "zero/base/timer.h"
#include "zero/device/device.h"

namespace zero::bench {

namespace {

using kernels::OptimizerHyper;
using kernels::OptimizerKind;
using kernels::OptimizerTensors;
using zero::DType;

struct KernelsArgs {
  bool json = false;
  std::size_t params = std::size_t{1} << 26;
  int threads = 0;
  kernels::Isa isa = kernels::Isa::Auto;
  int repetitions = 9;
  std::string only_optimizer;  // empty = all
  std::string device = "cpu";  // "cuda": the CUDA kernels on GPU 0, against its traffic probe
  int tensors = 1;             // the params split into this many tensors (tensor_sizes)
  std::uint64_t sizes_seed = 1;
  bool cold = false;  // caches evicted before every timed pass (CPU)
  std::optional<DType> only_grad;   // nullopt = fp32 and bf16
  std::optional<DType> only_state;  // nullopt = fp32 and bf16
};

constexpr std::string_view kUsage =
    "usage: zero-bench kernels [--json] [--params N|64M|1G] [--tensors K] [--sizes-seed S] "
    "[--threads T] [--isa I] [--reps R] [--optimizer O] [--grad-dtype fp32|bf16] "
    "[--state-dtype fp32|bf16] [--device cpu|cuda] [--cold]";

KernelsArgs parse_args(std::span<const std::string> args) {
  KernelsArgs r;
  auto number = [&](cli::FlagArg& arg) {
    ZERO_CHECK(arg.has_value(), "{} needs a value", arg.name());
    const std::string text = arg.value("a non-negative integer");
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    ZERO_CHECK(end != text.c_str() && *end == '\0' && v >= 0,
               "{} {}: expected a non-negative integer", arg.name(), text);
    return v;
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    cli::FlagArg arg(args, i);
    const std::string& a = arg.name();
    if (a == "--json") {
      arg.no_value();
      r.json = true;
    } else if (a == "--cold") {
      arg.no_value();
      r.cold = true;
    } else if (a == "--params") {
      r.params = parse_count(flag_value(arg, kUsage), a, kUsage);
    } else if (a == "--tensors") {
      const long long k = number(arg);
      ZERO_CHECK(k >= 1 && k <= 1'000'000, "--tensors {}: expected 1 to 1000000", k);
      r.tensors = static_cast<int>(k);
    } else if (a == "--sizes-seed") {
      r.sizes_seed = static_cast<std::uint64_t>(number(arg));
    } else if ((a == "--grad-dtype" || a == "--state-dtype") && arg.has_value()) {
      const std::string text = arg.value("a dtype");
      const std::optional<DType> dtype = parse_dtype(text);
      ZERO_CHECK(dtype == DType::F32 || dtype == DType::BF16, "{} {}: expected fp32 or bf16", a,
                 text);
      (a == "--grad-dtype" ? r.only_grad : r.only_state) = *dtype;
    } else if (a == "--threads") {
      r.threads = static_cast<int>(number(arg));
    } else if (a == "--reps") {
      r.repetitions = std::max(1, static_cast<int>(number(arg)));
    } else if (a == "--optimizer" && arg.has_value()) {
      r.only_optimizer = arg.value("an optimizer");
      ZERO_CHECK(kernels::parse_optimizer_kind(r.only_optimizer).has_value(),
                 "--optimizer {}: expected adam, adamw, adagrad, lion or sgd", r.only_optimizer);
    } else if (a == "--device" && arg.has_value()) {
      r.device = arg.value("a device");
      ZERO_CHECK(r.device == "cpu" || r.device == "cuda", "--device {}: expected cpu or cuda",
                 r.device);
    } else if (a == "--isa" && arg.has_value()) {
      const std::string text = arg.value("an ISA");
      const auto isa = kernels::parse_isa(text);
      ZERO_CHECK(isa.has_value(), "--isa {}: expected auto, scalar, avx2 or avx512", text);
      r.isa = *isa;
    } else {
      ZERO_CHECK(false, "unexpected argument '{}'; {}", args[i], kUsage);
    }
  }
  ZERO_CHECK(!r.cold || r.device == "cpu",
             "--cold with --device {}: the cache eviction is the CPU's; leave --cold out", r.device);
  ZERO_CHECK(static_cast<std::size_t>(r.tensors) <= r.params,
             "--tensors {} with --params {}: every tensor needs at least one element", r.tensors,
             r.params);
  return r;
}

// Huge-page backed when the kernel allows it: fewer TLB misses on a 1.5 GiB working set.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<void, FreeDeleter>;

Buffer allocate(std::size_t bytes) {
  constexpr std::size_t kHugePage = std::size_t{2} << 20;
  const std::size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, rounded);
  ZERO_CHECK_AS(OutOfMemory, p != nullptr, "kernels bench: cannot allocate {} bytes", rounded);
  madvise(p, rounded, MADV_HUGEPAGE);
  return Buffer(p);
}

// A deterministic value in [lo, hi) per index, so buffers can be filled in parallel.
float hashed(std::uint64_t i, std::uint64_t seed, float lo, float hi) {
  std::uint64_t z = i * 0x9e3779b97f4a7c15ull + seed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return lo + (hi - lo) * static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

// The --tensors split of `params` elements, which benchmarks/peers/cuda_optimizer_peers.py reads
// back from the JSON records ("sizes") to build the same tensors in torch. Tensor i weighs
// w_i = ⌊1024·2^(10·u_i)⌋ with u_i = hashed(i, seed, 0, 1), so the sizes spread log-uniformly over
// a factor of 1024 (64M params in 100 tensors, seed 1: 4279 to 4313016 elements); it gets
// 1 + ⌊(params − K)·w_i / Σw⌋ elements, and the first params − Σ of them one more, so the sizes sum
// to `params` exactly. K = 1 is one tensor of `params`.
std::vector<std::size_t> tensor_sizes(std::size_t params, int tensors, std::uint64_t seed) {
  const auto k = static_cast<std::size_t>(tensors);
  ZERO_CHECK(k >= 1 && k <= params, "kernels bench: {} tensors of {} params", k, params);
  ZERO_CHECK(params <= (std::size_t{1} << 43), "kernels bench: --params {} is over 2^43", params);
  std::vector<std::uint64_t> weights(k);
  std::uint64_t total_weight = 0;
  for (std::size_t i = 0; i < k; ++i) {
    weights[i] = static_cast<std::uint64_t>(1024.0 * std::exp2(10.0 * hashed(i, seed, 0.0f, 1.0f)));
    total_weight += weights[i];
  }
  std::vector<std::size_t> sizes(k);
  std::size_t total = 0;
  for (std::size_t i = 0; i < k; ++i) {
    sizes[i] = 1 + (params - k) * weights[i] / total_weight;  // < 2^63: weights[i] < 2^20
    total += sizes[i];
  }
  for (std::size_t i = 0; total < params; ++i, ++total) ++sizes[i];
  return sizes;
}

// Where each tensor lives in the arrays: every array of tensor i starts `offsets[i]` elements
// in, each offset a multiple of kTensorAlignElems (16 bytes of a bf16 array) so each tensor's
// arrays are 16-byte aligned, as tensors allocated one by one would be. The gaps between tensors
// are filled like the rest and touched by no kernel.
constexpr std::size_t kTensorAlignElems = 8;
struct Layout {
  std::vector<std::size_t> sizes;
  std::vector<std::size_t> offsets;
  std::size_t extent = 0;  // elements each array holds
};

Layout make_layout(const KernelsArgs& args) {
  Layout l;
  l.sizes = tensor_sizes(args.params, args.tensors, args.sizes_seed);
  for (std::size_t size : l.sizes) {
    l.extent = (l.extent + kTensorAlignElems - 1) / kTensorAlignElems * kTensorAlignElems;
    l.offsets.push_back(l.extent);
    l.extent += size;
  }
  return l;
}

struct Arrays {
  Buffer master, grad_f32, grad_bf16, state0_f32, state1_f32, state0_bf16, state1_bf16, out_bf16;
};

// The starting values, written from the same threads and tiles the kernels use (the first
// touch puts the pages where they run). Refilled before every case: a case's steps and traffic
// probes drift the values (after enough of them to NaN), and every case validates from the start.
void fill_arrays(const Arrays& a, std::size_t n, int threads) {
  auto* master = static_cast<float*>(a.master.get());
  auto* g32 = static_cast<float*>(a.grad_f32.get());
  auto* g16 = static_cast<std::uint16_t*>(a.grad_bf16.get());
  auto* m32 = static_cast<float*>(a.state0_f32.get());
  auto* v32 = static_cast<float*>(a.state1_f32.get());
  auto* m16 = static_cast<std::uint16_t*>(a.state0_bf16.get());
  auto* v16 = static_cast<std::uint16_t*>(a.state1_bf16.get());
  auto* out = static_cast<std::uint16_t*>(a.out_bf16.get());
  kernels::detail::for_each_tile(n, kernels::detail::kTileElems, threads,
                                 [&](std::size_t b, std::size_t e) {
                                   for (std::size_t i = b; i < e; ++i) {
                                     master[i] = hashed(i, 1, -1.0f, 1.0f);
                                     // Positive gradients keep the probe's v += g from making
                                     // Adam's second moment negative.
                                     g32[i] = hashed(i, 2, 1e-3f, 1e-2f);
                                     g16[i] = half::float_to_bf16(g32[i]);
                                     // Positive too: Adagrad's state0 is a sum of squares.
                                     m32[i] = hashed(i, 3, 1e-5f, 1e-3f);
                                     v32[i] = hashed(i, 4, 1e-6f, 1e-4f);
                                     m16[i] = half::float_to_bf16(m32[i]);
                                     v16[i] = half::float_to_bf16(v32[i]);
                                     out[i] = 0;
                                   }
                                 });
}

Arrays make_arrays(std::size_t n, int threads) {
  Arrays a{allocate(4 * n), allocate(4 * n), allocate(2 * n), allocate(4 * n),
           allocate(4 * n), allocate(2 * n), allocate(2 * n), allocate(2 * n)};
  fill_arrays(a, n, threads);
  return a;
}

// --cold: a buffer four times the last-level cache (64 MiB at least) read through before a timed
// pass, by the calling thread. Read, not written: its lines stay clean, so the pass pays for
// bringing its arrays in (and for the write-backs its own stores cause), not for writing the
// buffer back; the arrays' dirty lines are written back during the read, outside the timing.
class CacheEvictor {
 public:
  CacheEvictor() {
    const long l3 = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
    const std::size_t bytes =
        std::max<std::size_t>(std::size_t{64} << 20, l3 > 0 ? 4 * static_cast<std::size_t>(l3) : 0);
    words_.assign(bytes / sizeof(std::uint64_t), 1);
  }
  void operator()() {
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < words_.size(); i += 64 / sizeof(std::uint64_t)) sum += words_[i];
    sink_ = sum;
  }

 private:
  std::vector<std::uint64_t> words_;
  volatile std::uint64_t sink_ = 0;
};

struct Case {
  OptimizerHyper hyper;
  DType grad_dtype;
  DType state_dtype;
  bool param_out;
};

// The eight arrays of Arrays, wherever they live, in its member order; and their sizes.
using ArrayPtrs = std::array<void*, 8>;
std::array<std::size_t, 8> array_bytes(std::size_t n) {
  return {4 * n, 4 * n, 2 * n, 4 * n, 4 * n, 2 * n, 2 * n, 2 * n};
}
ArrayPtrs ptrs(const Arrays& a) {
  return {a.master.get(),     a.grad_f32.get(),    a.grad_bf16.get(),   a.state0_f32.get(),
          a.state1_f32.get(), a.state0_bf16.get(), a.state1_bf16.get(), a.out_bf16.get()};
}

// Every tensor of `layout` in the arrays `a`, as case `c` uses them.
std::vector<OptimizerTensors> tensors_for(const Case& c, const ArrayPtrs& a, const Layout& layout) {
  const bool bf16_grad = c.grad_dtype == DType::BF16;
  const bool bf16_state = c.state_dtype == DType::BF16;
  auto at = [](void* base, std::size_t elem_bytes, std::size_t offset) {
    return static_cast<std::byte*>(base) + offset * elem_bytes;
  };
  std::vector<OptimizerTensors> out;
  for (std::size_t i = 0; i < layout.sizes.size(); ++i) {
    const std::size_t off = layout.offsets[i];
    OptimizerTensors t;
    t.master = reinterpret_cast<float*>(at(a[0], 4, off));
    t.grad = bf16_grad ? at(a[2], 2, off) : at(a[1], 4, off);
    t.grad_dtype = c.grad_dtype;
    t.state0 = bf16_state ? at(a[5], 2, off) : at(a[3], 4, off);
    t.state1 = bf16_state ? at(a[6], 2, off) : at(a[4], 4, off);
    t.state_dtype = c.state_dtype;
    t.param_out = c.param_out ? at(a[7], 2, off) : nullptr;
    t.param_out_dtype = DType::BF16;
    t.numel = layout.sizes[i];
    out.push_back(t);
  }
  return out;
}

// " in tensor 3 of 100" when there are several, else "".
std::string tensor_label(std::size_t index, std::size_t count) {
  return count > 1 ? fmt::format(" in tensor {} of {}", index, count) : std::string();
}

// Copies `count` elements from `first` of every array the case uses into a private
// OptimizerTensors.
struct Sample {
  std::vector<float> master;
  std::vector<std::byte> grad, state0, state1, out;
  OptimizerTensors view;

  Sample(const OptimizerTensors& t, std::size_t first, std::size_t count) {
    auto copy = [&](const void* base, std::size_t elem_bytes, std::vector<std::byte>& into) {
      into.resize(count * elem_bytes);
      if (base != nullptr) {
        std::memcpy(into.data(), static_cast<const std::byte*>(base) + first * elem_bytes,
                    into.size());
      }
    };
    master.assign(t.master + first, t.master + first + count);
    copy(t.grad, dtype_size(t.grad_dtype), grad);
    copy(t.state0, dtype_size(t.state_dtype), state0);
    copy(t.state1, dtype_size(t.state_dtype), state1);
    copy(t.param_out, dtype_size(t.param_out_dtype), out);
    view = t;
    view.master = master.data();
    view.grad = grad.data();
    view.state0 = state0.data();
    view.state1 = state1.data();
    view.param_out = t.param_out != nullptr ? out.data() : nullptr;
    view.numel = count;
  }
};

// Where two arrays of `elems` elements of `elem_bytes` first differ, or "" if they do not:
// "master[17]: 0x3f800000 vs 0x3f800001".
std::string first_difference(const char* name, const void* expected, const void* actual,
                             std::size_t elems, std::size_t elem_bytes, std::size_t first) {
  const auto* e = static_cast<const std::byte*>(expected);
  const auto* a = static_cast<const std::byte*>(actual);
  if (std::memcmp(e, a, elems * elem_bytes) == 0) return "";
  for (std::size_t i = 0; i < elems; ++i) {
    if (std::memcmp(e + i * elem_bytes, a + i * elem_bytes, elem_bytes) == 0) continue;
    std::uint32_t ve = 0, va = 0;
    std::memcpy(&ve, e + i * elem_bytes, elem_bytes);
    std::memcpy(&va, a + i * elem_bytes, elem_bytes);
    return fmt::format("{}[{}]: scalar 0x{:0{}x}, benchmarked 0x{:0{}x}", name, first + i, ve,
                       2 * elem_bytes, va, 2 * elem_bytes);
  }
  return "";
}

// One step on the full arrays with the benchmarked ISA and threads must equal, bit for bit, the
// scalar single-thread path run on copies of three windows (start, middle, end). `where` names
// the tensor in the error.
void validate(const Case& c, const OptimizerTensors& t, const kernels::CpuExec& exec,
              std::int64_t step, const std::string& where) {
  const std::size_t window = std::min<std::size_t>(t.numel, 4099);
  const std::size_t starts[] = {0, (t.numel - window) / 2, t.numel - window};
  std::vector<Sample> samples;
  for (std::size_t s : starts) samples.emplace_back(t, s, window);
  const kernels::StepScalars scalars{1e-3, step, 0.5};
  kernels::optimizer_step_cpu(c.hyper, scalars, t, exec);
  const int states = kernels::optimizer_state_count(c.hyper);
  for (std::size_t k = 0; k < samples.size(); ++k) {
    Sample& s = samples[k];
    kernels::optimizer_step_cpu(c.hyper, scalars, s.view, {1, kernels::Isa::Scalar});
    const std::size_t first = starts[k];
    const std::size_t sb = dtype_size(t.state_dtype);
    std::string diff =
        first_difference("master", s.master.data(), t.master + first, window, 4, first);
    if (diff.empty() && states > 0) {
      diff = first_difference("state0", s.state0.data(),
                              static_cast<std::byte*>(t.state0) + first * sb, window, sb, first);
    }
    if (diff.empty() && states > 1) {
      diff = first_difference("state1", s.state1.data(),
                              static_cast<std::byte*>(t.state1) + first * sb, window, sb, first);
    }
    if (diff.empty() && t.param_out != nullptr) {
      diff = first_difference("param_out", s.out.data(),
                              static_cast<std::byte*>(t.param_out) + first * 2, window, 2, first);
    }
    ZERO_CHECK(diff.empty(),
               "kernels bench: {} (grad {}, state {}{}) differs from the scalar path{}: {}",
               kernels::optimizer_name(c.hyper.kind), dtype_name(c.grad_dtype),
               dtype_name(c.state_dtype), c.param_out ? ", bf16 param out" : "", where, diff);
  }
}

// Every case of `optimizers` in the benchmark's order: gradient dtype, state dtype, param write;
// only the dtypes --grad-dtype and --state-dtype name, when given.
std::vector<Case> cases_of(const KernelsArgs& args, const std::vector<OptimizerHyper>& optimizers) {
  std::vector<Case> out;
  for (const auto& hyper : optimizers) {
    for (DType grad : {DType::F32, DType::BF16}) {
      if (args.only_grad && grad != *args.only_grad) continue;
      for (DType state : {DType::F32, DType::BF16}) {
        if (args.only_state && state != *args.only_state) continue;
        for (bool param_out : {false, true}) out.push_back({hyper, grad, state, param_out});
      }
    }
  }
  return out;
}

// The table's heading, after a first line saying where the kernels run.
void print_heading(const KernelsArgs& args, const std::string& where) {
  if (args.json) return;
  if (args.tensors > 1) {
    std::printf("zero-bench kernels: %zu params in %d tensors (sizes seed %llu), %s, best of %d\n",
                args.params, args.tensors, static_cast<unsigned long long>(args.sizes_seed),
                where.c_str(), args.repetitions);
  } else {
    std::printf("zero-bench kernels: %zu params, %s, best of %d\n", args.params, where.c_str(),
                args.repetitions);
  }
  std::printf("%-8s %-5s %-5s %-5s %6s %12s %9s %12s %6s\n", "optim", "grad", "state", "out",
              "B/par", "Mparams/s", "GB/s", "probe GB/s", "ratio");
}

// One case's figures: bytes per parameter, the best kernel and probe times.
struct Row {
  Case c;
  std::size_t bytes = 0;
  std::size_t n = 0;
  std::string where;  // the ISA, or "cuda"
  int threads = 0;
  double kernel_s = 0;
  double probe_s = 0;
};

// "[4523,81920,...]": the tensor sizes, for the JSON records.
std::string json_sizes(const Layout& layout) {
  return fmt::format("[{}]", fmt::join(layout.sizes, ","));
}

// The JSON record also carries the split ("tensors", "sizes_seed", "sizes") and the best times
// ("step_s", "probe_s"), so a peer can be timed on the same tensors.
void print_row(const KernelsArgs& args, const Layout& layout, const Row& r) {
  const double params_per_s = static_cast<double>(r.n) / r.kernel_s;
  const double gb_per_s = params_per_s * static_cast<double>(r.bytes) / 1e9;
  const double limit_gb_per_s =
      static_cast<double>(r.n) * static_cast<double>(r.bytes) / r.probe_s / 1e9;
  const double ratio = gb_per_s / limit_gb_per_s;
  const std::string name(kernels::optimizer_name(r.c.hyper.kind));
  const std::string grad_name(dtype_name(r.c.grad_dtype)), state_name(dtype_name(r.c.state_dtype));
  const char* out_name = r.c.param_out ? "bf16" : "none";
  if (args.json) {
    std::printf(
        "{\"bench\":\"kernels\",\"device\":\"%s\",\"optimizer\":\"%s\",\"grad_dtype\":\"%s\","
        "\"state_dtype\":\"%s\",\"param_out\":\"%s\",\"isa\":\"%s\",\"threads\":%d,"
        "\"params\":%zu,\"params_per_s\":%.6g,\"bytes_per_param\":%zu,\"gb_per_s\":%.4g,"
        "\"limit\":\"traffic-probe\",\"limit_gb_per_s\":%.4g,\"ratio\":%.3f,\"tensors\":%zu,"
        "\"sizes_seed\":%llu,\"step_s\":%.6g,\"probe_s\":%.6g,\"cold\":%s,\"sizes\":%s}\n",
        args.device.c_str(), name.c_str(), grad_name.c_str(), state_name.c_str(), out_name,
        r.where.c_str(), r.threads, r.n, params_per_s, r.bytes, gb_per_s, limit_gb_per_s, ratio,
        layout.sizes.size(), static_cast<unsigned long long>(args.sizes_seed), r.kernel_s,
        r.probe_s, args.cold ? "true" : "false", json_sizes(layout).c_str());
  } else {
    std::printf("%-8s %-5s %-5s %-5s %6zu %12.0f %9.1f %12.1f %6.3f\n", name.c_str(),
                grad_name.c_str(), state_name.c_str(), out_name, r.bytes, params_per_s / 1e6,
                gb_per_s, limit_gb_per_s, ratio);
  }
  std::fflush(stdout);
}

// Every case on GPU 0: all tensors stepped by one optimizer_step_cuda call and timed with CUDA
// events (kernels_bench_cuda.h), next to traffic_probe_cuda over the same list. One step must
// equal the CPU kernels' on every tensor bit for bit (the same element math; nvcc builds with
// --fmad=false).
int run_kernels_on_device(const KernelsArgs& args, const std::vector<OptimizerHyper>& optimizers) {
  const std::unique_ptr<Device> device = make_device(args.device, 0);
  const Layout layout = make_layout(args);
  const std::size_t extent = layout.extent;
  const std::size_t count = layout.sizes.size();
  const int threads = kernels::resolve_threads(args.threads);
  const kernels::CpuExec cpu_exec{threads, kernels::Isa::Auto};
  const Arrays host = make_arrays(extent, threads);
  const std::array<std::size_t, 8> bytes = array_bytes(extent);
  std::array<zero::Buffer, 8> on_device;
  ArrayPtrs dev{};
  for (std::size_t k = 0; k < bytes.size(); ++k) {
    on_device[k] = device->allocate(bytes[k], MemoryKind::Device, MemoryTag::Other);
    dev[k] = on_device[k].data();
  }
  auto upload = [&] {
    const ArrayPtrs h = ptrs(host);
    for (std::size_t k = 0; k < bytes.size(); ++k) device->copy(dev[k], h[k], bytes[k]);
  };
  print_heading(args, args.device + " (GPU 0)");
  std::int64_t step = 1;
  std::vector<std::byte> back;
  for (const Case& c : cases_of(args, optimizers)) {
    const OptimizerHyper& hyper = c.hyper;
    const DType grad = c.grad_dtype, state = c.state_dtype;
    const bool param_out = c.param_out;
    fill_arrays(host, extent, threads);
    upload();
    const std::vector<OptimizerTensors> th = tensors_for(c, ptrs(host), layout);
    const std::vector<OptimizerTensors> td = tensors_for(c, dev, layout);
    const int state_count = kernels::optimizer_state_count(hyper);
    const kernels::StepScalars scalars{1e-3, step++, 0.5};
    time_optimizer_step_cuda(hyper, scalars, td);
    for (const OptimizerTensors& t : th) kernels::optimizer_step_cpu(hyper, scalars, t, cpu_exec);
    const std::pair<const void*, const void*> outputs[] = {
        {th[0].master, td[0].master},
        {state_count > 0 ? th[0].state0 : nullptr, td[0].state0},
        {state_count > 1 ? th[0].state1 : nullptr, td[0].state1},
        {th[0].param_out, td[0].param_out}};
    const char* names[] = {"master", "state0", "state1", "param_out"};
    const std::size_t sizes[] = {4, dtype_size(state), dtype_size(state), 2};
    for (std::size_t k = 0; k < 4; ++k) {
      if (outputs[k].first == nullptr) continue;
      // Tensor 0 starts at offset 0: its arrays are the whole arrays' starts.
      back.resize(extent * sizes[k]);
      device->copy(back.data(), outputs[k].second, back.size());
      for (std::size_t i = 0; i < count; ++i) {
        const std::size_t at = layout.offsets[i] * sizes[k];
        const std::string diff =
            first_difference(names[k], static_cast<const std::byte*>(outputs[k].first) + at,
                             back.data() + at, layout.sizes[i], sizes[k], 0);
        ZERO_CHECK(diff.empty(),
                   "kernels bench: {} (grad {}, state {}{}) on {} differs from the CPU "
                   "kernels{}: {}",
                   kernels::optimizer_name(hyper.kind), dtype_name(grad), dtype_name(state),
                   param_out ? ", bf16 param out" : "", args.device, tensor_label(i, count), diff);
      }
    }
    double best_kernel = 1e30, best_probe = 1e30;
    for (int r = 0; r < args.repetitions; ++r) {
      best_kernel = std::min(best_kernel, time_optimizer_step_cuda(hyper, {1e-3, step++, 1.0}, td));
      best_probe = std::min(best_probe, time_traffic_probe_cuda(td, state_count));
    }
    print_row(args, layout,
              {c, kernels::optimizer_bytes_per_elem(th[0], state_count), args.params, args.device,
               0, best_kernel, best_probe});
  }
  return 0;
}

}  // namespace

int run_kernels(std::span<const std::string> argv) {
  const KernelsArgs args = parse_args(argv);
  const kernels::Isa isa = kernels::resolve_isa(args.isa);
  const int threads = kernels::resolve_threads(args.threads);
  const kernels::CpuExec exec{threads, isa};
  const std::size_t n = args.params;

  std::vector<OptimizerHyper> optimizers;
  for (auto kind : {OptimizerKind::AdamW, OptimizerKind::Adam, OptimizerKind::Adagrad,
                    OptimizerKind::Lion, OptimizerKind::Sgd}) {
    if (!args.only_optimizer.empty() && kernels::optimizer_name(kind) != args.only_optimizer)
      continue;
    OptimizerHyper h;
    h.kind = kind;
    h.weight_decay = 0.01;
    if (kind == OptimizerKind::Sgd) h.momentum = 0.9;
    optimizers.push_back(h);
  }
  if (args.device != "cpu") return run_kernels_on_device(args, optimizers);
  // Several tensors on the CPU: one optimizer_step_cpu (traffic_probe_cpu) call per tensor, as
  // the engine steps its partitions; each tensor is validated alone.
  print_heading(args, fmt::format("{} threads, isa {}{}", threads, kernels::isa_name(isa),
                                  args.cold ? ", caches evicted before every pass" : ""));
  const Layout layout = make_layout(args);
  const Arrays arrays = make_arrays(layout.extent, threads);
  std::optional<CacheEvictor> evict;
  if (args.cold) evict.emplace();
  std::int64_t step = 1;
  for (const Case& c : cases_of(args, optimizers)) {
    const OptimizerHyper& hyper = c.hyper;
    fill_arrays(arrays, layout.extent, threads);
    const std::vector<OptimizerTensors> tensors = tensors_for(c, ptrs(arrays), layout);
    const int state_count = kernels::optimizer_state_count(hyper);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      validate(c, tensors[i], exec, step, tensor_label(i, tensors.size()));
    }
    ++step;
    double best_kernel = 1e30, best_probe = 1e30;
    for (int r = 0; r < args.repetitions; ++r) {
      const kernels::StepScalars scalars{1e-3, step++, 1.0};
      if (evict) (*evict)();
      auto t0 = std::chrono::steady_clock::now();
      for (const OptimizerTensors& t : tensors) {
        kernels::optimizer_step_cpu(hyper, scalars, t, exec);
      }
      best_kernel = std::min(best_kernel, seconds_since(t0));
      if (evict) (*evict)();
      t0 = std::chrono::steady_clock::now();
      for (const OptimizerTensors& t : tensors) kernels::traffic_probe_cpu(t, state_count, exec);
      best_probe = std::min(best_probe, seconds_since(t0));
    }
    print_row(args, layout,
              {c, kernels::optimizer_bytes_per_elem(tensors[0], state_count), n,
               std::string(kernels::isa_name(isa)), threads, best_kernel, best_probe});
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace zero::bench
