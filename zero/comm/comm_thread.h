// The communication thread of one communicator (internal to zero/comm).
//
// A CommThread runs the ops submitted to it one at a time, in submission order, on a thread of
// its own, which is what gives a backend's collectives their issue order and lets the rank's
// thread compute while they run. InProcComm and ShmComm each own one.
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

// Thread safety: submit() and outstanding() from any thread; the destructor from the owner.
class CommThread {
 public:
  CommThread();
  // Runs the ops still queued (an owner that aborted its group first makes them fail fast), then
  // joins the thread.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `op` behind every op submitted before it. The Work completes when op returns, or
  // fails with the exception op throws.
  Work submit(std::function<void()> op);

  // Submitted and not yet finished. Counted down before the Work completes, so an owner that
  // waited for all its Works and then goes away never counts as abandoning one.
  std::size_t outstanding() const { return outstanding_.load(); }

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
