#include "zero/comm/quantized_reduce_comm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "kernels/quantize.h"
#include "zero/base/error.h"
#include "zero/comm/comm_thread.h"
#include "zero/comm/reduce_math.h"

namespace zero {

std::unique_ptr<QuantizedReduceComm> QuantizedReduceComm::create(HierarchicalComm& nodes,
                                                                  int bits) {
  ZERO_CHECK(nodes.topology().nodes() > 1,
             "QuantizedReduceComm: {} is not a world of several nodes", nodes.backend_name());
  ZERO_CHECK(bits == 4 || bits == 8, "QuantizedReduceComm: {} bits; expected 4 or 8", bits);
  const NodeTopology& t = nodes.topology();
  const int r = nodes.rank();
  auto intra = nodes.split(t.node_of(r), t.local_of(r));
  auto inter = nodes.split(t.local_of(r), t.node_of(r));
  return std::unique_ptr<QuantizedReduceComm>(
      new QuantizedReduceComm(nodes, std::move(intra), std::move(inter), bits));
}

QuantizedReduceComm::QuantizedReduceComm(HierarchicalComm& nodes,
                                         std::unique_ptr<Communicator> intra,
                                         std::unique_ptr<Communicator> inter, int bits)
    : Communicator(CommOptions{nodes.timeout()}),
      world_(nodes),
      topology_(nodes.topology()),
      intra_(std::move(intra)),
      inter_(std::move(inter)),
      bits_(bits),
      thread_(std::make_unique<comm_detail::CommThread>()) {}

QuantizedReduceComm::~QuantizedReduceComm() { thread_->join(); }

std::string QuantizedReduceComm::backend_name() const {
  return fmt::format("qgz{}({})", bits_, world_.backend_name());
}

Work QuantizedReduceComm::start_impl(const CollectiveArgs& args) {
  const bool quantized = args.kind == Collective::ReduceScatter && args.op != ReduceOp::Max &&
                         args.dtype != DType::F64;
  return thread_->submit([this, args, quantized] {
    if (quantized) {
      reduce_scatter(args);
    } else {
      world_.start(args).wait();
    }
  });
}

std::unique_ptr<Communicator> QuantizedReduceComm::split_impl(int color, int key) {
  std::unique_ptr<Communicator> result;
  thread_->submit([&] { result = world_.split(color, key); }).wait();
  return result;
}

void QuantizedReduceComm::reduce_scatter(const CollectiveArgs& a) {
  const std::size_t c = a.elems;
  if (c == 0) return;
  const int L = topology_.ranks_per_node, N = topology_.nodes();
  const auto W = static_cast<std::size_t>(size());
  const std::size_t esz = dtype_size(a.dtype);
  const std::size_t qb = kernels::quantized_bytes(c, bits_);  // a multiple of 4
  const kernels::CpuExec serial{.threads = 1};
  send_.resize(W * qb);
  recv_.resize(W * qb);
  // 1. Every chunk quantized, grouped by the local rank of its destination, by node within.
  for (int lq = 0; lq < L; ++lq) {
    for (int nq = 0; nq < N; ++nq) {
      const auto* chunk =
          static_cast<const std::byte*>(a.send) + static_cast<std::size_t>(nq * L + lq) * c * esz;
      kernels::quantize_cpu(chunk, a.dtype, c, bits_,
                            send_.data() + static_cast<std::size_t>(lq * N + nq) * qb, serial);
    }
  }
  // 2. Inside the node: from each local rank, its chunks for the ranks with this local rank.
  intra_->all_to_all(send_.data(), recv_.data(), static_cast<std::size_t>(N) * qb / 4, DType::F32)
      .wait();
  // 3. Summed over the node's ranks in order, per destination node, then requantized.
  sums_.assign(static_cast<std::size_t>(N) * c, 0.0f);
  for (int nq = 0; nq < N; ++nq) {
    float* sum = sums_.data() + static_cast<std::size_t>(nq) * c;
    for (int lq = 0; lq < L; ++lq) {
      kernels::dequantize_add_cpu(recv_.data() + static_cast<std::size_t>(lq * N + nq) * qb, c,
                                  bits_, sum, serial);
    }
    kernels::quantize_cpu(sum, DType::F32, c, bits_,
                          send_.data() + static_cast<std::size_t>(nq) * qb, serial);
  }
  // 4. Across nodes: every node's partial sum of this rank's chunk.
  inter_->all_to_all(send_.data(), recv_.data(), qb / 4, DType::F32).wait();
  // 5. Summed over nodes in order, averaged, rounded once to the element type.
  std::vector<float>& total = sums_;
  total.assign(c, 0.0f);
  for (int nn = 0; nn < N; ++nn) {
    kernels::dequantize_add_cpu(recv_.data() + static_cast<std::size_t>(nn) * qb, c, bits_,
                                total.data(), serial);
  }
  void* out = a.in_place ? static_cast<std::byte*>(a.recv) + static_cast<std::size_t>(rank()) * c * esz
                         : a.recv;
  const float divisor = a.op == ReduceOp::Avg ? static_cast<float>(W) : 1.0f;
  if (a.dtype == DType::F32) {
    auto* o = static_cast<float*>(out);
    for (std::size_t i = 0; i < c; ++i) o[i] = total[i] / divisor;
  } else {
    comm_detail::narrow_from_f32(total.data(), out, c, a.dtype, divisor);
  }
}

}  // namespace zero
