// MiCS (DeepSpeed's mics_shard_size): the model states are partitioned inside shard groups of S
// consecutive ranks and replicated across the W/S groups.
//
// A MicsComm is what a stage-3 engine sees of that: its rank and size are the shard group's, so
// the engine partitions over S ranks and gathers parameters inside the group. reduce_scatter
// reduce-scatters inside the group and then all-reduces this rank's chunk across the replicas (the
// ranks at the same place of every group), so each chunk is the reduction over all W ranks: Avg
// gives (sum over the group / S) averaged over the W/S replicas, the mean over W. Every other
// collective stays inside the group. Everything runs in issue order on a thread of its own.
//
// Built over a HierarchicalComm the groups keep its topology (split() there): a shard group inside
// a node counts as intra-node, the replica all-reduce across nodes as inter-node, and a shard
// group that spans nodes gathers in two levels (mics_hierarchical_params_gather).
//
// Results: fp32 sums are taken in the group in rank order, then over the replicas in replica
// order, so they are bitwise reproducible but not the bits of a flat world's sum (within rounding
// of it). 16-bit gradients are rounded after each of the two reductions.
// Thread safety: as any Communicator.
#pragma once

#include <memory>
#include <string>

#include "zero/comm/communicator.h"

namespace zero {

namespace comm_detail {
class CommThread;
}

class MicsComm final : public Communicator {
 public:
  // Collective over `world`. Throws ConfigError at zero_optimization.mics_shard_size when
  // shard_size is not a divisor of world.size() ("use one of 1, 2, 4"). The groups are splits of
  // `world`, which the result does not use afterwards.
  static std::unique_ptr<MicsComm> create(Communicator& world, int shard_size);
  ~MicsComm() override;

  int rank() const override { return shard_->rank(); }
  int size() const override { return shard_->size(); }
  // "mics(<shard backend> x <replicas>)".
  std::string backend_name() const override;

  // This rank's replica (its shard group's index), and how many there are.
  int replica() const { return replica_; }
  int replicas() const { return replicas_; }
  // The ranks at this rank's place in every shard group, by replica. Used by the engine around a
  // checkpoint save (replica 0 writes, the others wait for it). Collectives on it must not
  // overlap this communicator's own: call it only with none of this communicator's in flight.
  Communicator& across_replicas() { return *across_; }

 protected:
  Work start_impl(const CollectiveArgs& args) override;
  std::unique_ptr<Communicator> split_impl(int color, int key) override;

 private:
  MicsComm(std::unique_ptr<Communicator> shard, std::unique_ptr<Communicator> across, int replica,
           int replicas);
  void run(const CollectiveArgs& a);  // communication thread

  std::unique_ptr<Communicator> shard_;
  std::unique_ptr<Communicator> across_;
  const int replica_;
  const int replicas_;
  std::unique_ptr<comm_detail::CommThread> thread_;  // last: stopped first
};

}  // namespace zero
