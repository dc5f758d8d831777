// Ranks as processes of one host, talking through shared memory (ShmComm).
//
// Every rank calls make_shm_communicator() with the same segment name: rank 0 creates
// /dev/shm/<name>, the others attach to it, and once all have, the name is unlinked (the
// mappings live on), so nothing is left in /dev/shm however the ranks end; a failed bootstrap
// removes it too, and a segment whose rank 0 was killed before everyone attached is removed by
// the next group's rank 0. The segment holds the ranks' barriers, their posted calls, an abort
// flag, and staging windows.
//
// Data: with cross-memory attach (process_vm_readv(2), probed at bootstrap between every pair of
// ranks) a rank reads its peers' buffers directly, as InProcComm's threads do (and with plain
// loads when a buffer lies in the peer's shared host arena, which make_shm_communicator enables
// and every rank maps at bootstrap; see zero/device/shared_host_arena.h; ZERO_SHM_ARENA=0 in the
// environment leaves the arena off, to compare): the rank that
// owns an output chunk reduces it, reading the inputs of ranks 0, 1, ..., N-1 in that order in
// cache-sized pieces. Without it (another pid namespace, ptrace forbidden), every rank copies
// its input through its staging windows in the segment, round by round, and the same reduction
// runs on the staged copies. Either way results are bitwise those of InProcComm with the same
// number of ranks: same element order, same reduce_math.
//
// Threads and order: every ShmComm owns one communication thread that runs its collectives in
// issue order (as InProcComm). Timeouts: a rank that waits longer than timeout() fails with
// CommError naming the op, its size, the ranks that arrived and those that did not (with their
// pids). A peer process that exits, or destroys its communicator, while others wait for it is
// noticed within tens of milliseconds: they fail with CommError "rank 1 (pid 1234) exited". Any
// failure aborts the group (a flag in the segment), so every rank fails fast; the group is
// unusable afterwards.
//
// Security: where the Yama LSM restricts ptrace to descendants (ptrace_scope 1), bootstrap calls
// prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY) so that peers may read this process's memory; any
// process of the same user may then do so too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "zero/comm/communicator.h"

namespace zero {

enum class ShmTransport {
  Auto,               // cross-memory attach if every rank can read every peer, else Segment
  CrossMemoryAttach,  // process_vm_readv; bootstrap fails if a rank cannot read a peer
  Segment,            // staged through the shared segment
};

struct ShmTuning {
  // Auto may be overridden with ZERO_SHM_TRANSPORT=cma|segment in the environment (to measure
  // or test the fallback); an explicit choice here is not.
  ShmTransport transport = ShmTransport::Auto;
  // Segment transport: bytes of one rank's staging window (two per rank). Rank 0's value is the
  // group's. At least 4096 and a multiple of 8.
  std::size_t window_bytes = std::size_t{1} << 20;
  // Cross-memory attach: bytes read from each peer per reduction step; 0 chooses from the world
  // size (1 MiB with one peer, down to 256 KiB with many), so that the pieces stay in cache. A
  // multiple of 8 otherwise.
  std::size_t piece_bytes = 0;
};

// Collective over the `world_size` processes that call it with the same `name` (a file name
// under /dev/shm: at most 200 characters, no '/'); `rank` is this process's, 0 <= rank <
// world_size. Rank 0 creates the segment, replacing a stale one of that name; the others wait
// for it up to options.timeout. Returns once every rank has attached. Throws CommError on a bad
// argument, on timeout (naming the ranks that did not attach), or if a rank exits first.
// split() makes a new segment per color (named from this one's random nonce).
std::unique_ptr<Communicator> make_shm_communicator(const std::string& name, int rank,
                                                    int world_size, const CommOptions& options = {},
                                                    const ShmTuning& tuning = {});

// The transport a ShmComm settled on at bootstrap (never Auto); nullopt for another backend.
std::optional<ShmTransport> shm_transport(const Communicator& comm);
// Bytes a ShmComm rank has read from its peers' buffers since it was made: in place, out of a
// peer's shared host arena (zero/device/shared_host_arena.h: what a CpuDevice allocates once a
// ShmComm exists in its process), and through the kernel (process_vm_readv). The segment
// transport counts neither. nullopt for another backend. Call it after the Work of the
// collectives it should count has completed.
struct ShmReadStats {
  std::uint64_t direct_bytes = 0;
  std::uint64_t kernel_bytes = 0;
};
std::optional<ShmReadStats> shm_read_stats(const Communicator& comm);

// "cma" or "segment" ("auto" for Auto).
std::string_view shm_transport_name(ShmTransport transport);

}  // namespace zero
