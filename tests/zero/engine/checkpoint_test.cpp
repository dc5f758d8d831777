// Checkpoints: exact resume at the same world size and stage, resharding to others, refusal of
// corrupted or incomplete checkpoints (state left untouched), crash safety under SIGKILL, failed
// saves that leave nothing behind, a load's model copy the same whether written into in-process
// peers or all-gathered, and a manifest parser that survives arbitrary edits.
#include "zero/checkpoint/checkpoint.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "tests/corrupt_file.h"
#include "tests/temp_dir.h"
#include "tests/zero/engine/engine_test_util.h"
#include "zero/base/error.h"
#include "zero/comm/testing/faulty_communicator.h"
#include "zero/engine/engine_impl.h"

namespace zero::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Resharded runs sum gradients over other rank groupings: equal within this.
constexpr double kReshardTol = 1e-5;

TrainResult run(const json& cfg, int world, int steps, const std::string& save_dir = {},
                int save_after = -1, const std::string& load_dir = {}) {
  return train_run(cfg, world, steps, save_dir, save_after, load_dir);
}

json config_for(int stage, const std::string& precision, int world, int global_micro = 12) {
  json c = base_config(stage, precision, 1, global_micro / world);
  c["zero_optimization"]["stage3_param_persistence_threshold"] = 20;
  return c;
}

TEST_CASE("a resumed run equals an uninterrupted one bitwise at the same world size and stage",
          "[engine][checkpoint]") {
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (int world : {1, 3}) {
        INFO(precision << " stage " << stage << ", " << world << " ranks");
        TempDir dir;
        json c = config_for(stage, precision, world);
        if (precision == "bf16" && stage == 2) {
          c["bf16"]["bf16_master_weights_and_grads"] =
              true;  // 16-bit masters go through fp32 files
          c["bf16"]["bf16_optimizer_states"] = true;
        }
        const TrainResult whole = run(c, world, 6, dir.str(), 3);
        REQUIRE(ckpt::read_latest(dir.str()) == "step3");
        const TrainResult resumed = run(c, world, 6, {}, -1, dir.str());
        require_bitwise_equal(whole, resumed);
        // The resumed run took exactly the remaining steps.
        REQUIRE(resumed.steps.size() == 3);
        CHECK(resumed.steps.front().global_steps == 4);
      }
    }
  }
}

TEST_CASE("a checkpoint reshards on load to any world size and stage", "[engine][checkpoint]") {
  struct Case {
    int save_world, save_stage, load_world, load_stage;
  };
  for (const std::string precision : {"fp32", "bf16"}) {
    for (const Case k : {Case{4, 3, 3, 1}, Case{2, 0, 4, 2}, Case{1, 1, 3, 3}, Case{3, 2, 2, 0},
                         Case{4, 1, 4, 3}}) {
      INFO(precision << ": saved at " << k.save_world << " ranks stage " << k.save_stage
                     << ", loaded at " << k.load_world << " ranks stage " << k.load_stage);
      TempDir dir;
      const TrainResult whole =
          run(config_for(k.save_stage, precision, k.save_world), k.save_world, 6, dir.str(), 3);
      const TrainResult resumed = run(config_for(k.load_stage, precision, k.load_world),
                                      k.load_world, 6, {}, -1, dir.str());
      REQUIRE(resumed.steps.size() == 3);
      const double tol = precision == "fp32" ? kReshardTol : 3e-3;  // bf16: rounded sums differ
      CHECK(max_abs_diff(whole.params, resumed.params) < tol);
      CHECK(max_abs_diff(resumed.params, resumed.initial) > 1e-3);
      if (k.save_world == k.load_world && precision == "fp32") {
        // Same world size, other stage: the sums are the same, so is the result.
        require_bitwise_equal(whole, resumed);
      }
    }
  }
}

