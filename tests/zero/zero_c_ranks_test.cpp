// The C ABI over real worlds: engines over a callback communicator (threads whose callbacks
// delegate to InProcComm), over shared memory (forked processes), and over the launcher's
// environment (forked processes with torchrun's variables) train bitwise like the C++ engine on
// in-process ranks, and a checkpoint saved through the C ABI at one world size loads at another.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "config/ds_config.h"
#include "kernels/cast.h"
#include "tests/temp_dir.h"
#include "tests/zero/comm/forked_ranks.h"
#include "zero/comm/inproc_comm.h"
#include "zero/device/device.h"
#include "zero/engine.h"
#include "zero/zero_c.h"

namespace {

constexpr std::int64_t kShape0[] = {6, 10};
constexpr std::int64_t kShape1[] = {10};
constexpr std::size_t kNumel[] = {60, 10};
constexpr std::size_t kTotal = 70;
constexpr int kSteps = 6;

std::string config_text(int stage, int world) {
  return R"({"train_batch_size": )" + std::to_string(2 * world) +
         R"(, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.5,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.01}},
  "zero_optimization": {"stage": )" +
         std::to_string(stage) +
         R"(, "reduce_bucket_size": 16, "stage3_param_persistence_threshold": 0}})";
}

float initial(std::size_t p, std::size_t e) {
  return 0.5f - 0.013f * static_cast<float>(e + 7 * p);
}

// Each rank's gradient differs (so the reduction matters) and depends on the weights.
float gradient(int rank, int micro, std::size_t p, std::size_t e, float w) {
  const float target = std::sin(0.3f * static_cast<float>(e + 11 * p));
  return (w - target) * (1.0f + 0.25f * static_cast<float>(rank)) +
         0.01f * static_cast<float>(micro);
}

int init_values(void*, std::size_t index, float* out, std::size_t numel) {
  for (std::size_t e = 0; e < numel; ++e) out[e] = initial(index, e);
  return 0;
}

const zero_param_spec kSpecs[] = {
    {"w", kShape0, 2, ZERO_DTYPE_BF16, 0, 0, 1, nullptr, 0},
    {"b", kShape1, 1, ZERO_DTYPE_BF16, 0, 1, 1, nullptr, 0},
};

void require_ok(int status) {
  if (status != ZERO_OK) throw std::runtime_error(zero_last_error());
}

// Trains through the C ABI; returns every parameter's fp32 master value, concatenated.
std::vector<float> train_c(zero_comm* comm, int rank, int stage, int world) {
  const std::string config = config_text(stage, world);
  zero_engine* e = nullptr;
  require_ok(
      zero_engine_create(config.c_str(), comm, kSpecs, 2, nullptr, init_values, nullptr, &e));
  for (int step = 0; step < kSteps; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      std::vector<std::vector<float>> grads(2);
      for (int u = 0; u < 2; ++u) require_ok(zero_engine_gather(e, u));
      for (std::size_t p = 0; p < 2; ++p) {
        const void* data = nullptr;
        std::size_t bytes = 0;
        require_ok(zero_engine_param(e, p, &data, &bytes));
        std::vector<float> w(kNumel[p]);
        zero::kernels::cast_cpu(data, zero::DType::BF16, w.data(), zero::DType::F32, w.size());
        for (std::size_t i = 0; i < w.size(); ++i)
          grads[p].push_back(gradient(rank, micro, p, i, w[i]));
      }
      for (std::size_t p = 2; p-- > 0;) {
        void* slot = nullptr;
        std::size_t bytes = 0;
        require_ok(zero_engine_grad(e, p, &slot, &bytes));
        zero::kernels::cast_cpu(grads[p].data(), zero::DType::F32, slot, zero::DType::BF16,
                                kNumel[p]);
        require_ok(zero_engine_grad_ready(e, p));
        require_ok(zero_engine_release(e, static_cast<int>(p)));
      }
      require_ok(zero_engine_step(e, nullptr));
    }
  }
  std::vector<float> out(kTotal);
  require_ok(zero_engine_gather_master(e, 0, out.data(), kNumel[0]));
  require_ok(zero_engine_gather_master(e, 1, out.data() + kNumel[0], kNumel[1]));
  zero_engine_destroy(e);
  return out;
}

