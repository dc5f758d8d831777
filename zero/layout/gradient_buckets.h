// Assignment of gradients to reduction buckets, in the order gradients become ready.
//
// Matches DeepSpeed's IPG bucketing (SPEC_DEEPSPEED.md §3.2): gradients arrive in backward order
// (reverse registration order by default); each goes into the open bucket of its dtype, and a
// bucket is closed (reduced) when the next gradient would overflow `reduce_bucket_size`. Unlike
// DeepSpeed, which reduces an oversized ("extra large") gradient alone in one piece, a gradient
// larger than the capacity is split into capacity-sized pieces, each its own bucket, so no bucket
// ever exceeds the capacity (and the engine's bucket buffers can be exactly that size).
//
// Pure values, no allocation of tensors.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "zero/base/dtype.h"
#include "zero/layout/flat_layout.h"

namespace zero {

// A run of one parameter's gradient inside a bucket.
struct BucketEntry {
  std::size_t param = 0;
  std::size_t param_begin = 0;    // first gradient element of the run, inside the parameter
  std::size_t numel = 0;          // 0 for a 0-element parameter (it still gets an entry)
  std::size_t bucket_offset = 0;  // where the run starts inside the bucket
};

struct GradientBucket {
  DType dtype = DType::F32;
  std::vector<BucketEntry> entries;  // in the order the gradients become ready
  std::size_t elems = 0;             // Σ entry numel ≤ capacity
};

// Buckets in the order they are closed (the order their reductions are issued). Every parameter
// appears in exactly one bucket, or, when larger than the capacity, in consecutive buckets that
// together cover it once. REQUIRES (checked): capacity_elems > 0.
std::vector<GradientBucket> assign_gradient_buckets(std::span<const ParamDesc> params,
                                                    std::size_t capacity_elems);

// Same, with gradients becoming ready in `ready_order` (indices into `params`, each exactly once;
// checked) instead of reverse registration order.
std::vector<GradientBucket> assign_gradient_buckets(std::span<const ParamDesc> params,
                                                    std::span<const std::size_t> ready_order,
                                                    std::size_t capacity_elems);

}  // namespace zero
