// The C ABI (zero/zero_c.h): a small problem trained through it, and failures coming back as
// statuses with messages instead of exceptions.
#include "zero/zero_c.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/zero/zero_c_problem.h"

using namespace zero::test;

namespace {

constexpr int kSteps = 30;
// Adam with lr 0.05 over 30 steps moves each weight by up to ~1.5: the loss must fall well below
// its start, not merely wiggle.
constexpr double kRequiredLossRatio = 0.5;

int init_fails(void*, std::size_t, float*, std::size_t) {
  return 3;
}

// A config file in a directory of its own, removed when the test ends.
class TempConfig {
 public:
  TempConfig(const std::string& name, const std::string& text) : path_(dir_ / (name + ".json")) {
    std::ofstream(path_) << text;
  }
  std::string path() const { return path_; }

 private:
  zero::test::TempDir dir_{"zero_c_test"};
  std::string path_;
};

}  // namespace

TEST_CASE(
    "a small problem trained through the C ABI lowers its loss at every stage and precision") {
  const auto [stage, precision, dtype] = GENERATE(std::make_tuple(0, "fp32", ZERO_DTYPE_F32),
                                                  std::make_tuple(2, "bf16", ZERO_DTYPE_BF16),
                                                  std::make_tuple(3, "fp16", ZERO_DTYPE_F16));
  const std::string text = config_text(stage, precision);
  INFO("config: " << text);
  const TempConfig config(std::string(precision) + std::to_string(stage), text);
  const std::vector<zero_param_spec> specs = specs_of(dtype);
  int init_calls = 0;
  zero_engine* e = nullptr;
  const int rc = zero_engine_create(config.path().c_str(), nullptr, specs.data(), specs.size(),
                                    nullptr, init_weights, &init_calls, &e);
  INFO(zero_last_error());
  REQUIRE(rc == ZERO_OK);
  REQUIRE(e != nullptr);
  CHECK(init_calls == 2);

  double first_loss = 0, last_loss = 0;
  zero_step_result r{};
  for (int t = 0; t < kSteps; ++t) {
    double window = 0;
    for (int k = 0; k < 2; ++k) {
      window += micro_step(e, dtype, &r);
      CHECK(r.boundary == (k == 1 ? 1 : 0));
    }
    if (t == 0) first_loss = window / 2;
    last_loss = window / 2;
  }
  CHECK(r.global_steps == kSteps);
  CHECK(r.skipped_steps <= 2);  // fp16: the dynamic scaler may back off at the start
  REQUIRE(first_loss > 0.5);    // the weights start away from the target
  CHECK(last_loss < kRequiredLossRatio * first_loss);

  // The master weights moved toward the target too.
  std::vector<float> master(kNumel[0]);
  REQUIRE(zero_engine_gather_master(e, 0, master.data(), master.size()) == ZERO_OK);
  double dist = 0, dist0 = 0;
  for (std::size_t i = 0; i < master.size(); ++i) {
    dist += std::abs(master[i] - target(0, i));
    dist0 += std::abs(1.5f + 0.01f * static_cast<float>(i) - target(0, i));
  }
  CHECK(dist < 0.75 * dist0);
  CHECK(zero_engine_destroy(e) == ZERO_OK);
}

