// A WorkState completed by another thread (internal to zero/comm).
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>

#include "zero/comm/communicator.h"

namespace zero::comm_detail {

// Thread safety: complete()/fail() from the thread running the op; wait()/test() from any.
class PromiseWork final : public WorkState {
 public:
  void complete() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
  }
  void fail(std::exception_ptr error) {
    {
      std::lock_guard lock(mu_);
      error_ = std::move(error);
      done_ = true;
    }
    cv_.notify_all();
  }
  void wait() override {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool test() override {
    std::lock_guard lock(mu_);
    if (error_) std::rethrow_exception(error_);
    return done_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace zero::comm_detail
