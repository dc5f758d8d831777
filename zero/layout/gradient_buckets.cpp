#include "zero/layout/gradient_buckets.h"

#include <algorithm>
#include <optional>

#include "zero/base/error.h"

namespace zero {

std::vector<GradientBucket> assign_gradient_buckets(std::span<const ParamDesc> params,
                                                    std::span<const std::size_t> ready_order,
                                                    std::size_t capacity_elems) {
  ZERO_CHECK(capacity_elems > 0, "gradient buckets: the bucket capacity must be positive");
  ZERO_CHECK(ready_order.size() == params.size(),
             "gradient buckets: ready order lists {} parameters, but {} are registered",
             ready_order.size(), params.size());
  std::vector<bool> seen(params.size(), false);
  for (std::size_t p : ready_order) {
    ZERO_CHECK(p < params.size(), "gradient buckets: ready order names parameter {} of {}", p,
               params.size());
    ZERO_CHECK(!seen[p], "gradient buckets: parameter {} (\"{}\") is twice in the ready order", p,
               params[p].name);
    seen[p] = true;
  }

  std::vector<GradientBucket> closed;
  // One open bucket per dtype (DeepSpeed keeps one IPG bucket per communication dtype), kept in
  // the order they were opened so the final flush is deterministic.
  std::vector<GradientBucket> open;
  auto open_bucket = [&](DType dtype) -> GradientBucket& {
    for (auto& b : open) {
      if (b.dtype == dtype) return b;
    }
    open.push_back(GradientBucket{dtype, {}, 0});
    return open.back();
  };
  auto close = [&](DType dtype) {
    auto it = std::find_if(open.begin(), open.end(), [&](auto& b) { return b.dtype == dtype; });
    if (it == open.end()) return;
    closed.push_back(std::move(*it));
    open.erase(it);
  };

  for (std::size_t p : ready_order) {
    const auto& desc = params[p];
    if (desc.numel > capacity_elems) {
      close(desc.dtype);
      for (std::size_t begin = 0; begin < desc.numel; begin += capacity_elems) {
        const std::size_t n = std::min(capacity_elems, desc.numel - begin);
        closed.push_back(GradientBucket{desc.dtype, {{p, begin, n, 0}}, n});
      }
      continue;
    }
    if (open_bucket(desc.dtype).elems + desc.numel > capacity_elems) close(desc.dtype);
    auto& bucket = open_bucket(desc.dtype);
    bucket.entries.push_back({p, 0, desc.numel, bucket.elems});
    bucket.elems += desc.numel;
  }
  for (auto& b : open) closed.push_back(std::move(b));
  return closed;
}

std::vector<GradientBucket> assign_gradient_buckets(std::span<const ParamDesc> params,
                                                    std::size_t capacity_elems) {
  std::vector<std::size_t> backward(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) backward[i] = params.size() - 1 - i;
  return assign_gradient_buckets(params, backward, capacity_elems);
}

}  // namespace zero
