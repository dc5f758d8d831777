// HierarchicalComm's quantized reduce-scatter (ZeRO++ qgZ; the algorithm and its error bound are
// in hierarchical_comm.h), with LoCo's error feedback when the caller passes a state. On a device
// the payloads and sums stay in its memory (comm_detail::LevelMemory); a point with error
// feedback is computed on the host, its values copied there and its payload back.
#include <vector>

#include "kernels/cast.h"
#include "kernels/quantize.h"
#include "zero/comm/hierarchical_comm.h"
#include "zero/comm/level_memory.h"

namespace zero {

namespace {

const kernels::CpuExec kSerial{.threads = 1};

// One quantization point's error feedback: its stored error (8-bit blocks) inside the state.
struct FeedbackPoint {
  std::byte* stored;  // quantized_bytes(n, 8) bytes
  float multiplier;   // the stored error is multiplier · stored
  float beta;
};

// `out` = Q(x + e) for the n fp32 values `x` (overwritten with x + e), and e = beta · e +
// (1 − beta) · (x + e − deQ(Q(x + e))) written back; `scratch` holds 2n floats.
void quantize_with_feedback(float* x, std::size_t n, int bits, void* out, const FeedbackPoint& p,
                            std::vector<float>& scratch) {
  scratch.assign(2 * n, 0.0f);
  float* old_error = scratch.data();
  float* rounded = scratch.data() + n;
  kernels::dequantize_add_cpu(p.stored, n, 8, old_error, kSerial);
  for (std::size_t i = 0; i < n; ++i) {
    old_error[i] *= p.multiplier;
    x[i] += old_error[i];
  }
  kernels::quantize_cpu(x, DType::F32, n, bits, out, kSerial);
  kernels::dequantize_add_cpu(out, n, bits, rounded, kSerial);
  for (std::size_t i = 0; i < n; ++i)
    old_error[i] = p.beta * old_error[i] + (1.0f - p.beta) * (x[i] - rounded[i]);
  kernels::quantize_cpu(old_error, DType::F32, n, 8, p.stored, kSerial);
}

}  // namespace

void HierarchicalComm::two_level_quantized_reduce_scatter(const CollectiveArgs& a) {
  const std::size_t c = a.elems;
  if (c == 0) return;
  const int L = topology_.ranks_per_node, N = topology_.nodes();
  const int bits = a.quantize_bits;
  const auto W = static_cast<std::size_t>(size());
  const std::size_t esz = dtype_size(a.dtype);
  const std::size_t qb = kernels::quantized_bytes(c, bits);  // a multiple of 4
  const LevelScratch need = scratch_of(a);
  std::byte* send = memory_->scratch(0, need[0]);
  std::byte* recv = memory_->scratch(1, need[1]);
  // LoCo: the state holds the error of each of this rank's W chunks (step 1), then of its N
  // partial sums (step 3), each in 8-bit blocks; a state of another size starts from zero errors.
  const std::size_t eb = kernels::quantized_bytes(c, 8);
  QuantizationFeedback* fb = a.feedback;
  if (fb != nullptr && fb->state.size() != (W + static_cast<std::size_t>(N)) * eb) {
    fb->state.assign((W + static_cast<std::size_t>(N)) * eb, std::byte{0});
    fb->multiplier = 1.0f;
  }
  const auto point = [&](std::size_t index) {
    return FeedbackPoint{fb->state.data() + index * eb, fb->multiplier, fb->beta};
  };
  // Q(x + e) of the c fp32 host values x into `out` (this memory's): straight there on the host,
  // through a host buffer on a device.
  const bool device = memory_->on_device();
  std::vector<std::byte> payload;
  const auto quantize_on_host = [&](float* x, std::size_t index, std::byte* out) {
    if (!device) {
      quantize_with_feedback(x, c, bits, out, point(index), feedback_scratch_);
      return;
    }
    payload.resize(qb);
    quantize_with_feedback(x, c, bits, payload.data(), point(index), feedback_scratch_);
    memory_->copy(out, payload.data(), qb);
  };
  // 1. Every chunk quantized, grouped by the local rank of its destination, by node within.
  for (int lq = 0; lq < L; ++lq) {
    for (int nq = 0; nq < N; ++nq) {
      const auto q = static_cast<std::size_t>(nq * L + lq);
      const auto* chunk = static_cast<const std::byte*>(a.send) + q * c * esz;
      std::byte* out = send + static_cast<std::size_t>(lq * N + nq) * qb;
      if (fb == nullptr) {
        memory_->quantize(chunk, a.dtype, c, bits, out);
        continue;
      }
      const std::byte* values = chunk;
      if (device) {
        host_values_.resize(c * esz);
        memory_->copy(host_values_.data(), chunk, c * esz);
        values = host_values_.data();
      }
      widened_.resize(c);
      kernels::cast_cpu(values, a.dtype, widened_.data(), DType::F32, c, kSerial);
      quantize_on_host(widened_.data(), q, out);
    }
  }
  // 2. Inside the node: from each local rank, its chunks for the ranks with this local rank.
  const CollectiveArgs in_node = {Collective::AllToAll, send, recv,
                                  static_cast<std::size_t>(N) * qb / 4, DType::F32};
  count(in_node, L, topology_.local_of(rank_), false);
  intra_->start(in_node).wait();
  // 3. Summed over the node's ranks in local order, per destination node, then requantized.
  auto* sums = reinterpret_cast<float*>(
      memory_->scratch(2, need[2]));
  memory_->fill_zero(sums, static_cast<std::size_t>(N) * c, DType::F32);
  for (int nq = 0; nq < N; ++nq) {
    float* sum = sums + static_cast<std::size_t>(nq) * c;
    for (int lq = 0; lq < L; ++lq) {
      memory_->dequantize_add(recv + static_cast<std::size_t>(lq * N + nq) * qb, c, bits, sum);
    }
    std::byte* out = send + static_cast<std::size_t>(nq) * qb;
    if (fb == nullptr) {
      memory_->quantize(sum, DType::F32, c, bits, out);
    } else if (!device) {
      quantize_on_host(sum, W + static_cast<std::size_t>(nq), out);
    } else {
      widened_.resize(c);
      memory_->copy(widened_.data(), sum, c * sizeof(float));
      quantize_on_host(widened_.data(), W + static_cast<std::size_t>(nq), out);
    }
  }
  if (fb != nullptr) fb->multiplier = 1.0f;  // every stored error was rewritten at this scale
  // 4. Across nodes: every node's partial sum of this rank's chunk.
  const CollectiveArgs across = {Collective::AllToAll, send, recv, qb / 4, DType::F32};
  count(across, N, topology_.node_of(rank_), true);
  inter_->start(across).wait();
  // 5. Summed over nodes in order, averaged, rounded once to the element type.
  memory_->fill_zero(sums, c, DType::F32);
  for (int nn = 0; nn < N; ++nn) {
    memory_->dequantize_add(recv + static_cast<std::size_t>(nn) * qb, c, bits, sums);
  }
  void* out = a.in_place
                  ? static_cast<std::byte*>(a.recv) + static_cast<std::size_t>(rank_) * c * esz
                  : a.recv;
  memory_->finish(sums, out, c, a.dtype, DType::F32,
                  a.op == ReduceOp::Avg ? static_cast<int>(W) : 1);
}

}  // namespace zero
