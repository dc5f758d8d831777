// A group of processes moved onto shared memory when they share a host (internal to zero/comm).
//
// A HierarchicalComm over an MPI world splits it into node groups, and those groups are MPI
// communicators too: over `mpirun --mca btl tcp,self` (or any transport between hosts) a node's
// own ranks would talk through the same link as the nodes. When every rank of a group sees the
// same /dev/shm, shared_memory_twin makes a ShmComm over the same ranks in the same order, so a
// node's collectives run in shared memory and only the level across nodes uses MPI. Results are
// unchanged bit for bit: every zero communicator reduces in rank order with the same kernel.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "zero/comm/communicator.h"

namespace zero::comm_detail {

// A random segment name ("zero-<kind>-<pid>-<random>") made by rank 0 of `comm` and broadcast,
// so every rank returns the same. Collective over `comm`.
std::string agreed_segment_name(Communicator& comm, std::string_view kind);

// A ShmComm over `group`'s ranks (same ranks, same order) when they are processes that all see
// one /dev/shm: rank 0 makes a probe file there, every rank looks for it, and all agree on the
// answer. Null when they do not (other hosts, or separate /dev/shm mounts), when `group` has one
// rank, or when its ranks share an address space (threads need no shared memory). Collective
// over `group`; the ShmComm takes `options`.
std::unique_ptr<Communicator> shared_memory_twin(Communicator& group, const CommOptions& options);

}  // namespace zero::comm_detail
