#include "zero/comm/completion_poll.h"

#include <fmt/format.h>

#include <exception>
#include <thread>

#include "zero/base/error.h"

namespace zero {

namespace {

PollStatus guarded_probe(const std::function<PollStatus()>& probe) {
  try {
    return probe();
  } catch (const std::exception& e) {
    return {false, e.what()};
  }
}

[[noreturn]] void fail(const PollTarget& target, const std::string& why,
                       const std::function<void()>& on_failure) {
  if (on_failure) {
    try {
      on_failure();
    } catch (...) {  // the first error is the one to report
    }
  }
  throw CommError(fmt::format("{}: {} {}", target.who, target.what, why));
}

}  // namespace

bool poll_once(const std::function<PollStatus()>& probe, const PollTarget& target,
               const std::function<void()>& on_failure) {
  const PollStatus status = guarded_probe(probe);
  if (!status.error.empty()) fail(target, "failed: " + status.error, on_failure);
  return status.complete;
}

void poll_until_complete(const std::function<PollStatus()>& probe, const PollTarget& target,
                         const std::function<void()>& on_failure) {
  const auto deadline = std::chrono::steady_clock::now() + target.timeout;
  for (int polls = 0;; ++polls) {
    if (poll_once(probe, target, on_failure)) return;
    if (std::chrono::steady_clock::now() > deadline) {
      fail(target,
           fmt::format("did not complete within {} ms (a rank may not have called it, or called "
                       "a different collective)",
                       target.timeout.count()),
           on_failure);
    }
    if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace zero