TEST_CASE("C ABI failures come back as statuses with a message naming the problem") {
  const TempConfig config("errors", config_text(2, "fp32"));
  const std::vector<zero_param_spec> specs = specs_of(ZERO_DTYPE_F32);
  int calls = 0;
  zero_engine* e = nullptr;

  SECTION("an unreadable config file") {
    CHECK(zero_engine_create("/nonexistent/ds.json", nullptr, specs.data(), 2, nullptr,
                             init_weights, &calls, &e) == ZERO_ERR_IO);
    CHECK_THAT(zero_last_error(), Catch::Contains("/nonexistent/ds.json"));
    CHECK(e == nullptr);
  }
  SECTION("an invalid config lists the key path") {
    const TempConfig bad(
        "bad", R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 7}})");
    CHECK(zero_engine_create(bad.path().c_str(), nullptr, specs.data(), 2, nullptr, init_weights,
                             &calls, &e) == ZERO_ERR_CONFIG);
    CHECK_THAT(zero_last_error(), Catch::Contains("zero_optimization.stage"));
  }
  SECTION("arguments the caller got wrong") {
    zero_engine_options options{nullptr, 0, -1, nullptr, nullptr};
    CHECK(zero_engine_create(config.path().c_str(), nullptr, specs.data(), 2, &options,
                             init_weights, &calls, &e) == ZERO_ERR_INVALID_ARGUMENT);
    CHECK_THAT(zero_last_error(), Catch::Contains("kernel_threads is -1"));
    for (const char* device : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "cud"}) {
      INFO(device);
      const zero_engine_options placed{nullptr, 0, 1, nullptr, device};
      CHECK(zero_engine_create(config.path().c_str(), nullptr, specs.data(), 2, &placed,
                               init_weights, &calls, &e) == ZERO_ERR_INVALID_ARGUMENT);
      CHECK_THAT(zero_last_error(), Catch::Contains(std::string("options->device is '") + device) &&
                                        Catch::Contains("\"cuda:N\""));
    }
    CHECK(zero_engine_create(config.path().c_str(), nullptr, specs.data(), 2, nullptr, init_weights,
                             &calls, nullptr) == ZERO_ERR_INVALID_ARGUMENT);
    CHECK_THAT(zero_last_error(), Catch::Contains("out is null"));
    std::vector<zero_param_spec> bad = specs;
    bad[1].dtype = 9;
    CHECK(zero_engine_create(config.path().c_str(), nullptr, bad.data(), 2, nullptr, init_weights,
                             &calls, &e) == ZERO_ERR_INVALID_ARGUMENT);
    CHECK_THAT(zero_last_error(), Catch::Contains("specs[1].dtype is 9"));
    CHECK(e == nullptr);
  }
  SECTION("a dtype other than the config's is refused by the engine") {
    const std::vector<zero_param_spec> bf16 = specs_of(ZERO_DTYPE_BF16);
    CHECK(zero_engine_create(config.path().c_str(), nullptr, bf16.data(), 2, nullptr, init_weights,
                             &calls, &e) != ZERO_OK);
    CHECK(std::string(zero_last_error()).size() > std::string("zero_engine_create: ").size());
    CHECK(e == nullptr);
  }
  SECTION("an init callback that fails") {
    CHECK(zero_engine_create(config.path().c_str(), nullptr, specs.data(), 2, nullptr, init_fails,
                             nullptr, &e) == ZERO_ERR_CALLBACK);
    CHECK_THAT(zero_last_error(), Catch::Contains("returned 3 for parameter 0"));
    CHECK(e == nullptr);
  }
  SECTION("misuse of a live engine") {
    REQUIRE(zero_engine_create(config.path().c_str(), nullptr, specs.data(), 2, nullptr,
                               init_weights, &calls, &e) == ZERO_OK);
    const void* data = nullptr;
    std::size_t bytes = 0;
    CHECK(zero_engine_param(e, 99, &data, &bytes) == ZERO_ERR_INVALID_ARGUMENT);
    CHECK_THAT(zero_last_error(), Catch::Contains("parameter 99 does not exist"));
    std::vector<float> master(5);
    CHECK(zero_engine_gather_master(e, 0, master.data(), master.size()) ==
          ZERO_ERR_INVALID_ARGUMENT);
    CHECK_THAT(zero_last_error(), Catch::Contains("has 32 elements, but numel is 5"));
    void* slot = nullptr;
    REQUIRE(zero_engine_grad(e, 1, &slot, &bytes) == ZERO_OK);
    REQUIRE(zero_engine_grad_ready(e, 1) == ZERO_OK);
    CHECK(zero_engine_grad(e, 1, &slot, &bytes) == ZERO_ERR_RUNTIME);  // already ready
    CHECK_THAT(zero_last_error(), Catch::StartsWith("zero_engine_grad: "));
    std::vector<float> grad(32);
    CHECK(zero_engine_grad_copy(e, 0, grad.data(), 5 * sizeof(float)) ==
          ZERO_ERR_INVALID_ARGUMENT);
    CHECK_THAT(zero_last_error(),
               Catch::Contains("20 bytes given, its slot holds 128") &&
                   Catch::Contains("layer.weight"));
    CHECK(zero_engine_grad_copy(e, 0, nullptr, 128) == ZERO_ERR_INVALID_ARGUMENT);
    CHECK_THAT(zero_last_error(), Catch::Contains("data is null"));
    // The stream form on a host engine: the same checks; a stream is refused by name.
    CHECK(zero_engine_grad_copy_on_stream(e, 0, grad.data(), 5 * sizeof(float), nullptr) ==
          ZERO_ERR_INVALID_ARGUMENT);
    CHECK_THAT(zero_last_error(), Catch::Contains("20 bytes given, its slot holds 128"));
    CHECK(zero_engine_grad_copy_on_stream(e, 0, nullptr, 128, nullptr) ==
          ZERO_ERR_INVALID_ARGUMENT);
    int not_a_stream = 0;
    CHECK(zero_engine_grad_copy_on_stream(e, 0, grad.data(), 128, &not_a_stream) != ZERO_OK);
    CHECK_THAT(zero_last_error(), Catch::StartsWith("zero_engine_grad_copy_on_stream: ") &&
                                      Catch::Contains("has no native streams (pass null)"));
    REQUIRE(zero_engine_grad_copy(e, 0, grad.data(), 128) == ZERO_OK);
    CHECK(zero_engine_grad_copy(e, 0, grad.data(), 128) == ZERO_ERR_RUNTIME);  // already ready
    CHECK_THAT(zero_last_error(), Catch::StartsWith("zero_engine_grad_copy: "));
    CHECK(zero_engine_grad_copy_on_stream(e, 0, grad.data(), 128, nullptr) == ZERO_ERR_RUNTIME);
    CHECK(zero_engine_step(nullptr, nullptr) == ZERO_ERR_INVALID_ARGUMENT);
    CHECK_THAT(zero_last_error(), Catch::Contains("engine is null"));

    // The message is per thread: a failure elsewhere leaves this thread's message alone.
    std::string other;
    std::thread([&] {
      zero_engine_gather(nullptr, 0);
      other = zero_last_error();
    }).join();
    CHECK_THAT(other, Catch::StartsWith("zero_engine_gather: "));
    CHECK_THAT(zero_last_error(), Catch::StartsWith("zero_engine_step: "));
    CHECK(zero_engine_destroy(e) == ZERO_OK);
  }
  CHECK(zero_engine_destroy(nullptr) == ZERO_OK);
}

