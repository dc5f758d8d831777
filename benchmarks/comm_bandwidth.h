// Timing of collectives, for `zero-bench comm` (comm_bench.cpp).
//
// Bus bandwidth follows the nccl-tests convention, so figures compare across world sizes and
// with the memory/link bandwidth they run on: with S the bytes of the larger per-rank buffer
// (reduce_scatter: input; all_gather: output; all_reduce, broadcast: the buffer) and t the time,
// algorithm bandwidth = S / t and bus bandwidth = algorithm bandwidth × factor, where the factor
// is (N-1)/N for reduce_scatter and all_gather, 2(N-1)/N for all_reduce, 1 for broadcast.
#pragma once

#include <cstddef>

#include "zero/comm/communicator.h"
#include "zero/device/device.h"

namespace zero::bench {

double bus_bandwidth_factor(Collective kind, int world_size);

struct CollectiveTiming {
  std::size_t bytes_per_rank = 0;  // S above
  int iterations = 0;
  int ops = 0;                // collectives issued on `comm`: the checked one, then the timed ones
  double seconds_per_op = 0;  // slowest rank's average
  double algorithm_gbps = 0;  // 1e9 bytes per second
  double bus_gbps = 0;
};

// Collective over `comm`: allocates `dtype` buffers of `bytes_per_rank` (tag Other) on `device`
// (host memory, or the GPU's own for a GPU device), checks one run's result against the expected
// values (throws zero::Error if wrong), then times `iterations` back-to-back ops after one
// warm-up. `control` (`comm` when null) carries the host-memory timing reduction, for a `comm`
// that takes device memory only (NCCL). Every rank returns the same figures.
// REQUIRES: kind is ReduceScatter, AllGather or AllReduce; dtype F32, BF16 or F16;
// bytes_per_rank a multiple of dtype_size × comm.size(); iterations >= 1.
CollectiveTiming time_collective(Communicator& comm, Device& device, Collective kind,
                                 std::size_t bytes_per_rank, int iterations,
                                 DType dtype = DType::F32, Communicator* control = nullptr);

}  // namespace zero::bench
