// A caching allocator over one source of raw memory (cudaMalloc, cudaMallocHost, aligned_alloc):
// freed blocks are kept and handed out again, so the buffers the engine allocates every step cost
// neither a driver call (which on a GPU also synchronizes the device) nor page faults.
//
// Requests are rounded up to a size class (CachePolicy); a freed block of at least
// `min_cached_bytes` is kept while the idle total stays within `max_cached_bytes`, and an
// allocation takes the smallest idle block of its class or larger, up to `max_fit_ratio` times
// the class. When the source fails, every idle block is returned to it and the request is tried
// once more; only then does allocate() report failure.
//
// This is the bookkeeping only, with no CUDA dependency: CpuDevice and CudaDevice each put one in
// front of their sources, and tests drive it over a fake source. Tags, the ledger and budgets are
// the Device's (device.h): the ledger counts bytes in use as requested, never idle blocks.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>

namespace zero {

// Raw memory of one kind. allocate() returns nullptr on failure and never throws.
class BlockSource {
 public:
  virtual ~BlockSource() = default;
  virtual void* allocate(std::size_t bytes) noexcept = 0;
  // REQUIRES: `data` came from allocate(bytes) with the same `bytes`.
  virtual void free(void* data, std::size_t bytes) noexcept = 0;
};

struct CachePolicy {
  // Size classes: requests below `large_threshold_bytes` round up to a multiple of
  // `small_granule_bytes`, larger ones to a multiple of `large_granule_bytes`. A granule of 1
  // keeps sizes exact.
  std::size_t small_granule_bytes = 512;
  std::size_t large_granule_bytes = std::size_t{2} << 20;
  std::size_t large_threshold_bytes = std::size_t{1} << 20;
  // Blocks smaller than this go straight back to the source when freed.
  std::size_t min_cached_bytes = 0;
  // Idle bytes kept at most; a block that would exceed it goes back to the source.
  std::size_t max_cached_bytes = std::size_t{1} << 30;
  // An idle block serves a request of class c only if it is at most c × max_fit_ratio bytes, so a
  // small buffer never pins a large block. 1 = exact class only.
  double max_fit_ratio = 1.25;
};

struct CacheStats {
  std::size_t live_blocks = 0;
  std::size_t live_bytes = 0;  // block sizes (class-rounded) of the blocks handed out
  std::size_t cached_blocks = 0;
  std::size_t cached_bytes = 0;
  std::size_t hits = 0;             // allocations served from the cache
  std::size_t misses = 0;           // allocations that went to the source
  std::size_t source_failures = 0;  // source allocations that returned nullptr
  std::size_t flushes = 0;          // times the cache was emptied to retry a failed allocation
};

class CachingAllocator {
 public:
  // REQUIRES: `source` outlives the allocator; granules >= 1; max_fit_ratio >= 1.
  CachingAllocator(BlockSource& source, const CachePolicy& policy);
  // Returns every idle block to the source. Blocks still handed out are not freed (their owner
  // is leaking them; the Device logs that from its ledger).
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (> 0), or nullptr when the source fails even after the cache
  // was returned to it.
  void* allocate(std::size_t bytes) noexcept;
  // REQUIRES: `data` came from allocate() of this allocator and was not freed since.
  void free(void* data) noexcept;
  // Returns every idle block to the source.
  void release_cached() noexcept;

  CacheStats stats() const;
  // The size class of a request of `bytes` under `policy`.
  static std::size_t size_class(std::size_t bytes, const CachePolicy& policy);

 private:
  void release_cached_locked() noexcept;

  BlockSource& source_;
  const CachePolicy policy_;
  mutable std::mutex mu_;
  std::multimap<std::size_t, void*> idle_;       // block size -> block
  std::unordered_map<void*, std::size_t> live_;  // block -> block size
  CacheStats stats_;
};

}  // namespace zero
