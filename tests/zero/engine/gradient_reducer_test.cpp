// GradientReducer alone, without an engine: every rank stages known gradients for every unit over
// a few micro-steps, and the reduced values that land in the target must be the exact sums over
// ranks (and micro-steps) of the slices each domain owns, at world sizes 1–16, for stages 0–3,
// with and without overlap, with buckets smaller than a unit, and in bf16.
#include "zero/engine/gradient_reducer.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <mutex>
#include <vector>

#include "kernels/cast.h"
#include "kernels/compute.h"
#include "zero/comm/inproc_comm.h"
#include "zero/device/cpu_device.h"

namespace zero::engine_detail {
namespace {

// Units of uneven sizes (one empty), so slices, padding and bucket pieces all vary. With
// `big_units` at world size W, two more units whose slices are large enough to be reduced alone
// (GradientReducer::kAloneMinSliceElems), between small ones that go through the buckets.
std::vector<ParamDesc> model_params(int big_units_world = 0) {
  std::vector<ParamDesc> params = {{"a", 37, DType::F32, 0, 0}, {"b", 5, DType::F32, 0, 0},
                                   {"c", 120, DType::F32, 0, 1}, {"d", 0, DType::F32, 0, 2},
                                   {"e", 64, DType::F32, 0, 3},  {"f", 1, DType::F32, 0, 3}};
  if (big_units_world > 0) {
    const std::size_t big =
        GradientReducer::kAloneMinSliceElems * static_cast<std::size_t>(big_units_world);
    params.push_back({"g", big + 3, DType::F32, 0, 4});
    params.push_back({"h", 11, DType::F32, 0, 5});
    params.push_back({"i", big - 5, DType::F32, 0, 6});
    params.push_back({"j", 7, DType::F32, 0, 6});
  }
  return params;
}

// Small integers: every partial sum is exact in fp32 and in bf16 (|sum| <= 256), so any summation
// order gives the same bits and the expected value can be computed directly.
float gradient_value(int rank, int unit, std::size_t elem, int micro) {
  return static_cast<float>((rank + 1) * static_cast<int>((elem + 3 * unit) % 5) - micro);
}

// The target: stage 0 lands in the reducer's own accumulation buffers, other stages in a
// partition the test owns.
class TestTarget final : public SliceMap {
 public:
  TestTarget(const FlatLayout& layout, int stage, DType dtype)
      : layout_(layout),
        stage_(stage),
        dtype_(dtype),
        partition_(layout.partition_elems() * dtype_size(dtype)) {}
  void attach(const GradientReducer* reducer) { reducer_ = reducer; }
  std::byte* gradient(int domain, int unit, std::size_t slice_offset) override {
    if (stage_ == 0) return reducer_->accumulated(domain, unit, slice_offset);
    REQUIRE(domain == 0);
    const UnitLayout& ul = layout_.unit(unit);
    return partition_.data() + (ul.partition_offset + slice_offset) * dtype_size(dtype_);
  }
  std::byte* model(int, int, std::size_t) override {
    FAIL("the reducer never writes the model copy");
    return nullptr;
  }

