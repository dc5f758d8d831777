// Two-level collectives over nodes (node_topology.h), and the count of the bytes each rank sends
// inside its node and across nodes.
//
// A HierarchicalComm wraps a world communicator. On one node (or with one rank per node) it
// forwards every collective to the world unchanged, so results are the world's bit for bit, and
// only counts. With several nodes of several ranks it splits the world into an intra-node group
// (the ranks of this node, by local rank) and an inter-node group (the ranks with this local rank,
// by node) and runs each collective in two levels, on a communication thread of its own. An MPI
// node group whose ranks share a /dev/shm is replaced by a ShmComm over the same ranks
// (shared_memory_twin.h; ZERO_NODE_SHM=0 keeps MPI), so only the level across nodes uses MPI:
//
//   reduce_scatter: the chunks are reordered so that local rank l's block holds the chunks of the
//                   ranks with local rank l; reduce-scatter inside the node, then across nodes;
//   all_gather:     across nodes first (each rank sends only its own chunk over the slower link),
//                   then inside the node, then the chunks are put back in rank order;
//   all_reduce:     reduce-scatter inside the node, all-reduce across nodes, all-gather inside;
//   broadcast:      across nodes among the ranks with the root's local rank, then inside nodes;
//   all_to_all:     inside the node each local rank collects the blocks for the ranks with its
//                   local rank, then across nodes those ranks exchange them;
//   barrier:        inside, across, inside.
//
// A reduce_scatter with CollectiveArgs::quantize_bits (ZeRO++ qgZ; Sum or Avg of fp32, bf16 or
// fp16) instead runs, for this rank r = (node n, local rank l) (hierarchical_quantized.cpp):
//   1. every chunk is quantized (kernels/quantize.h: 4 or 8 bits, one fp32 scale per 256
//      elements, from the true element type), grouped by the local rank of its destination;
//   2. an all-to-all inside the node: local rank l receives, from every local peer, the chunks
//      for the ranks with local rank l (one per node);
//   3. those are dequantized and summed in fp32 in local-rank order, then requantized;
//   4. an all-to-all across nodes among the ranks with local rank l: node n receives every node's
//      partial sum of its own chunk;
//   5. these are dequantized and summed in fp32 in node order; Avg divides by W; the result is
//      rounded once to the element type.
// So the result is the mean (or sum) over all W ranks at any chunk size, odd ones included
// (nothing is padded away, nothing falls back to an exact reduction), bitwise reproducible run to
// run, within the two quantizations' error: with s the scale of the block holding an element,
//   |result − exact sum| ≤ Σ over ranks of s/2 (step 1) + Σ over nodes of s/2 (step 3),
// divided by W for Avg (a block's s is its max |value| / 7 in 4 bits, / 127 in 8 bits). On one
// level the hint is ignored: the world reduces exactly.
// With CollectiveArgs::feedback (LoCo, communicator.h), steps 1 and 3 add back the error their
// quantization left at the same point in the last call and keep the blended new error: the state
// is W + N errors of one chunk, in 8-bit blocks, (W + N) · quantized_bytes(chunk, 8) bytes. A
// single call's bound above then holds for values plus carried error; over calls with the same
// inputs, the errors cancel, so the mean of the results approaches the exact mean.
//
// Semantics are communicator.h's with one difference: sums are taken node by node, then over
// nodes, so a two-level result is bitwise reproducible for a topology but not equal to the flat
// world's. 16-bit sums (and averages) travel as fp32 through both levels and are rounded once at
// the end, as the contract asks; Max travels in the element type.
//
// Memory: created without a device, collectives take host memory (the reordering is a memcpy,
// the arithmetic the CPU kernels'). Created with a Device (a GPU engine's world: NCCL, or
// DeviceInProcComm), they take that device's memory: the levels run on splits of the world,
// the reordering and the arithmetic between levels go through Device::copy and the device's
// compute table (comm_detail::LevelMemory), with the same bits. Such a communicator is also given
// a host communicator of the same ranks, the control communicator, for what must travel in host
// memory: create()'s placement check and split()'s membership exchange. On a device an fp64
// average is refused at the call (CommError; the device kernels do not divide fp64), and the
// quantized reduce-scatter's LoCo error feedback is computed on the host (its state is host
// memory): each of its quantization points crosses to the host and back.
// On a device, this communicator and every group split off it (one level or two) run their
// collectives on one communication thread they share, in the order they were issued: NCCL
// communicators whose kernels are enqueued in different orders on different ranks can deadlock,
// and the engine issues in the same order on every rank.
//
// Traffic: every collective counts, on each rank, the bytes a ring algorithm sends from that rank
// (reduce_scatter and all_gather (n−1)·chunk, all_reduce 2·(n−1)/n·buffer, broadcast the buffer on
// the root of each level), attributed to the level it ran on: on one node everything is
// intra-node, with one rank per node everything is inter-node.
//
// split() keeps the topology: a group whose members, in the group's order, are contiguous equal
// blocks per node is again a HierarchicalComm (two levels when it spans several nodes of several
// members; a MiCS shard group inside a node forwards and counts as intra-node); any other group
// forwards and counts everything as inter-node when it spans several nodes. A split's bytes are
// added to its parent's counts, so traffic() covers every group split off it.
//
// Failures: a failed level fails the collective (CommError from wait()), and every later one on
// this communicator fails too, naming the first failure. A lost peer is reported by the level
// that waits for it (its timeout, or the world's abort), so no rank hangs.
// Thread safety: as any Communicator. traffic() may be read from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zero/comm/communicator.h"
#include "zero/comm/node_topology.h"

