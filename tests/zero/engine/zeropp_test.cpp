// ZeRO++ and MiCS in the engine (stage 3): against plain stage 3 on the same ranks, run to run,
// across checkpoints, and the errors their keys get.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/zero/engine/engine_test_util.h"
#include "zero/base/error.h"
#include "zero/comm/hierarchical_comm.h"
#include "zero/comm/node_topology.h"
#include "kernels/quantize.h"
#include "zero/device/device.h"

namespace fs = std::filesystem;
using zero::Communicator;
using zero::HierarchicalComm;
namespace zt = zero::test;

namespace {

nlohmann::json stage3(nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json c = zt::base_config(3, "fp32", 1);
  c["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  c["zero_optimization"].update(extra);
  return c;
}

// The relative size of the largest difference between two runs' parameters.
double relative_diff(const zt::TrainResult& a, const zt::TrainResult& b) {
  double scale = 0;
  for (const auto& p : a.params) {
    for (float v : p) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  }
  REQUIRE(scale > 0);
  return zt::max_abs_diff(a.params, b.params) / scale;
}

// ||a − b|| / ||b|| over every parameter (L2).
double relative_distance(const zt::TrainResult& a, const zt::TrainResult& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < b.params.size(); ++i) {
    for (std::size_t j = 0; j < b.params[i].size(); ++j) {
      const double d = static_cast<double>(a.params[i][j]) - b.params[i][j];
      diff += d * d;
      norm += static_cast<double>(b.params[i][j]) * b.params[i][j];
    }
  }
  REQUIRE(norm > 0);
  return std::sqrt(diff / norm);
}

// 4 in-process ranks as 2 simulated nodes of 2: each train() runs its ranks over fresh
// HierarchicalComms and reports rank 0's bytes of that run.
class TwoNodes {
 public:
  explicit TwoNodes(int steps, const std::string& model = zt::TrainSpec{}.model) {
    spec_.world = 4;
    spec_.steps = steps;
    spec_.model = model;
    spec_.wrap_comm = [this](int r, Communicator& c) -> Communicator& {
      nodes_[static_cast<std::size_t>(r)] = HierarchicalComm::create(
          c, zero::resolve_node_topology(4, 2, [](const char*) { return nullptr; }));
      return *nodes_[static_cast<std::size_t>(r)];
    };
  }
  TwoNodes(const TwoNodes&) = delete;
  TwoNodes& operator=(const TwoNodes&) = delete;

  zt::TrainSpec& spec() { return spec_; }
  zt::TrainResult train(const nlohmann::json& config, zero::NodeTraffic* traffic = nullptr) {
    spec_.config = config;
    zt::TrainResult r = zt::train(spec_);
    if (traffic != nullptr) *traffic = nodes_[0]->traffic();
    return r;
  }

 private:
  std::vector<std::unique_ptr<HierarchicalComm>> nodes_{4};
  zt::TrainSpec spec_;
};

}  // namespace

TEST_CASE("MiCS trains within 1e-6 of plain stage 3, bitwise the same run to run") {
  for (const auto& [world, shard] : {std::pair{4, 2}, std::pair{6, 3}, std::pair{6, 2}}) {
    INFO("world " << world << ", shard groups of " << shard);
    const auto plain = zt::train_config(stage3(), world, 20);
    const auto mics = zt::train_config(stage3({{"mics_shard_size", shard}}), world, 20);
    const auto again = zt::train_config(stage3({{"mics_shard_size", shard}}), world, 20);
    zt::require_bitwise_equal(mics, again);
    REQUIRE(relative_diff(plain, mics) <= 1e-6);
    REQUIRE(mics.losses.back() < mics.losses.front());
  }
}

TEST_CASE(
    "MiCS on simulated nodes: a shard group per node is bitwise plain stage 3 in two levels") {
  // 4 ranks as 2 nodes of 2: plain stage 3 sums (r0 + r1) + (r2 + r3); MiCS sums in the shard
  // group (a node), then across the replicas, the same order.
  TwoNodes two(12);
  zero::NodeTraffic plain_traffic, mics_traffic;
  const auto plain = two.train(stage3(), &plain_traffic);
  const auto mics = two.train(stage3({{"mics_shard_size", 2}}), &mics_traffic);
  zt::require_bitwise_equal(plain, mics);
  // MiCS gathers inside the node: parameters never cross it, only the gradient all-reduce does.
  REQUIRE(plain_traffic.inter_bytes > 0);
  REQUIRE(mics_traffic.inter_bytes > 0);
  REQUIRE(mics_traffic.intra_bytes > 0);
}

