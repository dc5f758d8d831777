// ZeRO++ qgZ: gradients reduce-scattered in quantized blocks, in two levels over nodes.
//
// A QuantizedReduceComm wraps a HierarchicalComm of several nodes. Its reduce_scatter (W chunks of
// c elements in, this rank's reduced chunk out) runs, for this rank r = (node n, local rank l):
//   1. every chunk is quantized (kernels/quantize.h: `bits` 4 or 8, one fp32 scale per 256
//      elements, from the true element type), ordered by local rank of its destination;
//   2. an all-to-all inside the node: local rank l receives, from every local peer, the chunks
//      for the ranks with local rank l (one per node);
//   3. those are dequantized and summed in fp32 in local-rank order, then requantized;
//   4. an all-to-all across nodes among the ranks with local rank l: node n receives every node's
//      partial sum of its own chunk;
//   5. these are dequantized and summed in fp32 in node order; Avg divides by W; the result is
//      rounded once to the element type.
// So the result is the mean (or sum) over all W ranks of every element, at any chunk size, odd
// ones included: nothing is padded away, and nothing falls back to an exact reduction. Its error
// is bounded by the two quantizations: with s(x) the scale of the block holding x,
//   |result − exact sum| ≤ Σ over ranks of s/2 (step 1) + Σ over nodes of s/2 (step 3),
// divided by W for Avg (a block's s is its max |value| / 7 in 4 bits, / 127 in 8 bits). Results
// are deterministic and bitwise reproducible run to run; Max is reduced exactly.
// Every other collective, and split(), goes to the wrapped communicator unchanged. Everything runs
// in issue order on a thread of its own. Host memory only.
// Thread safety: as any Communicator.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "zero/comm/communicator.h"
#include "zero/comm/hierarchical_comm.h"

namespace zero {

namespace comm_detail {
class CommThread;
}

class QuantizedReduceComm final : public Communicator {
 public:
  // Collective over `nodes` (splits it into the two levels; with one rank per node the first
  // level is that rank alone). REQUIRES: nodes.topology().nodes() > 1; bits 4 or 8; `nodes`
  // outlives the result and is used by nobody else meanwhile.
  static std::unique_ptr<QuantizedReduceComm> create(HierarchicalComm& nodes, int bits);
  ~QuantizedReduceComm() override;

  int rank() const override { return world_.rank(); }
  int size() const override { return world_.size(); }
  // "qgz<bits>(<wrapped>)".
  std::string backend_name() const override;

 protected:
  Work start_impl(const CollectiveArgs& args) override;
  std::unique_ptr<Communicator> split_impl(int color, int key) override;

 private:
  QuantizedReduceComm(HierarchicalComm& nodes, std::unique_ptr<Communicator> intra,
                      std::unique_ptr<Communicator> inter, int bits);
  void reduce_scatter(const CollectiveArgs& a);  // communication thread

  HierarchicalComm& world_;
  const NodeTopology topology_;
  std::unique_ptr<Communicator> intra_;  // this node's ranks, by local rank
  std::unique_ptr<Communicator> inter_;  // the ranks with this local rank, by node
  const int bits_;
  std::vector<std::byte> send_, recv_;  // quantized payloads, communication thread only
  std::vector<float> sums_;
  std::unique_ptr<comm_detail::CommThread> thread_;  // last: stopped first
};

}  // namespace zero
