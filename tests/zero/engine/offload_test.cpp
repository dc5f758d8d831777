// Offload tiers change where the optimizer state lives, never the numbers: NVMe, host and a
// partial (ratio) offload, at stages 1-3, fp32 and bf16, on 1-3 ranks, give bitwise the
// parameters of the same run without offload (in fp32 that run keeps its master weights in the
// model copy, the offloaded ones apart, and an optimizer without state then keeps nothing at
// all); the ledger shows the NVMe bytes; a checkpoint saved from NVMe resumes bitwise; no swap
// file outlives the engine.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>

#include "tests/temp_dir.h"
#include "tests/zero/engine/engine_test_util.h"
#include "tests/zero/engine/gpu_stand_in.h"
#include "zero/base/error.h"
#include "zero/engine/engine_impl.h"

namespace zero::test {
namespace {

using nlohmann::json;

json with_offload(json c, const std::string& kind, const std::string& nvme_path) {
  json& z = c["zero_optimization"];
  z["sub_group_size"] = 100;  // several sub-groups per rank on the small MLP
  if (kind == "cpu") {
    z["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
    return c;
  }
  z["offload_optimizer"] = {{"device", "nvme"},
                            {"nvme_path", nvme_path},
                            {"buffer_count", 3},
                            {"pipeline_read", true},
                            {"pipeline_write", true}};
  if (kind == "ratio") z["offload_optimizer"]["ratio"] = 0.4;
  c["aio"] = {{"block_size", 4096}, {"queue_depth", 4}};
  return c;
}

constexpr const char* kModel = "mlp:8,48,32,4";

TrainResult run_world(const json& config, int world, int steps = 4) {
  return train_config(config, world, steps, kModel);
}

TEST_CASE("NVMe, host and partial offload give bitwise the run without offload", "[offload]") {
  TempDir nvme("zero_nvme");
  for (const char* precision : {"fp32", "bf16"}) {
    for (int stage = 1; stage <= 3; ++stage) {
      for (int world : {1, 3}) {
        const json plain = base_config(stage, precision, 1);
        const TrainResult a = run_world(plain, world);
        // Master weights of their own, in any memory kind (both NVMe slots count).
        auto master_bytes = [](const TrainResult& r) {
          std::size_t sum = 0;
          for (std::size_t k = 0; k < kNumMemoryKinds; ++k)
            sum += r.memory[0].at(static_cast<MemoryKind>(k), MemoryTag::MasterParams).current_bytes;
          return sum;
        };
        // Without offload an fp32 model's master weights are its model copy: none of their own.
        CHECK((master_bytes(a) == 0) == (std::string(precision) == "fp32"));
        for (const char* kind : {"nvme", "cpu", "ratio"}) {
          INFO(precision << " stage " << stage << " world " << world << " " << kind);
          const TrainResult b = run_world(with_offload(plain, kind, nvme.str()), world);
          require_bitwise_equal(a, b);
          CHECK(master_bytes(b) > 0);
          const std::size_t on_nvme = b.memory[0].total(MemoryKind::Nvme).current_bytes;
          if (std::string(kind) == "cpu") {
            CHECK(on_nvme == 0);
          } else {
            CHECK(on_nvme > 0);
            CHECK(b.memory[0].at(MemoryKind::Nvme, MemoryTag::OptimizerStates).current_bytes > 0);
          }
        }
      }
    }
  }
  CHECK(std::filesystem::is_empty(nvme.path()));  // no swap folder left behind
}

TEST_CASE("plain SGD in fp32 (no optimizer state, master weights in the model copy) stays bitwise "
          "across stages", "[engine]") {
  json c = base_config(0, "fp32", 2);
  c["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.1}}}};
  c.erase("scheduler");
  c["zero_allow_untested_optimizer"] = true;
  const TrainResult s0 = run_world(c, 3, 5);
  REQUIRE(max_abs_diff(s0.params, s0.initial) > 1e-3);
  for (int stage = 0; stage <= 3; ++stage) {
    c["zero_optimization"]["stage"] = stage;
    INFO("stage " << stage);
    const TrainResult r = run_world(c, 3, 5);
    require_bitwise_equal(s0, r);
    for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
      const auto kind = static_cast<MemoryKind>(k);
      CHECK(r.memory[0].at(kind, MemoryTag::MasterParams).current_bytes == 0);
      CHECK(r.memory[0].at(kind, MemoryTag::OptimizerStates).current_bytes == 0);
    }
  }
}

// max_in_cpu 0 keeps one unit record in host memory (every gather reads its record), the default
// 1e9 keeps all of them on this model.
json with_param_nvme(json c, const std::string& nvme_path, std::int64_t buffer_size = 100'000,
                     std::int64_t max_in_cpu = 0) {
  c["zero_optimization"]["offload_param"] = {{"device", "nvme"},
                                             {"nvme_path", nvme_path},
                                             {"buffer_count", 3},
                                             {"buffer_size", buffer_size},
                                             {"max_in_cpu", max_in_cpu}};
  return c;
}

TEST_CASE("stage-3 parameters on NVMe (with or without the optimizer state) stay bitwise",
          "[offload]") {
  TempDir nvme("zero_nvme");
  for (const char* precision : {"fp32", "bf16"}) {
    for (int world : {1, 3}) {
      INFO(precision << " world " << world);
      const json plain = base_config(3, precision, 2);
      const TrainResult a = run_world(plain, world);
      for (const json& c : {with_param_nvme(plain, nvme.str()),
                            with_param_nvme(plain, nvme.str(), 100'000, 1'000'000'000),
                            with_param_nvme(with_offload(plain, "nvme", nvme.str()), nvme.str()),
                            with_param_nvme(with_offload(plain, "ratio", nvme.str()), nvme.str()),
                            with_param_nvme(with_offload(plain, "cpu", nvme.str()), nvme.str())}) {
        const TrainResult b = run_world(c, world);
        require_bitwise_equal(a, b);
        for (const MemorySnapshot& m : b.memory) {
          CHECK(m.at(MemoryKind::Nvme, MemoryTag::LowPrecisionParams).current_bytes > 0);
          CHECK(m.at(MemoryKind::Device, MemoryTag::LowPrecisionParams).current_bytes <
                a.memory[0].at(MemoryKind::Device, MemoryTag::LowPrecisionParams).current_bytes);
        }
      }
    }
  }
  CHECK(std::filesystem::is_empty(nvme.path()));
}

// One rank training kModel from `config` by hand, so that a test can fail its I/O between calls.
DeviceOptions budgeted(std::optional<std::size_t> device_budget) {
  DeviceOptions o;
  o.device_budget_bytes = device_budget;
  return o;
}

// With `stand_in`, on a device the engine must treat as a GPU's (gpu_stand_in.h); `device_budget`:
// DeviceOptions::device_budget_bytes.
struct OneRank {
  explicit OneRank(const json& config, bool stand_in = false,
                   std::optional<std::size_t> device_budget = std::nullopt)
      : shape(models::MlpShape::parse(kModel)),
        mp(models::mlp_params(shape)),
        cfg(config::load_config_json(config,
                                     [] {
                                       config::Supplied s;
                                       s.world_size = 1;
                                       return s;
                                     }())),
        specs(make_specs()),
        comm(world.comm(0)),
        device(stand_in ? std::make_unique<GpuStandIn>(0, budgeted(device_budget))
                        : make_device("cpu", 0, budgeted(device_budget))),
        engine(Engine::create(
            cfg, *comm, *device, specs,
            [&](std::size_t i, std::span<float> out) { models::init_param(shape, i, 7, 0, out); },
            [] {
              EngineOptions o;
              o.kernel_threads = 1;
              return o;
            }())),
        data(shape, 7) {}

  engine_detail::EngineImpl& impl() { return dynamic_cast<engine_detail::EngineImpl&>(*engine); }

  // Gathers, runs forward and backward on step t's batch and hands the gradients over.
  void backward(int t) {
    std::vector<std::vector<float>> w(specs.size()), g(specs.size());
    for (std::size_t u = 0; u < engine->num_units(); ++u) engine->gather(static_cast<int>(u));
    for (std::size_t i = 0; i < specs.size(); ++i) {
      w[i] = to_f32(engine->param(i), cfg.model_dtype);
      g[i].resize(mp[i].numel());
    }
    const auto micro = static_cast<std::size_t>(*cfg.train_micro_batch_size_per_gpu);
    const models::Batch batch = data.batch(static_cast<std::uint64_t>(t), 0, micro);
    std::vector<std::span<const float>> ws(w.begin(), w.end());
    std::vector<std::span<float>> gs(g.begin(), g.end());
    models::forward_backward(shape, ws, batch, static_cast<float>(engine->backward_scale()), gs);
    for (std::size_t u = engine->num_units(); u-- > 0;) engine->release(static_cast<int>(u));
    for (std::size_t i = specs.size(); i-- > 0;) {
      kernels::cast_cpu(g[i].data(), DType::F32, engine->grad(i).data(), cfg.model_dtype,
                        g[i].size());
      engine->grad_ready(i);
    }
  }

  // Every parameter's master weights and model copy, then global steps and learning rate.
  std::vector<std::vector<float>> snapshot() {
    std::vector<std::vector<float>> out;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      out.push_back(engine->gather_master(i));
      out.push_back(to_f32(engine->gather_model(i), cfg.model_dtype));
    }
    out.push_back(
        {static_cast<float>(engine->global_steps()), static_cast<float>(engine->current_lr())});
    return out;
  }

  std::vector<ParamSpec> make_specs() const {
    std::vector<ParamSpec> out;
    for (std::size_t i = 0; i < mp.size(); ++i) {
      ParamSpec spec;
      spec.name = mp[i].name;
      for (std::size_t d : mp[i].shape) spec.shape.push_back(static_cast<std::int64_t>(d));
      spec.dtype = cfg.model_dtype;
      spec.unit = static_cast<int>(i / 2);
      out.push_back(spec);
    }
    return out;
  }

  const models::MlpShape shape;
  const std::vector<models::MlpParam> mp;
  const config::DsConfig cfg;
  const std::vector<ParamSpec> specs;
  InProcWorld world{1};
  const std::unique_ptr<Communicator> comm;
  const std::unique_ptr<Device> device;
  const std::unique_ptr<Engine> engine;
  const models::TeacherStudentData data;
};

// One rank trains; at step `faulty_step`, the I/O call k of one store's step fails (or, with
// `disk_gone`, every call from the k-th on), for every k until a step goes through. Each failed
// step must leave parameters, master weights and counters as they were; the run then continues.
// Returns the final master weights and the failures seen.
struct FaultRun {
  std::vector<std::vector<float>> params;
  int failures = 0;
};
FaultRun train_with_io_faults(const json& config, bool fault_params, int faulty_step,
                              bool disk_gone = false, bool stand_in = false) {
  OneRank r(config, stand_in);
  offload::AsyncIo* io = fault_params ? r.impl().param_io() : r.impl().optimizer_io();
  REQUIRE(io != nullptr);
  FaultRun result;
  for (int t = 0; t < 4; ++t) {
    for (std::uint64_t k = 0;; ++k) {
      const auto before = r.snapshot();
      r.backward(t);
      if (t == faulty_step) {
        const std::uint64_t at = io->calls() + k;
        io->set_fault([at, disk_gone](std::uint64_t call, const offload::IoRequest&) {
          const bool fail = disk_gone ? call >= at : call == at;
          return fail ? offload::Fault{offload::Fault::Kind::Error, EIO} : offload::Fault{};
        });
      }
      bool failed = false;
      try {
        r.engine->step();
      } catch (const IoError&) {
        failed = true;
      }
      io->set_fault(nullptr);
      if (!failed) break;
      INFO("step " << t << ": I/O call " << k << " of the step failed");
      REQUIRE(r.snapshot() == before);
      ++result.failures;
    }
  }
  for (std::size_t i = 0; i < r.specs.size(); ++i) {
    result.params.push_back(r.engine->gather_master(i));
  }
  return result;
}

TEST_CASE(
    "a stage-3 step whose parameter or optimizer NVMe I/O fails at any call changes "
    "nothing, and training continues bitwise",
    "[offload]") {
  TempDir nvme("zero_nvme");
  for (const char* precision : {"fp32", "bf16"}) {
    // The optimizer state all on NVMe, partly (ratio: resident sub-groups step after the ranks
    // agree), or in host memory; with no persistent unit, or with the first and last layers
    // persistent (their gathered copies are refreshed from the parameter store after the step;
    // the first layer's record is no longer cached by then).
    for (const char* optimizer : {"nvme", "ratio", "cpu"}) {
      for (int persistence : {0, 400}) {
        json c = base_config(3, precision, 1);
        c["zero_optimization"]["stage3_param_persistence_threshold"] = persistence;
        c = with_param_nvme(with_offload(c, optimizer, nvme.str()), nvme.str());
        const FaultRun plain = train_with_io_faults(c, true, -1);
        REQUIRE(plain.failures == 0);
        const bool optimizer_io = std::string(optimizer) != "cpu";
        for (bool params : {true, false}) {
          if (!params && !optimizer_io) continue;
          for (bool disk_gone : {false, true}) {
            INFO(precision << ", optimizer " << optimizer << ", persistence " << persistence
                           << (params ? ": parameter" : ": optimizer") << " store fails "
                           << (disk_gone ? "from one call on" : "once"));
            const FaultRun faulty = train_with_io_faults(c, params, 2, disk_gone);
            CHECK(faulty.failures >= 4);
            REQUIRE(faulty.params.size() == plain.params.size());
            for (std::size_t i = 0; i < plain.params.size(); ++i) {
              REQUIRE(faulty.params[i] == plain.params[i]);
            }
          }
        }
      }
    }
  }
  CHECK(std::filesystem::is_empty(nvme.path()));
}

TEST_CASE(
    "a checkpoint load into NVMe does its I/O before the ranks agree: a failure at any "
    "call changes nothing, and no whole copy of the state is held in memory",
    "[offload]") {
  TempDir nvme("zero_nvme");
  TempDir ckpt("zero_nvme_load");
  OneRank r(with_offload(base_config(2, "fp32", 1), "nvme", nvme.str()));
  Engine* engine = r.engine.get();
  Device* device = r.device.get();
  offload::AsyncIo* io = r.impl().optimizer_io();
  REQUIRE(io != nullptr);
  auto train_step = [&](int t) {
    r.backward(t);
    engine->step();
  };
  auto snapshot = [&] { return r.snapshot(); };
  train_step(0);
  train_step(1);
  engine->save_checkpoint(ckpt.str(), "saved");
  const auto saved = snapshot();
  train_step(2);
  const auto later = snapshot();
  REQUIRE(later != saved);
  std::size_t state_bytes = device->ledger().total(MemoryKind::Nvme).current_bytes / 2;
  REQUIRE(state_bytes > 0);
  for (bool disk_gone : {false, true}) {
    INFO((disk_gone ? "every I/O call from one on fails" : "one I/O call fails"));
    int failures = 0;
    for (std::uint64_t k = 0;; ++k) {
      const std::uint64_t at = io->calls() + k;
      io->set_fault([at, disk_gone](std::uint64_t call, const offload::IoRequest&) {
        const bool fail = disk_gone ? call >= at : call == at;
        return fail ? offload::Fault{offload::Fault::Kind::Error, EIO} : offload::Fault{};
      });
      device->ledger().reset_peaks();
      const std::size_t host_before = device->ledger().total(MemoryKind::Host).current_bytes;
      bool failed = false;
      try {
        engine->load_checkpoint(ckpt.str(), "saved");
      } catch (const Error&) {
        failed = true;
      }
      io->set_fault(nullptr);
      // What the load held in host memory beyond what was there: one block per tensor, not the
      // state (sub-groups of 100 elements here, a block of one aligned 4 KiB page each).
      CHECK(device->ledger().total(MemoryKind::Host).peak_bytes - host_before < state_bytes);
      if (!failed) break;
      INFO("I/O call " << k << " of the load failed");
      REQUIRE(snapshot() == later);
      ++failures;
    }
    CHECK(failures >= 4);
    REQUIRE(snapshot() == saved);
    train_step(2);  // and training goes on from there
    CHECK(snapshot() == later);
  }
}

// On a device the host cannot address the NVMe partition is stepped on the host and its model
// copy reaches the device through a mirror: a failed step must leave the device's copy as it was
// too (the undo is written to the mirror and copied back), and the run continue bitwise.
TEST_CASE("stepped on the host for a GPU, an NVMe step failing at any call changes nothing",
          "[offload]") {
  TempDir nvme("zero_nvme");
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    const json c = with_offload(base_config(stage, "bf16", 1), "nvme", nvme.str());
    const FaultRun plain = train_with_io_faults(c, false, -1);
    REQUIRE(plain.failures == 0);
    for (bool disk_gone : {false, true}) {
      const FaultRun faulty = train_with_io_faults(c, false, 2, disk_gone, /*stand_in=*/true);
      CHECK(faulty.failures >= 4);
      REQUIRE(faulty.params == plain.params);
    }
  }
}

TEST_CASE("a device with room for the model and state but not the buckets: an error at create",
          "[offload]") {
  for (bool overlap : {false, true}) {
    INFO("overlap_comm " << overlap);
    json c = base_config(2, "fp32", 1);
    c["zero_optimization"]["overlap_comm"] = overlap;
    OneRank free_run(c);
    const std::size_t at_create = free_run.engine->memory().total(MemoryKind::Device).current_bytes;
    free_run.backward(0);
    free_run.engine->step();
    const std::size_t buckets =
        free_run.engine->memory().at(MemoryKind::Device, MemoryTag::Buckets).current_bytes;
    REQUIRE(buckets > 0);
    CHECK_THROWS_WITH(OneRank(c, false, at_create + buckets / 2),
                      Catch::Contains("zero_optimization.reduce_bucket_size") &&
                          Catch::Contains("lower reduce_bucket_size") &&
                          Catch::Contains(overlap ? "two slots" : "one slot"));
    // With room for the buckets, the same budget trains (the check counts what is allocated).
    OneRank fits(c, false, at_create + buckets + (std::size_t{1} << 16));
    fits.backward(0);
    fits.engine->step();
    CHECK(fits.snapshot() == free_run.snapshot());
  }
}

TEST_CASE("offload_param.buffer_size below a unit's slice is an error naming both", "[offload]") {
  TempDir nvme("zero_nvme");
  CHECK_THROWS_WITH(run_world(with_param_nvme(base_config(3, "fp32", 1), nvme.str(), 10), 1, 1),
                    Catch::Contains("zero_optimization.offload_param.buffer_size") &&
                        Catch::Contains("raise buffer_size to at least"));
}

TEST_CASE("a list of nvme_path folders stripes the swap files over them, bitwise", "[offload]") {
  TempDir a("zero_nvme_a");
  TempDir b("zero_nvme_b");
  const json plain = base_config(2, "bf16", 1);
  json striped = with_offload(plain, "nvme", a.str());
  striped["zero_optimization"]["offload_optimizer"]["nvme_path"] = {a.str(), b.str()};
  const TrainResult r = run_world(striped, 2);
  require_bitwise_equal(run_world(plain, 2), r);
  CHECK(r.memory[0].total(MemoryKind::Nvme).current_bytes > 0);
  CHECK(std::filesystem::is_empty(a.path()));
  CHECK(std::filesystem::is_empty(b.path()));
}

TEST_CASE("gradient accumulation with NVMe offload stays bitwise", "[offload]") {
  TempDir nvme("zero_nvme");
  const json plain = base_config(2, "bf16", 3);
  require_bitwise_equal(run_world(plain, 2), run_world(with_offload(plain, "nvme", nvme.str()), 2));
}

TEST_CASE("a checkpoint saved from NVMe resumes bitwise, into NVMe or into memory", "[offload]") {
  TempDir nvme("zero_nvme");
  const json plain = base_config(3, "fp32", 1);
  const TrainResult whole = run_world(plain, 2, 6);
  // 1030 elements: a rank's last sub-group is more than a page shorter than the first, so a
  // load's writes must still reach the end of its record in the swap file.
  for (int sub_group : {100, 1030}) {
    INFO("sub_group_size " << sub_group);
    TempDir ckpt("zero_nvme_ckpt");
    json off = with_param_nvme(with_offload(plain, "nvme", nvme.str()), nvme.str());
    off["zero_optimization"]["sub_group_size"] = sub_group;
    TrainSpec save;
    save.config = off;
    save.world = 2;
    save.steps = 3;
    save.model = kModel;
    save.save_dir = ckpt.str();
    save.save_after = 3;
    train(save);
    for (const json& c : {off, plain}) {
      TrainSpec resume = save;
      resume.config = c;
      resume.steps = 6;
      resume.save_dir.clear();
      resume.save_after = -1;
      resume.load_dir = ckpt.str();
      require_bitwise_equal(whole, train(resume));
    }
  }
}

TEST_CASE("a device budget smaller than the optimizer state: refused in memory, trained via NVMe",
          "[offload]") {
  TempDir nvme("zero_nvme");
  const json plain = base_config(2, "fp32", 1);
  const TrainResult free_run = run_world(plain, 2);
  const MemorySnapshot& m = free_run.memory[0];
  const std::size_t state = m.at(MemoryKind::Device, MemoryTag::MasterParams).current_bytes +
                            m.at(MemoryKind::Device, MemoryTag::OptimizerStates).current_bytes;
  const std::size_t others = m.total(MemoryKind::Device).peak_bytes - state;
  REQUIRE(state > 0);
  // Room for everything but half of the optimizer state.
  const std::size_t budget = others + state / 2;
  TrainSpec spec;
  spec.config = plain;
  spec.world = 2;
  spec.steps = 4;
  spec.model = kModel;
  spec.device_budget = budget;
  CHECK_THROWS_AS(train(spec), OutOfMemory);
  CHECK_THROWS_WITH(train(spec),
                    Catch::Contains("optimizer_states") || Catch::Contains("master_params"));
  spec.config = with_offload(plain, "nvme", nvme.str());
  const TrainResult via_nvme = train(spec);
  require_bitwise_equal(free_run, via_nvme);
  for (const MemorySnapshot& r : via_nvme.memory) {
    CHECK(r.total(MemoryKind::Device).peak_bytes <= budget);
    CHECK(r.total(MemoryKind::Nvme).current_bytes >= state);  // two slots of every sub-group
  }
}

TEST_CASE("a full filesystem under nvme_path: an error naming the file, and no swap file left",
          "[offload]") {
  // A 64 KiB tmpfs (root only; without it the fault injection of subgroup_store_test covers
  // ENOSPC). tmpfs has no O_DIRECT: the swap files fall back to the page cache.
  TempDir dir("zero_nvme_full");
  const std::string mount = "mount -t tmpfs -o size=64k zero_full " + dir.str() + " 2>/dev/null";
  if (std::system(mount.c_str()) != 0) {
    WARN("cannot mount a tmpfs here (not root?): the full-disk case is covered by fault injection");
    return;
  }
  json c = with_offload(base_config(2, "fp32", 1), "nvme", dir.str());
  c["zero_optimization"]["sub_group_size"] = 4096;
  CHECK_THROWS_WITH(train_config(c, 1, 2, "mlp:64,256,256,8"),
                    Catch::Contains("optimizer.swp") && Catch::Contains("No space left on device"));
  CHECK(std::filesystem::is_empty(dir.path()));
  CHECK(std::system(("umount " + dir.str()).c_str()) == 0);
}

TEST_CASE("a bad nvme_path is a config error naming the key and the path", "[offload]") {
  json c = with_offload(base_config(2, "fp32", 1), "nvme", "/nonexistent/zero-swap");
  CHECK_THROWS_WITH(run_world(c, 1, 1),
                    Catch::Contains("zero_optimization.offload_optimizer.nvme_path") &&
                        Catch::Contains("/nonexistent/zero-swap") &&
                        Catch::Contains("does not exist"));
}

}  // namespace
}  // namespace zero::test