TEST_CASE("the C ABI reports versions, info, memory and timings, and saves and reads checkpoints") {
  CHECK(zero_abi_version() == ZERO_ABI_VERSION);
  CHECK_THAT(zero_version(), Catch::Matches(R"(\d+\.\d+\.\d+)"));
  const zero::test::TempDir dir("zero_c_ckpt");
  // The config as JSON text instead of a path.
  const std::string text = config_text(2, "fp32");
  const std::vector<zero_param_spec> specs = specs_of(ZERO_DTYPE_F32);
  const zero_group_options groups[] = {{0.02, NAN}};
  const zero_engine_options options{groups, 1, 1, "scalar", "cpu"};
  int calls = 0;
  zero_engine* e = nullptr;
  REQUIRE(zero_engine_create(text.c_str(), nullptr, specs.data(), specs.size(), &options,
                             init_weights, &calls, &e) == ZERO_OK);
  zero_engine_info info{};
  REQUIRE(zero_engine_info_get(e, &info) == ZERO_OK);
  CHECK(info.stage == 2);
  CHECK(info.world_size == 1);
  CHECK(info.dtype == ZERO_DTYPE_F32);
  CHECK(info.train_micro_batch_size_per_gpu == 1);
  CHECK(info.gradient_accumulation_steps == 2);
  CHECK(info.train_batch_size == 2);
  CHECK(info.num_params == 2);
  CHECK(info.num_groups == 1);
  double lr = 0;
  REQUIRE(zero_engine_lr(e, 0, &lr) == ZERO_OK);
  CHECK(lr == 0.02);  // the group override, not the config's 0.05

  zero_step_result r{};
  for (int k = 0; k < 4; ++k) micro_step(e, ZERO_DTYPE_F32, &r);
  std::int64_t steps = 0;
  REQUIRE(zero_engine_global_steps(e, &steps) == ZERO_OK);
  CHECK(steps == 2);

  char* json = nullptr;
  REQUIRE(zero_engine_memory_json(e, &json) == ZERO_OK);
  const nlohmann::json memory = nlohmann::json::parse(json);
  INFO(memory.dump());
  zero_free(json);
  // The CPU device's memory is the "device" kind; partitions are padded to an alignment. An fp32
  // model's master weights are its model copy, so Adam's two states are the optimizer's memory.
  const nlohmann::json& tags = memory["kinds"]["device"]["tags"];
  const std::size_t state_bytes = tags["optimizer_states"]["bytes"].get<std::size_t>();
  CHECK(state_bytes >= 2 * (kNumel[0] + kNumel[1]) * sizeof(float));
  CHECK(state_bytes < 4 * (kNumel[0] + kNumel[1]) * sizeof(float));
  CHECK(tags.value("master_params", nlohmann::json::object()).value("bytes", 0) == 0);
  REQUIRE(zero_engine_timings_json(e, &json) == ZERO_OK);
  const nlohmann::json timings = nlohmann::json::parse(json);
  zero_free(json);
  CHECK(timings["optimizer_s"].get<double>() > 0);
  CHECK(timings["buckets"].get<std::int64_t>() > 0);

  // A client scheduler's lr for the next step is part of what the checkpoint keeps.
  REQUIRE(zero_engine_set_lr(e, 0, 0.0375) == ZERO_OK);
  REQUIRE(zero_engine_save_checkpoint(e, dir.path().c_str(), nullptr, R"({"epoch": 3})") ==
          ZERO_OK);
  std::vector<float> saved(kNumel[0]);
  REQUIRE(zero_engine_gather_master(e, 0, saved.data(), saved.size()) == ZERO_OK);
  REQUIRE(zero_engine_set_lr(e, 0, 0.001) == ZERO_OK);
  micro_step(e, ZERO_DTYPE_F32, &r);
  micro_step(e, ZERO_DTYPE_F32, &r);
  char* client = nullptr;
  char* path = nullptr;
  REQUIRE(zero_engine_load_checkpoint(e, dir.path().c_str(), nullptr, &client, &path) == ZERO_OK);
  CHECK(nlohmann::json::parse(client) == nlohmann::json{{"epoch", 3}});
  CHECK(std::string(path) == (dir.path() / "global_step2").string());
  zero_free(client);
  zero_free(path);
  std::vector<float> loaded(kNumel[0]);
  REQUIRE(zero_engine_gather_master(e, 0, loaded.data(), loaded.size()) == ZERO_OK);
  CHECK(loaded == saved);
  REQUIRE(zero_engine_global_steps(e, &steps) == ZERO_OK);
  CHECK(steps == 2);
  REQUIRE(zero_engine_lr(e, 0, &lr) == ZERO_OK);
  CHECK(lr == 0.0375);
  CHECK(zero_engine_destroy(e) == ZERO_OK);

  // What zero_to_fp32 would write, in memory.
  zero_checkpoint* ck = nullptr;
  REQUIRE(zero_checkpoint_open(dir.path().c_str(), nullptr, &ck) == ZERO_OK);
  std::size_t n = 0;
  REQUIRE(zero_checkpoint_num_tensors(ck, &n) == ZERO_OK);
  REQUIRE(n == 2);
  const char* name = nullptr;
  std::int64_t shape[4];
  std::size_t ndim = 0;
  REQUIRE(zero_checkpoint_tensor(ck, 0, &name, shape, 4, &ndim) == ZERO_OK);
  CHECK(std::string(name) == "layer.weight");
  CHECK(ndim == 2);
  CHECK(shape[0] == 4);
  CHECK(shape[1] == 8);
  std::vector<float> read(kNumel[0]);
  REQUIRE(zero_checkpoint_read_fp32(ck, 0, read.data(), read.size()) == ZERO_OK);
  CHECK(read == saved);
  int dtype = -1;
  REQUIRE(zero_checkpoint_tensor_dtype(ck, 0, &dtype) == ZERO_OK);
  CHECK(dtype == ZERO_DTYPE_F32);
  CHECK(zero_checkpoint_read_fp32(ck, 0, read.data(), 3) == ZERO_ERR_INVALID_ARGUMENT);
  CHECK_THAT(zero_last_error(), Catch::Contains("has 32 elements, but numel is 3"));
  CHECK(zero_checkpoint_close(ck) == ZERO_OK);
  CHECK(zero_checkpoint_open("/nonexistent/ckpt", nullptr, &ck) == ZERO_ERR_IO);

  // A DeepSpeed checkpoint's frozen parameters are stored in bf16; the trained ones as fp32.
  const std::string ds = ZERO_TEST_DATA_DIR "/deepspeed_checkpoints/zero2_frozen_bf16";
  REQUIRE(zero_checkpoint_open(ds.c_str(), nullptr, &ck) == ZERO_OK);
  REQUIRE(zero_checkpoint_num_tensors(ck, &n) == ZERO_OK);
  std::map<std::string, int> dtypes;
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE(zero_checkpoint_tensor(ck, i, &name, shape, 4, &ndim) == ZERO_OK);
    REQUIRE(zero_checkpoint_tensor_dtype(ck, i, &dtype) == ZERO_OK);
    dtypes[name] = dtype;
  }
  CHECK(dtypes == std::map<std::string, int>{{"0.weight", ZERO_DTYPE_F32},
                                             {"0.bias", ZERO_DTYPE_F32},
                                             {"2.weight", ZERO_DTYPE_BF16},
                                             {"2.bias", ZERO_DTYPE_BF16},
                                             {"3.weight", ZERO_DTYPE_F32},
                                             {"3.bias", ZERO_DTYPE_F32},
                                             {"5.weight", ZERO_DTYPE_F32},
                                             {"5.bias", ZERO_DTYPE_F32}});
  CHECK(zero_checkpoint_close(ck) == ZERO_OK);
}

