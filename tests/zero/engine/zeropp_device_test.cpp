// ZeRO++ (hpZ, qwZ, qgZ, quantized frozen weights) and MiCS on an engine whose collectives take
// device memory (what a GPU engine gets: NCCL, or DeviceInProcComm for ranks that share one GPU),
// run on the CPU through the GPU stand-in (gpu_stand_in.h): the engine reaches its memory only
// through Device::copy and the device's compute table, and its host-memory collectives go
// through the control communicator. Every run must be bitwise the CPU engine's over host
// communicators (zeropp_test checks those against plain stage 3), and the quantizing keys must
// quantize through the device's table. The same on a real GPU is engine_gpu_test's.
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/zero/engine/engine_test_util.h"
#include "tests/zero/engine/gpu_stand_in.h"
#include "zero/comm/hierarchical_comm.h"
#include "zero/comm/node_topology.h"

namespace zero::test {
namespace {

nlohmann::json stage3(const nlohmann::json& extra) {
  nlohmann::json c = base_config(3, "fp32", 1);
  c["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  c["zero_optimization"].update(extra);
  return c;
}

// On the CPU engine (copies null), or on stand-in devices whose collectives take device memory.
TrainSpec spec_for(const nlohmann::json& cfg, int world, int steps,
                   std::atomic<std::size_t>* copies) {
  TrainSpec spec = stand_in_spec(cfg, world, steps, copies);
  spec.device_comm = copies != nullptr;
  return spec;
}

// Trains `spec` on the CPU and on the stand-in; the two must be bitwise equal, after the weights
// moved and with copies made through the stand-in. Returns the stand-in's run.
TrainResult device_equals_cpu(TrainSpec spec) {
  const TrainResult cpu = train(spec);
  const std::size_t quantizer_calls = stand_in_quantizer_calls;
  std::atomic<std::size_t> copies{0};
  TrainSpec on_device = spec_for(spec.config, spec.world, spec.steps, &copies);
  on_device.regather = spec.regather;
  on_device.save_dir = spec.save_dir;
  on_device.save_after = spec.save_after;
  on_device.model = spec.model;
  on_device.frozen = spec.frozen;
  TrainResult dev = train(on_device);
  REQUIRE(max_abs_diff(cpu.params, cpu.initial) > 1e-4);  // training moved the weights
  CHECK(copies > 0);                                      // through the device's copies
  require_bitwise_equal(cpu, dev);
  // A quantizing key quantized through the device's table, not the host's kernels.
  const nlohmann::json& z = spec.config["zero_optimization"];
  if (z.value("zero_quantized_weights", false) ||
      z.value("zero_quantized_nontrainable_weights", false)) {
    CHECK(stand_in_quantizer_calls > quantizer_calls);
  }
  return dev;
}

TEST_CASE("hpZ on device memory: re-gathers from the secondary copy, bitwise the CPU engine",
          "[engine][zeropp]") {
  for (const std::string precision : {"fp32", "bf16"}) {
    INFO(precision);
    nlohmann::json cfg = stage3({{"zero_hpz_partition_size", 2},
                                 {"stage3_max_reuse_distance", 0},
                                 {"stage3_prefetch_bucket_size", 0}});
    if (precision == "bf16") cfg["bf16"] = {{"enabled", true}};
    TrainSpec spec = spec_for(cfg, 4, 4, nullptr);
    spec.regather = true;
    const TrainResult dev = device_equals_cpu(spec);
    // The secondary copy lived in device memory while steps ran, and is gone after them.
    for (const auto& m : dev.memory) {
      const auto& u = m.at(MemoryKind::Device, MemoryTag::SecondaryParams);
      CHECK(u.peak_bytes > 0);
      CHECK(u.current_bytes == 0);
    }
  }
}

TEST_CASE("qwZ on device memory: gathers quantized by the device's table, bitwise the CPU engine",
          "[engine][zeropp]") {
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    INFO(precision);
    nlohmann::json cfg = stage3({{"zero_quantized_weights", true}});
    if (precision != "fp32") cfg[precision] = {{"enabled", true}};
    TrainSpec spec = spec_for(cfg, 3, 4, nullptr);
    spec.model = "mlp:24,200,100,5";
    const TrainResult dev = device_equals_cpu(spec);
    // Not plain stage 3's bits: the weights computed with were quantized.
    TrainSpec plain = spec;
    plain.config = stage3(nlohmann::json::object());
    CHECK(max_abs_diff(dev.params, train(plain).params) > 0);
  }
}

TEST_CASE("quantized frozen weights on device memory: int8 shards there, bitwise the CPU engine",
          "[engine][zeropp]") {
  TrainSpec spec = spec_for(stage3({{"zero_quantized_nontrainable_weights", true}}), 3, 4, nullptr);
  spec.model = "mlp:24,200,100,5";
  spec.frozen = [](std::size_t i) { return i == 0; };  // layers.0.weight: 24 x 200
  const TrainResult dev = device_equals_cpu(spec);
  // The frozen weight held as dequantize(quantize(value)) from the start, and never moved.
  TrainSpec whole = spec;
  whole.config = stage3(nlohmann::json::object());
  const std::vector<float> exact = train(whole).initial[0];
  CHECK(dev.params[0] == dev.initial[0]);
  CHECK(dev.initial[0] != exact);
  CHECK(max_abs_diff({dev.initial[0]}, {exact}) < 0.05);
}

TEST_CASE("MiCS on device memory trains bitwise as on the CPU, within 1e-6 of plain stage 3",
          "[engine][zeropp]") {
  for (const auto& [world, shard] : {std::pair{4, 2}, std::pair{6, 3}}) {
    INFO("world " << world << ", shard groups of " << shard);
    const TrainResult dev =
        device_equals_cpu(spec_for(stage3({{"mics_shard_size", shard}}), world, 4, nullptr));
    const TrainResult plain = train(spec_for(stage3(nlohmann::json::object()), world, 4, nullptr));
    CHECK(max_abs_diff(dev.params, plain.params) <= 1e-6);
  }
}

TEST_CASE("a MiCS checkpoint saved on device memory is written once and resumes on the CPU",
          "[engine][zeropp]") {
  TempDir dir("zeropp-device-mics");
  const std::string ckpt = (dir.path() / "ckpt").string();
  const nlohmann::json cfg = stage3({{"mics_shard_size", 2}});
  std::atomic<std::size_t> copies{0};
  const TrainResult whole = train(spec_for(cfg, 4, 6, &copies));
  TrainSpec saving = spec_for(cfg, 4, 3, &copies);
  saving.save_dir = ckpt;
  saving.save_after = 3;
  train(saving);
  // Replica 0 wrote it (its replica flag crossed on the host): a 2-rank partition's files.
  std::size_t rank_files = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(ckpt) / "step3"))
    rank_files += e.path().filename().string().find("rank") != std::string::npos;
  CHECK(rank_files == 2);
  TrainSpec resumed = spec_for(cfg, 4, 6, nullptr);
  resumed.load_dir = ckpt;
  require_bitwise_equal(whole, train(resumed));
}

