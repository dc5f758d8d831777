#include "zero/base/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace zero {

void copy_streaming(void* dst, const void* src, std::size_t bytes) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
#if defined(__x86_64__)
  // Below a few pages the fence and the head and tail cost more than the cache lines saved.
  constexpr std::size_t kMinBytes = 16384;
  if (bytes >= kMinBytes) {
    const std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    const std::size_t body = bytes / 64 * 64;
    for (std::size_t i = 0; i < body; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    _mm_sfence();
    d += body;
    s += body;
    bytes -= body;
  }
#endif
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
