// The limits `zero-bench step` compares the optimizer phase with: memcpy of the optimizer's bytes,
// and kernels::traffic_probe_cpu over the partition's arrays, on every rank at once.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "benchmarks/step_bench.h"
#include "kernels/compute.h"
#include "kernels/cpu_parallel.h"
#include "kernels/isa.h"
#include "kernels/optimizer.h"
#include "kernels/traffic_probe.h"
#include "zero/base/error.h"
#include "zero/base/timer.h"

namespace zero::bench::step_bench {

namespace {

constexpr int kLimitReps = 5;
constexpr std::size_t kMemcpyTileBytes = std::size_t{1} << 20;

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using HostArray = std::unique_ptr<std::byte, AlignedFree>;

// `bytes` of page-aligned memory outside the rank's Device, so the engine's ledger does not see
// it; first touched (zeroed) in 1 MiB tiles by `threads` OpenMP threads.
HostArray host_array(std::size_t bytes, int threads) {
  const std::size_t rounded = std::max<std::size_t>((bytes + 4095) / 4096 * 4096, 4096);
  HostArray a(static_cast<std::byte*>(std::aligned_alloc(4096, rounded)));
  ZERO_CHECK_AS(OutOfMemory, a != nullptr, "step bench: cannot allocate {} bytes", rounded);
  std::byte* p = a.get();
  kernels::detail::for_each_tile(
      rounded, kMemcpyTileBytes, threads,
      [&](std::size_t b, std::size_t e) { std::memset(p + b, 0, e - b); });
  return a;
}

// The slowest rank's seconds for fn(), best of kLimitReps; every rank starts each repetition
// after a barrier. Collective.
double best_seconds(Communicator& comm, const std::function<void()>& fn) {
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < kLimitReps; ++r) {
    comm.barrier().wait();
    const Clock::time_point start = Clock::now();
    fn();
    double seconds = seconds_since(start);
    comm.all_reduce(&seconds, &seconds, 1, DType::F64, ReduceOp::Max).wait();
    best = std::min(best, seconds);
  }
  return best;
}

// `shape`'s dtypes over `numel` elements of the given arrays (param_out only where `shape` has
// one).
kernels::OptimizerTensors probe_tensors(const kernels::OptimizerTensors& shape, std::size_t numel,
                                        void* master, void* grad, void* state0, void* state1,
                                        void* out) {
  kernels::OptimizerTensors t = shape;
  t.master = static_cast<float*>(master);
  t.grad = grad;
  t.state0 = state0;
  t.state1 = state1;
  t.param_out = shape.param_out != nullptr ? out : nullptr;
  t.numel = numel;
  return t;
}

}  // namespace

// Seconds for every rank to copy `bytes` at once with `threads` OpenMP threads, after a
// validated warm-up copy. Each thread copies one contiguous run, as the optimizer's static split
// gives each thread, with one plain memcpy call (libc picks its strategy for the run's size, as
// for any copy). Collective.
double memcpy_seconds(Communicator& comm, std::size_t bytes, int threads) {
  const HostArray src = host_array(bytes, threads);
  const HostArray dst = host_array(bytes, threads);
  std::memset(src.get(), comm.rank() + 1, bytes);
  const auto t = static_cast<std::size_t>(threads);
  const std::size_t run_bytes = ((bytes + t - 1) / t + 4095) / 4096 * 4096;
  auto copy = [&] {
    kernels::detail::for_each_tile(bytes, run_bytes, threads, [&](std::size_t b, std::size_t e) {
      std::memcpy(dst.get() + b, src.get() + b, e - b);
    });
  };
  copy();
  ZERO_CHECK(std::memcmp(dst.get(), src.get(), bytes) == 0,
             "step bench: memcpy of {} bytes on rank {} gave a wrong result", bytes, comm.rank());
  return best_seconds(comm, copy);
}

// Seconds for every rank at once to run kernels::traffic_probe_cpu (the optimizer's loads and
// stores, same tiles and threads, no arithmetic) over `shape`'s dtypes and `numel` elements, after
// one warm-up run. The probe leaves meaningless values: nothing to validate. Collective.
double probe_seconds(Communicator& comm, const kernels::OptimizerTensors& shape, int state_count,
                     std::size_t numel, int threads) {
  const HostArray master = host_array(numel * sizeof(float), threads);
  const HostArray grad = host_array(numel * dtype_size(shape.grad_dtype), threads);
  const HostArray state0 = host_array(numel * dtype_size(shape.state_dtype), threads);
  const HostArray state1 = host_array(numel * dtype_size(shape.state_dtype), threads);
  const HostArray out = host_array(numel * dtype_size(shape.param_out_dtype), threads);
  const kernels::OptimizerTensors t =
      probe_tensors(shape, numel, master.get(), grad.get(), state0.get(), state1.get(), out.get());
  const kernels::CpuExec exec{threads, kernels::Isa::Auto};
  auto probe = [&] { kernels::traffic_probe_cpu(t, state_count, exec); };
  probe();
  return best_seconds(comm, probe);
}

// Seconds for every rank at once to copy `bytes` between two arrays of its device's memory, after
// a validated warm-up copy. Collective over the host communicator `comm`.
double device_memcpy_seconds(Communicator& comm, Device& device, std::size_t bytes) {
  const Buffer src = device.allocate(bytes, MemoryKind::Device, MemoryTag::Other);
  const Buffer dst = device.allocate(bytes, MemoryKind::Device, MemoryTag::Other);
  std::vector<std::byte> pattern(bytes, static_cast<std::byte>(comm.rank() + 1));
  device.copy(src.data(), pattern.data(), bytes);
  auto copy = [&] { device.copy(dst.data(), src.data(), bytes); };
  copy();
  std::vector<std::byte> back(bytes);
  device.copy(back.data(), dst.data(), bytes);
  ZERO_CHECK(back == pattern, "step bench: a {}-byte copy on {} rank {} gave a wrong result", bytes,
             device.name(), comm.rank());
  return best_seconds(comm, copy);
}