namespace zero {

class Device;  // zero/device/device.h

namespace comm_detail {
class CommThread;
class LevelMemory;  // level_memory.h
}

struct NodeTraffic {
  std::uint64_t intra_bytes = 0;  // sent to ranks of this node
  std::uint64_t inter_bytes = 0;  // sent to ranks of other nodes
};

class HierarchicalComm final : public Communicator {
 public:
  // Collective over `world` (it splits it when there are several nodes of several ranks), and
  // checks on every rank at once that a launcher's placement is the contiguous blocks the
  // topology assumes (a CommError naming the first rank whose local rank disagrees, and the fix).
  // REQUIRES: `world` outlives the result; topology.world_size == world.size(). In two-level mode
  // the result never uses `world` after create(), so its owner may go on using it; on one level
  // the result forwards to it, so both are used from the same thread (communicator.h).
  // With `device`: collectives take its memory, and `control` (a host communicator of the same
  // ranks, which outlives the result and which the caller does not use while create() or split()
  // runs) carries the host-memory exchanges.
  static std::unique_ptr<HierarchicalComm> create(Communicator& world,
                                                  const NodeTopology& topology,
                                                  Device* device = nullptr,
                                                  Communicator* control = nullptr);
  ~HierarchicalComm() override;

  int rank() const override { return rank_; }
  int size() const override { return topology_.world_size; }
  // The world's name on one level; "hierarchical(<intra>/<inter>, N nodes x R ranks)" otherwise.
  std::string backend_name() const override;
  bool shares_address_space() const override;
  // The world's, in one level; in two, this rank's own memory only.
  void* peer_memory(int q, const void* remote, std::size_t bytes) const override;
  const void* peer_readable(int q, const void* remote, std::size_t bytes) const override;

  const NodeTopology& topology() const { return topology_; }
  // Whether collectives run in two levels (several nodes of several ranks each).
  bool two_level() const { return intra_ != nullptr; }
  // Bytes this rank sent since create(), by level.
  NodeTraffic traffic() const { return {counters_->intra.load(), counters_->inter.load()}; }

  // The scratch a two-level collective takes between the levels, per slot (the reordered or
  // widened chunks, payloads, fp32 sums). Each slot is kept and grown to the largest call until
  // destruction, so a run holds the slot-wise maximum over its calls.
  using LevelScratch = std::array<std::size_t, 3>;
  // That scratch in device memory for one collective of these arguments (`elems` as
  // CollectiveArgs::elems), for a caller that checks room on the device before it starts (the
  // engine's bucket check); zeros where none is taken there: one level, or host memory.
  LevelScratch device_scratch(Collective kind, std::size_t elems, DType dtype,
                              ReduceOp op = ReduceOp::Sum, int quantize_bits = 0) const;
  // The device scratch held now (zeros where none is taken there).
  // REQUIRES: no collective of this communicator in flight.
  LevelScratch device_scratch_held() const;

