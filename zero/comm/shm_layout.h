// The bytes of a ShmComm segment, as every rank's process sees them (internal to zero/comm).
//
//   [ShmHeader][ShmRankSlot × world size][staging: world size × 2 windows]
//
// Everything is plain data: the file starts out zero-filled, and fields that ranks change while
// others look are accessed through std::atomic_ref (lock-free, so address-free and valid across
// processes). A rank writes its posted call before the release store of its `step`, and peers
// read it after an acquire load that saw that step, so the call itself needs no atomics.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "zero/comm/process_watch.h"

namespace zero::comm_detail {

constexpr std::uint64_t kShmMagic = 0x316d68736f72657aull;  // "zeroshm1", little-endian
constexpr std::uint32_t kShmLayoutVersion = 2;
constexpr std::size_t kShmAbortReasonBytes = 1024;

template <typename T>
T load_acquire(const T& field) {
  return std::atomic_ref<T>(const_cast<T&>(field)).load(std::memory_order_acquire);
}
template <typename T>
void store_release(T& field, T value) {
  std::atomic_ref<T>(field).store(value, std::memory_order_release);
}

// One rank's collective, as CollectiveArgs with the buffers as addresses in its own process.
struct ShmCall {
  std::uint32_t kind = 0;  // Collective
  std::uint32_t dtype = 0;
  std::uint32_t op = 0;
  std::int32_t root = 0;
  std::uint32_t in_place = 0;
  std::uint32_t is_split = 0;
  std::int32_t color = 0;
  std::int32_t key = 0;
  std::uint64_t elems = 0;
  std::uint64_t send = 0;
  std::uint64_t recv = 0;
};

enum ShmRankState : std::uint32_t {
  kRankFree = 0,
  kRankClaimed = 1,   // a process took the place; its identity is not written yet
  kRankAttached = 2,  // `process` and the probe fields are valid
  kRankClosed = 3,    // its communicator was destroyed
};

struct alignas(64) ShmRankSlot {
  std::uint64_t step;   // atomic: the last barrier step this rank reached
  std::uint64_t seq;    // atomic: the collective this rank began last (for messages)
  std::uint32_t state;  // atomic: ShmRankState
  std::uint32_t cma;    // atomic: 0 not probed yet, 1 reads every peer, 2 cannot
  // atomic: elements of this rank's all_reduce chunk reduced so far in the current op (reset to
  // 0 before the op's first barrier, so peers, who look only after it, never see an older op's)
  std::uint64_t reduced;
  ProcessId process;
  // Cross-memory attach probe: peers read 8 bytes at probe_address and expect probe_value.
  std::uint64_t probe_address;
  std::uint64_t probe_value;
  // The rank's shared host arena (zero/device/shared_host_arena.h): its memfd's descriptor
  // number in the rank's process (-1: none), where it is mapped there, and its size. Peers map
  // it through /proc/<pid>/fd/<arena_fd> and read blocks in it directly.
  std::int32_t arena_fd;
  std::uint64_t arena_base;
  std::uint64_t arena_bytes;
  ShmCall call;
};

struct alignas(64) ShmHeader {
  std::uint64_t magic;  // atomic: kShmMagic once the creator has initialised everything
  std::uint32_t version;
  std::int32_t world_size;
  std::uint64_t nonce;  // random per segment
  ProcessId creator;
  std::uint64_t segment_bytes;
  std::uint64_t slots_offset;
  std::uint64_t staging_offset;
  std::uint64_t window_bytes;  // one staging window of one rank

  // Futex word: incremented whenever a rank's step or the abort state changes.
  alignas(64) std::uint32_t bell;
  std::uint32_t sleepers;     // atomic: ranks blocked in FUTEX_WAIT on `bell`
  std::uint32_t abort_state;  // atomic: 0 running, 1 reason being written, 2 aborted
  char abort_reason[kShmAbortReasonBytes];
};

}  // namespace zero::comm_detail
