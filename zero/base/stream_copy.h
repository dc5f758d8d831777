// Copies of ranges the copying core will not read again soon: a checkpoint load's tensors, a
// collective's chunks, a model copy tens of megabytes long.
#pragma once

#include <cstddef>

namespace zero {

// Copies `bytes` from src to dst with non-temporal stores where the CPU has them (SSE2 on
// x86-64), else memcpy. Non-temporal stores skip reading the destination's cache lines before
// writing them, so copying a large range costs one memory write per byte instead of a read and a
// write, and the destination does not push the source out of cache. The stores are fenced before
// returning: any thread that synchronizes with the caller afterwards sees them.
// REQUIRES: the ranges do not overlap. Any alignment.
void copy_streaming(void* dst, const void* src, std::size_t bytes);

// From this many bytes on, a copy's destination cannot stay in the copying core's cache (several
// times a core's L2), so copy_large streams it.
inline constexpr std::size_t kStreamingMinBytes = std::size_t{8} << 20;

// memcpy below kStreamingMinBytes, copy_streaming from there on. `bytes` is the size of the
// whole copy the caller makes, even when it hands over one tile of it at a time (`tile_bytes`).
void copy_large(void* dst, const void* src, std::size_t tile_bytes, std::size_t bytes);
// The same for a copy made in one piece.
inline void copy_large(void* dst, const void* src, std::size_t bytes) {
  copy_large(dst, src, bytes, bytes);
}

}  // namespace zero