TEST_CASE("a MiCS checkpoint is written once and resumes at any world size and stage") {
  zero::test::TempDir dir("zeropp-mics-ckpt");
  const std::string ckpt = (dir.path() / "ckpt").string();
  const auto mics = stage3({{"mics_shard_size", 2}});
  const auto whole = zt::train_run(mics, 4, 8);
  zt::train_run(mics, 4, 4, ckpt, 4);
  // One replica wrote it: the files of a 2-rank partition, no more.
  std::size_t rank_files = 0;
  for (const auto& e : fs::directory_iterator(fs::path(ckpt) / "step4")) {
    rank_files += e.path().filename().string().find("rank") != std::string::npos;
  }
  REQUIRE(rank_files == 2);
  // Resumed under MiCS on the same ranks: bitwise the uninterrupted run.
  const auto resumed = zt::train_run(mics, 4, 8, {}, -1, ckpt);
  zt::require_bitwise_equal(whole, resumed);
  // At another world size and stage (2 ranks of 8 rows: the same global batch) it trains on from
  // the same state.
  const auto as_stage2 = zt::train_run(zt::base_config(2, "fp32", 1, 8), 2, 8, {}, -1, ckpt);
  REQUIRE(relative_diff(whole, as_stage2) <= 1e-5);
}

TEST_CASE(
    "MiCS keys: a shard size that does not divide the world is refused by name; below "
    "stage 3 they are ignored") {
  REQUIRE_THROWS_WITH(zt::train_config(stage3({{"mics_shard_size", 3}}), 4, 1),
                      Catch::Contains("zero_optimization.mics_shard_size") &&
                          Catch::Contains("3 does not divide the world size 4") &&
                          Catch::Contains("use one of 1, 2, 4"));
  REQUIRE_THROWS_WITH(
      zt::train_config(stage3({{"mics_shard_size", 2}, {"reduce_scatter", false}}), 4, 1),
      Catch::Contains("set zero_optimization.reduce_scatter to true"));
  auto s2 = zt::base_config(2, "fp32", 1);
  const auto plain2 = zt::train_config(s2, 4, 6);
  s2["zero_optimization"]["mics_shard_size"] = 2;
  zt::require_bitwise_equal(plain2, zt::train_config(s2, 4, 6));
  // A shard group of the whole world is plain stage 3.
  zt::require_bitwise_equal(zt::train_config(stage3(), 4, 6),
                            zt::train_config(stage3({{"mics_shard_size", 4}}), 4, 6));
}

TEST_CASE(
    "hpZ: re-gathers come from the secondary partition inside the node, bitwise plain stage "
    "3, and the secondary copy is dropped after each step") {
  // 4 ranks as 2 nodes of 2, hpZ groups of 2 (a node); units released after forward and gathered
  // again (stage3_max_reuse_distance 0), as a backward does.
  TwoNodes two(10);
  two.spec().regather = true;
  zero::NodeTraffic plain_traffic, hpz_traffic;
  const auto plain =
      two.train(stage3({{"stage3_max_reuse_distance", 0}, {"stage3_prefetch_bucket_size", 0}}),
                &plain_traffic);
  const auto hpz = two.train(stage3({{"stage3_max_reuse_distance", 0},
                                     {"stage3_prefetch_bucket_size", 0},
                                     {"zero_hpz_partition_size", 2}}),
                             &hpz_traffic);
  zt::require_bitwise_equal(plain, hpz);
  // The second gather of each unit stays inside the node: fewer bytes across nodes.
  INFO("plain inter " << plain_traffic.inter_bytes << ", hpZ inter " << hpz_traffic.inter_bytes);
  REQUIRE(hpz_traffic.inter_bytes < plain_traffic.inter_bytes);
  REQUIRE(hpz_traffic.intra_bytes > 0);
  // The ledger: a secondary copy of about 1/2 of the model while a step runs, none after it.
  for (const auto& m : hpz.memory) {
    const auto& u = m.at(zero::MemoryKind::Device, zero::MemoryTag::SecondaryParams);
    REQUIRE(u.peak_bytes > 0);
    REQUIRE(u.current_bytes == 0);
  }
  for (const auto& m : plain.memory) {
    REQUIRE(m.at(zero::MemoryKind::Device, zero::MemoryTag::SecondaryParams).peak_bytes == 0);
  }
}

