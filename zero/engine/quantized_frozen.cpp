#include "zero/engine/quantized_frozen.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/compute.h"
#include "kernels/quantize.h"
#include "zero/base/error.h"

namespace zero::engine_detail {

namespace {
const kernels::CpuExec kOneThread{.threads = 1};
}  // namespace

QuantizedFrozen::QuantizedFrozen(Device& device, Communicator& comm, DType dtype,
                                 std::size_t numel)
    : device_(device),
      comm_(comm),
      dtype_(dtype),
      numel_(numel),
      world_(comm.size()),
      rank_(comm.rank()),
      slice_((numel + static_cast<std::size_t>(comm.size()) - 1) /
             static_cast<std::size_t>(comm.size())),
      qbytes_(kernels::quantized_bytes(slice_, 8)) {
  shard_ = device_.allocate(qbytes_, MemoryKind::Device, MemoryTag::LowPrecisionParams);
}

void QuantizedFrozen::quantize_slice(const std::byte* whole, int r, void* quantized) const {
  const std::size_t esz = dtype_size(dtype_);
  const std::size_t begin = std::min(numel_, static_cast<std::size_t>(r) * slice_);
  const std::size_t end = std::min(numel_, begin + slice_);
  std::vector<std::byte> padded(slice_ * esz, std::byte{0});  // zeros change no block's scale
  if (end > begin) std::memcpy(padded.data(), whole + begin * esz, (end - begin) * esz);
  kernels::quantize_cpu(padded.data(), dtype_, slice_, 8, quantized, kOneThread);
}

// Values from the host are quantized there (the CPU's quantizer gives the device's bytes,
// quantize.h) and copied in.
void QuantizedFrozen::set(const std::byte* whole) {
  std::vector<std::byte> q(qbytes_);
  quantize_slice(whole, rank_, q.data());
  device_.copy(shard_.data(), q.data(), qbytes_);
  if (!gathered()) return;
  const std::size_t slice_bytes = slice_ * dtype_size(dtype_);
  std::vector<std::byte> value(static_cast<std::size_t>(world_) * slice_bytes);
  for (int r = 0; r < world_; ++r) {
    quantize_slice(whole, r, q.data());
    kernels::dequantize_cpu(q.data(), slice_, 8,
                            value.data() + static_cast<std::size_t>(r) * slice_bytes, dtype_,
                            kOneThread);
  }
  device_.copy(whole_.data(), value.data(), value.size());
}

const std::byte* QuantizedFrozen::gather() {
  if (gathered()) return static_cast<const std::byte*>(whole_.data());
  const auto W = static_cast<std::size_t>(world_);
  Buffer all = device_.allocate(W * qbytes_, MemoryKind::Device, MemoryTag::GatherBuffers);
  // Quantized bytes travel as fp32 words (qbytes_ is a multiple of 4): a copy, no arithmetic.
  comm_.all_gather(shard_.data(), all.data(), qbytes_ / 4, DType::F32).wait();
  whole_ = device_.allocate(W * slice_ * dtype_size(dtype_), MemoryKind::Device,
                            MemoryTag::GatherBuffers);
  for (std::size_t r = 0; r < W; ++r) {
    device_.compute().dequantize(static_cast<const std::byte*>(all.data()) + r * qbytes_, slice_,
                                 8, element_at(whole_, dtype_, r * slice_), dtype_, kOneThread);
  }
  return static_cast<const std::byte*>(whole_.data());
}

std::vector<std::byte> QuantizedFrozen::read() {
  const bool was = gathered();
  const std::byte* data = gather();
  std::vector<std::byte> out(numel_ * dtype_size(dtype_));
  if (!out.empty()) device_.copy(out.data(), data, out.size());
  if (!was) release();
  return out;
}

}  // namespace zero::engine_detail
