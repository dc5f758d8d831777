// zero-bench comm: bus bandwidth of reduce_scatter, all_gather and all_reduce, fp32, bf16 and fp16,
// for InProcComm (W ranks as threads of this process), ShmComm (W processes this command forks,
// over shared memory) and, when launched by mpirun, MpiComm (the job's processes). Each figure is
// validated (a sum over ranks of known values) before it is timed: best of R single ops after a
// warm-up, the slowest rank's time. InProcComm and ShmComm are measured in alternating rounds
// (--rounds N: inproc, shm, inproc, shm, ...), each row keeping its best over the rounds, so a
// slow minute of a shared machine lands on both; rows print once every round is done. ShmComm
// rows also give their ratio to InProcComm's figure for the same op, dtype and size ("vs
// inproc"), the target being 0.8 or more.
//
// Figures follow nccl-tests (comm_bandwidth.h): with S the bytes of the full buffer per rank
// (reduce_scatter's input, all_gather's output, all_reduce's buffer), algbw = S / t; busbw =
// algbw·(W-1)/W for reduce_scatter and all_gather, algbw·2(W-1)/W for all_reduce.
//
// The limit next to each figure is memcpy, measured in the same run with the same ranks: every
// rank std::memcpy's S bytes at once; limit = S / (slowest rank's time), best of one copy timed
// before each of the figure's single ops. It is a reference, not a bound: with 2 ranks a
// shared-memory reduce_scatter moves less than a memcpy of S per rank (reads S, writes S/2), so
// a ratio above 1 is possible.
//
// With --ranks-per-node N (N a divisor of the world size below it) every backend is measured a
// second time through a HierarchicalComm over the same ranks as world/N simulated nodes (backend
// "inproc/2x2" for 2 nodes of 2): two-level collectives beside the flat ones, each row with the
// bytes one op sends per rank inside nodes and across them (intra_node_bytes, inter_node_bytes).
//
// The figure the issue quotes: OpenMPI 4.1's reduce_scatter_block (MPI_Ireduce_scatter_block,
// which MpiComm uses) reached about 0.4 GB/s bus bandwidth on this machine for 64 MB per rank
// between 2 processes; a shared-memory collective should be an order of magnitude faster.
#include "benchmarks/comm_bench.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "benchmarks/bench_flags.h"
#include "benchmarks/comm_bandwidth.h"
#include "benchmarks/commands.h"
#include "cli/flags.h"
#include "zero/base/dtype.h"
#include "zero/base/error.h"
#include "zero/base/timer.h"
#include "zero/comm/communicator.h"
#include "zero/comm/hierarchical_comm.h"
#include "zero/comm/inproc_comm.h"
#include "zero/comm/node_topology.h"
#include "zero/comm/shm_comm.h"
#include "zero/device/device.h"