 private:
  const FlatLayout& layout_;
  const int stage_;
  const DType dtype_;
  const GradientReducer* reducer_ = nullptr;
  std::vector<std::byte> partition_;
};

struct Case {
  int stage = 2;
  int world = 2;
  int micro_steps = 2;
  bool overlap = true;
  std::size_t bucket_elems = 64;
  DType dtype = DType::F32;  // gradients, accumulation and communication
  bool big_units = false;    // model_params(world): units reduced alone besides bucketed ones
};

// Runs one window of `micro_steps` on every rank; returns the number of mismatching elements
// and counts the elements compared.
std::size_t run_case(const Case& c, std::size_t& compared, std::int64_t& buckets,
                     std::int64_t* alone = nullptr) {
  const std::vector<ParamDesc> params = model_params(c.big_units ? c.world : 0);
  const FlatLayout layout = FlatLayout::build(params, {c.world, 1, 4});
  std::mutex mu;
  std::size_t mismatches = 0;
  run_ranks(c.world, [&](Communicator& comm) {
    const int r = comm.rank();
    CpuDevice device(r);
    EngineTimings timings;
    TestTarget target(layout, c.stage, c.dtype);
    ReducerOptions options;
    options.stage = c.stage;
    options.grad_dtype = options.accum_dtype = options.comm_dtype = c.dtype;
    options.bucket_elems = c.bucket_elems;
    options.overlap_comm = c.overlap;
    options.op = ReduceOp::Sum;
    options.exec.threads = 1;
    GradientReducer reducer(comm, device, device.compute(), layout, options, target, timings);
    target.attach(&reducer);
    for (int k = 0; k < c.micro_steps; ++k) {
      // Backward order: last unit first.
      for (int u = static_cast<int>(layout.num_units()); u-- > 0;) {
        std::byte* staging = reducer.staging(u);
        const UnitLayout& ul = layout.unit(u);
        if (ul.padded_elems == 0) {
          REQUIRE(staging == nullptr);
        } else {
          std::vector<float> v(ul.padded_elems);
          for (std::size_t e = 0; e < v.size(); ++e) v[e] = gradient_value(r, u, e, k);
          kernels::cast_cpu(v.data(), DType::F32, staging, c.dtype, v.size());
        }
        reducer.unit_complete(u);
      }
      reducer.end_micro_step();
    }

    std::size_t bad = 0, seen = 0;
    const int domains = c.stage == 0 ? c.world : 1;
    for (int d = 0; d < domains; ++d) {
      const int owner = c.stage == 0 ? d : r;
      for (std::size_t u = 0; u < layout.num_units(); ++u) {
        const UnitLayout& ul = layout.unit(static_cast<int>(u));
        if (ul.slice_elems == 0) continue;
        std::vector<float> got(ul.slice_elems);
        kernels::cast_cpu(target.gradient(d, static_cast<int>(u), 0), c.dtype, got.data(),
                          DType::F32, got.size());
        for (std::size_t j = 0; j < ul.slice_elems; ++j) {
          const std::size_t e = static_cast<std::size_t>(owner) * ul.slice_elems + j;
          float want = 0;
          for (int q = 0; q < c.world; ++q) {
            for (int k = 0; k < c.micro_steps; ++k)
              want += gradient_value(q, static_cast<int>(u), e, k);
          }
          bad += got[j] != want;
          ++seen;
        }
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    mismatches += bad;
    compared += seen;
    if (r == 0) buckets = timings.buckets;
    if (r == 0 && alone != nullptr) *alone = timings.units_alone;
  });
  return mismatches;
}

TEST_CASE("the reducer lands the exact sum of every rank's gradients at world sizes 1 to 16") {
  for (int world = 1; world <= 16; ++world) {
    for (int stage : {0, 1, 2, 3}) {
      Case c;
      c.world = world;
      c.stage = stage;
      INFO("world " << world << ", stage " << stage);
      std::size_t compared = 0;
      std::int64_t buckets = 0;
      REQUIRE(run_case(c, compared, buckets) == 0);
      // Every rank compared its whole partition (every partition at stage 0): not vacuous.
      const FlatLayout layout = FlatLayout::build(model_params(), {world, 1, 4});
      const std::size_t per_rank = layout.partition_elems() * (stage == 0 ? world : 1);
      REQUIRE(compared == per_rank * static_cast<std::size_t>(world));
      REQUIRE(buckets > 0);
    }
  }
}

TEST_CASE(
    "the reducer gives the same sums with one slot, tiny buckets, one micro-step and in bf16") {
  for (int world : {1, 3, 4, 7}) {
    for (int stage : {0, 1, 2, 3}) {
      for (bool overlap : {false, true}) {
        for (std::size_t bucket : {std::size_t{1}, std::size_t{9}, std::size_t{100000}}) {
          for (int micro : {1, 3}) {
            for (DType dtype : {DType::F32, DType::BF16}) {
              if (dtype == DType::BF16 && world > 4) continue;  // sums past 256 are not exact
              Case c{stage, world, micro, overlap, bucket, dtype};
              INFO("world " << world << ", stage " << stage << ", overlap " << overlap
                            << ", bucket " << bucket << ", micro-steps " << micro << ", "
                            << dtype_name(dtype));
              std::size_t compared = 0;
              std::int64_t buckets = 0;
              REQUIRE(run_case(c, compared, buckets) == 0);
              REQUIRE(compared > 0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("a bucket never holds more than reduce_bucket_size elements of all ranks' chunks") {
  // 4 ranks, 9-element buckets: each bucket holds at most 9 / 4 = 2 elements per rank, so the
  // 176 elements per rank of stage 2's one micro-step need at least 88 reductions.
  Case c{2, 4, 1, false, 9, DType::F32};
  std::size_t compared = 0;
  std::int64_t buckets = 0;
  REQUIRE(run_case(c, compared, buckets) == 0);
  const FlatLayout layout = FlatLayout::build(model_params(), {4, 1, 4});
  REQUIRE(buckets >= static_cast<std::int64_t>((layout.partition_elems() + 1) / 2));
}

TEST_CASE("units reduced alone, straight into the target or landed, give the exact sums") {
  for (int world : {1, 2, 3}) {
    for (int stage : {0, 1, 2, 3}) {
      for (bool overlap : {false, true}) {
        for (int micro : {1, 3}) {
          for (DType dtype : {DType::F32, DType::BF16}) {
            // Tiny buckets too: the small units' pieces interleave with the lone units'.
            for (std::size_t bucket : {std::size_t{9}, std::size_t{500'000'000}}) {
              Case c{stage, world, micro, overlap, bucket, dtype, true};
              INFO("world " << world << ", stage " << stage << ", overlap " << overlap
                            << ", micro-steps " << micro << ", " << dtype_name(dtype)
                            << ", bucket " << bucket);
              std::size_t compared = 0;
              std::int64_t buckets = 0, alone = 0;
              REQUIRE(run_case(c, compared, buckets, &alone) == 0);
              // Both big units of every micro-step went alone; the small ones used buckets.
              CHECK(alone == 2 * micro);
              CHECK(buckets > alone);
              const FlatLayout layout = FlatLayout::build(model_params(world), {world, 1, 4});
              const std::size_t per_rank = layout.partition_elems() * (stage == 0 ? world : 1);
              REQUIRE(compared == per_rank * static_cast<std::size_t>(world));
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace zero::engine_detail
