// The one place that chooses a process-level Communicator by build configuration (DESIGN.md §2).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "zero/base/error.h"
#include "zero/comm/communicator.h"
#include "zero/comm/device_inproc_comm.h"
#include "zero/comm/launcher_env.h"
#include "zero/device/device.h"

#if ZERO_WITH_MPI
#include "zero/comm/mpi_comm.h"
#endif
#if ZERO_WITH_NCCL
#include "kernels/cuda_device_count.h"
#include "zero/comm/nccl_comm.h"
#endif

namespace zero {

std::unique_ptr<Communicator> make_communicator(std::string_view backend,
                                                const CommOptions& options) {
  if (backend == "mpi") {
#if ZERO_WITH_MPI
    return MpiComm::world(options);
#else
    (void)options;
    throw Error(
        "make_communicator: \"mpi\" was requested but this build has no MPI (MPI was not found "
        "at configure time, or ZERO_WITH_MPI=OFF)");
#endif
  }
  if (backend == "nccl") {
#if ZERO_WITH_NCCL
    // Checked before any communication, so every rank fails alike without a collective.
    const LauncherEnv env = read_launcher_env();
    const int gpus = kernels::cuda_device_count();
    ZERO_CHECK(gpus > 0,
               "make_communicator: \"nccl\" needs a GPU per rank, but rank {} sees no CUDA device",
               env.rank);
    // The launcher's host communicator carries the NCCL unique id, then is closed.
    const std::unique_ptr<Communicator> host = make_env_communicator(options);
    NcclCommOptions nccl;
    nccl.comm = options;
    nccl.cuda_ordinal = env.local_rank % gpus;
    return NcclComm::create(*host, nccl);
#else
    throw Error(
        "make_communicator: \"nccl\" was requested but this build has no NCCL (needs CUDA and "
        "NCCL at configure time)");
#endif
  }
  if (backend == "shm" || backend == "env") return make_env_communicator(options);
  if (backend == "inproc") {
    throw Error(
        "make_communicator: in-process ranks are threads of one process; create them with "
        "InProcWorld::comm(rank) or run_ranks() (zero/comm/inproc_comm.h)");
  }
  throw Error("make_communicator: unknown backend \"" + std::string(backend) +
              "\"; expected \"mpi\", \"nccl\", \"shm\" or \"env\"");
}

std::unique_ptr<Communicator> make_gpu_communicator(Communicator& host, int cuda_ordinal,
                                                    const CommOptions& options) {
#if ZERO_WITH_NCCL
  NcclCommOptions nccl;
  nccl.comm = options;
  nccl.cuda_ordinal = cuda_ordinal;
  return NcclComm::create(host, nccl);
#else
  (void)host;
  (void)cuda_ordinal;
  (void)options;
  throw Error(
      "make_gpu_communicator: ranks on GPUs talk through NCCL, and this build has none (needs "
      "CUDA and NCCL at configure time)");
#endif
}

std::unique_ptr<Communicator> make_gpu_communicator(Communicator& host, Device& device,
                                                    const CommOptions& options) {
  const int ordinal = device.gpu_ordinal();
  const bool in_process = host.shares_address_space();
  if (in_process && host.size() > 1) {
    // Every rank learns every rank's GPU, so all choose alike.
    std::vector<double> ordinals(static_cast<std::size_t>(host.size()));
    ordinals[static_cast<std::size_t>(host.rank())] = ordinal;
    host.all_gather_in_place(ordinals.data(), 1, DType::F64).wait();
    if (std::all_of(ordinals.begin(), ordinals.end(), [&](double o) { return o == ordinals[0]; }))
      return DeviceInProcWorld::join(host, device, options);
    std::map<double, std::vector<int>> ranks_by_gpu;
    for (int q = 0; q < host.size(); ++q)
      ranks_by_gpu[ordinals[static_cast<std::size_t>(q)]].push_back(q);
    for (const auto& [gpu, ranks] : ranks_by_gpu) {
      ZERO_CHECK(ranks.size() == 1 && gpu >= 0,
                 "make_gpu_communicator: in-process ranks [{}] are on {} while other ranks are "
                 "elsewhere: NCCL refuses two ranks on one GPU, and the in-process device "
                 "communicator needs every rank on the same GPU",
                 fmt::join(ranks, ", "),
                 gpu >= 0 ? fmt::format("GPU {}", gpu) : std::string("the host"));
    }
  }
  if (ordinal < 0) {
    ZERO_CHECK(in_process,
               "make_gpu_communicator: the \"{}\" device is no GPU, and its ranks (the {} "
               "backend's) are not threads of one process",
               device.name(), host.backend_name());
    return DeviceInProcWorld::join(host, device, options);
  }
#if !ZERO_WITH_NCCL
  if (in_process && host.size() == 1) return DeviceInProcWorld::join(host, device, options);
#endif
  return make_gpu_communicator(host, ordinal, options);
}

bool communicator_available(std::string_view backend) {
  if (backend == "inproc" || backend == "shm" || backend == "env") return true;
  if (backend == "mpi") return ZERO_WITH_MPI != 0;
  if (backend == "nccl") return ZERO_WITH_NCCL != 0;
  return false;
}

}  // namespace zero
