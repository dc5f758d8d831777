// HierarchicalComm's quantized reduce-scatter (ZeRO++ qgZ; the algorithm and its error bound are
// in hierarchical_comm.h).
#include <vector>

#include "kernels/quantize.h"
#include "zero/comm/hierarchical_comm.h"
#include "zero/comm/reduce_math.h"

namespace zero {

void HierarchicalComm::two_level_quantized_reduce_scatter(const CollectiveArgs& a) {
  const std::size_t c = a.elems;
  if (c == 0) return;
  const int L = topology_.ranks_per_node, N = topology_.nodes();
  const int bits = a.quantize_bits;
  const auto W = static_cast<std::size_t>(size());
  const std::size_t esz = dtype_size(a.dtype);
  const std::size_t qb = kernels::quantized_bytes(c, bits);  // a multiple of 4
  const kernels::CpuExec serial{.threads = 1};
  std::byte* send = scratch(scratch_a_, W * qb);
  std::byte* recv = scratch(scratch_b_, W * qb);
  // 1. Every chunk quantized, grouped by the local rank of its destination, by node within.
  for (int lq = 0; lq < L; ++lq) {
    for (int nq = 0; nq < N; ++nq) {
      const auto* chunk =
          static_cast<const std::byte*>(a.send) + static_cast<std::size_t>(nq * L + lq) * c * esz;
      kernels::quantize_cpu(chunk, a.dtype, c, bits,
                            send + static_cast<std::size_t>(lq * N + nq) * qb, serial);
    }
  }
  // 2. Inside the node: from each local rank, its chunks for the ranks with this local rank.
  const CollectiveArgs in_node = {Collective::AllToAll, send, recv,
                                  static_cast<std::size_t>(N) * qb / 4, DType::F32};
  count(in_node, L, topology_.local_of(rank_), false);
  intra_->start(in_node).wait();
  // 3. Summed over the node's ranks in local order, per destination node, then requantized.
  sums_.assign(static_cast<std::size_t>(N) * c, 0.0f);
  for (int nq = 0; nq < N; ++nq) {
    float* sum = sums_.data() + static_cast<std::size_t>(nq) * c;
    for (int lq = 0; lq < L; ++lq) {
      kernels::dequantize_add_cpu(recv + static_cast<std::size_t>(lq * N + nq) * qb, c, bits, sum,
                                  serial);
    }
    kernels::quantize_cpu(sum, DType::F32, c, bits, send + static_cast<std::size_t>(nq) * qb,
                          serial);
  }
  // 4. Across nodes: every node's partial sum of this rank's chunk.
  const CollectiveArgs across = {Collective::AllToAll, send, recv, qb / 4, DType::F32};
  count(across, N, topology_.node_of(rank_), true);
  inter_->start(across).wait();
  // 5. Summed over nodes in order, averaged, rounded once to the element type.
  sums_.assign(c, 0.0f);
  for (int nn = 0; nn < N; ++nn) {
    kernels::dequantize_add_cpu(recv + static_cast<std::size_t>(nn) * qb, c, bits, sums_.data(),
                                serial);
  }
  void* out = a.in_place
                  ? static_cast<std::byte*>(a.recv) + static_cast<std::size_t>(rank_) * c * esz
                  : a.recv;
  comm_detail::finish_reduction(sums_.data(), out, c, a.dtype, DType::F32,
                                a.op == ReduceOp::Avg ? static_cast<int>(W) : 1);
}

}  // namespace zero
