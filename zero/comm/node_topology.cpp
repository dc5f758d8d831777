#include "zero/comm/node_topology.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "zero/base/error.h"

namespace zero {

std::string divisors_of(int n) {
  std::vector<int> d;
  for (int k = 1; k <= n; ++k) {
    if (n % k == 0) d.push_back(k);
  }
  std::string out;
  for (std::size_t i = 0; i < d.size(); ++i) {
    out += (i == 0 ? "" : ", ") + std::to_string(d[i]);
  }
  return out;
}

namespace {

// `text` as a positive int, or nullopt.
std::optional<int> positive_int(const char* text) {
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0' || v < 1 || v > (1 << 30)) return std::nullopt;
  return static_cast<int>(v);
}

NodeTopology checked(int world_size, int ranks_per_node, std::string source,
                     std::string_view spelled) {
  if (ranks_per_node < 1 || world_size % ranks_per_node != 0) {
    throw Error(fmt::format(
        "{} does not divide the world size {}: nodes hold equal, contiguous blocks of ranks; use "
        "one of {}",
        spelled, world_size, divisors_of(world_size)));
  }
  NodeTopology t;
  t.world_size = world_size;
  t.ranks_per_node = ranks_per_node;
  t.source = std::move(source);
  return t;
}

}  // namespace

bool simulated_nodes_requested(const std::function<const char*(const char*)>& lookup) {
  const char* text = lookup(kSimulatedNodesVar);
  return text != nullptr && *text != '\0';
}

bool simulated_nodes_requested() {
  return simulated_nodes_requested([](const char* name) { return std::getenv(name); });
}

NodeTopology resolve_node_topology(int world_size, std::optional<int> ranks_per_node,
                                   const std::function<const char*(const char*)>& lookup) {
  ZERO_CHECK(world_size >= 1, "resolve_node_topology: world size {} (must be at least 1)",
             world_size);
  if (ranks_per_node) {
    return checked(world_size, *ranks_per_node, "--ranks-per-node",
                   fmt::format("--ranks-per-node {}", *ranks_per_node));
  }
  if (const char* text = lookup(kSimulatedNodesVar); text != nullptr && *text != '\0') {
    const std::optional<int> v = positive_int(text);
    if (!v) {
      throw Error(fmt::format(
          "ZERO_RANKS_PER_NODE={}: not a positive integer; set it to the ranks each node holds "
          "(one of {}), or unset it",
          text, divisors_of(world_size)));
    }
    return checked(world_size, *v, "ZERO_RANKS_PER_NODE",
                   fmt::format("ZERO_RANKS_PER_NODE={}", *v));
  }
  // The launcher's local world, first torchrun's, then Open MPI's, then Hydra's (launcher_env.h).
  struct Pair {
    const char* size;
    const char* rank;
  };
  for (const Pair& p : {Pair{"LOCAL_WORLD_SIZE", "LOCAL_RANK"},
                        Pair{"OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
                        Pair{"MPI_LOCALNRANKS", "MPI_LOCALRANKID"}}) {
    const std::optional<int> v = positive_int(lookup(p.size));
    if (!v) continue;
    if (*v >= world_size) break;  // every rank on this host: one node
    NodeTopology t = checked(world_size, *v, p.size, fmt::format("{}={}", p.size, *v));
    const char* local = lookup(p.rank);
    if (local != nullptr) {
      const std::optional<int> l = std::string_view(local) == "0" ? 0 : positive_int(local);
      if (l) t.launcher_local_rank = *l;
    }
    return t;
  }
  NodeTopology t;
  t.world_size = world_size;
  t.ranks_per_node = world_size;
  return t;
}

NodeTopology resolve_node_topology(int world_size, std::optional<int> ranks_per_node) {
  return resolve_node_topology(world_size, ranks_per_node,
                               [](const char* name) { return std::getenv(name); });
}

}  // namespace zero
