// The one place that chooses a process-level Communicator by build configuration (DESIGN.md §2).
#include <string>

#include "zero/base/error.h"
#include "zero/comm/communicator.h"
#include "zero/comm/launcher_env.h"

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

bool communicator_available(std::string_view backend) {
  if (backend == "inproc" || backend == "shm" || backend == "env") return true;
  if (backend == "mpi") return ZERO_WITH_MPI != 0;
  if (backend == "nccl") return ZERO_WITH_NCCL != 0;
  return false;
}

}  // namespace zero