NodeTopology two_of_two() {
  return resolve_node_topology(4, 2, [](const char*) { return nullptr; });
}

// 4 ranks as 2 nodes of 2: on the CPU engine (a HierarchicalComm over the host ranks), or on the
// stand-in devices (one over their device communicator, the host one its control communicator).
TrainResult two_nodes(const nlohmann::json& cfg, bool on_device, int steps = 4,
                      std::optional<std::size_t> device_budget = std::nullopt) {
  std::atomic<std::size_t> copies{0};
  std::vector<std::unique_ptr<HierarchicalComm>> host_nodes(4);
  TrainSpec spec = spec_for(cfg, 4, steps, on_device ? &copies : nullptr);
  spec.model = "mlp:24,200,100,5";
  spec.device_budget = device_budget;
  if (on_device) {
    spec.wrap_device_comm = [](int, Communicator& world, Device& device,
                               Communicator& host) -> std::unique_ptr<Communicator> {
      return HierarchicalComm::create(world, two_of_two(), &device, &host);
    };
  } else {
    spec.wrap_comm = [&](int r, Communicator& c) -> Communicator& {
      host_nodes[static_cast<std::size_t>(r)] = HierarchicalComm::create(c, two_of_two());
      return *host_nodes[static_cast<std::size_t>(r)];
    };
  }
  const std::size_t quantizer_calls = stand_in_quantizer_calls;
  TrainResult result = train(spec);
  if (on_device) {
    CHECK(copies > 0);
    // qgZ and qwZ quantize through the device's table, not the host's kernels.
    const nlohmann::json& z = cfg["zero_optimization"];
    if (z.value("zero_quantized_gradients", false) || z.value("zero_quantized_weights", false))
      CHECK(stand_in_quantizer_calls > quantizer_calls);
  }
  return result;
}

