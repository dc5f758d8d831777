// How a ShmComm collective's bytes move between the ranks (internal to zero/comm).
//
// Both transports run on the communication thread after the op's first barrier — every rank's
// call is posted in its slot and known to match — and return before the op's last barrier,
// with this rank's output complete. Both reduce with comm_detail::reduce_elements over the
// ranks' inputs in rank order, each output chunk by its owner (all_reduce: the chunks of
// chunk_bounds), so the bits are InProcComm's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "zero/comm/communicator.h"
#include "zero/comm/shm_group.h"

namespace zero::comm_detail {

// Where cross-memory attach puts the pieces it reads from peers before reducing them: one
// piece per peer, each placed at the same offset modulo 64 as the remote address it receives
// (the kernel's copy is several times slower between differently aligned addresses).
class ShmScratch {
 public:
  ShmScratch(int peers, std::size_t piece_bytes);
  std::size_t piece_bytes() const { return piece_bytes_; }
  char* for_peer(int k, std::uint64_t remote) const;

 private:
  struct Free {
    void operator()(char* p) const;
  };
  std::size_t piece_bytes_;
  std::size_t stride_;
  std::unique_ptr<char, Free> base_;
};

// The piece size of `tuning` for `world_size` ranks (see ShmTuning::piece_bytes).
std::size_t shm_piece_bytes(const ShmTuning& tuning, int world_size);

// Reads peers' buffers with process_vm_readv. REQUIRES: g.cross_memory_attach().
void cma_collective(ShmGroup& g, const CollectiveArgs& a, const ShmOp& op, ShmScratch& scratch);

// Every rank copies its exposed buffer through its two staging windows in the segment, one
// window per round and one barrier per round; the windows alternate, so a rank refills one
// only after every peer has passed the barrier that follows their use of it.
void staged_collective(ShmGroup& g, const CollectiveArgs& a, const ShmOp& op);

}  // namespace zero::comm_detail
