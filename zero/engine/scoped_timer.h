// Adds the wall time of a scope to one EngineTimings field.
#pragma once

#include <chrono>

namespace zero::engine_detail {

class ScopedTimer {
 public:
  explicit ScopedTimer(double& into) : into_(into), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() {
    into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double& into_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace zero::engine_detail
