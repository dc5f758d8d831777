// A copy for bytes the copying core will not read again soon (a checkpoint load's tensors).
#pragma once

#include <cstddef>

namespace zero::io {

// Copies `bytes` from src to dst with non-temporal stores where the CPU has them (SSE2 on
// x86-64), else memcpy. Non-temporal stores skip reading the destination's cache lines before
// writing them, so copying a large range costs one memory write per byte instead of a read and a
// write, and the destination does not push the source out of cache. The stores are fenced before
// returning: any thread that synchronizes with the caller afterwards sees them.
// REQUIRES: the ranges do not overlap. Any alignment.
void copy_streaming(void* dst, const void* src, std::size_t bytes);

}  // namespace zero::io
