// ParamFetcher alone, without an engine: every rank's partition holds values that name their rank
// and position, so a gathered unit shows whether every rank's slice arrived in its place; then
// persistence, prefetch by trace, and ranks that gather different units.
#include "zero/engine/param_fetcher.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <catch2/catch.hpp>
#include <mutex>
#include <string>
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

TEST_CASE("a release says whether the trace keeps the unit, whose copy then stays where it is") {
  // Forward gathers units 1 and 3, backward gathers 3 and 1 again: g 1, r 1, g 3, r 3, g 3, r 3,
  // g 1, r 1. The first micro-step records the trace and keeps nothing.
  for (const std::size_t distance : {std::size_t{50}, std::size_t{1'000'000}}) {
    INFO("max_reuse_distance " << distance);
    FetchOptions options;
    options.param_persistence_threshold_elems = 0;
    options.prefetch_bucket_elems = 0;
    options.max_reuse_distance_elems = distance;
    run(2, options,
        [&](ParamFetcher& fetcher, const FlatLayout& layout, int, const EngineTimings& timings) {
          const auto micro_step = [&] {
            std::vector<int> kept;
            std::vector<const std::byte*> where;
            for (const int u : {1, 3, 3, 1}) {
              fetcher.gather(u);
              REQUIRE(wrong_elements(fetcher, layout, u) == 0);
              where.push_back(fetcher.data(u));
              const bool k = fetcher.release(u);
              kept.push_back(k ? 1 : 0);
              // A kept copy is still there; a freed one is gone.
              REQUIRE((fetcher.data(u) != nullptr) == k);
            }
            fetcher.end_micro_step();
            fetcher.finish_order_check();
            return std::pair{kept, where};
          };
          REQUIRE(micro_step().first == std::vector<int>{0, 0, 0, 0});
          const std::int64_t before = timings.gathers;
          const auto [kept, where] = micro_step();
          if (distance == 50) {
            // Unit 1's next use is 140 elements away (unit 3 twice); unit 3's is the next gather.
            REQUIRE(kept == std::vector<int>{0, 1, 0, 0});
            REQUIRE(where[2] == where[1]);  // gathered again where it was kept
            REQUIRE(timings.gathers - before == 3);
          } else {
            REQUIRE(kept == std::vector<int>{1, 1, 0, 0});
            REQUIRE(where[2] == where[1]);
            REQUIRE(where[3] == where[0]);
            REQUIRE(timings.gathers - before == 2);  // each unit all-gathered once
          }
          REQUIRE(fetcher.live_elems() == 0);
        });
  }
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

// NCCL's collectives as gather_for_stream sees them, on the host: order_stream stands for the
// stream's wait (it waits on the host, so the memory is ready as the stream would find it) and
// records the stream; wait() counts the host's waits.
class StreamOrderedComm final : public Communicator {
 public:
  explicit StreamOrderedComm(Communicator& inner)
      : Communicator(CommOptions{inner.timeout()}), inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend_name() const override { return "stream-ordered"; }

  std::vector<void*> ordered;  // the streams order_stream was asked for
  int host_waits = 0;

 protected:
  Work start_impl(const CollectiveArgs& args) override {
    return Work(std::make_shared<State>(inner_.start(args), *this));
  }
  std::unique_ptr<Communicator> split_impl(int color, int key) override {
    return inner_.split(color, key);
  }

 private:
  struct State final : WorkState {
    State(Work w, StreamOrderedComm& c) : inner(std::move(w)), comm(c) {}
    void wait() override {
      inner.wait();
      ++comm.host_waits;
    }
    bool test() override { return inner.test(); }
    bool order_stream(void* stream) override {
      inner.wait();
      comm.ordered.push_back(stream);
      return true;
    }
    Work inner;
    StreamOrderedComm& comm;
  };
  Communicator& inner_;
};

// Records the streams the engine's work is ordered after (a CPU device refuses any).
class StreamRecordingDevice final : public CpuDevice {
 public:
  using CpuDevice::CpuDevice;
  std::vector<void*> ordered_after;

 protected:
  void order_after_native_stream_impl(void* stream) override { ordered_after.push_back(stream); }
};

TEST_CASE("a unit gathered for a stream leaves the wait to it, and its release orders after it") {
  FetchOptions options;
  options.param_persistence_threshold_elems = 0;
  options.max_reuse_distance_elems = 0;
  options.prefetch_bucket_elems = 0;
  const FlatLayout layout = FlatLayout::build(model_params(), {2, 1, 1});
  // Checked on the test's thread: what failed on which rank.
  std::mutex mu;
  std::vector<std::string> failed;
  std::size_t checks = 0;
  run_ranks(2, [&](Communicator& base) {
    StreamOrderedComm comm(base);
    StreamRecordingDevice device(comm.rank());
    auto check = [&](bool ok, const char* what) {
      std::lock_guard<std::mutex> lock(mu);
      ++checks;
      if (!ok) failed.push_back(fmt::format("rank {}: {}", comm.rank(), what));
    };
    std::vector<float> partition(layout.partition_elems());
    for (std::size_t j = 0; j < partition.size(); ++j) partition[j] = slice_value(comm.rank(), j);
    EngineTimings timings;
    int a = 0, b = 0;  // two streams' handles
    int before_destruction = 0;
    {
      ParamFetcher fetcher(comm, device, layout, layout.num_units(), DType::F32,
                           reinterpret_cast<const std::byte*>(partition.data()), options,
                           timings);
      // Left to stream a: no host wait, the values right.
      fetcher.gather_for_stream(1, &a);
      check(comm.ordered == std::vector<void*>{&a}, "unit 1 ordered for stream a");
      check(comm.host_waits == 0, "no host wait for unit 1");
      check(wrong_elements(fetcher, layout, 1) == 0, "unit 1's values");
      // Asked again for the same stream: nothing more to order or wait for.
      fetcher.gather_for_stream(1, &a);
      check(comm.ordered.size() == 1 && comm.host_waits == 0, "unit 1 again for a: nothing");
      // Released: the engine's stream is ordered after a, still without a host wait.
      fetcher.release(1);
      check(device.ordered_after == std::vector<void*>{&a}, "release orders after a");
      check(comm.host_waits == 0, "no host wait at the release");
      // Gathered for a, then asked for b: the host waits, and the release orders after nothing.
      fetcher.gather_for_stream(3, &a);
      fetcher.gather_for_stream(3, &b);
      check(comm.host_waits == 1, "unit 3 for another stream: one host wait");
      check(wrong_elements(fetcher, layout, 3) == 0, "unit 3's values");
      fetcher.release(3);
      check(device.ordered_after.size() == 1, "unit 3's release orders after nothing");
      // A plain gather waits on the host and orders nothing; the legacy stream (null) is the
      // engine's own, so its release orders after nothing either.
      fetcher.gather(4);
      check(comm.host_waits == 2, "a plain gather waits on the host");
      fetcher.release(4);
      fetcher.gather_for_stream(1, nullptr);
      check(comm.ordered == std::vector<void*>{&a, &a, nullptr}, "the streams asked for");
      fetcher.release(1);
      check(device.ordered_after.size() == 1, "the legacy stream needs no ordering");
      // Still ordered for a stream when the fetcher ends: it waits for that all-gather first.
      fetcher.gather_for_stream(3, &b);
      fetcher.end_micro_step();
      fetcher.finish_order_check();
      before_destruction = comm.host_waits;
    }
    check(comm.host_waits == before_destruction + 1, "the destructor waits for unit 3");
  });
  INFO(fmt::format("{}", fmt::join(failed, "\n")));
  REQUIRE(failed.empty());
  REQUIRE(checks == 2 * 13);
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