TEST_CASE("a corrupted, incomplete or foreign checkpoint is refused by name and changes nothing",
          "[engine][checkpoint]") {
  const json c = config_for(2, "fp32", 2);
  TempDir good;
  run(c, 2, 3, good.str(), 3);  // the checkpoint the cases below damage copies of
  auto copy = [&](const TempDir& to) {
    fs::copy(good.path(), to.path(),
             fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  };
  auto load_error = [&](const std::string& dir) -> std::string {
    try {
      run(c, 2, 4, {}, -1, dir);
    } catch (const std::exception& e) {
      return e.what();
    }
    return {};
  };
  {
    TempDir d;
    copy(d);
    flip_byte(d.str() + "/step3/" + ckpt::rank_file_name(1, 2), "exp_avg_sq");
    const std::string e = load_error(d.str());
    CHECK_THAT(e, Catch::Contains("'exp_avg_sq'") && Catch::Contains("rank_00001_of_00002") &&
                      Catch::Contains("corrupted"));
  }
  {
    TempDir d;
    copy(d);
    fs::remove(d.str() + "/step3/" + ckpt::rank_file_name(0, 2));
    CHECK_THAT(load_error(d.str()),
               Catch::Contains("rank_00000_of_00002.safetensors") && Catch::Contains("missing"));
  }
  {
    TempDir d;
    copy(d);
    json m = json::parse(std::ifstream(d.str() + "/step3/manifest.json"));
    m["format_version"] = ckpt::kFormatVersion + 1;
    std::ofstream(d.str() + "/step3/manifest.json") << m.dump();
    CHECK_THAT(load_error(d.str()), Catch::Contains("format_version") && Catch::Contains("newer"));
  }
  {
    TempDir d;
    copy(d);
    json m = json::parse(std::ifstream(d.str() + "/step3/manifest.json"));
    m["params"][0]["numel"] = m["params"][0]["numel"].get<int>() + 1;
    std::ofstream(d.str() + "/step3/manifest.json") << m.dump();
    CHECK_THAT(load_error(d.str()), Catch::Contains("params[0].numel") && Catch::Contains("shape"));
  }
  TempDir empty;
  CHECK_THAT(load_error(empty.str()), Catch::Contains("not a checkpoint directory"));
  // A model that does not match: another shape.
  {
    TrainSpec spec;
    spec.config = c;
    spec.world = 2;
    spec.steps = 4;
    spec.model = "mlp:8,20,16,4";
    spec.load_dir = good.str();
    CHECK_THROWS_WITH(train(spec), Catch::Contains("layers.0.weight") && Catch::Contains("shape"));
  }
  // After a refused load the engine goes on exactly as if it had never tried.
  run_ranks(1, [&](Communicator& comm) {
    config::Supplied s;
    s.world_size = 1;
    const config::DsConfig cfg = config::load_config_json(config_for(1, "fp32", 1), s);
    std::vector<ParamSpec> specs = {{"w", {10}, DType::F32, 0, 0, true}};
    auto device = make_device("cpu", 0);
    auto engine = Engine::create(cfg, comm, *device, specs, [](std::size_t, std::span<float> v) {
      std::fill(v.begin(), v.end(), 0.25f);
    });
    const std::vector<float> before = engine->gather_master(0);
    bool threw = false;
    try {
      engine->load_checkpoint(good.str());  // another model
    } catch (const IoError&) {
      threw = true;
    }
    if (!threw || engine->gather_master(0) != before || engine->global_steps() != 0) {
      throw Error("a refused load changed the engine");
    }
  });
}

TEST_CASE("a save killed at any point never damages the previous checkpoint",
          "[engine][checkpoint]") {
  TempDir dir;
  const json c = config_for(2, "bf16", 1);
  // A first complete checkpoint.
  run(c, 1, 2, dir.str(), 2);
  std::mt19937 rng(1234);
  int killed_mid_save = 0;
  for (int attempt = 0; attempt < 12; ++attempt) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // Saves over and over (new tags) until killed.
      try {
        TrainSpec spec;
        spec.config = c;
        spec.world = 1;
        spec.steps = 3;
        spec.model = "mlp:64,256,256,64";  // ~90K parameters: a save takes a while
        for (int i = 0; i < 1000; ++i) {
          spec.save_dir = dir.str();
          spec.save_after = 1 + i % 3;
          train(spec);
        }
      } catch (...) {
      }
      ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 200));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    killed_mid_save += WIFSIGNALED(status);
    // Whatever `latest` names is complete and verifies.
    const auto reader = ckpt::CheckpointReader::open(dir.str());
    for (int r = 0; r < reader.manifest().world_size; ++r)
      REQUIRE_NOTHROW(reader.verify_rank_file(r));
  }
  CHECK(killed_mid_save == 12);
}

