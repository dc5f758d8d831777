// One ShmComm group: the ranks that share a segment, and how they wait for each other
// (internal to zero/comm).
//
// Waiting: a rank that reaches a barrier stores its step and rings the segment's bell (a futex
// word), then spins for a few microseconds and otherwise sleeps on the bell in short slices.
// Between slices it looks at the ranks it still waits for: one whose process exited, or whose
// communicator was destroyed, fails the wait at once, naming the rank and its pid. Every failure
// (that, a timeout, a mismatch, an unreadable buffer) aborts the group: a flag and a reason in
// the segment, which every other rank sees at its next look, so all of them fail promptly.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/comm/process_watch.h"
#include "zero/comm/shm_comm.h"
#include "zero/comm/shm_segment.h"

namespace zero::comm_detail {

// Maps `bytes` of `fd` read-only (shared) at an address whose distance from `own_base` is,
// modulo kStaggerPeriod, `index` × kStagger; with own_base 0, wherever the kernel likes.
// Returns MAP_FAILED (errno set) like mmap.
//
// Why: a reduction reads the same offset of this rank's buffer and of each peer's, and the
// engines of all ranks allocate the same blocks at the same offsets of their shared host arenas.
// Arenas mapped side by side lie a multiple of their size (256 GiB) apart, so the two loads'
// addresses agree in every bit below 2^38. So placed, a 64 MiB all-reduce between two ranks took
// 13-21 ms, against 6-7 ms with the views staggered (this machine, an AMD EPYC). The likely cause:
// the L1 way predictor of AMD's Zen cores tags lines by a hash of address bits 12-27, and loads
// whose addresses share that hash keep evicting each other.
inline constexpr std::uint64_t kStaggerPeriod = std::uint64_t{1} << 28;
inline constexpr std::uint64_t kStagger = 0x41000;  // 260 KiB: bits 12 and 18 of the distance
// `writable`: mapped for reading and writing (the fd must be open for both).
void* map_staggered(int fd, std::size_t bytes, std::uint64_t own_base, std::uint64_t index,
                    bool writable = false);

// The collective (or bootstrap, or split) a rank is in: for messages and the deadline.
struct ShmOp {
  std::string what;
  std::uint64_t seq = 0;  // collective number on this communicator, from 1; 0 for the bootstrap
  std::chrono::steady_clock::time_point deadline;
  std::chrono::milliseconds timeout{0};
};

struct ShmJoinArgs {
  std::string name;
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{0};
  ShmTuning tuning;
  std::string label = "world";
  // For a split: the processes that will hold each rank, known from the parent group, so that a
  // member that dies before attaching is noticed. Empty for a world.
  std::vector<ProcessId> expected;
};

class ShmGroup {
 public:
  // Collective over the group's ranks: creates (rank 0) or attaches to the segment, waits until
  // every rank has attached, unlinks the name, and decides the transport (cross-memory attach
  // if every rank can read every peer). Throws CommError on timeout, when a rank exits first, or
  // when the segment cannot be made; rank 0 then removes the file.
  static std::shared_ptr<ShmGroup> join(const ShmJoinArgs& args);

  // Marks this rank's place closed, so peers still waiting for it fail at once.
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& label() const { return label_; }
  std::uint64_t nonce() const { return segment_.header().nonce; }
  bool cross_memory_attach() const { return cma_; }
  const ShmTuning& tuning() const { return tuning_; }
  const ShmSegment& segment() const { return segment_; }
  ShmRankSlot& slot(int q) const { return segment_.slot(q); }
  ProcessId process(int q) const { return slot(q).process; }

  // The barrier: marks this rank as having reached its next step and waits until every rank
  // has. `first` says whether this is the op's first barrier (for the timeout message). Throws
  // CommError if the group is aborted, if a rank it waits for exited or closed its
  // communicator, or at op.deadline; the last two abort the group.
  void arrive(const ShmOp& op, bool first);

  // Waits until `ready()` holds, where only rank q can make it hold. Throws CommError like
  // arrive() if the group is aborted, q exits or closes its communicator, or at op.deadline
  // (naming q and `waiting_for`).
  template <typename Ready>
  void wait_for(int q, Ready&& ready, const ShmOp& op, const char* waiting_for) {
    if (ready()) return;
    wait_for_impl(q, std::function<bool()>(std::forward<Ready>(ready)), op, waiting_for);
  }

  // Tells ranks sleeping in arrive() or wait_for() to look again (after a change they may wait
  // for).
  void ring() const;

  // Fails every pending and later wait of every rank with `reason` (the first reason is kept).
  void abort(const std::string& reason) noexcept;
  // Aborts the group with `reason` and throws CommError("<this rank>: <op> failed: <why>"),
  // where <why> is the group's first abort reason: `reason` unless a peer aborted earlier.
  [[noreturn]] void fail(const ShmOp& op, const std::string& reason);

  // Copies `bytes` at address `remote` of rank q's process to `local` (cross-memory attach).
  // Fails the op (see fail()) if q exited or the memory cannot be read.
  void read_peer(int q, std::uint64_t remote, void* local, std::size_t bytes, const ShmOp& op);
  // Where `bytes` at address `remote` of rank q's process can be read with plain loads in this
  // one (its shared host arena, mapped here at bootstrap), or null: then read_peer() them.
  const void* direct(int q, std::uint64_t remote, std::size_t bytes) const;
  // The same view for writing (Communicator::peer_memory()), or null where direct() is, or where
  // q's arena could only be mapped read-only. Thread safety: any thread (the views are fixed
  // once join() returns).
  void* writable(int q, std::uint64_t remote, std::size_t bytes) const;

  // Bytes this rank read from peers so far: directly from their arenas, and through the kernel.
  const ShmReadStats& read_stats() const { return stats_; }
  void count_direct(std::size_t bytes) { stats_.direct_bytes += bytes; }

  // "rank 1 (pid 1234)".
  std::string rank_name(int q) const;

 private:
  ShmGroup(ShmSegment segment, const ShmJoinArgs& args);

  bool aborted() const;
  std::string abort_reason() const;
  void wait_for_impl(int q, const std::function<bool()>& ready, const ShmOp& op,
                     const char* waiting_for);
  // Sleeps on the bell until it moves from `seen`, for at most `limit`.
  void sleep_on_bell(std::uint32_t seen, std::chrono::nanoseconds limit) const;
  // Why a missing rank q will never arrive (exited or closed), or nullopt.
  std::optional<std::string> gone(int q);
  std::string prefix() const;
  void probe_cross_memory_attach(const ShmOp& op);
  void map_peer_arenas();

  // A peer's shared host arena as mapped in this process (read-only).
  struct PeerArena {
    std::uint64_t remote_base = 0;
    std::uint64_t bytes = 0;
    std::byte* local = nullptr;
    bool writable = false;  // mapped for writing too
  };

  ShmSegment segment_;
  const int rank_;
  const int size_;
  const std::string label_;
  const ShmTuning tuning_;
  std::vector<ProcessId> expected_;
  std::vector<ProcessWatch> watches_;  // per rank, opened on first need
  std::uint64_t step_ = 0;             // barriers passed; the communication thread only
  bool cma_ = false;
  std::uint64_t probe_word_ = 0;  // what peers read to test cross-memory attach
  std::vector<PeerArena> arenas_;  // per rank; empty ones are not mapped
  ShmReadStats stats_;             // the communication thread only
};

}  // namespace zero::comm_detail
