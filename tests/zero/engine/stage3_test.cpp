// Stage 3's fetching: persistence, trace-based prefetch, the live-parameter cap, reuse distance, a
// unit order that changes mid-training, and ranks that disagree on the order. The trainer here
// gathers, uses and releases one unit at a time (as a layer-by-layer forward does), and its
// gradients depend on the gathered values, so a wrong gather shows in the parameters.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "tests/temp_dir.h"
#include "tests/zero/engine/engine_test_util.h"
#include "zero/base/error.h"

namespace zero::test {
namespace {

using nlohmann::json;

constexpr int kUnits = 6;

// Unit k: one weight of 40 + 8k elements, plus a bias of 3 in units 0 and 3.
std::vector<ParamSpec> layer_specs(DType dtype) {
  std::vector<ParamSpec> specs;
  for (int k = 0; k < kUnits; ++k) {
    specs.push_back({fmt::format("layers.{}.weight", k), {40 + 8 * k}, dtype, 0, k, true});
    if (k % 3 == 0) specs.push_back({fmt::format("layers.{}.bias", k), {3}, dtype, 0, k, true});
  }
  return specs;
}

struct Stage3Run {
  std::vector<std::vector<float>> params;  // final master values (rank 0)
  std::vector<std::vector<float>> initial;
  std::vector<MemorySnapshot> memory;
  std::vector<EngineTimings> timings;
  std::vector<std::string> errors;  // per rank, empty when none
};

// order(rank, step) gives the units to gather, in order, for that micro-step.
Stage3Run run_layers(const json& cfg_json, int world, int steps,
                     const std::function<std::vector<int>(int, int)>& order) {
  config::Supplied supplied;
  supplied.world_size = world;
  const config::DsConfig cfg = config::load_config_json(cfg_json, supplied);
  const std::vector<ParamSpec> specs = layer_specs(cfg.model_dtype);
  Stage3Run out;
  out.memory.resize(static_cast<std::size_t>(world));
  out.timings.resize(static_cast<std::size_t>(world));
  out.errors.resize(static_cast<std::size_t>(world));
  std::mutex mu;
  try {
    run_ranks(world, [&](Communicator& comm) {
      const int r = comm.rank();
      try {
        auto device = make_device("cpu", r);
        EngineOptions options;
        options.kernel_threads = 1;
        auto engine = Engine::create(
            cfg, comm, *device, specs,
            [](std::size_t i, std::span<float> v) {
              for (std::size_t j = 0; j < v.size(); ++j)
                v[j] = 0.05f * static_cast<float>((i * 7 + j) % 11) - 0.2f;
            },
            options);
        std::vector<std::vector<float>> initial;
        for (std::size_t i = 0; i < specs.size(); ++i) initial.push_back(engine->gather_master(i));
        for (int t = 0; t < steps; ++t) {
          // Forward: gradients of 0.5·Σ (w − target)², target a function of the element and
          // step, plus a rank-dependent part, computed from the gathered values.
          std::vector<std::vector<float>> grads(specs.size());
          for (int u : order(r, t)) {
            engine->gather(u);
            for (std::size_t i = 0; i < specs.size(); ++i) {
              if (specs[i].unit != u) continue;
              const std::vector<float> w = to_f32(engine->param(i), cfg.model_dtype);
              grads[i].resize(w.size());
              for (std::size_t j = 0; j < w.size(); ++j) {
                const float target =
                    0.1f * static_cast<float>((j + static_cast<std::size_t>(t)) % 5) +
                    0.01f * static_cast<float>(r);
                grads[i][j] = (w[j] - target) * static_cast<float>(engine->backward_scale());
              }
            }
            engine->release(u);
          }
          for (std::size_t i = specs.size(); i-- > 0;) {
            if (grads[i].empty()) continue;
            std::span<std::byte> slot = engine->grad(i);
            kernels::cast_cpu(grads[i].data(), DType::F32, slot.data(), cfg.model_dtype,
                              grads[i].size());
            engine->grad_ready(i);
          }
          engine->step();
        }
        std::vector<std::vector<float>> final_params;
        for (std::size_t i = 0; i < specs.size(); ++i)
          final_params.push_back(engine->gather_master(i));
        // The 16-bit model a save writes is the master rounded once (the lp copy of the step).
        for (std::size_t i = 0; i < specs.size(); ++i) {
          const std::vector<std::byte> lp = engine->gather_model(i);
          std::vector<std::byte> expect(lp.size());
          kernels::cast_cpu(final_params[i].data(), DType::F32, expect.data(), cfg.model_dtype,
                            final_params[i].size());
          if (lp != expect) throw Error("gather_model differs from the rounded master");
        }
        std::lock_guard<std::mutex> lock(mu);
        out.memory[static_cast<std::size_t>(r)] = engine->memory();
        out.timings[static_cast<std::size_t>(r)] = engine->timings();
        if (r == 0) {
          out.params = std::move(final_params);
          out.initial = std::move(initial);
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        out.errors[static_cast<std::size_t>(r)] = e.what();
        throw;
      }
    });
  } catch (const std::exception&) {
  }
  return out;
}

std::vector<int> forward(int, int) {
  std::vector<int> v(kUnits);
  for (int k = 0; k < kUnits; ++k) v[static_cast<std::size_t>(k)] = k;
  return v;
}

json stage3_config(const std::string& precision, std::int64_t prefetch, std::int64_t max_live,
                   std::int64_t persistence = 0) {
  json c = base_config(3, precision, 1, 2);
  c["zero_optimization"]["stage3_prefetch_bucket_size"] = prefetch;
  c["zero_optimization"]["stage3_max_live_parameters"] = max_live;
  c["zero_optimization"]["stage3_param_persistence_threshold"] = persistence;
  return c;
}

void require_same(const Stage3Run& a, const Stage3Run& b) {
  for (const auto& e : a.errors) REQUIRE(e.empty());
  for (const auto& e : b.errors) REQUIRE(e.empty());
  REQUIRE(a.params.size() == b.params.size());
  std::size_t moved = 0;
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(a.params[i].size() == b.params[i].size());
    REQUIRE(std::memcmp(a.params[i].data(), b.params[i].data(),
                        a.params[i].size() * sizeof(float)) == 0);
    for (std::size_t j = 0; j < a.params[i].size(); ++j) moved += a.params[i][j] != a.initial[i][j];
  }
  REQUIRE(moved > 0);
}

TEST_CASE(
    "stage 3 with and without prefetch, any bucket, live limit or persistence equals stage 2 "
    "bitwise",
    "[engine][stage3]") {
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    for (int world : {1, 2, 3, 4, 8}) {
      INFO(precision << ", " << world << " ranks");
      json s2 = base_config(2, precision, 1, 2);
      const Stage3Run ref = run_layers(s2, world, 4, forward);
      struct Variant {
        std::int64_t prefetch, max_live, persistence;
      };
      for (const Variant v :
           {Variant{0, 1'000'000, 0}, Variant{100, 1'000'000, 0}, Variant{1'000'000, 1'000'000, 0},
            Variant{1'000'000, 400, 0}, Variant{1'000'000, 1'000'000, 50}, Variant{64, 300, 3}}) {
        INFO("prefetch " << v.prefetch << ", max_live " << v.max_live << ", persistence "
                         << v.persistence);
        const Stage3Run r = run_layers(
            stage3_config(precision, v.prefetch, v.max_live, v.persistence), world, 4, forward);
        require_same(ref, r);
      }
    }
  }
}

TEST_CASE("stage 3 prefetches along the recorded trace and stays under the live limit",
          "[engine][stage3]") {
  const std::size_t dtype_bytes = 2;  // bf16
  for (std::int64_t max_live : {250, 400, 100000}) {
    INFO("stage3_max_live_parameters " << max_live);
    const Stage3Run r = run_layers(stage3_config("bf16", 100000, max_live), 4, 5, forward);
    for (const auto& e : r.errors) REQUIRE(e.empty());
    for (std::size_t rank = 0; rank < 4; ++rank) {
      const MemorySnapshot& m = r.memory[rank];
      // The live window never exceeds the limit...
      CHECK(m.at(MemoryKind::Device, MemoryTag::GatherBuffers).peak_bytes <=
            static_cast<std::size_t>(max_live) * dtype_bytes);
      // ... and is empty between steps; parameters are the rank's slices only.
      CHECK(m.at(MemoryKind::Device, MemoryTag::GatherBuffers).current_bytes == 0);
      const EngineTimings& t = r.timings[rank];
      // Steps 2..5 follow the trace. Padded at 4 ranks, units are 64, 64, 64, 128, 128, 128
      // elements: with a window of 250 units 1-3 are prefetched each step; with more room every
      // unit after the first.
      CHECK(t.prefetches >= 4 * 3);
      if (max_live == 100000) CHECK(t.prefetches == 4 * (kUnits - 1));
      CHECK(t.gathers == 5 * kUnits);
    }
  }
  // Without prefetch, every gather is on demand.
  const Stage3Run off = run_layers(stage3_config("bf16", 0, 100000), 2, 3, forward);
  CHECK(off.timings[0].prefetches == 0);
  CHECK(off.timings[0].gathers == 3 * kUnits);
}

TEST_CASE("persistent units stay gathered and count as parameters, not as the live window",
          "[engine][stage3]") {
  // Units 0 and 3 (weights 40 and 64 elements, biases 3) are at or below 64: persistent.
  const Stage3Run r = run_layers(stage3_config("fp32", 0, 100000, 64), 2, 3, forward);
  for (const auto& e : r.errors) REQUIRE(e.empty());
  const EngineTimings& t = r.timings[0];
  // Units 0, 1 (48), 2 (56), 3 (64) are persistent; 4 and 5 are gathered every step. The ranks
  // share an address space, so each step writes its new slices of the persistent units into every
  // rank's copy instead of re-gathering them: its whole slice of each (the units pad to 64, 64,
  // 64 and 96 elements, slices of 32, 32, 32 and 48) to the one peer, 3 steps of fp32.
  CHECK(t.gathers == 3 * 2 + 4);  // 2 per step, plus the 4 persistent at create
  CHECK(t.pushed_bytes == 3 * (32 + 32 + 32 + 48) * 4);
  {
    // Without the push they are re-gathered after each step, to the same values.
    REQUIRE(::setenv("ZERO_MODEL_PUSH", "0", 1) == 0);
    const Stage3Run gathered = run_layers(stage3_config("fp32", 0, 100000, 64), 2, 3, forward);
    ::unsetenv("ZERO_MODEL_PUSH");
    require_same(r, gathered);
    CHECK(gathered.timings[0].gathers == 3 * 2 + 4 * 4);
    CHECK(gathered.timings[0].pushed_bytes == 0);
  }
  const MemorySnapshot& m = r.memory[0];
  // Persistent copies (4 units, padded to 2 × 16) next to this rank's slices.
  CHECK(m.at(MemoryKind::Device, MemoryTag::LowPrecisionParams).current_bytes >=
        (40 + 3 + 48 + 56 + 64 + 3) * 4);
  CHECK(m.at(MemoryKind::Device, MemoryTag::GatherBuffers).current_bytes == 0);
}

TEST_CASE("a unit order that changes mid-training re-records the trace and gives the same result",
          "[engine][stage3]") {
  auto changing = [](int, int t) {
    std::vector<int> v = forward(0, t);
    if (t >= 2) std::reverse(v.begin(), v.end());  // another branch from step 2 on
    if (t == 4) v.erase(v.begin() + 2);            // one unit unused in step 4
    return v;
  };
  const Stage3Run with = run_layers(stage3_config("fp32", 100000, 100000), 3, 7, changing);
  const Stage3Run without = run_layers(stage3_config("fp32", 0, 100000), 3, 7, changing);
  require_same(with, without);
  CHECK(with.timings[0].prefetches > 0);
  CHECK(with.timings[0].gathers > with.timings[0].prefetches);
}

TEST_CASE("ranks that gather units in different orders fail with an error naming the units",
          "[engine][stage3]") {
  // At 2 ranks units 1 and 2 both pad to 64 elements: swapped on one rank, the all-gathers look
  // alike to the communicator, and the engine's end-of-micro-step check names the difference.
  auto swapped = [](int rank, int t) {
    std::vector<int> v = forward(rank, t);
    if (rank == 1 && t == 1) std::swap(v[1], v[2]);
    return v;
  };
  const Stage3Run same_size = run_layers(stage3_config("fp32", 0, 100000), 2, 3, swapped);
  for (const std::string& e : same_size.errors) {
    CHECK_THAT(e, Catch::Contains("different orders") &&
                      Catch::Contains("gather #1: rank 0 gathered unit 1, rank 1 gathered unit 2"));
  }
  // Units of different sizes (2 and 3): the communicator itself refuses the mismatch.
  auto sizes_differ = [](int rank, int t) {
    std::vector<int> v = forward(rank, t);
    if (rank == 1 && t == 1) std::swap(v[2], v[3]);
    return v;
  };
  const Stage3Run other = run_layers(stage3_config("fp32", 100000, 100000), 2, 3, sizes_differ);
  for (const std::string& e : other.errors) CHECK_THAT(e, Catch::Contains("different collectives"));
}

TEST_CASE("a demand gather over stage3_max_live_parameters says which units hold the memory",
          "[engine][stage3]") {
  // Gather without releasing, with room for two units only.
  json c = stage3_config("fp32", 0, 120);
  config::Supplied supplied;
  supplied.world_size = 1;
  const config::DsConfig cfg = config::load_config_json(c, supplied);
  const std::vector<ParamSpec> specs = layer_specs(DType::F32);
  std::string message;
  run_ranks(1, [&](Communicator& comm) {
    auto device = make_device("cpu", 0);
    auto engine = Engine::create(cfg, comm, *device, specs, [](std::size_t, std::span<float> v) {
      std::fill(v.begin(), v.end(), 1.0f);
    });
    engine->gather(0);
    engine->gather(1);
    try {
      engine->gather(2);
    } catch (const Error& e) {
      message = e.what();
    }
  });
  CHECK_THAT(message, Catch::Contains("stage3_max_live_parameters = 120") &&
                          Catch::Contains("units 0, 1 are gathered"));
}

// set_param on two ranks: rank 1's values replace the master weights, the gathered copy and the
// own slices (in memory or in the NVMe parameter store) of one parameter; the others keep theirs.
TEST_CASE("set_param replaces one parameter everywhere a rank keeps it, also on NVMe",
          "[engine][stage3]") {
  TempDir nvme("zero_set_param");
  for (const bool on_nvme : {false, true}) {
    json c = stage3_config("bf16", 0, 1'000'000);
    if (on_nvme) {
      c["zero_optimization"]["offload_param"] = {
          {"device", "nvme"}, {"nvme_path", nvme.path().string()}, {"buffer_size", 100'000}};
    }
    config::Supplied supplied;
    supplied.world_size = 2;
    const config::DsConfig cfg = config::load_config_json(c, supplied);
    const std::vector<ParamSpec> specs = layer_specs(DType::BF16);
    const std::size_t target = 2;  // layers.1.weight: unit 1, split over both ranks
    REQUIRE(specs[target].unit == 1);
    std::vector<float> values(static_cast<std::size_t>(specs[target].shape[0]));
    for (std::size_t j = 0; j < values.size(); ++j)
      values[j] = 0.375f + 0.125f * static_cast<float>(j % 7);  // exact in bf16
    std::mutex mu;
    std::vector<std::string> failures;
    run_ranks(2, [&](Communicator& comm) {
      auto device = make_device("cpu", comm.rank());
      auto engine =
          Engine::create(cfg, comm, *device, specs, [](std::size_t i, std::span<float> v) {
            std::fill(v.begin(), v.end(), 0.01f * static_cast<float>(i + 1));
          });
      std::vector<std::vector<float>> before;
      for (std::size_t i = 0; i < specs.size(); ++i) before.push_back(engine->gather_master(i));
      auto fail = [&](const std::string& what) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back(
            fmt::format("rank {} ({}): {}", comm.rank(), on_nvme ? "nvme" : "memory", what));
      };
      engine->gather(1);  // gathered before the change: the copy must follow it
      engine->set_param(
          target, comm.rank() == 1 ? std::span<const float>(values) : std::span<const float>(), 1);
      if (to_f32(engine->param(target), DType::BF16) != values) fail("gathered copy");
      engine->release(1);
      engine->gather(1);  // gathered again from the own slices
      if (to_f32(engine->param(target), DType::BF16) != values) fail("slices");
      engine->release(1);
      if (engine->gather_master(target) != values) fail("master");
      for (std::size_t i = 0; i < specs.size(); ++i) {
        if (i != target && engine->gather_master(i) != before[i]) fail(specs[i].name + " changed");
      }
    });
    INFO(fmt::format("{}", fmt::join(failures, "; ")));
    CHECK(failures.empty());
  }
}

}  // namespace
}  // namespace zero::test
