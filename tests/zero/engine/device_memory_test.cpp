// The engine's path for a device whose memory the host does not read (a GPU's), run on the CPU:
// a CpuDevice stand-in with another name makes the engine move every value that crosses between
// host code and engine memory with Device::copy (initial values, gathered and set parameters,
// checkpoint tiles, the store's initial states), as it must on a GPU, while the kernels still
// run on the CPU. The results must be bitwise the CPU engine's, with the engine's collectives on
// the host's InProcComm or on the device's memory (DeviceInProcComm). The CUDA device itself is
// engine_gpu_test's.
#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <optional>

#include "tests/temp_dir.h"
#include "tests/zero/engine/engine_test_util.h"
#include "tests/zero/engine/gpu_stand_in.h"
#include "zero/base/error.h"

namespace zero::test {
namespace {

TrainSpec spec_for(const nlohmann::json& cfg, int world, int steps,
                   std::atomic<std::size_t>* copies) {
  return stand_in_spec(cfg, world, steps, copies);
}

// Trains `cfg` on 2 ranks on the CPU and on the stand-in, requires the stand-in's run (returned)
// bitwise equal to the CPU's, after the weights moved and with copies made through the stand-in.
TrainResult stand_in_equals_cpu(const nlohmann::json& cfg) {
  const TrainResult cpu = train(spec_for(cfg, 2, 4, nullptr));
  std::atomic<std::size_t> copies{0};
  TrainResult staged = train(spec_for(cfg, 2, 4, &copies));
  REQUIRE(max_abs_diff(cpu.params, cpu.initial) > 1e-4);  // training moved the weights
  CHECK(copies > 0);                                      // the staged path was taken
  require_bitwise_equal(cpu, staged);
  return staged;
}

TEST_CASE("staged through device copies, every stage and precision trains bitwise as on the CPU",
          "[engine]") {
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    for (int stage = 0; stage <= 3; ++stage) {
      INFO(precision << " stage " << stage);
      stand_in_equals_cpu(base_config(stage, precision, 2, 2));
    }
  }
}

TEST_CASE("staged through device copies, a checkpoint saves and resumes bitwise", "[engine]") {
  for (int stage : {0, 2, 3}) {
    INFO("stage " << stage);
    const nlohmann::json cfg = base_config(stage, "bf16", 1, 2);
    TempDir dir;
    std::atomic<std::size_t> copies{0};
    TrainSpec whole = spec_for(cfg, 2, 6, &copies);
    whole.save_dir = dir.str();
    whole.save_after = 3;
    const TrainResult uninterrupted = train(whole);
    TrainSpec resumed = spec_for(cfg, 2, 6, &copies);
    resumed.load_dir = dir.str();
    const TrainResult r = train(resumed);
    REQUIRE(r.steps.size() == 3);
    require_bitwise_equal(uninterrupted, r);
    // And what the stand-in saved is what the CPU engine saves: it resumes there bitwise too.
    TrainSpec on_cpu = spec_for(cfg, 2, 6, nullptr);
    on_cpu.load_dir = dir.str();
    require_bitwise_equal(uninterrupted, train(on_cpu));
  }
}

// offload_optimizer on a device the host cannot address: the partition is stepped on the host
// (ZeRO-Offload's schedule) — reduced gradients copied into host memory as each bucket finishes,
// the CPU kernels stepping, the model copy written into a host mirror and copied back to the
// device a run at a time. Nothing of the device's model copy is written by host code, so a missed
// or misplaced copy trains differently from the CPU engine.
nlohmann::json with_optimizer_offload(nlohmann::json cfg, const std::string& device,
                                      const std::string& nvme_path = "") {
  nlohmann::json& z = cfg["zero_optimization"];
  z["sub_group_size"] = 100;  // several sub-groups, so several runs per step
  z["offload_optimizer"] = {{"device", device}, {"pin_memory", true}};
  if (device == "nvme") {
    z["offload_optimizer"]["nvme_path"] = nvme_path;
    cfg["aio"] = {{"block_size", 4096}, {"queue_depth", 4}};
  }
  return cfg;
}

TEST_CASE("offload_optimizer on a device that is not the host steps on the host, bitwise",
          "[engine]") {
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    for (int stage = 1; stage <= 3; ++stage) {
      INFO(precision << " stage " << stage);
      const TrainResult staged =
          stand_in_equals_cpu(with_optimizer_offload(base_config(stage, precision, 2, 2), "cpu"));
      for (const MemorySnapshot& m : staged.memory) {
        // Master weights, states and the reduced gradients are host memory; the model copy is on
        // the device with its mirror in pinned host memory.
        CHECK(m.at(MemoryKind::Device, MemoryTag::MasterParams).current_bytes == 0);
        CHECK(m.at(MemoryKind::PinnedHost, MemoryTag::MasterParams).current_bytes > 0);
        CHECK(m.at(MemoryKind::PinnedHost, MemoryTag::Gradients).current_bytes > 0);
        CHECK(m.at(MemoryKind::PinnedHost, MemoryTag::LowPrecisionParams).current_bytes > 0);
        CHECK(m.at(MemoryKind::Device, MemoryTag::LowPrecisionParams).current_bytes > 0);
      }
    }
  }
}