TEST_CASE(
    "hpZ keys: a partition size that does not divide the world, or with MiCS, is refused "
    "by name") {
  REQUIRE_THROWS_WITH(zt::train_config(stage3({{"zero_hpz_partition_size", 3}}), 4, 1),
                      Catch::Contains("zero_optimization.zero_hpz_partition_size") &&
                          Catch::Contains("3 does not divide the world size 4") &&
                          Catch::Contains("use one of 1, 2, 4"));
  REQUIRE_THROWS_WITH(
      zt::train_config(stage3({{"zero_hpz_partition_size", 2}, {"mics_shard_size", 2}}), 4, 1),
      Catch::Contains("use one of them"));
  // A group of the whole world is plain stage 3.
  zt::require_bitwise_equal(zt::train_config(stage3(), 4, 6),
                            zt::train_config(stage3({{"zero_hpz_partition_size", 4}}), 4, 6));
}

namespace {

// Rank 0's mean loss over the last 10 windows (one window's loss is one micro-batch's, which
// varies more from step to step than the runs being compared differ).
double final_loss(const zt::TrainResult& r) {
  REQUIRE(r.losses.size() >= 10);
  double sum = 0;
  for (std::size_t i = r.losses.size() - 10; i < r.losses.size(); ++i) sum += r.losses[i];
  return sum / 10;
}

// Every step's loss is finite and the final loss within `tolerance` (relative) of plain's. The
// quantized runs differ from plain by the quantization noise itself, not by rounding: near the
// teacher-student's loss floor 8-bit weights and 4-bit gradients move the final loss by 1-5% in
// either direction from seed to seed (measured: zero-train, 50 steps, seeds 1-3 and 13), while
// plain runs that differ only in summation order agree to 2e-7. The tests allow 5%; the issue's
// 2% holds on the acceptance configuration (docs/zero-train.md).
void require_close_loss(const zt::TrainResult& plain, const zt::TrainResult& run,
                        double tolerance) {
  REQUIRE(run.losses.size() == plain.losses.size());
  for (double l : run.losses) REQUIRE(std::isfinite(l));
  INFO("final loss " << final_loss(run) << " against plain " << final_loss(plain));
  REQUIRE(final_loss(plain) <
          0.8 * plain.losses.front());  // it learned: the comparison means something
  REQUIRE(std::fabs(final_loss(run) - final_loss(plain)) <= tolerance * final_loss(plain));
}

}  // namespace

TEST_CASE(
    "qwZ: weights gathered in int8 train within 5% of plain stage 3 over 50 steps, "
    "reproducibly, with fewer bytes, and the master weights stay exact") {
  TwoNodes two(50, "mlp:24,200,100,5");
  zero::NodeTraffic plain_traffic, qw_traffic;
  const auto plain = two.train(stage3(), &plain_traffic);
  const auto qw = two.train(stage3({{"zero_quantized_weights", true}}), &qw_traffic);
  require_close_loss(plain, qw, 0.05);
  zt::require_bitwise_equal(qw, two.train(stage3({{"zero_quantized_weights", true}})));
  // The weights differ from plain's (they were computed from quantized copies), yet only by
  // training noise: a broken dequantization would not train at all.
  REQUIRE(zt::max_abs_diff(plain.params, qw.params) > 0);
  INFO("inter-node bytes: plain " << plain_traffic.inter_bytes << ", qwZ "
                                  << qw_traffic.inter_bytes);
  REQUIRE(static_cast<double>(qw_traffic.inter_bytes) <
          0.7 * static_cast<double>(plain_traffic.inter_bytes));
}

