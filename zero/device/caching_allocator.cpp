#include "zero/device/caching_allocator.h"

#include <cstdint>

#include "zero/base/error.h"

namespace zero {

CachingAllocator::CachingAllocator(BlockSource& source, const CachePolicy& policy)
    : source_(source), policy_(policy) {
  ZERO_ASSERT(policy.small_granule_bytes >= 1 && policy.large_granule_bytes >= 1);
  ZERO_ASSERT(policy.max_fit_ratio >= 1.0);
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mu_);
  release_cached_locked();
}

std::size_t CachingAllocator::size_class(std::size_t bytes, const CachePolicy& policy) {
  const std::size_t granule = bytes < policy.large_threshold_bytes ? policy.small_granule_bytes
                                                                   : policy.large_granule_bytes;
  if (bytes > SIZE_MAX - (granule - 1)) return bytes;  // the source will refuse it anyway
  return (bytes + granule - 1) / granule * granule;
}

void* CachingAllocator::allocate(std::size_t bytes) noexcept {
  const std::size_t cls = size_class(bytes, policy_);
  std::lock_guard lock(mu_);
  const auto fit_limit = static_cast<double>(cls) * policy_.max_fit_ratio;
  auto it = idle_.lower_bound(cls);
  if (it != idle_.end() && static_cast<double>(it->first) <= fit_limit) {
    const std::size_t block = it->first;
    void* data = it->second;
    idle_.erase(it);
    stats_.cached_blocks -= 1;
    stats_.cached_bytes -= block;
    live_.emplace(data, block);
    stats_.live_blocks += 1;
    stats_.live_bytes += block;
    stats_.hits += 1;
    return data;
  }
  stats_.misses += 1;
  void* data = source_.allocate(cls);
  if (data == nullptr) {
    stats_.source_failures += 1;
    if (idle_.empty()) return nullptr;
    // Idle blocks of other sizes may be what the source is missing (on a GPU, device memory
    // fragmented among cached blocks): give them back and try once more.
    release_cached_locked();
    stats_.flushes += 1;
    data = source_.allocate(cls);
    if (data == nullptr) {
      stats_.source_failures += 1;
      return nullptr;
    }
  }
  live_.emplace(data, cls);
  stats_.live_blocks += 1;
  stats_.live_bytes += cls;
  return data;
}

void CachingAllocator::free(void* data) noexcept {
  if (data == nullptr) return;
  std::lock_guard lock(mu_);
  auto it = live_.find(data);
  ZERO_ASSERT(it != live_.end());
  const std::size_t block = it->second;
  live_.erase(it);
  stats_.live_blocks -= 1;
  stats_.live_bytes -= block;
  if (block >= policy_.min_cached_bytes &&
      stats_.cached_bytes + block <= policy_.max_cached_bytes) {
    idle_.emplace(block, data);
    stats_.cached_blocks += 1;
    stats_.cached_bytes += block;
    return;
  }
  source_.free(data, block);
}

void CachingAllocator::release_cached() noexcept {
  std::lock_guard lock(mu_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() noexcept {
  for (auto& [block, data] : idle_) source_.free(data, block);
  idle_.clear();
  stats_.cached_blocks = 0;
  stats_.cached_bytes = 0;
}

CacheStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace zero
