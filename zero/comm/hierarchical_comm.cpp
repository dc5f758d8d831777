#include "zero/comm/hierarchical_comm.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include "kernels/quantize.h"
#include "zero/base/error.h"
#include "zero/comm/comm_thread.h"
#include "zero/comm/level_memory.h"
#include "zero/comm/shared_memory_twin.h"

namespace zero {
namespace {

std::byte* at(void* base, std::size_t bytes) {
  return static_cast<std::byte*>(base) + bytes;
}
const std::byte* at(const void* base, std::size_t bytes) {
  return static_cast<const std::byte*>(base) + bytes;
}

bool sixteen_bit(DType t) {
  return t == DType::BF16 || t == DType::F16;
}

// The dtype a reduction travels in through both levels: 16-bit sums and averages in fp32, so
// that they are rounded once (communicator.h).
DType work_dtype(const CollectiveArgs& a) {
  return sixteen_bit(a.dtype) && a.op != ReduceOp::Max ? DType::F32 : a.dtype;
}

// The bytes a ring algorithm sends from rank `me` of `n` for `a` (see the header).
std::uint64_t ring_bytes(const CollectiveArgs& a, int n, int me) {
  const std::uint64_t bytes = a.elems * dtype_size(a.dtype);
  const auto peers = static_cast<std::uint64_t>(n - 1);
  switch (a.kind) {
    case Collective::ReduceScatter:
    case Collective::AllGather:
    case Collective::AllToAll: return peers * bytes;
    case Collective::AllReduce: return 2 * peers * bytes / static_cast<std::uint64_t>(n);
    case Collective::Broadcast: return n > 1 && me == a.root ? bytes : 0;
    case Collective::Barrier: return 0;
  }
  return 0;
}

CollectiveArgs level_args(Collective kind, const void* send, void* recv, std::size_t elems,
                          DType dtype, ReduceOp op, bool in_place, int root = 0) {
  return {kind, send, recv, elems, dtype, op, root, in_place};
}

// A node's group of MPI processes on one host talks through shared memory, so only the level
// across nodes uses MPI (shared_memory_twin.h); other groups stay as they are. ZERO_NODE_SHM=0
// keeps MPI inside nodes too (a /dev/shm too small for the segments, or to compare).
std::unique_ptr<Communicator> on_shared_memory(std::unique_ptr<Communicator> group) {
  if (group == nullptr || group->backend_name() != "mpi") return group;
  if (const char* v = std::getenv("ZERO_NODE_SHM"); v != nullptr && std::string_view(v) == "0") {
    return group;
  }
  std::unique_ptr<Communicator> shm =
      comm_detail::shared_memory_twin(*group, CommOptions{group->timeout()});
  return shm ? std::move(shm) : std::move(group);
}

}  // namespace

std::unique_ptr<HierarchicalComm> HierarchicalComm::create(Communicator& world,
                                                           const NodeTopology& topology,
                                                           Device* device, Communicator* control) {
  ZERO_CHECK(topology.world_size == world.size(),
             "HierarchicalComm: the topology has {} ranks but the communicator {}",
             topology.world_size, world.size());
  ZERO_CHECK(device == nullptr ||
                 (control != nullptr && control->size() == world.size() &&
                  control->rank() == world.rank()),
             "HierarchicalComm over device memory: pass the host communicator of the same ranks "
             "(rank {} of {})",
             world.rank(), world.size());
  Communicator& host = device != nullptr ? *control : world;
  if (topology.launcher_local_rank) {
    // Every rank learns whether any rank's placement disagrees with the contiguous blocks.
    const int me = world.rank();
    const bool off = *topology.launcher_local_rank != topology.local_of(me);
    std::array<double, 2> flag = {off ? static_cast<double>(world.size() - me) : 0.0, 0.0};
    host.all_reduce(flag.data(), flag.data(), flag.size(), DType::F64, ReduceOp::Max).wait();
    if (flag[0] > 0) {
      const int first = world.size() - static_cast<int>(flag[0]);
      throw CommError(fmt::format(
          "{}={} says rank {} is not local rank {} of node {}: the launcher placed ranks "
          "round-robin over hosts, and zero groups nodes as contiguous blocks of ranks; launch "
          "with contiguous placement (mpirun --map-by slot, torchrun's default), or set "
          "ZERO_RANKS_PER_NODE to describe what you want simulated",
          topology.source, topology.ranks_per_node, first, topology.local_of(first),
          topology.node_of(first)));
    }
  }
  return std::unique_ptr<HierarchicalComm>(new HierarchicalComm(
      nullptr, world, topology, std::make_shared<Counters>(), device, nullptr, control));
}

std::unique_ptr<HierarchicalComm> make_device_nodes(Communicator& device_world, Device& device,
                                                    Communicator& host,
                                                    const NodeTopology& topology,
                                                    bool quantized_gradients) {
  const bool simulated =
      topology.source == "ZERO_RANKS_PER_NODE" || topology.source == "--ranks-per-node";
  const bool two_levels = !topology.single_node() && topology.ranks_per_node > 1;
  if (!two_levels || !(simulated || quantized_gradients)) return nullptr;
  return HierarchicalComm::create(device_world, topology, &device, &host);
}

HierarchicalComm::HierarchicalComm(std::unique_ptr<Communicator> owned, Communicator& world,
                                   const NodeTopology& topology, std::shared_ptr<Counters> counters,
                                   Device* device, std::unique_ptr<Communicator> owned_control,
                                   Communicator* control,
                                   std::shared_ptr<comm_detail::CommThread> family_thread)
    : Communicator(CommOptions{world.timeout()}),
      owned_world_(std::move(owned)),
      world_(world),
      topology_(topology),
      rank_(world.rank()),
      owned_control_(std::move(owned_control)),
      control_(owned_control_ ? owned_control_.get() : control),
      device_(device),
      memory_(std::make_unique<comm_detail::LevelMemory>(device)),
      counters_(std::move(counters)) {
  if (device_ != nullptr) {
    thread_ = family_thread ? std::move(family_thread)
                            : std::make_shared<comm_detail::CommThread>();
  }
  if (topology_.single_node() || topology_.ranks_per_node == 1) return;
  intra_ = on_shared_memory(world.split(topology_.node_of(rank_), topology_.local_of(rank_)));
  inter_ = world.split(topology_.local_of(rank_), topology_.node_of(rank_));
  splitter_ = world.split(0, rank_);
  if (device_ != nullptr) control_splitter_ = control_->split(0, rank_);
  if (!thread_) thread_ = std::make_shared<comm_detail::CommThread>();
}

HierarchicalComm::~HierarchicalComm() {
  if (device_ == nullptr) {
    if (thread_) thread_->join();
    return;
  }
  // The family's thread may run on for other groups: wait for this one's ops (in issue order,
  // so the last one) before its levels go. A failure was reported to whoever waited for it.
  try {
    last_.wait();
  } catch (...) {
  }
}

std::string HierarchicalComm::backend_name() const {
  if (!two_level()) return world_.backend_name();
  return fmt::format("hierarchical({}/{}, {} nodes x {} ranks)", intra_->backend_name(),
                     inter_->backend_name(), topology_.nodes(), topology_.ranks_per_node);
}

bool HierarchicalComm::shares_address_space() const {
  return !two_level() && world_.shares_address_space();
}

void* HierarchicalComm::peer_memory(int q, const void* remote, std::size_t bytes) const {
  if (two_level()) return q == rank() ? const_cast<void*>(remote) : nullptr;
  return world_.peer_memory(q, remote, bytes);
}

const void* HierarchicalComm::peer_readable(int q, const void* remote, std::size_t bytes) const {
  if (two_level()) return q == rank() ? remote : nullptr;
  return world_.peer_readable(q, remote, bytes);
}

void HierarchicalComm::count(const CollectiveArgs& a, int group_size, int group_rank, bool inter) {
  const std::uint64_t bytes = ring_bytes(a, group_size, group_rank);
  (inter ? counters_->inter : counters_->intra).fetch_add(bytes, std::memory_order_relaxed);
}

Work HierarchicalComm::start_impl(const CollectiveArgs& args) {
  ZERO_CHECK_AS(CommError,
                device_ == nullptr || args.dtype != DType::F64 || args.op != ReduceOp::Avg ||
                    (args.kind != Collective::ReduceScatter && args.kind != Collective::AllReduce),
                "rank {}: {}: an fp64 average on device memory is not taken here (the device "
                "kernels divide fp32, bf16 and fp16)",
                rank_, describe(args, size()));
  if (!two_level()) {
    count(args, size(), rank_, /*inter=*/topology_.ranks_per_node == 1 && size() > 1);
    if (device_ == nullptr) return world_.start(args);
  }
  Work work = thread_->submit([this, args] { run(args); });
  if (device_ != nullptr) last_ = work;
  return work;
}

std::unique_ptr<Communicator> HierarchicalComm::split_impl(int color, int key) {
  // Every rank's (color, key), and the plain split, over a communicator nobody else is using
  // right now: the world on one level, the private copy on the communication thread otherwise.
  const int world = size();
  std::vector<double> all(2 * static_cast<std::size_t>(world));
  const std::array<double, 2> mine = {static_cast<double>(color), static_cast<double>(key)};
  // On a device the exchange, and a split of the same color, go to the control communicator.
  std::unique_ptr<Communicator> flat, flat_control;
  auto split_plainly = [&](Communicator& base, Communicator* host) {
    (host != nullptr ? *host : base).all_gather(mine.data(), all.data(), mine.size(), DType::F64)
        .wait();
    flat = base.split(color, key);
    if (host != nullptr) flat_control = host->split(color, key);
  };
  if (two_level()) {
    thread_->submit([&] { split_plainly(*splitter_, control_splitter_.get()); }).wait();
  } else if (device_ != nullptr) {
    thread_->submit([&] { split_plainly(world_, control_); }).wait();  // the family's order
  } else {
    split_plainly(world_, nullptr);
  }
  if (!flat) return nullptr;
  // The group's members in its order, and whether they form contiguous equal blocks per node.
  std::vector<std::pair<double, int>> members;
  for (int q = 0; q < world; ++q) {
    if (all[2 * static_cast<std::size_t>(q)] == mine[0]) {
      members.emplace_back(all[2 * static_cast<std::size_t>(q) + 1], q);
    }
  }
  std::sort(members.begin(), members.end());
  std::vector<int> run_lengths;  // members per run of the same node
  std::vector<int> run_nodes;
  for (const auto& [k, q] : members) {
    const int node = topology_.node_of(q);
    if (!run_nodes.empty() && run_nodes.back() == node) {
      ++run_lengths.back();
    } else {
      run_nodes.push_back(node);
      run_lengths.push_back(1);
    }
  }
  std::vector<int> distinct = run_nodes;
  std::sort(distinct.begin(), distinct.end());
  const bool blocks = std::adjacent_find(distinct.begin(), distinct.end()) == distinct.end() &&
                      std::all_of(run_lengths.begin(), run_lengths.end(),
                                  [&](int n) { return n == run_lengths.front(); });
  NodeTopology t;
  t.world_size = static_cast<int>(members.size());
  t.source = topology_.source;
  // Not blocks: one "node" per member, so every byte counts as inter-node (it may cross one).
  t.ranks_per_node = blocks ? run_lengths.front() : (run_nodes.size() == 1 ? t.world_size : 1);
  // A group inside one node (a MiCS shard group) runs on shared memory like the node's own.
  // Collective over the new group only; on the communication thread while the world's levels
  // are in use there (MPI calls come from one thread at a time).
  if (run_nodes.size() == 1) {
    if (two_level()) {
      thread_->submit([&] { flat = on_shared_memory(std::move(flat)); }).wait();
    } else {
      flat = on_shared_memory(std::move(flat));
    }
  }
  Communicator& group = *flat;
  return std::unique_ptr<HierarchicalComm>(new HierarchicalComm(
      std::move(flat), group, t, counters_, device_, std::move(flat_control), nullptr,
      device_ != nullptr ? thread_ : nullptr));
}

void HierarchicalComm::run(const CollectiveArgs& a) {
  if (!two_level()) {  // a device group of one level, on the family's thread
    world_.start(a).wait();
    return;
  }
  if (!failure_.empty()) {
    throw CommError(fmt::format("rank {}: {} not run: an earlier collective failed: {}", rank_,
                                describe(a, size()), failure_));
  }
  try {
    memory_->bind_thread();
    switch (a.kind) {
      case Collective::ReduceScatter:
        if (a.quantize_bits != 0 && a.op != ReduceOp::Max && a.dtype != DType::F64) {
          two_level_quantized_reduce_scatter(a);
        } else {
          two_level_reduce_scatter(a);
        }
        return;
      case Collective::AllGather: two_level_all_gather(a); return;
      case Collective::AllReduce: two_level_all_reduce(a); return;
      case Collective::Broadcast: two_level_broadcast(a); return;
      case Collective::AllToAll: two_level_all_to_all(a); return;
      case Collective::Barrier: {
        const CollectiveArgs b =
            level_args(Collective::Barrier, nullptr, nullptr, 0, a.dtype, a.op, false);
        intra_->start(b).wait();
        inter_->start(b).wait();
        intra_->start(b).wait();
        return;
      }
    }
  } catch (const std::exception& e) {
    failure_ = fmt::format("{} on {} nodes x {} ranks: {}", describe(a, size()), topology_.nodes(),
                           topology_.ranks_per_node, e.what());
    throw CommError(fmt::format("rank {}: {}", rank_, failure_));
  }
}

HierarchicalComm::LevelScratch HierarchicalComm::scratch_of(const CollectiveArgs& a) const {
  const auto L = static_cast<std::size_t>(topology_.ranks_per_node);
  const auto N = static_cast<std::size_t>(topology_.nodes());
  const std::size_t c = a.elems, esz = dtype_size(a.dtype), wsz = dtype_size(work_dtype(a));
  switch (a.kind) {
    case Collective::ReduceScatter:
      if (a.quantize_bits != 0) {  // payloads out and in, then the fp32 sums per node
        const std::size_t payloads = L * N * kernels::quantized_bytes(c, a.quantize_bits);
        return {payloads, payloads, N * c * sizeof(float)};
      }
      return {L * N * c * wsz, c * wsz, 0};  // reordered and widened; this rank's block
    case Collective::AllGather: return {L * N * c * esz, N * c * esz, 0};
    case Collective::AllReduce: return {L * ((c + L - 1) / L) * wsz, 0, 0};
    case Collective::AllToAll: return {L * N * c * esz, L * N * c * esz, 0};
    case Collective::Broadcast:
    case Collective::Barrier: return {};
  }
  return {};
}

HierarchicalComm::LevelScratch HierarchicalComm::device_scratch(Collective kind, std::size_t elems,
                                                                DType dtype, ReduceOp op,
                                                                int quantize_bits) const {
  if (!two_level() || device_ == nullptr) return {};
  CollectiveArgs a{kind, nullptr, nullptr, elems, dtype, op};
  a.quantize_bits = quantize_bits;
  return scratch_of(a);
}

HierarchicalComm::LevelScratch HierarchicalComm::device_scratch_held() const {
  if (!two_level() || device_ == nullptr) return {};
  LevelScratch held{};
  for (std::size_t s = 0; s < held.size(); ++s) held[s] = memory_->scratch_bytes(static_cast<int>(s));
  return held;
}

// The two levels' ranks: L ranks per node, N nodes, this rank local l of node n.
void HierarchicalComm::two_level_reduce_scatter(const CollectiveArgs& a) {
  const std::size_t c = a.elems;
  if (c == 0) return;
  const int L = topology_.ranks_per_node, N = topology_.nodes();
  const int l = topology_.local_of(rank_);
  const DType w = work_dtype(a);
  const std::size_t esz = dtype_size(a.dtype), wsz = dtype_size(w);
  const ReduceOp level_op = a.op == ReduceOp::Max ? ReduceOp::Max : ReduceOp::Sum;
  // Block l' of S holds the chunks of ranks n'·L + l' for n' = 0..N-1, in the work dtype.
  const LevelScratch need = scratch_of(a);
  std::byte* s = memory_->scratch(0, need[0]);
  for (int lq = 0; lq < L; ++lq) {
    for (int nq = 0; nq < N; ++nq) {
      const auto from = static_cast<std::size_t>(nq * L + lq) * c;
      const auto to = static_cast<std::size_t>(lq * N + nq) * c;
      memory_->to_work(at(a.send, from * esz), s + to * wsz, c, a.dtype, w);
    }
  }
  const std::size_t block = static_cast<std::size_t>(N) * c;
  const CollectiveArgs in_node =
      level_args(Collective::ReduceScatter, s, s, block, w, level_op, /*in_place=*/true);
  count(in_node, L, l, false);
  intra_->start(in_node).wait();
  std::byte* mine = memory_->scratch(1, need[1]);
  const CollectiveArgs across =
      level_args(Collective::ReduceScatter, s + static_cast<std::size_t>(l) * block * wsz, mine, c,
                 w, level_op, false);
  count(across, N, topology_.node_of(rank_), true);
  inter_->start(across).wait();
  void* dst = a.in_place ? at(a.recv, static_cast<std::size_t>(rank_) * c * esz) : a.recv;
  memory_->finish(mine, dst, c, a.dtype, w, a.op == ReduceOp::Avg ? size() : 1);
}

void HierarchicalComm::two_level_all_gather(const CollectiveArgs& a) {
  const std::size_t c = a.elems;
  if (c == 0) return;
  const int L = topology_.ranks_per_node, N = topology_.nodes();
  const std::size_t esz = dtype_size(a.dtype);
  const void* mine = a.in_place ? at(a.recv, static_cast<std::size_t>(rank_) * c * esz) : a.send;
  // Across nodes first: the ranks with this local rank, in node order.
  const LevelScratch need = scratch_of(a);
  std::byte* g1 = memory_->scratch(1, need[1]);
  const CollectiveArgs across =
      level_args(Collective::AllGather, mine, g1, c, a.dtype, a.op, false);
  count(across, N, topology_.node_of(rank_), true);
  inter_->start(across).wait();
  // Then inside the node: block l' holds the chunks of ranks n'·L + l'.
  std::byte* g2 = memory_->scratch(0, need[0]);
  const CollectiveArgs in_node = level_args(Collective::AllGather, g1, g2,
                                            static_cast<std::size_t>(N) * c, a.dtype, a.op, false);
  count(in_node, L, topology_.local_of(rank_), false);
  intra_->start(in_node).wait();
  for (int lq = 0; lq < L; ++lq) {
    for (int nq = 0; nq < N; ++nq) {
      const auto from = static_cast<std::size_t>(lq * N + nq) * c;
      const auto to = static_cast<std::size_t>(nq * L + lq) * c;
      memory_->copy(at(a.recv, to * esz), g2 + from * esz, c * esz);
    }
  }
}

void HierarchicalComm::two_level_all_reduce(const CollectiveArgs& a) {
  const std::size_t e = a.elems;
  if (e == 0) return;
  const int L = topology_.ranks_per_node, N = topology_.nodes();
  const int l = topology_.local_of(rank_);
  const DType w = work_dtype(a);
  const std::size_t wsz = dtype_size(w);
  const ReduceOp level_op = a.op == ReduceOp::Max ? ReduceOp::Max : ReduceOp::Sum;
  const std::size_t k = (e + static_cast<std::size_t>(L) - 1) / static_cast<std::size_t>(L);
  std::byte* s = memory_->scratch(0, scratch_of(a)[0]);
  memory_->to_work(a.send, s, e, a.dtype, w);
  memory_->fill_zero(s + e * wsz, static_cast<std::size_t>(L) * k - e, w);
  const CollectiveArgs scatter =
      level_args(Collective::ReduceScatter, s, s, k, w, level_op, /*in_place=*/true);
  count(scatter, L, l, false);
  intra_->start(scatter).wait();
  std::byte* block = s + static_cast<std::size_t>(l) * k * wsz;
  const CollectiveArgs across =
      level_args(Collective::AllReduce, block, block, k, w, level_op, /*in_place=*/true);
  count(across, N, topology_.node_of(rank_), true);
  inter_->start(across).wait();
  const CollectiveArgs gather =
      level_args(Collective::AllGather, s, s, k, w, level_op, /*in_place=*/true);
  count(gather, L, l, false);
  intra_->start(gather).wait();
  memory_->finish(s, a.recv, e, a.dtype, w, a.op == ReduceOp::Avg ? size() : 1);
}

void HierarchicalComm::two_level_all_to_all(const CollectiveArgs& a) {
  const std::size_t c = a.elems;
  if (c == 0) return;
  const int L = topology_.ranks_per_node, N = topology_.nodes();
  const std::size_t esz = dtype_size(a.dtype);
  auto block = [&](const void* base, int index) {
    return at(base, static_cast<std::size_t>(index) * c * esz);
  };
  // Inside the node: local rank l' gets the blocks for the ranks with local rank l', by node.
  const LevelScratch need = scratch_of(a);
  std::byte* s = memory_->scratch(0, need[0]);
  std::byte* t = memory_->scratch(1, need[1]);
  for (int lq = 0; lq < L; ++lq) {
    for (int nq = 0; nq < N; ++nq)
      memory_->copy(s + (lq * N + nq) * c * esz, block(a.send, nq * L + lq), c * esz);
  }
  const CollectiveArgs in_node =
      level_args(Collective::AllToAll, s, t, static_cast<std::size_t>(N) * c, a.dtype, a.op, false);
  count(in_node, L, topology_.local_of(rank_), false);
  intra_->start(in_node).wait();
  // t[l''][n'] came from local rank l'' for rank (n', this local rank). Across nodes: node n' gets
  // them by l''; what arrives from node n'' is in source-rank order already.
  for (int nq = 0; nq < N; ++nq) {
    for (int lq = 0; lq < L; ++lq)
      memory_->copy(s + (nq * L + lq) * c * esz, t + (lq * N + nq) * c * esz, c * esz);
  }
  const CollectiveArgs across = level_args(Collective::AllToAll, s, a.recv,
                                           static_cast<std::size_t>(L) * c, a.dtype, a.op, false);
  count(across, N, topology_.node_of(rank_), true);
  inter_->start(across).wait();
}

void HierarchicalComm::two_level_broadcast(const CollectiveArgs& a) {
  if (a.elems == 0) return;
  const int root_local = topology_.local_of(a.root);
  if (topology_.local_of(rank_) == root_local) {
    const CollectiveArgs across = level_args(Collective::Broadcast, a.recv, a.recv, a.elems,
                                             a.dtype, a.op, true, topology_.node_of(a.root));
    count(across, topology_.nodes(), topology_.node_of(rank_), true);
    inter_->start(across).wait();
  }
  const CollectiveArgs in_node =
      level_args(Collective::Broadcast, a.recv, a.recv, a.elems, a.dtype, a.op, true, root_local);
  count(in_node, topology_.ranks_per_node, topology_.local_of(rank_), false);
  intra_->start(in_node).wait();
}

}  // namespace zero