TEST_CASE("zero_engine_set_accumulation_boundary overrides the count of micro-steps") {
  // gradient_accumulation_steps is 2: by the count, every second step() is a boundary.
  const std::vector<zero_param_spec> specs = specs_of(ZERO_DTYPE_F32);
  int calls = 0;
  zero_engine* e = nullptr;
  REQUIRE(zero_engine_create(config_text(2, "fp32").c_str(), nullptr, specs.data(), specs.size(),
                             nullptr, init_weights, &calls, &e) == ZERO_OK);
  zero_step_result r{};
  REQUIRE(zero_engine_set_accumulation_boundary(e, 1) == ZERO_OK);  // a window of one micro-step
  micro_step(e, ZERO_DTYPE_F32, &r);
  CHECK(r.boundary == 1);
  CHECK(r.global_steps == 1);
  REQUIRE(zero_engine_set_accumulation_boundary(e, 0) == ZERO_OK);  // three without a boundary
  for (int i = 0; i < 3; ++i) {
    micro_step(e, ZERO_DTYPE_F32, &r);
    CHECK(r.boundary == 0);
  }
  REQUIRE(zero_engine_set_accumulation_boundary(e, 1) == ZERO_OK);
  micro_step(e, ZERO_DTYPE_F32, &r);
  CHECK(r.boundary == 1);
  CHECK(r.global_steps == 2);
  REQUIRE(zero_engine_set_accumulation_boundary(e, -1) == ZERO_OK);  // the count again
  micro_step(e, ZERO_DTYPE_F32, &r);
  CHECK(r.boundary == 0);
  micro_step(e, ZERO_DTYPE_F32, &r);
  CHECK(r.boundary == 1);
  CHECK(r.global_steps == 3);
  CHECK(zero_engine_set_accumulation_boundary(e, 2) == ZERO_ERR_RUNTIME);
  CHECK_THAT(zero_last_error(), Catch::Contains("boundary 2 is not -1, 0 or 1"));
  zero_engine_destroy(e);
}

