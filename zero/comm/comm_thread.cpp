#include "zero/comm/comm_thread.h"

#include <exception>
#include <memory>
#include <utility>

#include "zero/base/error.h"
#include "zero/comm/work_state.h"

namespace zero::comm_detail {

CommThread::CommThread() : thread_([this] { run(); }) {}

CommThread::~CommThread() {
  join();
}

Work CommThread::submit(std::function<void()> op) {
  auto promise = std::make_shared<PromiseWork>();
  ++outstanding_;
  {
    std::lock_guard lock(mu_);
    ZERO_ASSERT(!stopping_);
    queue_.push_back([this, promise, op = std::move(op)] {
      try {
        op();
        --outstanding_;
        promise->complete();
      } catch (...) {
        --outstanding_;
        promise->fail(std::current_exception());
      }
    });
  }
  cv_.notify_one();
  return Work(promise);
}

Work CommThread::submit(std::function<void()> op, bool waited) {
  // outstanding_ drops after an op returns, so 0 here orders every op before this one.
  if (!waited || outstanding_.load() != 0) return submit(std::move(op));
  auto promise = std::make_shared<PromiseWork>();
  try {
    op();
    promise->complete();
  } catch (...) {
    promise->fail(std::current_exception());
  }
  return Work(promise);
}

void CommThread::join() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CommThread::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything submitted has run
    auto task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

}  // namespace zero::comm_detail
