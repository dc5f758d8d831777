// The shared-memory file behind one ShmComm group (internal to zero/comm).
//
// Rank 0 creates the segment under a temporary name, initialises it completely and only then
// renames it to /dev/shm/<name>, replacing any file of that name atomically. The other ranks
// open /dev/shm/<name> and accept it only if it is initialised, made for their world size, and
// its creator is still running — so a segment left by an earlier run whose rank 0 died is never
// attached to; they wait for the new one instead. The name is unlinked once every rank has
// attached (the mappings live on), so a crash later leaves nothing behind in /dev/shm.
//
// A segment whose creator is killed before every rank attached cannot unlink itself; it can
// never complete its bootstrap either, so rank 0 of every later group removes such segments
// (ShmComm's magic, this user's, creator exited) and orphaned temporary files before creating
// its own — a launcher that kills its workers leaves them only until the next launch.
//
// What this cannot tell apart: a stale segment whose creator is still alive (an earlier launch
// with the same name that hangs) from the current one. Names unique per launch avoid it;
// make_env_communicator derives such names.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "zero/comm/process_watch.h"
#include "zero/comm/shm_layout.h"

namespace zero::comm_detail {

class ShmSegment {
 public:
  // "/dev/shm/<name>". REQUIRES: valid_name(name).
  static std::string path_of(const std::string& name);
  // Empty if `name` can be a ShmComm segment name, else why not.
  static std::string name_problem(const std::string& name);

  // Removes from /dev/shm the files of this user that are ShmComm segments whose creator has
  // exited, and temporary files of creators that no longer run. Returns how many it removed.
  static int remove_stale();

  // Rank 0: a new segment for `world_size` ranks with staging windows of `window_bytes`,
  // renamed into place at /dev/shm/<name>, with rank 0's place claimed. Throws CommError if the
  // file cannot be made (the temporary file is removed).
  static ShmSegment create(const std::string& name, int world_size, std::size_t window_bytes);

  // Rank `rank` > 0: waits until /dev/shm/<name> holds a live segment for `world_size` ranks
  // (made by `creator` when given), claims the rank's place and maps it. Throws CommError at
  // `deadline` (the message says after `timeout`), if the creator is known and exits first, if
  // the segment was made for another world size, or if the rank's place is already taken.
  static ShmSegment attach(const std::string& name, int rank, int world_size,
                           std::chrono::steady_clock::time_point deadline,
                           std::chrono::milliseconds timeout,
                           const std::optional<ProcessId>& creator);

  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&&) = delete;
  ShmSegment(const ShmSegment&) = delete;
  ~ShmSegment();

  // Removes /dev/shm/<name> if it still names this segment (not a newer one). Idempotent.
  void unlink_name() noexcept;

  const std::string& name() const { return name_; }
  ShmHeader& header() const { return *static_cast<ShmHeader*>(base_); }
  ShmRankSlot& slot(int rank) const;
  // Rank q's staging window `parity` (0 or 1), header().window_bytes long.
  char* staging(int rank, int parity) const;

 private:
  ShmSegment(std::string name, void* base, std::size_t bytes, std::uint64_t device,
             std::uint64_t inode);

  std::string name_;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::uint64_t device_ = 0;  // identity of the file, for unlink_name()
  std::uint64_t inode_ = 0;
  bool unlinked_ = false;
};

}  // namespace zero::comm_detail
