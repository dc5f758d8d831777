// zero-bench kernels: every optimizer × gradient dtype × state dtype × fused bf16 param write,
// each next to its roofline measured in the same run: kernels::traffic_probe_cpu moves the same
// bytes in the same pattern (same arrays, tiles, threads) with no optimizer arithmetic.
// The result is validated against the scalar path before timing.
#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "benchmarks/commands.h"
#include "cli/flags.h"
#include "kernels/compute.h"
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
};

constexpr std::string_view kUsage =
    "usage: zero-bench kernels [--json] [--params N] [--threads T] [--isa I] [--reps R] "
    "[--optimizer O] [--device cpu|cuda]";

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
    } else if (a == "--params") {
      r.params = static_cast<std::size_t>(number(arg));
      ZERO_CHECK(r.params >= 1, "--params must be >= 1");
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

OptimizerTensors tensors_for(const Case& c, const ArrayPtrs& a, std::size_t n) {
  OptimizerTensors t;
  t.master = static_cast<float*>(a[0]);
  const bool bf16_grad = c.grad_dtype == DType::BF16;
  t.grad = bf16_grad ? a[2] : a[1];
  t.grad_dtype = c.grad_dtype;
  const bool bf16_state = c.state_dtype == DType::BF16;
  t.state0 = bf16_state ? a[5] : a[3];
  t.state1 = bf16_state ? a[6] : a[4];
  t.state_dtype = c.state_dtype;
  t.param_out = c.param_out ? a[7] : nullptr;
  t.param_out_dtype = DType::BF16;
  t.numel = n;
  return t;
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
// scalar single-thread path run on copies of three windows (start, middle, end).
void validate(const Case& c, const OptimizerTensors& t, const kernels::CpuExec& exec,
              std::int64_t step) {
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
               "kernels bench: {} (grad {}, state {}{}) differs from the scalar path: {}",
               kernels::optimizer_name(c.hyper.kind), dtype_name(c.grad_dtype),
               dtype_name(c.state_dtype), c.param_out ? ", bf16 param out" : "", diff);
  }
}

// Every case of `optimizers` in the benchmark's order: gradient dtype, state dtype, param write.
std::vector<Case> cases_of(const std::vector<OptimizerHyper>& optimizers) {
  std::vector<Case> out;
  for (const auto& hyper : optimizers) {
    for (DType grad : {DType::F32, DType::BF16}) {
      for (DType state : {DType::F32, DType::BF16}) {
        for (bool param_out : {false, true}) out.push_back({hyper, grad, state, param_out});
      }
    }
  }
  return out;
}

// The table's heading, after a first line saying where the kernels run.
void print_heading(const KernelsArgs& args, const std::string& where) {
  if (args.json) return;
  std::printf("zero-bench kernels: %zu params, %s, best of %d\n", args.params, where.c_str(),
              args.repetitions);
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

void print_row(const KernelsArgs& args, const Row& r) {
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
        "\"limit\":\"traffic-probe\",\"limit_gb_per_s\":%.4g,\"ratio\":%.3f}\n",
        args.device.c_str(), name.c_str(), grad_name.c_str(), state_name.c_str(), out_name,
        r.where.c_str(), r.threads, r.n, params_per_s, r.bytes, gb_per_s, limit_gb_per_s, ratio);
  } else {
    std::printf("%-8s %-5s %-5s %-5s %6zu %12.0f %9.1f %12.1f %6.3f\n", name.c_str(),
                grad_name.c_str(), state_name.c_str(), out_name, r.bytes, params_per_s / 1e6,
                gb_per_s, limit_gb_per_s, ratio);
  }
  std::fflush(stdout);
}

