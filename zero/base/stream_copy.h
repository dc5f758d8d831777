// Copies of ranges the copying core will not read again soon: a checkpoint load's tensors, a
// collective's chunks, a model copy tens of megabytes long.
#pragma once

#include <cstddef>
#include <functional>

namespace zero {

// Copies `bytes` from src to dst with non-temporal stores where the CPU has them (SSE2 on
// x86-64), else memcpy. Non-temporal stores skip reading the destination's cache lines before
// writing them, so copying a large range costs one memory write per byte instead of a read and a
// write, and the destination does not push the source out of cache. The stores are fenced before
// returning: any thread that synchronizes with the caller afterwards sees them.
// REQUIRES: the ranges do not overlap. Any alignment.
void copy_streaming(void* dst, const void* src, std::size_t bytes);

// copy_streaming without the fence, for many copies in a row that one fence can close: the copier
// calls streaming_fence() after the last of them and before anything that lets another thread
// read the copies (a barrier, a flag's release store). A fence after every 64 KiB tile of an
// optimizer step's push stalled the step's next tile on the memory writes of the last one.
void copy_streaming_unfenced(void* dst, const void* src, std::size_t bytes);
void streaming_fence();

// copy_streaming that shows the source to see(stretch, stretch_bytes) first, in order, the
// stretches covering the range; each stretch is copied right after see() returns. Where the copy
// streams (x86-64, 16 KiB or more) a stretch is at most kSeenStretchBytes; otherwise the whole
// range is one stretch. A checksum taken this way costs little beyond the copy: see() reads
// the stretch into L1, the copy takes it from there, and the memory writes of one stretch overlap
// the reads of the next (one fence at the end, not one per stretch). Checksumming 512 KiB pieces
// and then copying each ran at about 0.8 of the plain copy's speed here; 4 KiB stretches at 0.9-1.
// REQUIRES: the ranges do not overlap; see() does not write either. Any alignment.
inline constexpr std::size_t kSeenStretchBytes = 4096;
void copy_streaming_seen(void* dst, const void* src, std::size_t bytes,
                         const std::function<void(const std::byte*, std::size_t)>& see);

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
