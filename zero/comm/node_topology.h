// Which ranks share a node: the topology the two-level collectives (hierarchical_comm.h) follow.
//
// Nodes are contiguous blocks of ranks of equal size, as DeepSpeed and torchrun group them: with
// R ranks per node, rank r is local rank r % R of node r / R. The size R comes from, first to
// last:
//   * the caller (zero-train --ranks-per-node N);
//   * ZERO_RANKS_PER_NODE=N, to simulate nodes on one host;
//   * the launcher's local world (torchrun's LOCAL_WORLD_SIZE, Open MPI's
//     OMPI_COMM_WORLD_LOCAL_SIZE, Hydra's MPI_LOCALNRANKS), when it starts the ranks on several
//     hosts;
//   * else every rank is on one node.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace zero {

struct NodeTopology {
  int world_size = 1;
  int ranks_per_node = 1;
  // Where ranks_per_node came from, for messages: "--ranks-per-node", "ZERO_RANKS_PER_NODE",
  // "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS" or "one node".
  std::string source = "one node";
  // The launcher's local rank of this process, when the size came from the launcher: a rank
  // whose local rank is not rank % ranks_per_node was placed round-robin, which the contiguous
  // blocks above do not describe (checked by HierarchicalComm::create on every rank at once).
  std::optional<int> launcher_local_rank;

  int nodes() const { return world_size / ranks_per_node; }
  int node_of(int rank) const { return rank / ranks_per_node; }
  int local_of(int rank) const { return rank % ranks_per_node; }
  bool single_node() const { return ranks_per_node == world_size; }
};

// The variable that simulates nodes on one host.
inline constexpr const char* kSimulatedNodesVar = "ZERO_RANKS_PER_NODE";
// Whether it is set (non-empty) in `lookup` (a getenv), or in the process environment: where a
// caller builds two levels only when asked to (a GPU engine, make_device_nodes).
bool simulated_nodes_requested(const std::function<const char*(const char*)>& lookup);
bool simulated_nodes_requested();

// "1, 2, 4": the divisors of n, for messages that ask for one.
std::string divisors_of(int n);

// The topology of `world_size` ranks (see above). `ranks_per_node` is the caller's value, if
// any; `lookup` is a getenv. Throws zero::Error naming the value, where it came from and the fix
// when it is not a positive divisor of world_size ("ZERO_RANKS_PER_NODE=3 does not divide the
// world size 4 ...: use one of 1, 2, 4").
NodeTopology resolve_node_topology(int world_size, std::optional<int> ranks_per_node,
                                   const std::function<const char*(const char*)>& lookup);
// The same from the process environment.
NodeTopology resolve_node_topology(int world_size, std::optional<int> ranks_per_node);

}  // namespace zero
