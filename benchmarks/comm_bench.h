// Internal to `zero-bench comm` (comm_bench.cpp): its arguments, one figure, the measurement every
// backend shares and the forked ShmComm ranks (comm_bench_shm.cpp).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "benchmarks/comm_bandwidth.h"
#include "zero/base/dtype.h"
#include "zero/comm/communicator.h"
#include "zero/comm/shm_comm.h"
#include "zero/device/device.h"

namespace zero::bench::comm_bench {

enum class BackendChoice { Inproc, Shm, Mpi, Nccl, All };

struct CommArgs {
  bool json = false;
  int world_size = 2;  // inproc, shm and nccl (one GPU per rank); under mpirun the job's size
  std::vector<std::size_t> sizes_bytes = {std::size_t{1} << 20, std::size_t{16} << 20,
                                          std::size_t{64} << 20};
  BackendChoice backend = BackendChoice::All;
  int repetitions = 5;
  int rounds = 3;                     // of inproc and shm, alternating
  std::optional<int> ranks_per_node;  // also measure two-level collectives over simulated nodes
};

struct Figure {
  std::string backend;
  Collective op = Collective::ReduceScatter;
  DType dtype = DType::F32;
  int world_size = 0;
  CollectiveTiming timing;
  double memcpy_gbps = 0;
  std::optional<ShmTransport> transport;  // ShmComm's
  double inproc_bus_gbps = 0;  // InProcComm's figure for the same op, dtype and size, 0 if none
  // ShmComm: of the bytes read from peers, the share read in place from their shared host
  // arenas (the rest through process_vm_readv); negative when not counted.
  double direct_fraction = -1;
  // Two-level rows (--ranks-per-node): one op's bytes per rank inside and across nodes; -1 for
  // flat rows.
  double intra_node_bytes = -1;
  double inter_node_bytes = -1;
};

// Every figure for one backend, in a fixed order (size, dtype, op: the flat rows, then with
// --ranks-per-node the same rows in two levels). Collective over `comm`; every rank returns the
// same timings. Buffers live in host memory, or with `gpu` in that GPU's memory, `control` then
// carrying the host-memory timing reductions.
std::vector<Figure> measure(Communicator& comm, const CommArgs& args, Device* gpu = nullptr,
                            Communicator* control = nullptr);

// Forks --world-size processes, each a ShmComm rank measuring the same figures; rank 0 sends
// them back to this process.
std::vector<Figure> measure_shm(const CommArgs& args);

}  // namespace zero::bench::comm_bench
