#include "benchmarks/comm_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "zero/base/error.h"
#include "zero/base/timer.h"
#include "zero/comm/reduce_math.h"

namespace zero::bench {

double bus_bandwidth_factor(Collective kind, int world_size) {
  const double n = world_size;
  switch (kind) {
    case Collective::ReduceScatter:
    case Collective::AllGather:
    case Collective::AllToAll: return (n - 1) / n;
    case Collective::AllReduce: return 2 * (n - 1) / n;
    case Collective::Broadcast: return 1;
    case Collective::Barrier: return 0;
  }
  return 0;
}

CollectiveTiming time_collective(Communicator& comm, Device& device, Collective kind,
                                 std::size_t bytes_per_rank, int iterations, DType dtype,
                                 Communicator* control) {
  const auto world = static_cast<std::size_t>(comm.size());
  const std::size_t esize = dtype_size(dtype);
  ZERO_CHECK(kind == Collective::ReduceScatter || kind == Collective::AllGather ||
                 kind == Collective::AllReduce,
             "time_collective: {} is not timed", collective_name(kind));
  ZERO_CHECK(dtype != DType::F64, "time_collective: fp64 is not timed");
  ZERO_CHECK(bytes_per_rank % (esize * world) == 0 && bytes_per_rank > 0,
             "time_collective: {} bytes is not a positive multiple of {} x {} ranks",
             bytes_per_rank, esize, world);
  ZERO_CHECK(iterations >= 1, "time_collective: iterations must be at least 1");
  const std::size_t elems = bytes_per_rank / esize;
  const std::size_t chunk = elems / world;
  const MemoryKind kind_of_memory =
      device.host_addressable() ? MemoryKind::Host : MemoryKind::Device;
  Buffer big = device.allocate(bytes_per_rank, kind_of_memory, MemoryTag::Other);
  Buffer small = device.allocate(bytes_per_rank / world, kind_of_memory, MemoryTag::Other);

  auto issue = [&]() -> Work {
    switch (kind) {
      case Collective::ReduceScatter:
        return comm.reduce_scatter(big.data(), small.data(), chunk, dtype, ReduceOp::Sum);
      case Collective::AllGather: return comm.all_gather(small.data(), big.data(), chunk, dtype);
      default: return comm.all_reduce(big.data(), big.data(), elems, dtype, ReduceOp::Sum);
    }
  };
  // Small integers, exact in every dtype (sums up to world·(world+1)/2), through host memory
  // (Device::copy: a GPU's memory is not the host's).
  auto fill = [&](Buffer& b, float value) {
    const std::vector<float> v(b.size_bytes() / esize, value);
    std::vector<std::byte> raw(b.size_bytes());
    if (dtype == DType::F32) {
      std::memcpy(raw.data(), v.data(), raw.size());
    } else {
      comm_detail::narrow_from_f32(v.data(), raw.data(), v.size(), dtype, 1.0f);
    }
    device.copy(b.data(), raw.data(), raw.size());
  };
  auto values = [&](const Buffer& b) {
    std::vector<std::byte> raw(b.size_bytes());
    device.copy(raw.data(), b.data(), raw.size());
    std::vector<float> v(b.size_bytes() / esize);
    if (dtype == DType::F32) {
      std::memcpy(v.data(), raw.data(), raw.size());
    } else {
      comm_detail::widen_to_f32(raw.data(), v.data(), v.size(), dtype);
    }
    return v;
  };

  // Validate, then time (STYLE.md, Benchmarks).
  fill(big, static_cast<float>(comm.rank() + 1));
  fill(small, static_cast<float>(comm.rank() + 1));
  issue().wait();
  const auto n = static_cast<float>(world);
  const float sum = n * (n + 1) / 2;
  bool ok = true;
  switch (kind) {
    case Collective::ReduceScatter: {
      const std::vector<float> got = values(small);
      ok = std::all_of(got.begin(), got.end(), [&](float v) { return v == sum; });
      break;
    }
    case Collective::AllGather: {
      const std::vector<float> got = values(big);
      for (std::size_t i = 0; i < elems && ok; ++i)
        ok = got[i] == static_cast<float>(i / chunk + 1);
      break;
    }
    default: {
      const std::vector<float> got = values(big);
      ok = std::all_of(got.begin(), got.end(), [&](float v) { return v == sum; });
    }
  }
  ZERO_CHECK(ok, "time_collective: {} ({}) on rank {} gave a wrong result", collective_name(kind),
             dtype_name(dtype), comm.rank());

  comm.barrier().wait();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) issue().wait();
  double seconds[1] = {seconds_since(start)};
  (control != nullptr ? *control : comm)
      .all_reduce(seconds, seconds, 1, DType::F64, ReduceOp::Max)
      .wait();

  CollectiveTiming t;
  t.bytes_per_rank = bytes_per_rank;
  t.iterations = iterations;
  t.ops = 1 + iterations;
  t.seconds_per_op = seconds[0] / iterations;
  t.algorithm_gbps = static_cast<double>(bytes_per_rank) / t.seconds_per_op / 1e9;
  t.bus_gbps = t.algorithm_gbps * bus_bandwidth_factor(kind, comm.size());
  return t;
}

}  // namespace zero::bench
