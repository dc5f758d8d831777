#include "zero/comm/bandwidth.h"

#include <algorithm>
#include <chrono>

#include "zero/error.h"

namespace zero {

double bus_bandwidth_factor(Collective kind, int world_size) {
  const double n = world_size;
  switch (kind) {
    case Collective::ReduceScatter:
    case Collective::AllGather: return (n - 1) / n;
    case Collective::AllReduce: return 2 * (n - 1) / n;
    case Collective::Broadcast: return 1;
    case Collective::Barrier: return 0;
  }
  return 0;
}

CollectiveTiming time_collective(Communicator& comm, Device& device, Collective kind,
                                 std::size_t bytes_per_rank, int iterations) {
  const auto world = static_cast<std::size_t>(comm.size());
  ZERO_CHECK(kind == Collective::ReduceScatter || kind == Collective::AllGather ||
                 kind == Collective::AllReduce,
             "time_collective: {} is not timed", collective_name(kind));
  ZERO_CHECK(bytes_per_rank % (4 * world) == 0 && bytes_per_rank > 0,
             "time_collective: {} bytes is not a positive multiple of 4 x {} ranks", bytes_per_rank,
             world);
  ZERO_CHECK(iterations >= 1, "time_collective: iterations must be at least 1");
  const std::size_t elems = bytes_per_rank / 4;
  const std::size_t chunk = elems / world;
  Buffer big = device.allocate(bytes_per_rank, MemoryKind::Host, MemoryTag::Other);
  Buffer small = device.allocate(bytes_per_rank / world, MemoryKind::Host, MemoryTag::Other);
  auto big_f = big.as<float>();
  auto small_f = small.as<float>();
  const auto mine = static_cast<float>(comm.rank() + 1);

  auto issue = [&]() -> Work {
    switch (kind) {
      case Collective::ReduceScatter:
        return comm.reduce_scatter(big_f.data(), small_f.data(), chunk, DType::F32, ReduceOp::Sum);
      case Collective::AllGather:
        return comm.all_gather(small_f.data(), big_f.data(), chunk, DType::F32);
      default: return comm.all_reduce(big_f.data(), big_f.data(), elems, DType::F32, ReduceOp::Sum);
    }
  };

  // Validate, then time (STYLE.md, Benchmarks).
  std::fill(big_f.begin(), big_f.end(), mine);
  std::fill(small_f.begin(), small_f.end(), mine);
  issue().wait();
  const auto n = static_cast<float>(world);
  const float sum = n * (n + 1) / 2;
  bool ok = true;
  switch (kind) {
    case Collective::ReduceScatter:
      ok = std::all_of(small_f.begin(), small_f.end(), [&](float v) { return v == sum; });
      break;
    case Collective::AllGather:
      for (std::size_t i = 0; i < elems && ok; i += chunk) {
        ok = big_f[i] == static_cast<float>(i / chunk + 1) && big_f[i + chunk - 1] == big_f[i];
      }
      break;
    default: ok = std::all_of(big_f.begin(), big_f.end(), [&](float v) { return v == sum; });
  }
  ZERO_CHECK(ok, "time_collective: {} on rank {} gave a wrong result", collective_name(kind),
             comm.rank());

  comm.barrier().wait();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) issue().wait();
  double seconds[1] = {
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
  comm.all_reduce(seconds, seconds, 1, DType::F64, ReduceOp::Max).wait();

  CollectiveTiming t;
  t.bytes_per_rank = bytes_per_rank;
  t.iterations = iterations;
  t.seconds_per_op = seconds[0] / iterations;
  t.algorithm_gbps = static_cast<double>(bytes_per_rank) / t.seconds_per_op / 1e9;
  t.bus_gbps = t.algorithm_gbps * bus_bandwidth_factor(kind, comm.size());
  return t;
}

}  // namespace zero
