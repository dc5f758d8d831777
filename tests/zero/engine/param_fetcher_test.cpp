// ParamFetcher alone, without an engine: every rank's partition holds values that name their rank
// and position, so a gathered unit shows whether every rank's slice arrived in its place; then
// persistence, prefetch by trace, and ranks that gather different units.
#include "zero/engine/param_fetcher.h"

#include <catch2/catch.hpp>
#include <mutex>
#include <vector>

#include "zero/base/error.h"
#include "zero/comm/inproc_comm.h"
#include "zero/device/cpu_device.h"

namespace zero::engine_detail {
namespace {

// Units 0 and 2 are small (persistent under a threshold of 10), units 1, 3 and 4 are not; unit 4
// is unit 1's size.
std::vector<ParamDesc> model_params() {
  return {{"a", 6, DType::F32, 0, 0}, {"b", 40, DType::F32, 0, 1}, {"c", 3, DType::F32, 0, 2},
          {"d", 4, DType::F32, 0, 2}, {"e", 70, DType::F32, 0, 3}, {"f", 40, DType::F32, 0, 4}};
}

float slice_value(int rank, std::size_t partition_offset) {
  return static_cast<float>(rank * 1000 + static_cast<int>(partition_offset));
}

using Body = std::function<void(ParamFetcher&, const FlatLayout&, int, const EngineTimings&)>;

// Runs `body` on every rank with its partition filled by slice_value().
void run(int world, const FetchOptions& options, const Body& body) {
  const FlatLayout layout = FlatLayout::build(model_params(), {world, 1, 1});
  run_ranks(world, [&](Communicator& comm) {
    const int r = comm.rank();
    CpuDevice device(r);
    std::vector<float> partition(layout.partition_elems());
    for (std::size_t j = 0; j < partition.size(); ++j) partition[j] = slice_value(r, j);
    EngineTimings timings;
    ParamFetcher fetcher(comm, device, layout, layout.num_units(), DType::F32,
                         reinterpret_cast<const std::byte*>(partition.data()), options, timings);
    body(fetcher, layout, r, timings);
  });
}

// Element e of a gathered unit is rank e / S's slice element e % S.
std::size_t wrong_elements(const ParamFetcher& fetcher, const FlatLayout& layout, int unit) {
  const UnitLayout& ul = layout.unit(unit);
  const auto* data = reinterpret_cast<const float*>(fetcher.data(unit));
  REQUIRE(data != nullptr);
  std::size_t wrong = 0;
  for (std::size_t e = 0; e < ul.padded_elems; ++e) {
    const int owner = static_cast<int>(e / ul.slice_elems);
    wrong += data[e] != slice_value(owner, ul.partition_offset + e % ul.slice_elems);
  }
  return wrong;
}

TEST_CASE("a gathered unit holds every rank's slice in rank order, at world sizes 1 to 8") {
  for (int world = 1; world <= 8; ++world) {
    INFO("world " << world);
    FetchOptions options;
    options.param_persistence_threshold_elems = 0;
    std::mutex mu;
    std::size_t wrong = 0, units = 0;
    run(world, options,
        [&](ParamFetcher& fetcher, const FlatLayout& layout, int, const EngineTimings&) {
          for (int step = 0; step < 3; ++step) {
            for (int u = 0; u < 5; ++u) {
              fetcher.gather(u);
              const std::size_t w = wrong_elements(fetcher, layout, u);
              fetcher.release(u);
              std::lock_guard<std::mutex> lock(mu);
              wrong += w;
              ++units;
            }
            fetcher.end_micro_step();
          }
        });
    REQUIRE(units == static_cast<std::size_t>(world) * 15);
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("small units stay gathered, the others are freed on release unless reused soon") {
  FetchOptions options;
  options.param_persistence_threshold_elems = 10;
  options.max_reuse_distance_elems = 0;
  options.prefetch_bucket_elems = 0;
  run(2, options, [&](ParamFetcher& fetcher, const FlatLayout& layout, int, const EngineTimings&) {
    REQUIRE(fetcher.persistent(0));
    REQUIRE_FALSE(fetcher.persistent(1));
    REQUIRE(fetcher.persistent(2));
    REQUIRE_FALSE(fetcher.persistent(3));
    REQUIRE(wrong_elements(fetcher, layout, 0) == 0);  // gathered from the start
    for (int u = 0; u < 5; ++u) {
      fetcher.gather(u);
      fetcher.release(u);
    }
    REQUIRE(fetcher.data(0) != nullptr);
    REQUIRE(fetcher.data(1) == nullptr);
    REQUIRE(fetcher.data(3) == nullptr);
    REQUIRE(fetcher.live_elems() == 0);
    fetcher.end_micro_step();
  });
}

TEST_CASE("after the first micro-step the trace prefetches the next units") {
  FetchOptions options;
  options.param_persistence_threshold_elems = 0;
  options.max_reuse_distance_elems = 0;
  options.prefetch_bucket_elems = 1000;
  std::mutex mu;
  std::vector<std::int64_t> prefetches;
  std::size_t wrong = 0;
  run(2, options,
      [&](ParamFetcher& fetcher, const FlatLayout& layout, int, const EngineTimings& timings) {
        std::size_t w = 0;
        std::vector<std::int64_t> mine;
        for (int step = 0; step < 3; ++step) {
          for (int u : {3, 1, 0, 4, 2}) {
            fetcher.gather(u);
            w += wrong_elements(fetcher, layout, u);
            fetcher.release(u);
          }
          fetcher.end_micro_step();
          mine.push_back(timings.prefetches);
        }
        std::lock_guard<std::mutex> lock(mu);
        wrong += w;
        prefetches = mine;
      });
  REQUIRE(wrong == 0);
  // The first micro-step records the trace and prefetches nothing; the later ones prefetch.
  REQUIRE(prefetches.size() == 3);
  REQUIRE(prefetches[0] == 0);
  REQUIRE(prefetches[1] > 0);
  REQUIRE(prefetches[2] > prefetches[1]);
}

TEST_CASE("ranks that gather different units get an error naming the difference, not a hang") {
  FetchOptions options;
  options.param_persistence_threshold_elems = 0;
  options.prefetch_bucket_elems = 0;
  REQUIRE_THROWS_WITH(
      run(2, options,
          [&](ParamFetcher& fetcher, const FlatLayout&, int rank, const EngineTimings&) {
            // Same-size all-gathers (so no collective fails), different units.
            fetcher.gather(rank == 0 ? 1 : 4);
            fetcher.release(rank == 0 ? 1 : 4);
            fetcher.end_micro_step();
            fetcher.finish_order_check();
          }),
      Catch::Contains("unit"));
}

}  // namespace
}  // namespace zero::engine_detail