namespace zero::bench {

using comm_bench::BackendChoice;
using comm_bench::CommArgs;
using comm_bench::Figure;
using comm_bench::measure;
using comm_bench::measure_shm;

namespace {

constexpr std::string_view kUsage =
    "usage: zero-bench comm [--json] [--world-size N] [--sizes LIST] [--backend "
    "inproc|shm|mpi|nccl|all] "
    "[--reps R] [--rounds N] [--ranks-per-node N]";

// "64K", "1M", "2G" (binary units) or a plain byte count.
std::size_t parse_size(std::string_view text) {
  ZERO_CHECK(!text.empty(), "--sizes: empty size; {}", kUsage);
  std::size_t scale = 1;
  std::string digits(text);
  const std::size_t unit = std::string_view("KMG").find(
      static_cast<char>(std::toupper(static_cast<unsigned char>(text.back()))));
  if (unit != std::string_view::npos) {
    scale = std::size_t{1} << (10 * (unit + 1));
    digits.pop_back();
  }
  char* end = nullptr;
  const unsigned long long v = std::strtoull(digits.c_str(), &end, 10);
  ZERO_CHECK(!digits.empty() && end != digits.c_str() && *end == '\0' && v > 0 &&
                 v <= std::numeric_limits<std::size_t>::max() / scale,
             "--sizes {}: expected a positive byte count such as 65536, 64K, 16M or 1G", text);
  return static_cast<std::size_t>(v) * scale;
}

std::string size_label(std::size_t bytes) {
  if (bytes % (std::size_t{1} << 30) == 0) return std::to_string(bytes >> 30) + "G";
  if (bytes % (std::size_t{1} << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes % (std::size_t{1} << 10) == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes);
}

CommArgs parse_args(std::span<const std::string> args) {
  CommArgs r;
  auto integer = [&](cli::FlagArg& arg, long long min) {
    const std::string text = flag_value(arg, kUsage);
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    ZERO_CHECK(end != text.c_str() && *end == '\0' && v >= min && v <= 1 << 20,
               "{} {}: expected an integer >= {}", arg.name(), text, min);
    return static_cast<int>(v);
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    cli::FlagArg arg(args, i);
    const std::string& a = arg.name();
    if (a == "--json") {
      arg.no_value();
      r.json = true;
    } else if (a == "--world-size") {
      r.world_size = integer(arg, 2);
      // Each rank contributes rank + 1, which bf16 holds exactly up to 256.
      ZERO_CHECK(r.world_size <= 256, "--world-size {}: at most 256 ranks", r.world_size);
    } else if (a == "--ranks-per-node") {
      r.ranks_per_node = integer(arg, 1);
    } else if (a == "--reps") {
      r.repetitions = integer(arg, 1);
    } else if (a == "--rounds") {
      r.rounds = integer(arg, 1);
    } else if (a == "--sizes") {
      r.sizes_bytes.clear();
      const std::string text = flag_value(arg, kUsage);
      std::string_view list = text;
      while (!list.empty()) {
        const std::size_t comma = list.find(',');
        r.sizes_bytes.push_back(parse_size(list.substr(0, comma)));
        list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
      }
      ZERO_CHECK(!r.sizes_bytes.empty(), "--sizes needs at least one size; {}", kUsage);
    } else if (a == "--backend") {
      const std::string b = flag_value(arg, kUsage);
      if (b == "inproc") {
        r.backend = BackendChoice::Inproc;
      } else if (b == "shm") {
        r.backend = BackendChoice::Shm;
      } else if (b == "mpi") {
        r.backend = BackendChoice::Mpi;
      } else if (b == "nccl") {
        r.backend = BackendChoice::Nccl;
      } else if (b == "all") {
        r.backend = BackendChoice::All;
      } else {
        ZERO_CHECK(false, "--backend {}: expected inproc, shm, mpi, nccl or all", b);
      }
    } else {
      ZERO_CHECK(false, "unexpected argument '{}'; {}", args[i], kUsage);
    }
  }
  return r;
}

// Whether a launcher started this process as one rank of a job (OpenMPI's mpirun sets the first,
// PMIx launchers the second, MPICH's Hydra the third). Decided without initialising MPI.
bool launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

// The limit beside each figure: every rank of `comm` std::memcpy's `bytes` at the same time.
// The buffers are allocated and the copy validated once; seconds() then times one copy, the
// slowest rank's. A figure times one copy before each of its collectives and keeps the best of
// each, so a slow stretch of a shared machine lands on both sides of its ratio. On a GPU device
// the copy is the GPU's own (Device::copy between two buffers of its memory) and `control`
// carries the host-memory reduction. Collective over `comm`.
class MemcpyProbe {
 public:
  MemcpyProbe(Communicator& comm, Device& device, std::size_t bytes, Communicator& control)
      : comm_(comm), device_(device), control_(control), bytes_(bytes),
        gpu_(!device.host_addressable()) {
    const MemoryKind kind = gpu_ ? MemoryKind::Device : MemoryKind::Host;
    src_ = device.allocate(bytes, kind, MemoryTag::Other);
    dst_ = device.allocate(bytes, kind, MemoryTag::Other);
    std::vector<std::byte> expected(bytes, static_cast<std::byte>(comm.rank() + 1));
    std::vector<std::byte> got(bytes, std::byte{0});
    device.copy(src_.data(), expected.data(), bytes);
    device.copy(dst_.data(), got.data(), bytes);
    copy();
    device.copy(got.data(), dst_.data(), bytes);
    ZERO_CHECK(got == expected, "comm bench: memcpy of {} bytes on rank {} gave a wrong result",
               bytes, comm.rank());
  }

  double seconds() {
    comm_.barrier().wait();
    const auto start = std::chrono::steady_clock::now();
    copy();
    double seconds[1] = {seconds_since(start)};
    control_.all_reduce(seconds, seconds, 1, DType::F64, ReduceOp::Max).wait();
    return seconds[0];
  }

  double gbps(double seconds) const { return static_cast<double>(bytes_) / seconds / 1e9; }

 private:
  void copy() {
    if (gpu_) {
      device_.copy(dst_.data(), src_.data(), bytes_);
    } else {
      std::memcpy(dst_.data(), src_.data(), bytes_);
    }
  }

  Communicator& comm_;
  Device& device_;
  Communicator& control_;
  std::size_t bytes_;
  bool gpu_;
  Buffer src_;
  Buffer dst_;
};

// `rounds`: how many rounds the printed figures are the best of (1 under mpirun).
void print_header(const CommArgs& args, int rounds) {
  if (args.json) return;
  std::printf(
      "zero-bench comm: bus bandwidth (nccl-tests convention), best of %d single ops in each "
      "of %d rounds; limit: memcpy of the same bytes on every rank at once; vs inproc: busbw / "
      "inproc's\n",
      args.repetitions, rounds);
  std::printf("%-10s %-15s %-5s %5s %9s %10s %11s %11s %12s %7s %9s%s\n", "backend", "op",
              "dtype", "ranks", "per rank", "time ms", "algbw GB/s", "busbw GB/s", "memcpy GB/s",
              "ratio", "vs inproc", args.ranks_per_node ? "  intra/inter node bytes per op" : "");
}

void print_figure(const CommArgs& args, const Figure& f) {
  const std::string op(collective_name(f.op));
  const std::string dtype(dtype_name(f.dtype));
  const double ratio = f.timing.bus_gbps / f.memcpy_gbps;
  const bool compared = f.inproc_bus_gbps > 0;
  const double vs_inproc = compared ? f.timing.bus_gbps / f.inproc_bus_gbps : 0;
  if (args.json) {
    std::string extra;
    if (f.transport) {
      extra += fmt::format(",\"transport\":\"{}\"", shm_transport_name(*f.transport));
    }
    if (f.direct_fraction >= 0) extra += fmt::format(",\"direct_fraction\":{:.3f}", f.direct_fraction);
    if (f.inter_node_bytes >= 0) {
      extra += fmt::format(",\"intra_node_bytes\":{:.0f},\"inter_node_bytes\":{:.0f}",
                           f.intra_node_bytes, f.inter_node_bytes);
    }
    if (compared) {
      extra += fmt::format(",\"inproc_busbw_gb_per_s\":{:.4g},\"ratio_to_inproc\":{:.3f}",
                           f.inproc_bus_gbps, vs_inproc);
    }
    std::printf(
        "{\"bench\":\"comm\",\"backend\":\"%s\",\"op\":\"%s\",\"dtype\":\"%s\","
        "\"world_size\":%d,\"bytes_per_rank\":%zu,\"reps\":%d,\"time_s\":%.6g,"
        "\"algbw_gb_per_s\":%.4g,\"busbw_gb_per_s\":%.4g,\"limit\":\"memcpy\","
        "\"limit_gb_per_s\":%.4g,\"ratio\":%.3f%s}\n",
        f.backend.c_str(), op.c_str(), dtype.c_str(), f.world_size, f.timing.bytes_per_rank,
        args.repetitions, f.timing.seconds_per_op, f.timing.algorithm_gbps, f.timing.bus_gbps,
        f.memcpy_gbps, ratio, extra.c_str());
  } else {
    const std::string vs = compared ? fmt::format("{:.3f}", vs_inproc) : "";
    const std::string bytes = f.inter_node_bytes >= 0 ? fmt::format("  {:.0f} / {:.0f}",
                                                                     f.intra_node_bytes,
                                                                     f.inter_node_bytes)
                                                         : "";
    std::printf("%-10s %-15s %-5s %5d %9s %10.3f %11.2f %11.2f %12.2f %7.3f %9s%s\n",
                f.backend.c_str(), op.c_str(), dtype.c_str(), f.world_size,
                size_label(f.timing.bytes_per_rank).c_str(), f.timing.seconds_per_op * 1e3,
                f.timing.algorithm_gbps, f.timing.bus_gbps, f.memcpy_gbps, ratio, vs.c_str(),
                bytes.c_str());
  }
  std::fflush(stdout);
}

// Every size must split into `world_size` fp32 (and so bf16) chunks; names all that do not.
void check_sizes(const CommArgs& args, int world_size) {
  const auto world = static_cast<std::size_t>(world_size);
  std::string bad_sizes;
  for (std::size_t bytes : args.sizes_bytes) {
    if (bytes % (4 * world) != 0) bad_sizes += (bad_sizes.empty() ? "" : ", ") + size_label(bytes);
  }
  ZERO_CHECK(bad_sizes.empty(),
             "--sizes: {} bytes per rank cannot be split into {} fp32 chunks (use multiples of "
             "{} bytes)",
             bad_sizes, world, 4 * world);
}

// The rows of `flat` again, through a HierarchicalComm over `comm` as simulated nodes of
// args.ranks_per_node ranks, appended to `figures` (--ranks-per-node). Each row also counts one
// more op's bytes per level. Collective over `comm`.
void measure_two_level(Communicator& comm, const CommArgs& args, Device& device,
                       std::vector<Figure>& figures) {
  const NodeTopology topology = resolve_node_topology(comm.size(), args.ranks_per_node);
  const auto nodes = HierarchicalComm::create(comm, topology);
  const std::string name = fmt::format("{}/{}x{}", comm.backend_name(), topology.nodes(),
                                       topology.ranks_per_node);
  const std::size_t flat_rows = figures.size();
  for (std::size_t i = 0; i < flat_rows; ++i) {
    Figure f = figures[i];
    f.backend = name;
    f.transport.reset();
    f.direct_fraction = -1;
    for (int r = 0; r < args.repetitions; ++r) {
      const CollectiveTiming t = time_collective(*nodes, device, f.op, f.timing.bytes_per_rank, 1,
                                                 f.dtype, &comm);
      if (r == 0 || t.seconds_per_op < f.timing.seconds_per_op) f.timing = t;
    }
    // One op's bytes per level: a further call's traffic over the ops it issued.
    const NodeTraffic before = nodes->traffic();
    const CollectiveTiming counted =
        time_collective(*nodes, device, f.op, f.timing.bytes_per_rank, 1, f.dtype, &comm);
    const NodeTraffic after = nodes->traffic();
    f.intra_node_bytes = static_cast<double>(after.intra_bytes - before.intra_bytes) / counted.ops;
    f.inter_node_bytes = static_cast<double>(after.inter_bytes - before.inter_bytes) / counted.ops;
    figures.push_back(f);
  }
}

// In-process ranks, one GPU each, over NCCL (the in-process communicator carries the host-side
// reductions). The limit is the GPU's own copy between two buffers of its memory.
void check_nccl(const CommArgs& args) {
  const int gpus = visible_gpu_count();
  ZERO_CHECK(communicator_available("nccl"),
             "--backend nccl: this build has no NCCL (needs CUDA and NCCL at configure time)");
  ZERO_CHECK(gpus > 0,
             "--backend nccl: this process sees no CUDA device; run it on a machine with GPUs");
  ZERO_CHECK(gpus >= args.world_size,
             "--backend nccl: {} ranks need a GPU each, and this process sees {}; use "
             "--world-size {} or fewer",
             args.world_size, gpus, gpus);
}

std::vector<Figure> measure_nccl(const CommArgs& args) {
  std::vector<Figure> figures;
  run_ranks(args.world_size, [&](Communicator& host) {
    DeviceOptions options;
    options.cuda_ordinal = host.rank();
    const std::unique_ptr<Device> gpu = make_device("cuda", host.rank(), options);
    const std::unique_ptr<Communicator> nccl = make_gpu_communicator(host, gpu->gpu_ordinal());
    auto mine = measure(*nccl, args, gpu.get(), &host);
    if (host.rank() == 0) figures = std::move(mine);
  });
  return figures;
}

std::vector<Figure> measure_inproc(const CommArgs& args) {
  std::vector<Figure> figures;
  run_ranks(args.world_size, [&](Communicator& comm) {
    auto mine = measure(comm, args);
    if (comm.rank() == 0) figures = std::move(mine);
  });
  return figures;
}

// Keeps in `best` each row's fastest timing (and its fastest memcpy) of `round`.
void keep_best(std::vector<Figure>& best, const std::vector<Figure>& round) {
  if (best.empty()) {
    best = round;
    return;
  }
  for (std::size_t i = 0; i < best.size(); ++i) {
    if (round[i].timing.seconds_per_op < best[i].timing.seconds_per_op) {
      best[i].timing = round[i].timing;
    }
    best[i].memcpy_gbps = std::max(best[i].memcpy_gbps, round[i].memcpy_gbps);
    best[i].direct_fraction = std::min(best[i].direct_fraction, round[i].direct_fraction);
  }
}

// InProcComm and ShmComm in alternating rounds, then every row printed.
void measure_local(const CommArgs& args, bool run_inproc, bool run_shm) {
  std::vector<Figure> inproc;
  std::vector<Figure> shm;
  for (int round = 0; round < args.rounds; ++round) {
    if (!args.json && args.rounds > 1) {
      std::fprintf(stderr, "zero-bench comm: round %d of %d\n", round + 1, args.rounds);
    }
    if (run_inproc) keep_best(inproc, measure_inproc(args));
    if (run_shm) keep_best(shm, measure_shm(args));
  }
  for (const Figure& f : inproc) print_figure(args, f);
  for (std::size_t i = 0; i < shm.size(); ++i) {
    if (i < inproc.size()) shm[i].inproc_bus_gbps = inproc[i].timing.bus_gbps;
    print_figure(args, shm[i]);
  }
}

}  // namespace

// comm_bench.h
std::vector<Figure> comm_bench::measure(Communicator& comm, const CommArgs& args, Device* gpu,
                                        Communicator* control) {
  check_sizes(args, comm.size());
  std::unique_ptr<Device> cpu;
  if (gpu == nullptr) cpu = make_device("cpu", comm.rank());
  Device* const device = gpu != nullptr ? gpu : cpu.get();
  Communicator& host = control != nullptr ? *control : comm;
  const std::optional<ShmTransport> transport = shm_transport(comm);
  std::vector<Figure> figures;
  for (std::size_t bytes : args.sizes_bytes) {
    MemcpyProbe limit(comm, *device, bytes, host);
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      for (Collective op :
           {Collective::ReduceScatter, Collective::AllGather, Collective::AllReduce}) {
        // Single ops, each after its own validated warm-up run and a timed memcpy; every rank
        // gets the same figures, so every rank keeps the same best.
        Figure f{comm.backend_name(), op, dtype, comm.size(), {}, 0, transport, 0};
        const std::optional<ShmReadStats> before = shm_read_stats(comm);
        double memcpy_s = std::numeric_limits<double>::infinity();
        for (int r = 0; r < args.repetitions; ++r) {
          memcpy_s = std::min(memcpy_s, limit.seconds());
          const CollectiveTiming t = time_collective(comm, *device, op, bytes, 1, dtype, &host);
          if (r == 0 || t.seconds_per_op < f.timing.seconds_per_op) f.timing = t;
        }
        f.memcpy_gbps = limit.gbps(memcpy_s);
        if (const std::optional<ShmReadStats> after = shm_read_stats(comm)) {
          const auto direct = static_cast<double>(after->direct_bytes - before->direct_bytes);
          const auto kernel = static_cast<double>(after->kernel_bytes - before->kernel_bytes);
          if (direct + kernel > 0) f.direct_fraction = direct / (direct + kernel);
        }
        figures.push_back(f);
      }
    }
  }
  if (gpu == nullptr && args.ranks_per_node) measure_two_level(comm, args, *device, figures);
  return figures;
}

int run_comm(std::span<const std::string> argv) {
  const CommArgs args = parse_args(argv);
  const bool under_mpirun = launched_by_mpirun();
  const bool mpi_built = communicator_available("mpi");
  ZERO_CHECK(args.backend != BackendChoice::Mpi || mpi_built,
             "--backend mpi: this build has no MPI (MPI was not found at configure time, or "
             "ZERO_WITH_MPI=OFF)");
  ZERO_CHECK(args.backend != BackendChoice::Mpi || under_mpirun,
             "--backend mpi: not launched by mpirun; run e.g. `mpirun -np 2 zero-bench comm "
             "--backend mpi`");
  ZERO_CHECK(!under_mpirun || mpi_built,
             "launched by mpirun, but this build has no MPI to coordinate the processes; run "
             "zero-bench comm without mpirun for the inproc figures");

  ZERO_CHECK(!args.ranks_per_node || args.backend != BackendChoice::Nccl,
             "--ranks-per-node with --backend nccl: two-level collectives run on host memory; "
             "drop one of the two");
  if (args.ranks_per_node && !under_mpirun) {
    resolve_node_topology(args.world_size, args.ranks_per_node);  // throws naming the divisors
  }
  if (args.backend == BackendChoice::Nccl) {
    ZERO_CHECK(!under_mpirun,
               "--backend nccl: zero-bench runs its own ranks; run it without mpirun");
    check_sizes(args, args.world_size);
    check_nccl(args);
    print_header(args, 1);
    for (const Figure& f : measure_nccl(args)) print_figure(args, f);
    return 0;
  }
  const bool run_inproc =
      args.backend == BackendChoice::Inproc || args.backend == BackendChoice::All;
  const bool run_shm = args.backend == BackendChoice::Shm || args.backend == BackendChoice::All;
  ZERO_CHECK(!under_mpirun || args.backend != BackendChoice::Shm,
             "--backend shm: zero-bench forks its own shm ranks; run it without mpirun");
  if (run_inproc || run_shm) check_sizes(args, args.world_size);
  if (!under_mpirun) {
    print_header(args, args.rounds);
    measure_local(args, run_inproc, run_shm);
    if (args.backend == BackendChoice::All) {
      std::fprintf(stderr, "zero-bench comm: mpi skipped (not launched by mpirun)\n");
    }
    return 0;
  }
  if (args.backend == BackendChoice::All) {
    std::fprintf(stderr,
                 "zero-bench comm: shm skipped (it forks its own ranks; run without "
                 "mpirun)\n");
  }

  const auto mpi = make_communicator("mpi");
  ZERO_CHECK(mpi->size() >= 2 || args.backend != BackendChoice::Mpi,
             "--backend mpi: the job has 1 process; run it with mpirun -np 2 or more");
  const bool run_mpi = (args.backend == BackendChoice::Mpi || args.backend == BackendChoice::All) &&
                       mpi->size() >= 2;
  if (run_mpi) check_sizes(args, mpi->size());
  if (!run_mpi && args.backend == BackendChoice::All && mpi->rank() == 0) {
    std::fprintf(stderr, "zero-bench comm: mpi skipped (the job has 1 process)\n");
  }
  if (mpi->rank() == 0) print_header(args, 1);
  if (run_mpi) {
    const std::vector<Figure> figures = measure(*mpi, args);
    if (mpi->rank() == 0) {
      for (const Figure& f : figures) print_figure(args, f);
    }
  }
  if (run_inproc) {
    // The other processes wait in the barrier, sleeping rather than spinning (MpiComm's wait
    // backs off), so rank 0's threads have the machine. A failure on rank 0 is rethrown only
    // after the barrier, so the others are not left waiting.
    std::exception_ptr failure;
    if (mpi->rank() == 0) {
      try {
        for (const Figure& f : measure_inproc(args)) print_figure(args, f);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    mpi->set_timeout(std::chrono::hours(1));
    mpi->barrier().wait();
    if (failure) std::rethrow_exception(failure);
  }
  return 0;
}

}  // namespace zero::bench