 protected:
  Work start_impl(const CollectiveArgs& args) override;
  std::unique_ptr<Communicator> split_impl(int color, int key) override;

 private:
  HierarchicalComm(Communicator& world, const NodeTopology& topology);

  // Communication thread only.
  void run(const CollectiveArgs& a);
  void two_level_reduce_scatter(const CollectiveArgs& a);
  void two_level_all_gather(const CollectiveArgs& a);
  void two_level_all_reduce(const CollectiveArgs& a);
  void two_level_broadcast(const CollectiveArgs& a);
  void two_level_all_to_all(const CollectiveArgs& a);
  void two_level_quantized_reduce_scatter(const CollectiveArgs& a);
  void count(const CollectiveArgs& a, int group_size, int group_rank, bool inter);
  // The scratch `a` takes in two levels (device_scratch()'s, in this communicator's memory).
  LevelScratch scratch_of(const CollectiveArgs& a) const;

  struct Counters {
    std::atomic<std::uint64_t> intra{0};
    std::atomic<std::uint64_t> inter{0};
  };
  // `owned` (null: borrowed) is `world`; `owned_control` (null: borrowed) is `control`;
  // `family_thread` (device mode) the thread of the communicator this one was split off.
  HierarchicalComm(std::unique_ptr<Communicator> owned, Communicator& world,
                   const NodeTopology& topology, std::shared_ptr<Counters> counters,
                   Device* device, std::unique_ptr<Communicator> owned_control,
                   Communicator* control,
                   std::shared_ptr<comm_detail::CommThread> family_thread = nullptr);

  std::unique_ptr<Communicator> owned_world_;  // a split's own world (null: borrowed)
  Communicator& world_;
  const NodeTopology topology_;
  const int rank_;
  std::unique_ptr<Communicator> intra_;  // null: forwarding to world_
  std::unique_ptr<Communicator> inter_;
  std::unique_ptr<Communicator> splitter_;  // a private copy of the world, for split()
  // On a device: the host communicator of the same ranks (create()), and its private copy for
  // split() in two-level mode. Null on the host, where the world carries those exchanges.
  std::unique_ptr<Communicator> owned_control_;
  Communicator* control_ = nullptr;
  std::unique_ptr<Communicator> control_splitter_;
  Device* device_;
  // Scratch slots 0, 1 (payloads), 2 (fp32 sums), and the copies between the levels.
  std::unique_ptr<comm_detail::LevelMemory> memory_;
  std::vector<std::byte> host_values_;             // LoCo's values on the host (a device's)
  std::vector<float> widened_, feedback_scratch_;  // its error feedback's fp32 work
  std::string failure_;                              // the first failure, communication thread only
  std::shared_ptr<Counters> counters_;               // shared with the groups split off this one
  Work last_;  // device mode: the last op issued, waited for by the destructor
  // Two-level mode on the host; always on a device, shared with the groups split off (above).
  std::shared_ptr<comm_detail::CommThread> thread_;  // last: stopped first
};

// The two-level communicator a GPU engine runs over, or null for `device_world` itself (its own
// collectives over every rank: NCCL follows the real topology without help). Two levels where they
// are asked for, on several nodes of several ranks: a simulated topology (topology.source
// "ZERO_RANKS_PER_NODE" or "--ranks-per-node": the test bed of one host) or qgZ
// (`quantized_gradients`: the quantized reduction runs between the levels). Collective over
// `device_world` and `host` (the control communicator, same ranks).
std::unique_ptr<HierarchicalComm> make_device_nodes(Communicator& device_world, Device& device,
                                                    Communicator& host,
                                                    const NodeTopology& topology,
                                                    bool quantized_gradients);

}  // namespace zero