// Two units of two parameters, 2 ranks: small engines built directly, for the cases below.
const std::vector<ParamSpec> kSmallSpecs = {{"a.weight", {40, 30}, DType::F32, 0, 0, true},
                                            {"a.bias", {30}, DType::F32, 0, 0, true},
                                            {"b.weight", {30, 50}, DType::F32, 0, 1, true},
                                            {"b.bias", {50}, DType::F32, 0, 1, true}};

std::unique_ptr<Engine> small_engine(Communicator& comm, Device& device, float value,
                                     int stage = 2) {
  config::Supplied s;
  s.world_size = comm.size();
  const config::DsConfig cfg =
      config::load_config_json(config_for(stage, "fp32", comm.size(), 6 * comm.size()), s);
  return Engine::create(cfg, comm, device, kSmallSpecs, [&](std::size_t i, std::span<float> v) {
    for (std::size_t j = 0; j < v.size(); ++j)
      v[j] = value + 0.001f * static_cast<float>(i + j % 7);
  });
}

// One optimizer step with gradients fixed by (rank, parameter, element).
void small_step(Engine& engine, int rank) {
  for (std::size_t u = 0; u < engine.num_units(); ++u) engine.gather(static_cast<int>(u));
  for (std::size_t i = kSmallSpecs.size(); i-- > 0;) {
    std::span<std::byte> g = engine.grad(i);
    std::vector<float> v(g.size() / sizeof(float));
    for (std::size_t j = 0; j < v.size(); ++j)
      v[j] = 0.01f * static_cast<float>((rank + 1) * (j % 5)) - 0.02f;
    std::memcpy(g.data(), v.data(), g.size());
    engine.grad_ready(i);
  }
  for (std::size_t u = engine.num_units(); u-- > 0;) engine.release(static_cast<int>(u));
  engine.step();
}

std::vector<std::vector<float>> masters(Engine& engine) {
  std::vector<std::vector<float>> out;
  for (std::size_t i = 0; i < kSmallSpecs.size(); ++i) out.push_back(engine.gather_master(i));
  return out;
}

// The model copy (fp32) of every parameter, as a forward pass sees it.
std::vector<std::vector<float>> model_copy(Engine& engine) {
  std::vector<std::vector<float>> out;
  for (std::size_t u = 0; u < engine.num_units(); ++u) engine.gather(static_cast<int>(u));
  for (std::size_t i = 0; i < kSmallSpecs.size(); ++i) {
    const std::span<const std::byte> p = engine.param(i);
    out.emplace_back(p.size() / sizeof(float));
    std::memcpy(out.back().data(), p.data(), p.size());
  }
  for (std::size_t u = engine.num_units(); u-- > 0;) engine.release(static_cast<int>(u));
  return out;
}

TEST_CASE("a load that finds a corrupted tensor after reading others leaves the engine as it was",
          "[engine][checkpoint]") {
  TempDir good;
  run_ranks(2, [&](Communicator& comm) {
    auto device = make_device("cpu", comm.rank());
    auto engine = small_engine(comm, *device, 0.25f);
    small_step(*engine, comm.rank());
    engine->save_checkpoint(good.str(), "step1");
  });
  // The engine's model copy after a refused load, and its state after one more step, against an
  // engine that never tried; and, so the comparison is not vacuous, what a good load gives.
  auto after = [&](const std::string& load_dir, std::string* error) {
    std::vector<std::vector<float>> result;
    run_ranks(2, [&](Communicator& comm) {
      auto device = make_device("cpu", comm.rank());
      auto engine = small_engine(comm, *device, 0.5f);
      if (!load_dir.empty()) {
        try {
          engine->load_checkpoint(load_dir);
        } catch (const IoError& e) {
          if (comm.rank() == 0) *error = e.what();
        }
      }
      std::vector<std::vector<float>> model = model_copy(*engine);
      small_step(*engine, comm.rank());
      std::vector<std::vector<float>> m = masters(*engine);
      if (comm.rank() == 0) {
        m.push_back({static_cast<float>(engine->global_steps())});
        m.insert(m.end(), model.begin(), model.end());
        result = std::move(m);
      }
    });
    return result;
  };
  const auto untouched = after({}, nullptr);
  std::string error;
  const auto loaded = after(good.str(), &error);
  REQUIRE(error.empty());
  REQUIRE(loaded != untouched);
  // exp_avg_sq is the last tensor read: master and exp_avg were read whole before it fails. And
  // master itself, of the other rank's file.
  for (const auto& [rank, tensor] :
       std::vector<std::pair<int, std::string>>{{0, "exp_avg_sq"}, {1, "master"}}) {
    INFO("corrupted: " << tensor << " of rank " << rank << "'s file");
    TempDir bad;
    fs::copy(good.path(), bad.path(), fs::copy_options::recursive);
    flip_byte(bad.str() + "/step1/" + ckpt::rank_file_name(rank, 2), tensor);
    error.clear();
    const auto refused = after(bad.str(), &error);
    CHECK_THAT(error, Catch::Contains("'" + tensor + "'") &&
                          Catch::Contains(ckpt::rank_file_name(rank, 2)) &&
                          Catch::Contains("corrupted"));
    CHECK(refused == untouched);
  }
}

