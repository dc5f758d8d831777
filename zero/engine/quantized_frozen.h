// ZeRO++'s zero_quantized_nontrainable_weights at stage 3: a frozen parameter kept as this rank's
// shard, quantized to int8 blocks, and gathered whole only while its unit is (the LoRA case: a
// large frozen base model costs each rank about 1/W byte per element instead of a whole 16-bit
// copy).
//
// The parameter's elements are cut into W slices of ceil(numel / W) (the last ones padded with
// zeros); rank r keeps slice r quantized as kernels/quantize.h lays it out (8 bits, one fp32 scale
// per 256 elements, quantized from the model dtype's values, never from reinterpreted bits).
// gather() all-gathers the quantized slices and dequantizes every one of them, its own included,
// so every rank computes with the same weights: dequantize(quantize(value)), rounded to the model
// dtype. Master weights do not exist for a frozen parameter; the values a checkpoint or
// gather_master reads are these dequantized ones.
//
// The shard and the gathered value are memory of `device` (a GPU's, too): gather() all-gathers
// over `comm`, whose collectives take that memory, and dequantizes with the device's compute
// table; set() and read() move host bytes with Device::copy. Collectives: gather(), and read()
// when not gathered, are collective over `comm`: every rank calls them for the same parameters
// in the same order. set() and release() are local. Thread safety: the rank's thread only.
#pragma once

#include <cstddef>
#include <vector>

#include "zero/base/dtype.h"
#include "zero/comm/communicator.h"
#include "zero/device/device.h"

namespace zero::engine_detail {

class QuantizedFrozen {
 public:
  // REQUIRES: device, comm outlive this; comm's collectives take the device's memory.
  QuantizedFrozen(Device& device, Communicator& comm, DType dtype, std::size_t numel);

  // Keeps this rank's slice of `whole` (numel elements of the model dtype, host memory)
  // quantized; while gathered, the gathered value becomes the new one's too (every rank holds
  // `whole`, so no collective is needed). Not collective.
  void set(const std::byte* whole);
  // The whole value (numel elements of the model dtype), gathered and dequantized; it stays
  // until release(). Collective unless already gathered.
  const std::byte* gather();
  void release() { whole_.reset(); }
  bool gathered() const { return !whole_.empty(); }
  // The whole value in host bytes; collective unless gathered (then released again).
  std::vector<std::byte> read();
  std::size_t numel() const { return numel_; }

 private:
  // `quantized` (qbytes_) = slice r of `whole`, padded with zeros, quantized.
  void quantize_slice(const std::byte* whole, int r, void* quantized) const;

  Device& device_;
  Communicator& comm_;
  const DType dtype_;
  const std::size_t numel_;
  const int world_;
  const int rank_;
  const std::size_t slice_;  // elements of one rank's slice, padding included
  const std::size_t qbytes_;  // bytes of one quantized slice (a multiple of 4)
  Buffer shard_;  // this rank's quantized slice
  Buffer whole_;  // while gathered: world_ · slice_ elements of the model dtype
};

}  // namespace zero::engine_detail