TEST_CASE(
    "qgZ, and hpZ+qwZ+qgZ together, train within 5% of plain stage 3 over 50 steps with "
    "no inf or nan, reproducibly, under 0.3x the inter-node bytes") {
  TwoNodes two(50, "mlp:24,200,100,5");
  zero::NodeTraffic plain_traffic, qg_traffic, all_traffic;
  const auto plain = two.train(stage3(), &plain_traffic);
  const auto qg = two.train(stage3({{"zero_quantized_gradients", true}}), &qg_traffic);
  require_close_loss(plain, qg, 0.05);
  zt::require_bitwise_equal(qg, two.train(stage3({{"zero_quantized_gradients", true}})));
  REQUIRE(qg_traffic.inter_bytes < plain_traffic.inter_bytes);

  const auto all = two.train(stage3({{"zero_hpz_partition_size", 2},
                                     {"zero_quantized_weights", true},
                                     {"zero_quantized_gradients", true}}),
                             &all_traffic);
  require_close_loss(plain, all, 0.05);
  INFO("inter-node bytes: plain " << plain_traffic.inter_bytes << ", hpZ+qwZ+qgZ "
                                  << all_traffic.inter_bytes);
  REQUIRE(static_cast<double>(all_traffic.inter_bytes) <=
          0.3 * static_cast<double>(plain_traffic.inter_bytes));
}

TEST_CASE(
    "LoCo (zeropp_loco_param) feeds qgZ's errors back: within 5% of plain stage 3 over 50 "
    "steps, reproducibly, and a reset every step is qgZ without it, bit for bit") {
  TwoNodes two(50, "mlp:24,200,100,5");
  const auto plain = two.train(stage3());
  const auto loco_config = [](int reset_steps) {
    return stage3({{"zero_quantized_gradients", true},
                   {"zeropp_loco_param", {{"err_beta", 0.8}, {"reset_T", reset_steps}}}});
  };
  const auto qg = two.train(stage3({{"zero_quantized_gradients", true}}));
  const auto loco = two.train(loco_config(1024));
  require_close_loss(plain, loco, 0.05);
  zt::require_bitwise_equal(loco, two.train(loco_config(1024)));
  // The errors carried from step to step change the result...
  REQUIRE(zt::max_abs_diff(loco.params, qg.params) > 0);
  // ...and keeps the weights nearer plain stage 3's than qgZ alone (on zero-train's MLP over
  // seeds 1, 2, 3 and 13: 0.062–0.070 against qgZ's 0.073–0.082 of their norm, docs/multi-node.md).
  const double qg_drift = relative_distance(qg, plain), loco_drift = relative_distance(loco, plain);
  INFO("distance from plain stage 3's weights: qgZ " << qg_drift << ", qgZ+LoCo " << loco_drift
                                                     << "; final loss: plain " << final_loss(plain)
                                                     << ", qgZ " << final_loss(qg)
                                                     << ", qgZ+LoCo " << final_loss(loco));
  REQUIRE(qg_drift > 0);
  REQUIRE(loco_drift < qg_drift);
  // The errors are in the ledger, under gradients.
  const auto gradient_bytes = [](const zt::TrainResult& r) {
    return r.memory[0].at(zero::MemoryKind::Device, zero::MemoryTag::Gradients).current_bytes;
  };
  REQUIRE(gradient_bytes(loco) > gradient_bytes(qg));
  // With one gradient reduction per unit per step, clearing the errors after every step leaves
  // nothing to carry: plain qgZ.
  zt::require_bitwise_equal(qg, two.train(loco_config(1)));
}

TEST_CASE("qgZ on one node reduces exactly (zero-train prints the engine's note saying so)") {
  zt::TrainSpec spec;
  spec.world = 2;
  spec.steps = 6;
  spec.config = stage3();
  const auto plain = zt::train(spec);
  spec.config = stage3({{"zero_quantized_gradients", true}});
  zt::require_bitwise_equal(plain, zt::train(spec));
}

