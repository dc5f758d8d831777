// Ranks as MPI processes (OpenMPI), with MPI's nonblocking collectives.
//
// Built only when MPI is found (ZERO_HAVE_MPI); <mpi.h> stays out of this header.
//
// MPI ownership: MpiComm::world() initialises MPI if nobody has (MPI_Init_thread with
// MPI_THREAD_SERIALIZED) and then finalises it at process exit (std::atexit). If the embedding
// initialised MPI itself, it also finalises it, after destroying every MpiComm.
//
// Progress and threads: collectives are issued at once (MPI_Ireduce_scatter_block,
// MPI_Iallgather, MPI_Iallreduce, MPI_Ibcast, MPI_Ibarrier) and progress inside MPI_Test, which
// Work::test() and Work::wait() call; OpenMPI has no progress thread, so a large collective
// advances while the caller computes only as far as the transport does it on its own. All calls
// on an MpiComm and its Works come from one thread at a time (MPI_THREAD_SERIALIZED).
//
// Differences from InProcComm, by design of MPI: the reduction order is the library's, so results
// agree with InProcComm within rounding, not bitwise (with 2 ranks a sum is the same either way).
// bf16/fp16 sums are widened to fp32 in a staging buffer, summed with MPI_SUM and rounded once
// (the order of fp32 additions is MPI's); bf16/fp16 Max uses a custom MPI_Op. In-place
// reduce_scatter uses MPI_IN_PLACE, which overwrites chunk 0 of the buffer on every rank.
// Element counts per call must fit in an int (MPI's count type).
//
// Timeouts: wait() polls MPI_Test until timeout() has passed since wait() was entered (MPI makes
// no progress before it is polled), then throws CommError naming the op and its size. MPI does
// not say which ranks have arrived, so the message cannot name them. A request cannot be
// cancelled, so the communicator is unusable afterwards (later calls throw); abort the job.
// split() is MPI_Comm_split, which is blocking and has no timeout.
#pragma once

#include <memory>

#include "zero/comm/communicator.h"

namespace zero {

namespace comm_detail {
struct MpiState;
}

class MpiComm final : public Communicator {
 public:
  // A communicator over every process of the job (a duplicate of MPI_COMM_WORLD). Collective
  // over all processes.
  static std::unique_ptr<MpiComm> world(const CommOptions& options = {});
  ~MpiComm() override;

  int rank() const override;
  int size() const override;
  std::string backend_name() const override { return "mpi"; }

 protected:
  Work start_impl(const CollectiveArgs& args) override;
  std::unique_ptr<Communicator> split_impl(int color, int key) override;

 private:
  MpiComm(std::shared_ptr<comm_detail::MpiState> state, const CommOptions& options);

  std::shared_ptr<comm_detail::MpiState> state_;
};

}  // namespace zero
