// Which process a rank is, and whether it is still running (internal to zero/comm).
//
// ShmComm ranks are processes that wait for each other through shared memory; a rank that waits
// on a peer which has exited must find out in well under a second rather than at its timeout.
// A pid alone does not name a process for long (pids are reused), so a process is named by its
// pid, its start time and its pid namespace, all from /proc.
#pragma once

#include <cstdint>

namespace zero::comm_detail {

// Plain data, so it can live in a shared-memory segment.
struct ProcessId {
  std::int32_t pid = 0;
  std::uint64_t start_ticks = 0;    // /proc/<pid>/stat field 22: clock ticks after boot
  std::uint64_t pid_namespace = 0;  // inode of /proc/self/ns/pid, 0 when unknown
};

// The calling process.
ProcessId current_process();
// The running process with this pid (in this pid namespace), or a ProcessId with pid 0 if there
// is none.
ProcessId process_with_pid(std::int32_t pid);

// Whether `p` names a process this process can see: one in the same pid namespace (pids and
// /proc mean something only there). Processes in other namespaces are never reported exited.
bool same_pid_namespace(const ProcessId& p);

// One look at /proc: true if `p` is gone, a zombie, or its pid now names a different process
// (another start time). False if it runs, or if it cannot be known (another pid namespace).
bool process_exited(const ProcessId& p);

// Watches one process for exit. With a pidfd (Linux 5.3+) a check is one poll(2), without it a
// read of /proc/<pid>/stat. Not thread-safe; cheap enough to call every few milliseconds.
class ProcessWatch {
 public:
  ProcessWatch() = default;
  explicit ProcessWatch(const ProcessId& p);
  ~ProcessWatch();
  ProcessWatch(ProcessWatch&& other) noexcept;
  ProcessWatch& operator=(ProcessWatch&& other) noexcept;
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  // Whether this watch was given a process.
  bool watching() const { return process_.pid != 0; }
  // True once the watched process has exited (then stays true). False for a default watch.
  bool exited();

 private:
  ProcessId process_;
  int pidfd_ = -1;
  bool exited_ = false;
};

}  // namespace zero::comm_detail
