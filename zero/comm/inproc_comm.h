// In-process ranks: N ranks are N threads of one process sharing its address space.
//
// Collectives do not pass messages. Once every rank has arrived, each rank's communication thread
// reads its peers' buffers directly: a reduction is computed by the rank that owns the output
// chunk, reading the inputs of ranks 0, 1, ..., N-1 in that order. So results are independent of
// timing and bitwise identical on every rank and across runs (all_reduce and reduce_scatter give
// the same bits for the same element), and each byte crosses memory about once.
//
// Threads: every InProcComm owns one communication thread that runs its collectives in issue
// order; the rank's own thread only enqueues and waits. Timeouts: a rank that waits longer than
// timeout() for its peers fails the collective with CommError naming the op, its size, the ranks
// that arrived and those that did not (with the last collective each of those started), and
// aborts the group, so every peer fails promptly too instead of hanging.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "zero/comm/communicator.h"

namespace zero {

namespace comm_detail {
struct InProcWorldState;
}

// The shared state of one set of in-process ranks. Create it once, then hand comm(r) to the
// thread of rank r. Thread safety: comm() and abort() may be called from any thread.
// REQUIRES: the world outlives nothing in particular; communicators keep the state alive.
class InProcWorld {
 public:
  explicit InProcWorld(int size, const CommOptions& options = {});
  ~InProcWorld();
  InProcWorld(const InProcWorld&) = delete;
  InProcWorld& operator=(const InProcWorld&) = delete;

  int size() const;
  // Rank r's communicator. REQUIRES (checked): 0 <= rank < size(), each rank taken at most once.
  std::unique_ptr<Communicator> comm(int rank);
  // Fails every pending and future collective of every communicator of this world (splits
  // included) with CommError carrying `reason`. Idempotent; the first reason is kept.
  void abort(const std::string& reason);

 private:
  std::shared_ptr<comm_detail::InProcWorldState> state_;
};

// Runs fn(comm) on `world_size` threads, one per rank, and joins them. If any rank throws, the
// world is aborted (so the others' collectives fail fast) and the first exception thrown is
// rethrown here once every thread has finished.
void run_ranks(int world_size, const std::function<void(Communicator&)>& fn,
               const CommOptions& options = {});

}  // namespace zero