// The same training on the C++ engine over in-process ranks: the reference.
std::vector<float> train_inproc(int stage, int world) {
  std::vector<float> out;
  zero::run_ranks(world, [&](zero::Communicator& comm) {
    const auto config = zero::config::load_config_string(config_text(stage, world),
                                                         {.world_size = world, .values = {}});
    auto device = zero::make_device("cpu", comm.rank());
    std::vector<zero::ParamSpec> specs = {{"w", {6, 10}, zero::DType::BF16, 0, 0},
                                          {"b", {10}, zero::DType::BF16, 0, 1}};
    auto engine = zero::Engine::create(config, comm, *device, specs,
                                       [](std::size_t index, std::span<float> v) {
                                         init_values(nullptr, index, v.data(), v.size());
                                       });
    for (int step = 0; step < kSteps; ++step) {
      for (int micro = 0; micro < 2; ++micro) {
        std::vector<std::vector<float>> grads(2);
        for (int u = 0; u < 2; ++u) engine->gather(u);
        for (std::size_t p = 0; p < 2; ++p) {
          const auto data = engine->param(p);
          std::vector<float> w(kNumel[p]);
          zero::kernels::cast_cpu(data.data(), zero::DType::BF16, w.data(), zero::DType::F32,
                                  w.size());
          for (std::size_t i = 0; i < w.size(); ++i)
            grads[p].push_back(gradient(comm.rank(), micro, p, i, w[i]));
        }
        for (std::size_t p = 2; p-- > 0;) {
          zero::kernels::cast_cpu(grads[p].data(), zero::DType::F32, engine->grad(p).data(),
                                  zero::DType::BF16, kNumel[p]);
          engine->grad_ready(p);
          engine->release(static_cast<int>(p));
        }
        engine->step();
      }
    }
    std::vector<float> w = engine->gather_master(0), b = engine->gather_master(1);
    if (comm.rank() == 0) {
      out = w;
      out.insert(out.end(), b.begin(), b.end());
    }
  });
  return out;
}

// Guards against a vacuous pass: training moved every weight, by `mean_move` on average.
void require_trained(const std::vector<float>& v, double mean_move) {
  REQUIRE(v.size() == kTotal);
  double moved = 0;
  for (std::size_t e = 0; e < kNumel[0]; ++e) {
    REQUIRE(v[e] != initial(0, e));
    moved += std::abs(v[e] - initial(0, e));
  }
  REQUIRE(moved > mean_move * static_cast<double>(kNumel[0]));
}

// Callbacks over an InProcComm: what a framework's process group would do.
struct Bridge {
  zero::Communicator* comm;
};
zero::DType dtype_of(int d) {
  return d == ZERO_DTYPE_F16    ? zero::DType::F16
         : d == ZERO_DTYPE_BF16 ? zero::DType::BF16
         : d == ZERO_DTYPE_F64  ? zero::DType::F64
                                : zero::DType::F32;
}
zero::ReduceOp op_of(int op) {
  return op == ZERO_OP_AVG   ? zero::ReduceOp::Avg
         : op == ZERO_OP_MAX ? zero::ReduceOp::Max
                             : zero::ReduceOp::Sum;
}
int cb_reduce_scatter(void* u, const void* s, void* r, size_t n, int dt, int op) {
  static_cast<Bridge*>(u)->comm->reduce_scatter(s, r, n, dtype_of(dt), op_of(op)).wait();
  return 0;
}
int cb_all_gather(void* u, const void* s, void* r, size_t n, int dt) {
  static_cast<Bridge*>(u)->comm->all_gather(s, r, n, dtype_of(dt)).wait();
  return 0;
}
int cb_all_reduce(void* u, const void* s, void* r, size_t n, int dt, int op) {
  static_cast<Bridge*>(u)->comm->all_reduce(s, r, n, dtype_of(dt), op_of(op)).wait();
  return 0;
}
int cb_broadcast(void* u, void* b, size_t n, int dt, int root) {
  static_cast<Bridge*>(u)->comm->broadcast(b, n, dtype_of(dt), root).wait();
  return 0;
}
int cb_barrier(void* u) {
  static_cast<Bridge*>(u)->comm->barrier().wait();
  return 0;
}

// Children write their result here: one kTotal-float slot per rank.
std::vector<float> result_of(const zero::test::SharedRegion& region, int rank) {
  const float* base = reinterpret_cast<const float*>(region.data()) + rank * kTotal;
  return {base, base + kTotal};
}

// A forked rank: trains over `c`, writes its result into its slot of `region`, destroys `c`.
void train_into(zero::test::SharedRegion& region, zero_comm* c, int r, int stage, int world) {
  const std::vector<float> v = train_c(c, r, stage, world);
  std::memcpy(reinterpret_cast<float*>(region.data()) + r * kTotal, v.data(),
              kTotal * sizeof(float));
  zero_comm_destroy(c);
}

void expect_clean(const std::vector<zero::test::RankOutcome>& outcomes) {
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    INFO("rank " << r << ": " << outcomes[r].error);
    CHECK(outcomes[r].exit_code == 0);
  }
}

}  // namespace

