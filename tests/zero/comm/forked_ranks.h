// Ranks as forked child processes, for the ShmComm and launcher tests.
//
// A child runs the rank's function and leaves with _exit(): it never returns into Catch2 (whose
// state it shares with the parent). What a child reports goes through memory mapped shared
// before the fork. Fork only while the test process has no other threads (join InProcWorld
// ranks first).
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace zero::test {

// Anonymous shared memory, zero-filled, visible to children forked after it was made.
class SharedRegion {
 public:
  explicit SharedRegion(std::size_t bytes) : bytes_(bytes == 0 ? 1 : bytes) {
    base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (base_ == MAP_FAILED) throw std::runtime_error("mmap of a shared region failed");
  }
  ~SharedRegion() { ::munmap(base_, bytes_); }
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  char* data() const { return static_cast<char*>(base_); }
  std::size_t size() const { return bytes_; }

 private:
  void* base_;
  std::size_t bytes_;
};

struct RankOutcome {
  int exit_code = -1;  // -1 if killed by a signal
  int signal = 0;      // the signal that killed it
  std::string error;   // what() of the exception the rank ended with, empty if none
  double seconds = 0;  // from the fork to the end of the rank's function (or its error)
  std::chrono::steady_clock::time_point end;  // the same instant (the clock is system-wide)
};

// Children forked at construction; wait() reaps them.
class ForkedRanks {
 public:
  static constexpr std::size_t kErrorBytes = 4096;

  ForkedRanks(int world_size, const std::function<void(int rank)>& fn)
      : reports_(static_cast<std::size_t>(world_size) * sizeof(Report)) {
    std::fflush(nullptr);
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < world_size; ++r) {
      const pid_t pid = ::fork();
      if (pid < 0) throw std::runtime_error("fork failed");
      if (pid == 0) run_child(r, fn, start);
      pids_.push_back(pid);
      running_.push_back(pid);
    }
  }
  ~ForkedRanks() {
    for (pid_t pid : running_) {
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
  }
  ForkedRanks(const ForkedRanks&) = delete;
  ForkedRanks& operator=(const ForkedRanks&) = delete;

  pid_t pid(int rank) const { return pids_[static_cast<std::size_t>(rank)]; }

  // Waits for every child; one still running after `limit` is killed (and reported killed).
  std::vector<RankOutcome> wait(std::chrono::seconds limit = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::vector<RankOutcome> out(pids_.size());
    for (std::size_t r = 0; r < pids_.size(); ++r) {
      int status = 0;
      while (::waitpid(pids_[r], &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) ::kill(pids_[r], SIGKILL);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      running_[r] = -1;
      if (WIFEXITED(status)) out[r].exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) out[r].signal = WTERMSIG(status);
      const Report& rep = report(static_cast<int>(r));
      out[r].error = std::string(rep.error, strnlen(rep.error, kErrorBytes));
      out[r].seconds = rep.seconds;
      out[r].end = std::chrono::steady_clock::time_point(std::chrono::nanoseconds(rep.end_ns));
    }
    return out;
  }

 private:
  struct Report {
    double seconds;
    std::int64_t end_ns;
    char error[kErrorBytes];
  };
  Report& report(int r) const { return reinterpret_cast<Report*>(reports_.data())[r]; }

  [[noreturn]] void run_child(int r, const std::function<void(int)>& fn,
                              std::chrono::steady_clock::time_point start) {
    int code = 0;
    Report& rep = report(r);
    try {
      fn(r);
    } catch (const std::exception& e) {
      std::strncpy(rep.error, e.what(), kErrorBytes - 1);
      code = 1;
    } catch (...) {
      std::strncpy(rep.error, "a non-standard exception", kErrorBytes - 1);
      code = 1;
    }
    const auto end = std::chrono::steady_clock::now();
    rep.seconds = std::chrono::duration<double>(end - start).count();
    rep.end_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(end.time_since_epoch()).count();
    std::fflush(nullptr);
    ::_exit(code);
  }

  SharedRegion reports_;
  std::vector<pid_t> pids_;
  std::vector<pid_t> running_;  // -1 once reaped
};

// Entries of /dev/shm whose name starts with `prefix` (segments and their temporary names).
inline std::vector<std::string> shm_files_with_prefix(const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

// A segment name no other test run uses.
inline std::string unique_shm_name(const std::string& what) {
  static int counter = 0;
  return "zero-test-" + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
}

}  // namespace zero::test