TEST_CASE(
    "zero_quantized_nontrainable_weights: a frozen weight is kept as int8 shards and computes "
    "as dequantize(quantize(value)) of each rank's slice; training goes on, reproducibly") {
  for (int world : {2, 3}) {
    INFO("world " << world);
    zt::TrainSpec spec;
    spec.world = world;
    spec.steps = 6;
    spec.model = "mlp:24,200,100,5";
    spec.frozen = [](std::size_t i) { return i == 0; };  // layers.0.weight: 24 x 200
    spec.config = stage3();
    const auto whole = zt::train(spec);
    spec.config = stage3({{"zero_quantized_nontrainable_weights", true}});
    const auto quantized = zt::train(spec);
    zt::require_bitwise_equal(quantized, zt::train(spec));

    // The reference: each rank's slice of the initial value (padded with zeros) quantized to
    // int8 blocks and back, as kernels/quantize.h does it.
    const std::vector<float>& initial = whole.initial[0];
    REQUIRE(whole.params[0] == initial);  // frozen: never changes
    const std::size_t n = initial.size();
    const std::size_t slice = (n + static_cast<std::size_t>(world) - 1) / world;
    std::vector<float> expected(n);
    for (std::size_t b = 0; b < n; b += slice) {
      std::vector<float> part(slice, 0.0f), back(slice);
      std::copy(initial.begin() + b, initial.begin() + std::min(n, b + slice), part.begin());
      std::vector<std::byte> q(zero::kernels::quantized_bytes(slice, 8));
      zero::kernels::quantize_cpu(part.data(), zero::DType::F32, slice, 8, q.data());
      zero::kernels::dequantize_cpu(q.data(), slice, 8, back.data(), zero::DType::F32);
      std::copy(back.begin(), back.begin() + std::min(slice, n - b), expected.begin() + b);
    }
    REQUIRE(expected != initial);  // the quantization changes the values: the test means something
    REQUIRE(quantized.params[0] == expected);
    // The trainable weights learned from those values: not whole's bits, but the same training.
    REQUIRE(zt::max_abs_diff(quantized.params, whole.params) > 0);
    REQUIRE(relative_diff(quantized, whole) < 0.05);

    // Each rank keeps about 1/W byte per element of it (plus a scale per 256) instead of 4.
    const auto low = [](const zt::TrainResult& r) {
      return r.memory[0]
          .at(zero::MemoryKind::Device, zero::MemoryTag::LowPrecisionParams)
          .current_bytes;
    };
    const std::size_t saved = low(whole) - low(quantized);
    INFO("low-precision bytes: whole " << low(whole) << ", quantized " << low(quantized));
    REQUIRE(saved >= n * sizeof(float) - slice - 64);
  }
}

TEST_CASE("a quantized frozen weight is read only while its unit is gathered, and checkpoints") {
  zt::TempDir dir;
  zt::TrainSpec spec;
  spec.world = 2;
  spec.steps = 4;
  spec.model = "mlp:24,200,100,5";
  spec.frozen = [](std::size_t i) { return i == 0; };
  spec.config = stage3({{"zero_quantized_nontrainable_weights", true}});
  spec.save_dir = dir.path().string();
  spec.save_after = 2;
  const auto straight = zt::train(spec);
  // Resumed from step 2 at world sizes 2 and 3: the frozen weight's saved value is the
  // dequantized one, and requantizing it (on other slices at world 3) keeps it within a
  // quantization step.
  for (int world : {2, 3}) {
    zt::TrainSpec resume = spec;
    resume.world = world;
    resume.save_dir.clear();
    resume.save_after = -1;
    resume.load_dir = dir.path().string();
    const auto resumed = zt::train(resume);
    double amax = 0, diff = 0;
    for (std::size_t j = 0; j < straight.params[0].size(); ++j) {
      amax = std::max(amax, static_cast<double>(std::fabs(straight.params[0][j])));
      diff = std::max(diff, static_cast<double>(
                                std::fabs(resumed.params[0][j] - straight.params[0][j])));
    }
    INFO("world " << world << ": frozen weight moved by " << diff << " (max |w| " << amax << ")");
    REQUIRE(diff <= amax / 127);
    if (world == 2) REQUIRE(relative_diff(resumed, straight) < 1e-3);
  }

  const auto cfg = zero::config::load_config_json(spec.config, [] {
    zero::config::Supplied s;
    s.world_size = 1;
    return s;
  }());
  std::vector<zero::ParamSpec> specs = {{"w", {300}, zero::DType::F32, 0, 0, false},
                                        {"b", {3}, zero::DType::F32, 0, 0, true}};
  zero::run_ranks(1, [&](Communicator& comm) {
    auto device = zero::make_device("cpu", 0);
    auto engine = zero::Engine::create(cfg, comm, *device, specs,
                                       [](std::size_t, std::span<float> out) {
                                         for (std::size_t j = 0; j < out.size(); ++j)
                                           out[j] = 0.01f * static_cast<float>(j);
                                       });
    REQUIRE_THROWS_WITH(engine->param(0), Catch::Contains("'w'") && Catch::Contains("int8") &&
                                              Catch::Contains("gather its unit 0 first"));
    engine->gather(0);
    REQUIRE(engine->param(0).size() == 300 * sizeof(float));
    engine->release(0);
    REQUIRE_THROWS(engine->param(0));
  });
}