double pinned_copy_seconds(Communicator& comm, Device& device, std::size_t bytes, bool to_host) {
  const Buffer host = device.allocate(bytes, MemoryKind::PinnedHost, MemoryTag::Other);
  const Buffer dev = device.allocate(bytes, MemoryKind::Device, MemoryTag::Other);
  const auto fill = static_cast<std::byte>(comm.rank() + 3);
  std::memset(host.data(), static_cast<int>(fill), bytes);
  device.copy(dev.data(), host.data(), bytes);  // the device's copy holds the pattern
  std::vector<std::byte> back(bytes);
  device.copy(back.data(), dev.data(), bytes);
  ZERO_CHECK(std::all_of(back.begin(), back.end(), [&](std::byte b) { return b == fill; }),
             "step bench: a {}-byte pinned copy on {} rank {} gave a wrong result", bytes,
             device.name(), comm.rank());
  auto copy = [&] {
    if (to_host) {
      device.copy(host.data(), dev.data(), bytes);
    } else {
      device.copy(dev.data(), host.data(), bytes);
    }
  };
  copy();
  return best_seconds(comm, copy);
}

// kernels' traffic probe through the device's compute table (synchronous, as every entry is) over
// device arrays of the partition's size and dtypes. Collective over `comm`.
double device_probe_seconds(Communicator& comm, Device& device,
                            const kernels::OptimizerTensors& shape, int state_count,
                            std::size_t numel) {
  auto array = [&](std::size_t bytes) {
    Buffer b =
        device.allocate(std::max<std::size_t>(bytes, 1), MemoryKind::Device, MemoryTag::Other);
    const std::vector<std::byte> zeros(b.size_bytes());
    device.copy(b.data(), zeros.data(), zeros.size());
    return b;
  };
  const Buffer master = array(numel * sizeof(float));
  const Buffer grad = array(numel * dtype_size(shape.grad_dtype));
  const Buffer state0 = array(numel * dtype_size(shape.state_dtype));
  const Buffer state1 = array(numel * dtype_size(shape.state_dtype));
  const Buffer out = array(numel * dtype_size(shape.param_out_dtype));
  const kernels::OptimizerTensors t = probe_tensors(shape, numel, master.data(), grad.data(),
                                                    state0.data(), state1.data(), out.data());
  auto probe = [&] { device.compute().traffic_probe(t, state_count, {}); };
  probe();
  return best_seconds(comm, probe);
}

// Per rank, per step without accumulation: N elements in all, S = N / W of them this rank's
// partition (the optimizer's elements, all W partitions at stage 0), with g, a, c, m the bytes of
// the gradient (model), accumulation, communication and model dtypes. In-process collectives:
// a reduce-scatter reads W chunks and writes one; an all-reduce also copies the W − 1 other
// reduced chunks; an all-gather copies W − 1 slices.
PhaseBytes phase_bytes(int stage, int world, const config::DsConfig& cfg,
                       std::size_t optimizer_elems, std::size_t optimizer_bytes_per_elem,
                       double gathered_elems, bool synthetic, bool forward_reads,
                       double pushed_bytes) {
  const double W = world;
  const double domains = stage == 0 ? W : 1;
  const double S = static_cast<double>(optimizer_elems) / domains;
  const double N = S * W;
  const double g = static_cast<double>(dtype_size(cfg.model_dtype));
  const double a =
      static_cast<double>(dtype_size(cfg.data_types.grad_accum_dtype.value_or(cfg.model_dtype)));
  const double c = static_cast<double>(dtype_size(cfg.communication_data_type));
  const double m = g;
  const bool check_overflow =
      cfg.fp16.enabled || (cfg.bf16.enabled && cfg.bf16.check_grad_overflow);
  PhaseBytes b;
  // The synthetic trainer reads every parameter (kForwardPasses times, but a unit's later passes
  // may hit the cache, so only the first counts) and copies every gradient into its slot.
  if (synthetic) b.model = N * ((forward_reads ? m : 0) + 2 * g);
  b.pack = N * (g + c);  // every rank's chunks, in the communication dtype
  b.reduce = N * c + S * c + (stage == 0 ? 2 * (N - S) * c : 0);
  b.unpack = domains * S * (c + a);
  b.norm = domains * S * a * (check_overflow ? 2 : 1);
  b.optimizer = static_cast<double>(optimizer_elems * optimizer_bytes_per_elem);
  if (stage == 1 || stage == 2) {
    // What the step pushed is written once, from the cache (the optimizer's phase times it);
    // the all-gather copies the rest.
    const double pushed = std::min(pushed_bytes, (N - S) * m);
    b.optimizer += pushed;
    b.all_gather = 2 * ((N - S) * m - pushed);
  }
  if (stage == 3) {
    // Persistent units the step pushed are written from the cache into every rank's gathered
    // copy, this rank's own included (the peers' are what it counted).
    if (pushed_bytes > 0 && W > 1) b.optimizer += pushed_bytes * W / (W - 1);
    b.gather = 2 * gathered_elems * (W - 1) / W * m;
  }
  return b;
}

}  // namespace zero::bench::step_bench