// Every case on GPU 0 through its compute table (CudaDevice::compute(): the CUDA kernels, which
// synchronize before returning), next to the table's traffic probe. One step on the full arrays
// must equal the CPU kernels' bit for bit (the same element math; nvcc builds with --fmad=false).
int run_kernels_on_device(const KernelsArgs& args, const std::vector<OptimizerHyper>& optimizers) {
  const std::unique_ptr<Device> device = make_device(args.device, 0);
  const kernels::ComputeKernels& table = device->compute();
  const std::size_t n = args.params;
  const int threads = kernels::resolve_threads(args.threads);
  const kernels::CpuExec cpu_exec{threads, kernels::Isa::Auto};
  const Arrays host = make_arrays(n, threads);
  const std::array<std::size_t, 8> bytes = array_bytes(n);
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
  for (const Case& c : cases_of(optimizers)) {
    const OptimizerHyper& hyper = c.hyper;
    const DType grad = c.grad_dtype, state = c.state_dtype;
    const bool param_out = c.param_out;
    fill_arrays(host, n, threads);
    upload();
    const OptimizerTensors th = tensors_for(c, ptrs(host), n);
    const OptimizerTensors td = tensors_for(c, dev, n);
    const int state_count = kernels::optimizer_state_count(hyper);
    const kernels::StepScalars scalars{1e-3, step++, 0.5};
    table.optimizer_step(hyper, scalars, td, {});
    kernels::optimizer_step_cpu(hyper, scalars, th, cpu_exec);
    const std::pair<const void*, const void*> outputs[] = {
        {th.master, td.master},
        {state_count > 0 ? th.state0 : nullptr, td.state0},
        {state_count > 1 ? th.state1 : nullptr, td.state1},
        {th.param_out, td.param_out}};
    const char* names[] = {"master", "state0", "state1", "param_out"};
    const std::size_t sizes[] = {4, dtype_size(state), dtype_size(state), 2};
    for (std::size_t k = 0; k < 4; ++k) {
      if (outputs[k].first == nullptr) continue;
      back.resize(n * sizes[k]);
      device->copy(back.data(), outputs[k].second, back.size());
      const std::string diff =
          first_difference(names[k], outputs[k].first, back.data(), n, sizes[k], 0);
      ZERO_CHECK(diff.empty(),
                 "kernels bench: {} (grad {}, state {}{}) on {} differs from the CPU "
                 "kernels: {}",
                 kernels::optimizer_name(hyper.kind), dtype_name(grad), dtype_name(state),
                 param_out ? ", bf16 param out" : "", args.device, diff);
    }
    double best_kernel = 1e30, best_probe = 1e30;
    for (int r = 0; r < args.repetitions; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      table.optimizer_step(hyper, {1e-3, step++, 1.0}, td, {});
      best_kernel = std::min(best_kernel, seconds_since(t0));
      t0 = std::chrono::steady_clock::now();
      table.traffic_probe(td, state_count, {});
      best_probe = std::min(best_probe, seconds_since(t0));
    }
    print_row(args, {c, kernels::optimizer_bytes_per_elem(th, state_count), n, args.device, 0,
                     best_kernel, best_probe});
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
  print_heading(args, fmt::format("{} threads, isa {}", threads, kernels::isa_name(isa)));
  const Arrays arrays = make_arrays(n, threads);
  std::int64_t step = 1;
  for (const Case& c : cases_of(optimizers)) {
    const OptimizerHyper& hyper = c.hyper;
    fill_arrays(arrays, n, threads);
    const OptimizerTensors t = tensors_for(c, ptrs(arrays), n);
    const int state_count = kernels::optimizer_state_count(hyper);
    validate(c, t, exec, step++);
    double best_kernel = 1e30, best_probe = 1e30;
    for (int r = 0; r < args.repetitions; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      kernels::optimizer_step_cpu(hyper, {1e-3, step++, 1.0}, t, exec);
      best_kernel = std::min(best_kernel, seconds_since(t0));
      t0 = std::chrono::steady_clock::now();
      kernels::traffic_probe_cpu(t, state_count, exec);
      best_probe = std::min(best_probe, seconds_since(t0));
    }
    print_row(args, {c, kernels::optimizer_bytes_per_elem(t, state_count), n,
                     std::string(kernels::isa_name(isa)), threads, best_kernel, best_probe});
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace zero::bench