TEST_CASE("offload_optimizer nvme and 16-bit master weights on a device that is not the host",
          "[engine]") {
  TempDir dir;
  SECTION("nvme, stage 2") {
    stand_in_equals_cpu(with_optimizer_offload(base_config(2, "bf16", 2, 2), "nvme", dir.str()));
  }
  SECTION("stage 3 with its parameters offloaded too: host memory, and NVMe") {
    for (const std::string tier : {"cpu", "nvme"}) {
      INFO("offload_param and offload_optimizer on " << tier);
      nlohmann::json cfg = with_optimizer_offload(base_config(3, "bf16", 2, 2), tier, dir.str());
      cfg["zero_optimization"]["offload_param"] = {{"device", tier}, {"pin_memory", true}};
      if (tier == "nvme") cfg["zero_optimization"]["offload_param"]["nvme_path"] = dir.str();
      const TrainResult staged = stand_in_equals_cpu(cfg);
      for (const MemorySnapshot& m : staged.memory) {
        // No model copy of the partition on the device: only gathered units are.
        CHECK(m.at(MemoryKind::Device, MemoryTag::MasterParams).current_bytes == 0);
        CHECK(m.at(MemoryKind::PinnedHost, MemoryTag::LowPrecisionParams).current_bytes +
                  m.at(MemoryKind::Nvme, MemoryTag::LowPrecisionParams).current_bytes >
              0);
      }
    }
  }
  SECTION("bf16 master weights and states on the device (stepped in device tiles), stages 1-3") {
    for (int stage = 1; stage <= 3; ++stage) {
      INFO("stage " << stage);
      nlohmann::json cfg = base_config(stage, "bf16", 1, 2);
      cfg["bf16"]["bf16_master_weights_and_grads"] = true;
      cfg["bf16"]["bf16_optimizer_states"] = true;
      stand_in_equals_cpu(cfg);
    }
  }
  SECTION("bf16 master weights and states, offloaded to the host, stage 1") {
    nlohmann::json cfg = with_optimizer_offload(base_config(1, "bf16", 1, 2), "cpu");
    cfg["bf16"]["bf16_master_weights_and_grads"] = true;
    cfg["bf16"]["bf16_optimizer_states"] = true;
    stand_in_equals_cpu(cfg);
  }
  SECTION("a checkpoint saved offloaded on the stand-in resumes bitwise on the CPU") {
    const nlohmann::json cfg = with_optimizer_offload(base_config(2, "bf16", 1, 2), "cpu");
    std::atomic<std::size_t> copies{0};
    TrainSpec whole = spec_for(cfg, 2, 6, &copies);
    whole.save_dir = dir.str();
    whole.save_after = 3;
    const TrainResult uninterrupted = train(whole);
    TrainSpec resumed = spec_for(cfg, 2, 6, &copies);
    resumed.load_dir = dir.str();
    require_bitwise_equal(uninterrupted, train(resumed));
    TrainSpec on_cpu = spec_for(cfg, 2, 6, nullptr);
    on_cpu.load_dir = dir.str();
    require_bitwise_equal(uninterrupted, train(on_cpu));
  }
}

// Ranks that share one device, the engine's collectives on its memory through DeviceInProcComm
// (what in-process ranks on one GPU get from make_gpu_communicator), the reductions and copies
// made by the device's compute table: every stage bitwise the CPU engine over InProcComm, so
// every stage bitwise every other (the CPU engine's stages agree bitwise, engine_test).
TEST_CASE("ranks sharing a device through DeviceInProcComm train every stage bitwise as the CPU",
          "[engine]") {
  run_ranks(2, [](Communicator& host) {
    GpuStandIn device(host.rank(), {});
    if (make_gpu_communicator(host, device)->backend_name() != "device-inproc")
      throw Error("make_gpu_communicator: not the in-process device communicator");
  });
  for (const std::string precision : {"fp32", "bf16"}) {
    for (int world : {2, 3}) {
      std::optional<TrainResult> first;
      for (int stage = 0; stage <= 3; ++stage) {
        INFO(precision << ", " << world << " ranks, stage " << stage);
        const nlohmann::json cfg = base_config(stage, precision, 2, 2);
        const TrainResult cpu = train(spec_for(cfg, world, 4, nullptr));
        std::atomic<std::size_t> copies{0};
        TrainSpec shared = spec_for(cfg, world, 4, &copies);
        shared.device_comm = true;
        const TrainResult on_device = train(shared);
        REQUIRE(max_abs_diff(cpu.params, cpu.initial) > 1e-4);  // training moved the weights
        CHECK(copies > 0);
        require_bitwise_equal(cpu, on_device);
        if (first) {
          require_bitwise_equal(*first, on_device);
        } else {
          first = on_device;
        }
      }
    }
  }
}

TEST_CASE("on a device that is not the host, what does not run there yet is refused by name",
          "[engine]") {
  std::atomic<std::size_t> copies{0};
  nlohmann::json cfg = base_config(2, "bf16", 1, 2);
  TempDir dir;
  cfg = with_optimizer_offload(cfg, "nvme", dir.str());
  cfg["zero_optimization"]["offload_optimizer"]["ratio"] = 0.5;
  CHECK_THROWS_WITH(train(spec_for(cfg, 1, 1, &copies)),
                    Catch::Contains("zero_optimization.offload_optimizer.ratio") &&
                        Catch::Contains("\"gpu-stand-in\" device") &&
                        Catch::Contains("ZERO_DEVICE=cpu"));
  cfg = base_config(3, "bf16", 1, 2);
  cfg["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
  CHECK_THROWS_WITH(train(spec_for(cfg, 1, 1, &copies)),
                    Catch::Contains("zero_optimization.offload_param") &&
                        Catch::Contains("offload the optimizer too"));
}

}  // namespace
}  // namespace zero::test
