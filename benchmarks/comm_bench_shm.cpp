// comm_bench.h's measure_shm: zero-bench comm's ShmComm ranks, forked from this process, rank 0
// sending its figures back through a pipe.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "benchmarks/comm_bench.h"
#include "zero/base/error.h"
#include "zero/comm/shm_comm.h"

namespace zero::bench::comm_bench {

namespace {

// What a forked shm rank 0 hands back to the parent through a pipe, one record per figure in
// measure()'s order (the parent knows each row's op, dtype and size from that order).
struct FigureRecord {
  CollectiveTiming timing;
  double memcpy_gbps = 0;
  double direct_fraction = -1;
  int transport = -1;  // ShmTransport, or -1 for none
  double intra_node_bytes = -1;
  double inter_node_bytes = -1;
};

void write_all(int fd, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    ZERO_CHECK(n > 0, "zero-bench comm: writing figures to the parent failed: {}",
               std::strerror(errno));
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

// Reads until end of file.
std::string read_all(int fd) {
  std::string out;
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    ZERO_CHECK(n >= 0, "zero-bench comm: reading the shm ranks' figures failed: {}",
               std::strerror(errno));
    if (n == 0) return out;
    out.append(chunk, static_cast<std::size_t>(n));
  }
}

}  // namespace

std::vector<Figure> measure_shm(const CommArgs& args) {
  const std::string name = fmt::format("zero-bench-comm-{}-{}", ::getpid(),
                                       std::chrono::steady_clock::now().time_since_epoch().count());
  int pipe_fds[2];
  ZERO_CHECK(::pipe2(pipe_fds, O_CLOEXEC) == 0, "zero-bench comm: pipe failed: {}",
             std::strerror(errno));
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < args.world_size; ++r) {
    const pid_t pid = ::fork();
    ZERO_CHECK(pid >= 0, "zero-bench comm: fork of shm rank {} failed", r);
    if (pid == 0) {
      ::close(pipe_fds[0]);
      int code = 0;
      try {
        const auto comm =
            make_shm_communicator(name, r, args.world_size, CommOptions{std::chrono::minutes(10)});
        const std::vector<Figure> figures = measure(*comm, args);
        if (r == 0) {
          for (const Figure& f : figures) {
            const FigureRecord rec{
                f.timing,           f.memcpy_gbps,
                f.direct_fraction,  f.transport ? static_cast<int>(*f.transport) : -1,
                f.intra_node_bytes, f.inter_node_bytes};
            write_all(pipe_fds[1], &rec, sizeof rec);
          }
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "zero-bench comm: shm rank %d: %s\n", r, e.what());
        code = 1;
      }
      std::fflush(nullptr);
      ::_exit(code);  // never return into the parent's stack
    }
    pids.push_back(pid);
  }
  ::close(pipe_fds[1]);
  const std::string records = read_all(pipe_fds[0]);
  ::close(pipe_fds[0]);
  std::vector<std::string> failed;
  for (int r = 0; r < args.world_size; ++r) {
    int status = 0;
    ::waitpid(pids[static_cast<std::size_t>(r)], &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    failed.push_back(WIFSIGNALED(status)
                         ? fmt::format("rank {} killed by signal {}", r, WTERMSIG(status))
                         : fmt::format("rank {} exited with status {}", r, WEXITSTATUS(status)));
  }
  ZERO_CHECK(failed.empty(), "zero-bench comm: the shm ranks failed: {}",
             fmt::format("{}", fmt::join(failed, "; ")));

  // measure()'s order: the flat rows, then (--ranks-per-node) the same rows in two levels.
  std::vector<Figure> figures;
  const std::size_t count = records.size() / sizeof(FigureRecord);
  const std::string two_level =
      args.ranks_per_node
          ? fmt::format("shm/{}x{}", args.world_size / *args.ranks_per_node, *args.ranks_per_node)
          : "";
  for (const std::string& backend : {std::string("shm"), two_level}) {
    if (backend.empty()) continue;
    for (std::size_t size_index = 0; size_index < args.sizes_bytes.size(); ++size_index) {
      for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
        for (Collective op :
             {Collective::ReduceScatter, Collective::AllGather, Collective::AllReduce}) {
          ZERO_CHECK(figures.size() < count && records.size() % sizeof(FigureRecord) == 0,
                     "zero-bench comm: the shm ranks sent {} bytes of figures, not {} records",
                     records.size(), figures.size() + 1);
          FigureRecord rec;
          std::memcpy(&rec, records.data() + figures.size() * sizeof rec, sizeof rec);
          Figure f{backend,         op,           dtype, args.world_size, rec.timing,
                   rec.memcpy_gbps, std::nullopt, 0};
          if (rec.transport >= 0) f.transport = static_cast<ShmTransport>(rec.transport);
          f.direct_fraction = rec.direct_fraction;
          f.intra_node_bytes = rec.intra_node_bytes;
          f.inter_node_bytes = rec.inter_node_bytes;
          figures.push_back(f);
        }
      }
    }
  }
  return figures;
}

}  // namespace zero::bench::comm_bench