TEST_CASE("a load writes the same model copy into in-process peers as an all-gather brings",
          "[engine][checkpoint]") {
  // In-process ranks share an address space: each rank writes its slices into the peers' model
  // copies as it reads them. Behind a wrapper that does not say so, the load all-gathers them.
  for (int stage : {1, 2}) {
    for (int world : {2, 3}) {
      INFO("stage " << stage << ", " << world << " ranks");
      TempDir dir;
      std::vector<std::vector<float>> saved, initial;
      run_ranks(world, [&](Communicator& comm) {
        auto device = make_device("cpu", comm.rank());
        auto engine = small_engine(comm, *device, 0.25f, stage);
        small_step(*engine, comm.rank());
        engine->save_checkpoint(dir.str(), "step1");
        std::vector<std::vector<float>> model = model_copy(*engine);
        if (comm.rank() == 0) saved = std::move(model);
      });
      auto loaded = [&](bool wrapped) {
        std::vector<std::vector<std::vector<float>>> per_rank(static_cast<std::size_t>(world));
        run_ranks(world, [&](Communicator& comm) {
          FaultyCommunicator gathering(comm, 0);  // never fails; shares no address space
          Communicator& c = wrapped ? static_cast<Communicator&>(gathering) : comm;
          REQUIRE(c.shares_address_space() == !wrapped);
          auto device = make_device("cpu", comm.rank());
          auto engine = small_engine(c, *device, 0.5f, stage);
          std::vector<std::vector<float>> before = model_copy(*engine);
          if (comm.rank() == 0 && !wrapped) initial = std::move(before);
          engine->load_checkpoint(dir.str());
          per_rank[static_cast<std::size_t>(comm.rank())] = model_copy(*engine);
        });
        return per_rank;
      };
      const auto pushed = loaded(false);
      const auto gathered = loaded(true);
      REQUIRE(saved != initial);  // the load has something to change
      for (int r = 0; r < world; ++r) {
        INFO("rank " << r);
        CHECK(pushed[static_cast<std::size_t>(r)] == saved);
        CHECK(gathered[static_cast<std::size_t>(r)] == saved);
      }
    }
  }
}

TEST_CASE("a save that fails with ENOSPC leaves no temporary folder and the previous checkpoint",
          "[engine][checkpoint]") {
  TempDir dir;
  // Write calls of a rank file: the header, then one per tensor of this size (one piece each).
  constexpr std::size_t kHeader = 0, kMaster = 1, kLastState = 3;
  for (int failing : {0, 1}) {
    for (std::size_t call : {kHeader, kMaster, kLastState}) {
      INFO("rank " << failing << " fails write call " << call);
      std::vector<std::string> errors(2);
      const bool first = !fs::exists(dir.path() / "step1");
      run_ranks(2, [&](Communicator& comm) {
        auto device = make_device("cpu", comm.rank());
        auto engine = small_engine(comm, *device, 0.25f);
        auto& impl = dynamic_cast<engine_detail::EngineImpl&>(*engine);
        if (first) engine->save_checkpoint(dir.str(), "step1");
        if (comm.rank() == failing) {
          impl.set_checkpoint_write_fault([&](std::size_t n) { return n == call ? ENOSPC : 0; });
        }
        // A new tag, and the tag `latest` names (which the save would replace).
        for (const char* tag : {"step2", "step1"}) {
          try {
            engine->save_checkpoint(dir.str(), tag);
          } catch (const IoError& e) {
            errors[static_cast<std::size_t>(comm.rank())] += e.what();
          }
        }
      });
      for (const std::string& e : errors) CHECK_THAT(e, Catch::Contains(std::strerror(ENOSPC)));
      std::vector<std::string> left;
      for (const auto& entry : fs::recursive_directory_iterator(dir.path()))
        left.push_back(fs::relative(entry.path(), dir.path()).string());
      std::sort(left.begin(), left.end());
      CHECK(left == std::vector<std::string>{"latest", "step1", "step1/manifest.json",
                                             "step1/" + ckpt::rank_file_name(0, 2),
                                             "step1/" + ckpt::rank_file_name(1, 2)});
      CHECK(ckpt::read_latest(dir.str()) == "step1");
      const auto reader = ckpt::CheckpointReader::open(dir.str());
      for (int r = 0; r < 2; ++r) CHECK_NOTHROW(reader.verify_rank_file(r));
    }
  }
}

