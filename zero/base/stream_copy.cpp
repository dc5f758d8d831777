#include "zero/base/stream_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace zero {

namespace {

#if defined(__x86_64__)
// Copies whole 64-byte lines to a 16-byte-aligned dst with non-temporal stores; no fence.
void stream_lines(std::byte* d, const std::byte* s, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
}

// Copies bytes to dst: ordinary stores up to dst's first 16-byte boundary, non-temporal stores
// for the whole 64-byte groups after it, ordinary stores for the tail. No fence.
void stream_unfenced(std::byte* d, const std::byte* s, std::size_t bytes) {
  const std::size_t head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  const std::size_t body = (bytes - head) / 64 * 64;
  stream_lines(d + head, s + head, body);
  std::memcpy(d + head + body, s + head + body, bytes - head - body);
}
#endif

// Below a few pages the fence and the head and tail cost more than the cache lines saved.
constexpr std::size_t kStreamMinBytes = 16384;

}  // namespace

void copy_streaming_unfenced(void* dst, const void* src, std::size_t bytes) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
#if defined(__x86_64__)
  if (bytes >= kStreamMinBytes) {
    stream_unfenced(d, s, bytes);
    return;
  }
#endif
  std::memcpy(d, s, bytes);
}

void streaming_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

void copy_streaming(void* dst, const void* src, std::size_t bytes) {
  copy_streaming_unfenced(dst, src, bytes);
  if (bytes >= kStreamMinBytes) streaming_fence();
}

void copy_streaming_seen(void* dst, const void* src, std::size_t bytes,
                         const std::function<void(const std::byte*, std::size_t)>& see) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
#if defined(__x86_64__)
  if (bytes >= kStreamMinBytes) {
    // Stretches end where dst is kSeenStretchBytes-aligned, so every stretch but the first starts
    // on a line of its own and only the first and last need ordinary stores at their edges.
    const auto addr = reinterpret_cast<std::uintptr_t>(d);
    for (std::size_t done = 0; done < bytes;) {
      const std::size_t end = std::min(
          bytes, (addr + done) / kSeenStretchBytes * kSeenStretchBytes + kSeenStretchBytes - addr);
      see(s + done, end - done);
      stream_unfenced(d + done, s + done, end - done);
      done = end;
    }
    streaming_fence();
    return;
  }
#endif
  if (bytes > 0) see(s, bytes);
  std::memcpy(d, s, bytes);
}

void copy_large(void* dst, const void* src, std::size_t tile_bytes, std::size_t bytes) {
  if (bytes >= kStreamingMinBytes) {
    copy_streaming(dst, src, tile_bytes);
  } else {
    std::memcpy(dst, src, tile_bytes);
  }
}

}  // namespace zero
