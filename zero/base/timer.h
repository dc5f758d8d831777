// Wall-time measurement on the steady clock.
#pragma once

#include <chrono>

namespace zero {

// Seconds from `start` to now.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Adds the wall time of its scope, in seconds, to `into` (which must outlive it).
class ScopedTimer {
 public:
  explicit ScopedTimer(double& into) : into_(into), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() { into_ += seconds_since(start_); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double& into_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace zero