TEST_CASE("tied names are checked at registration and recorded in the manifest",
          "[engine][checkpoint]") {
  TempDir dir;
  config::Supplied s;
  s.world_size = 1;
  const config::DsConfig cfg = config::load_config_json(config_for(1, "fp32", 1), s);
  auto init = [](std::size_t, std::span<float> v) { std::fill(v.begin(), v.end(), 0.5f); };
  std::string duplicate_error;
  run_ranks(1, [&](Communicator& comm) {
    auto device = make_device("cpu", 0);
    std::vector<ParamSpec> specs = {
        {"embed.weight", {4, 3}, DType::F32, 0, 0, true, {"lm_head.weight"}},
        {"norm.weight", {3}, DType::F32, 0, 0, true}};
    auto engine = Engine::create(cfg, comm, *device, specs, init);
    engine->save_checkpoint(dir.str(), "tied");
    specs[1].tied_names = {"lm_head.weight"};
    try {
      Engine::create(cfg, comm, *device, specs, init);
    } catch (const Error& e) {
      duplicate_error = e.what();
    }
  });
  const auto reader = ckpt::CheckpointReader::open(dir.str(), "tied");
  CHECK(reader.manifest().params[0].aliases == std::vector<std::string>{"lm_head.weight"});
  CHECK(reader.manifest().params[1].aliases.empty());
  CHECK_THAT(duplicate_error, Catch::Contains("'norm.weight': tied name 'lm_head.weight'"));
}

TEST_CASE("the manifest parser survives arbitrary edits", "[engine][checkpoint]") {
  TempDir dir;
  run(config_for(3, "fp32", 2), 2, 1, dir.str(), 1);
  const json original = json::parse(std::ifstream(dir.str() + "/step1/manifest.json"));
  std::mt19937 rng(99);
  const std::vector<json> values = {json(),           json(-1),  json(0),       json(1),
                                    json(1ull << 62), json("x"), json::array(), json::object(),
                                    json(1.5),        json(true)};
  std::size_t refused = 0, accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    json m = original;
    // Replace a random leaf (or container) with a random value.
    std::vector<json::json_pointer> paths;
    std::function<void(const json&, const json::json_pointer&)> walk =
        [&](const json& v, const json::json_pointer& p) {
          paths.push_back(p);
          if (v.is_object()) {
            for (const auto& [k, x] : v.items()) walk(x, p / k);
          } else if (v.is_array()) {
            for (std::size_t k = 0; k < v.size(); ++k) walk(v[k], p / k);
          }
        };
    walk(m, json::json_pointer());
    const auto& target = paths[1 + rng() % (paths.size() - 1)];
    m[target] = values[rng() % values.size()];
    try {
      const ckpt::Manifest parsed = ckpt::Manifest::from_json(m, "fuzz");
      ++accepted;
      // Anything accepted is self-consistent: every trainable parameter lies inside its unit.
      for (const ckpt::ParamEntry& p : parsed.params) {
        if (!p.trainable) continue;
        REQUIRE(p.offset + p.numel <=
                parsed.units.at(static_cast<std::size_t>(p.unit)).padded_elems);
      }
    } catch (const IoError&) {
      ++refused;
    }
  }
  CHECK(refused > 1000);
  CHECK(accepted > 0);
}

}  // namespace
}  // namespace zero::test
