// Ranks as MPI processes (OpenMPI): reductions over MPI's point-to-point messages, the rest
// through MPI's nonblocking collectives.
//
// Built only when MPI is found (ZERO_HAVE_MPI); <mpi.h> stays out of this header.
//
// MPI ownership: MpiComm::world() initialises MPI if nobody has (MPI_Init_thread with
// MPI_THREAD_SERIALIZED) and then finalises it at process exit (std::atexit). If the embedding
// initialised MPI itself, it also finalises it, after destroying every MpiComm.
//
// How collectives travel: reductions (reduce_scatter, all_reduce) are point-to-point messages,
// each rank sending part q of its input to rank q (MPI_Isend/MPI_Irecv on a duplicate of the
// communicator, one tag per round); the parts that arrive are reduced here in rank order by the
// kernel InProcComm uses, so results are bitwise InProcComm's at any world size, and 16-bit
// floats move as 16-bit and are summed in fp32 registers (no widened copy, no custom MPI_Op).
// all_reduce is two rounds: reduce part `me`, then exchange the reduced parts. Buffers for the
// arriving parts come from a per-communicator pool, so a warm step's collectives allocate
// nothing. all_gather, broadcast and barrier are MPI's own nonblocking collectives. (On one host,
// zero-bench comm: a reduce_scatter of 32 MB of fp32 takes 7 ms this way, 32 ms through Open MPI
// 4.1's MPI_Ireduce_scatter_block.) Element counts per message must fit in an int.
//
// Progress and threads: every message is posted at once and progresses inside MPI_Testall,
// which Work::test() and Work::wait() call; a round's reduction and the posting of the next run
// there too. OpenMPI has no progress thread, so a large collective advances while the caller
// computes only as far as the transport does it on its own. All calls on an MpiComm and its
// Works come from one thread at a time (MPI_THREAD_SERIALIZED).
//
// Timeouts: wait() polls MPI_Testall until timeout() has passed since wait() was entered (MPI makes
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