TEST_CASE("a client LR scheduler's lr reaches the engine through zero_engine_set_lr") {
  const std::vector<zero_param_spec> specs = specs_of(ZERO_DTYPE_F32);
  int calls = 0;
  zero_engine* e = nullptr;
  REQUIRE(zero_engine_create(config_text(1, "fp32").c_str(), nullptr, specs.data(), specs.size(),
                             nullptr, init_weights, &calls, &e) == ZERO_OK);
  double lr = 0;
  REQUIRE(zero_engine_lr(e, 0, &lr) == ZERO_OK);
  CHECK(lr == 0.05);
  REQUIRE(zero_engine_set_lr(e, 0, 0.0125) == ZERO_OK);
  REQUIRE(zero_engine_lr(e, 0, &lr) == ZERO_OK);
  CHECK(lr == 0.0125);
  CHECK(zero_engine_set_lr(e, 3, 0.1) == ZERO_ERR_RUNTIME);
  CHECK_THAT(zero_last_error(), Catch::Contains("unknown param group 3"));
  CHECK(zero_engine_set_lr(e, 0, -1.0) == ZERO_ERR_RUNTIME);
  CHECK_THAT(zero_last_error(), Catch::Contains("lr -1 for param group 0"));
  zero_engine_destroy(e);

  // A config schedule sets every step's lr: a client one is refused by name.
  std::string scheduled = config_text(1, "fp32");
  scheduled.insert(scheduled.rfind('}'),
                   R"(, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4}})");
  REQUIRE(zero_engine_create(scheduled.c_str(), nullptr, specs.data(), specs.size(), nullptr,
                             init_weights, &calls, &e) == ZERO_OK);
  CHECK(zero_engine_set_lr(e, 0, 0.1) == ZERO_ERR_RUNTIME);
  CHECK_THAT(zero_last_error(), Catch::Contains("\"scheduler\" block (WarmupLR)"));
  zero_engine_destroy(e);
}