TEST_CASE(
    "C ABI engines over callbacks, shared memory and the launcher's environment train "
    "bitwise like in-process ranks") {
  const int world = GENERATE(2, 3);
  const int stage = GENERATE(1, 3);
  INFO("world " << world << ", stage " << stage);
  const std::vector<float> reference = train_inproc(stage, world);
  require_trained(reference, 0.05);

  SECTION("callbacks") {
    zero::InProcWorld inproc(world);
    std::vector<std::vector<float>> results(static_cast<std::size_t>(world));
    std::vector<std::thread> threads;
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        auto comm = inproc.comm(r);
        Bridge bridge{comm.get()};
        const zero_comm_callbacks table{
            &bridge,      r,          world,  cb_reduce_scatter, cb_all_gather, cb_all_reduce,
            cb_broadcast, cb_barrier, nullptr};
        zero_comm* c = nullptr;
        try {
          require_ok(zero_comm_create_callbacks(&table, &c));
          results[static_cast<std::size_t>(r)] = train_c(c, r, stage, world);
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
          inproc.abort(e.what());
        }
        zero_comm_destroy(c);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r << ": " << errors[static_cast<std::size_t>(r)]);
      CHECK(results[static_cast<std::size_t>(r)] == reference);
    }
  }
  SECTION("shared memory, one process per rank") {
    zero::test::SharedRegion region(static_cast<std::size_t>(world) * kTotal * sizeof(float));
    const std::string name = zero::test::unique_shm_name("capi");
    zero::test::ForkedRanks ranks(world, [&](int r) {
      zero_comm* c = nullptr;
      require_ok(zero_comm_create_shm(name.c_str(), r, world, 20000, &c));
      const char* backend = nullptr;
      require_ok(zero_comm_backend(c, &backend));
      if (std::string(backend) != "shm")
        throw std::runtime_error("backend " + std::string(backend));
      train_into(region, c, r, stage, world);
    });
    expect_clean(ranks.wait());
    for (int r = 0; r < world; ++r) CHECK(result_of(region, r) == reference);
  }
  SECTION("the launcher's environment (torchrun's variables)") {
    zero::test::SharedRegion region(static_cast<std::size_t>(world) * kTotal * sizeof(float));
    const std::string port = std::to_string(20000 + ::getpid() % 20000);
    zero::test::ForkedRanks ranks(world, [&](int r) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      zero_comm* c = nullptr;
      require_ok(zero_comm_create_env(20000, &c));
      int rank = -1, size = -1;
      require_ok(zero_comm_rank(c, &rank));
      require_ok(zero_comm_size(c, &size));
      if (rank != r || size != world) throw std::runtime_error("rank/size from the environment");
      train_into(region, c, r, stage, world);
    });
    expect_clean(ranks.wait());
    for (int r = 0; r < world; ++r) CHECK(result_of(region, r) == reference);
  }
}

TEST_CASE("a checkpoint saved through the C ABI by 2 processes loads into 1 rank") {
  const zero::test::TempDir dir("zero_c_ranks_ckpt");
  const std::string name = zero::test::unique_shm_name("capi-ckpt");
  zero::test::SharedRegion region(kTotal * sizeof(float));
  zero::test::ForkedRanks ranks(2, [&](int r) {
    zero_comm* c = nullptr;
    require_ok(zero_comm_create_shm(name.c_str(), r, 2, 20000, &c));
    const std::string config = config_text(2, 2);
    zero_engine* e = nullptr;
    require_ok(zero_engine_create(config.c_str(), c, kSpecs, 2, nullptr, init_values, nullptr, &e));
    for (std::size_t p = 0; p < 2; ++p) {
      void* slot = nullptr;
      std::size_t bytes = 0;
      require_ok(zero_engine_grad(e, p, &slot, &bytes));
      std::memset(slot, 0x3f, bytes);  // bf16 0x3f3f: about 0.75
      require_ok(zero_engine_grad_ready(e, p));
    }
    require_ok(zero_engine_step(e, nullptr));
    require_ok(zero_engine_step(e, nullptr));  // the boundary (2 micro-steps per rank)
    require_ok(zero_engine_save_checkpoint(e, dir.path().c_str(), "t", R"({"k": 1})"));
    if (r == 0) {
      require_ok(
          zero_engine_gather_master(e, 0, reinterpret_cast<float*>(region.data()), kNumel[0]));
      require_ok(zero_engine_gather_master(
          e, 1, reinterpret_cast<float*>(region.data()) + kNumel[0], kNumel[1]));
    } else {
      std::vector<float> scratch(kTotal);
      require_ok(zero_engine_gather_master(e, 0, scratch.data(), kNumel[0]));
      require_ok(zero_engine_gather_master(e, 1, scratch.data(), kNumel[1]));
    }
    zero_engine_destroy(e);
    zero_comm_destroy(c);
  });
  expect_clean(ranks.wait());
  const std::vector<float> saved = result_of(region, 0);
  require_trained(saved, 0.01);

  const std::string config = config_text(0, 1);
  zero_engine* e = nullptr;
  REQUIRE(zero_engine_create(config.c_str(), nullptr, kSpecs, 2, nullptr, init_values, nullptr,
                             &e) == ZERO_OK);
  char* client = nullptr;
  REQUIRE(zero_engine_load_checkpoint(e, dir.path().c_str(), "t", &client, nullptr) == ZERO_OK);
  CHECK(std::string(client) == R"({"k":1})");
  zero_free(client);
  std::vector<float> loaded(kTotal);
  REQUIRE(zero_engine_gather_master(e, 0, loaded.data(), kNumel[0]) == ZERO_OK);
  REQUIRE(zero_engine_gather_master(e, 1, loaded.data() + kNumel[0], kNumel[1]) == ZERO_OK);
  CHECK(loaded == saved);
  std::int64_t steps = 0;
  REQUIRE(zero_engine_global_steps(e, &steps) == ZERO_OK);
  CHECK(steps == 1);
  zero_engine_destroy(e);
}
