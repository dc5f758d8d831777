#include "zero/comm/process_watch.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace zero::comm_detail {

namespace {

#ifndef SYS_pidfd_open
constexpr long kSysPidfdOpen = 434;  // the same number on every architecture
#else
constexpr long kSysPidfdOpen = SYS_pidfd_open;
#endif

struct StatFields {
  bool found = false;
  char state = '?';
  std::uint64_t start_ticks = 0;
};

// The command name (field 2) may hold spaces and parentheses, so fields are counted from the
// last ')'.
StatFields read_stat(std::int32_t pid) {
  StatFields out;
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return out;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return out;
  ++p;
  // After ')': " S ppid pgrp ..." — field 3 is the state, field 22 the start time.
  int field = 2;
  while (*p != '\0' && field < 22) {
    while (*p == ' ') ++p;
    ++field;
    if (field == 3) out.state = *p;
    if (field == 22) {
      out.start_ticks = std::strtoull(p, nullptr, 10);
      out.found = true;
      break;
    }
    while (*p != '\0' && *p != ' ') ++p;
  }
  return out;
}

std::uint64_t own_pid_namespace() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_ino);
}

}  // namespace

ProcessId current_process() {
  ProcessId p;
  p.pid = static_cast<std::int32_t>(::getpid());
  p.start_ticks = read_stat(p.pid).start_ticks;
  p.pid_namespace = own_pid_namespace();
  return p;
}

ProcessId process_with_pid(std::int32_t pid) {
  const StatFields s = read_stat(pid);
  if (!s.found) return {};
  return {pid, s.start_ticks, own_pid_namespace()};
}

bool same_pid_namespace(const ProcessId& p) {
  return p.pid > 0 && p.pid_namespace != 0 && p.pid_namespace == own_pid_namespace();
}

bool process_exited(const ProcessId& p) {
  if (!same_pid_namespace(p)) return false;
  const StatFields s = read_stat(p.pid);
  if (!s.found) return true;
  if (s.state == 'Z' || s.state == 'X' || s.state == 'x') return true;
  return p.start_ticks != 0 && s.start_ticks != p.start_ticks;
}

ProcessWatch::ProcessWatch(const ProcessId& p) : process_(p) {
  if (!same_pid_namespace(p)) return;
  const long fd = ::syscall(kSysPidfdOpen, p.pid, 0);
  if (fd >= 0) {
    pidfd_ = static_cast<int>(fd);
    ::fcntl(pidfd_, F_SETFD, FD_CLOEXEC);
  }
  // Opened after the process may already have gone and its pid been reused: the start time
  // decides whether the pidfd watches the right process.
  if (process_exited(p)) exited_ = true;
}

ProcessWatch::~ProcessWatch() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

ProcessWatch::ProcessWatch(ProcessWatch&& other) noexcept
    : process_(other.process_), pidfd_(std::exchange(other.pidfd_, -1)), exited_(other.exited_) {}

ProcessWatch& ProcessWatch::operator=(ProcessWatch&& other) noexcept {
  if (this != &other) {
    if (pidfd_ >= 0) ::close(pidfd_);
    process_ = other.process_;
    pidfd_ = std::exchange(other.pidfd_, -1);
    exited_ = other.exited_;
  }
  return *this;
}

bool ProcessWatch::exited() {
  if (exited_ || process_.pid == 0) return exited_;
  if (pidfd_ >= 0) {
    pollfd pfd{pidfd_, POLLIN, 0};
    const int rc = ::poll(&pfd, 1, 0);
    exited_ = rc > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  } else {
    exited_ = process_exited(process_);
  }
  return exited_;
}

}  // namespace zero::comm_detail