TEST_CASE("over two simulated nodes on device memory, qgZ, LoCo, hpZ+qwZ+qgZ and MiCS train "
          "bitwise as on the CPU, with the same bytes by level",
          "[engine][zeropp]") {
  const nlohmann::json none = nlohmann::json::object();
  const TrainResult plain = two_nodes(stage3(none), true);
  for (const nlohmann::json& keys :
       {nlohmann::json{{"zero_quantized_gradients", true}},
        nlohmann::json{{"zero_quantized_gradients", true},
                       {"zeropp_loco_param", {{"err_beta", 0.8}, {"reset_T", 2}}}},
        nlohmann::json{{"zero_hpz_partition_size", 2},
                       {"zero_quantized_weights", true},
                       {"zero_quantized_gradients", true}},
        nlohmann::json{{"mics_shard_size", 2}}}) {
    INFO(keys.dump());
    const TrainResult cpu = two_nodes(stage3(keys), false);
    const TrainResult dev = two_nodes(stage3(keys), true);
    REQUIRE(max_abs_diff(cpu.params, cpu.initial) > 1e-4);  // training moved the weights
    require_bitwise_equal(cpu, dev);
    for (std::size_t r = 0; r < 4; ++r) {
      INFO("rank " << r << ": inter-node bytes " << dev.traffic[r].inter_bytes << " (plain "
                   << plain.traffic[r].inter_bytes << ", the CPU engine's "
                   << cpu.traffic[r].inter_bytes << ")");
      // The CPU engine counts its host-memory collectives (norms, checks, the initial
      // broadcasts) too; a device engine sends those through the control communicator.
      CHECK(dev.traffic[r].intra_bytes > 0);
      CHECK(dev.traffic[r].intra_bytes <= cpu.traffic[r].intra_bytes);
      CHECK(dev.traffic[r].inter_bytes <= cpu.traffic[r].inter_bytes);
      // Every one of them sends fewer bytes across nodes than plain stage 3 on the same nodes.
      CHECK(dev.traffic[r].inter_bytes < plain.traffic[r].inter_bytes);
    }
  }
}

// The scratch the two levels keep between them (the reordered, widened chunks) is device memory
// too: a budget with room for the model, its state and the buckets but not for that scratch is an
// error when the engine is created, naming it, not an out-of-memory error in the first backward.
TEST_CASE("a device without room for the two-level scratch beside the buckets: an error at create",
          "[engine][zeropp]") {
  const nlohmann::json cfg = stage3(nlohmann::json::object());
  const TrainResult free_run = two_nodes(cfg, true);
  const MemorySnapshot& m = free_run.memory[0];
  const std::size_t scratch = m.at(MemoryKind::Device, MemoryTag::Staging).current_bytes;
  const std::size_t buckets = m.at(MemoryKind::Device, MemoryTag::Buckets).current_bytes;
  REQUIRE(scratch > 0);
  REQUIRE(buckets > 0);
  // What the engine holds before its first backward: everything but the buckets, the scratch and
  // the gathers, which come later.
  const std::size_t at_create = m.total(MemoryKind::Device).current_bytes - scratch - buckets -
                                m.at(MemoryKind::Device, MemoryTag::GatherBuffers).current_bytes;
  // (The initial all-gather already took the gather's share: the check counts the rest.)
  CHECK_THROWS_WITH(two_nodes(cfg, true, 4, at_create + buckets + scratch - 1),
                    Catch::Contains("zero_optimization.reduce_bucket_size") &&
                        Catch::Contains("collectives between nodes") &&
                        Catch::Contains("lower reduce_bucket_size"));
  // Under the run's own peak the check lets it train, bitwise as without a budget.
  const std::size_t peak = m.total(MemoryKind::Device).peak_bytes;
  require_bitwise_equal(free_run, two_nodes(cfg, true, 4, peak + (std::size_t{1} << 16)));
}

}  // namespace
}  // namespace zero::test
