// The communication thread of one communicator (internal to zero/comm).
//
// Runs the ops submitted to it one at a time, in submission order, on a thread of its own, so
// the rank's thread only enqueues and waits (communicator.h: ops issued on one communicator run
// in issue order). InProcComm, ShmComm and CallbackComm each own one.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "zero/comm/communicator.h"

namespace zero::comm_detail {

class CommThread {
 public:
  CommThread();
  // join().
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `op` and returns its Work: complete once `op` returns, failed with whatever it throws.
  // Thread safety: called by the communicator's owning thread (one thread at a time).
  // REQUIRES: join() has not been called.
  Work submit(std::function<void()> op);
  // submit(), or with `waited` (the caller waits for the Work before submitting anything else)
  // and nothing in flight, `op` run right here on the calling thread: the same order, no
  // hand-offs. The Work is then complete, or failed with what `op` threw.
  Work submit(std::function<void()> op, bool waited);

  // Ops submitted and not finished yet. Counted down before the Work completes, so an owner that
  // waited for every Work it issued reads 0 (and never counts as abandoning an op).
  std::size_t outstanding() const { return outstanding_.load(); }

  // Runs every op already submitted, then stops the thread and joins it. Idempotent.
  // REQUIRES: not called from an op.
  void join();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::atomic<std::size_t> outstanding_{0};
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace zero::comm_detail
