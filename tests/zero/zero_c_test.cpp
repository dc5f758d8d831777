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

#include "kernels/cast.h"
#include "tests/temp_dir.h"

namespace {

// The trained problem: minimise 0.5 * mean((w - target)^2) over every element of two tensors.
constexpr std::int64_t kShape0[] = {4, 8};
constexpr std::int64_t kShape1[] = {8};
constexpr std::size_t kNumel[] = {32, 8};
constexpr int kSteps = 30;
// Adam with lr 0.05 over 30 steps moves each weight by up to ~1.5: the loss must fall well below
// its start, not merely wiggle.
constexpr double kRequiredLossRatio = 0.5;

float target(std::size_t param, std::size_t e) {
  return std::sin(0.7f * static_cast<float>(e + 13 * param));
}

int init_weights(void* user, std::size_t index, float* out, std::size_t numel) {
  ++*static_cast<int*>(user);
  for (std::size_t e = 0; e < numel; ++e) out[e] = 1.5f + 0.01f * static_cast<float>(e + index);
  return 0;
}

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

std::string config_text(int stage, const std::string& precision) {
  std::string dtype_block;
  if (precision == "bf16") dtype_block = R"("bf16": {"enabled": true},)";
  if (precision == "fp16") dtype_block = R"("fp16": {"enabled": true, "initial_scale_power": 12},)";
  return R"({
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 0,
  )" + dtype_block +
         R"(
  "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.0}},
  "zero_optimization": {"stage": )" +
         std::to_string(stage) + R"(}
})";
}

zero::DType to_zero_dtype(int d) {
  return d == ZERO_DTYPE_BF16  ? zero::DType::BF16
         : d == ZERO_DTYPE_F16 ? zero::DType::F16
                               : zero::DType::F32;
}

std::vector<zero_param_spec> specs_of(int dtype) {
  return {{"layer.weight", kShape0, 2, dtype, 0, 0, 1, nullptr, 0},
          {"layer.bias", kShape1, 1, dtype, 0, 1, 1, nullptr, 0}};
}

// One micro-step through the C ABI; returns the unscaled loss.
double micro_step(zero_engine* e, int dtype, zero_step_result* result) {
  const zero::DType dt = to_zero_dtype(dtype);
  for (int u = 0; u < 2; ++u) REQUIRE(zero_engine_gather(e, u) == ZERO_OK);
  double scale = 0;
  REQUIRE(zero_engine_backward_scale(e, &scale) == ZERO_OK);
  double loss = 0;
  std::vector<std::vector<float>> grads(2);
  const std::size_t total = kNumel[0] + kNumel[1];
  for (std::size_t p = 0; p < 2; ++p) {
    const void* data = nullptr;
    std::size_t bytes = 0;
    REQUIRE(zero_engine_param(e, p, &data, &bytes) == ZERO_OK);
    REQUIRE(bytes == kNumel[p] * zero::dtype_size(dt));
    std::vector<float> w(kNumel[p]);
    zero::kernels::cast_cpu(data, dt, w.data(), zero::DType::F32, w.size());
    grads[p].resize(kNumel[p]);
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double d = w[i] - target(p, i);
      loss += 0.5 * d * d / static_cast<double>(total);
      grads[p][i] = static_cast<float>(d / static_cast<double>(total) * scale);
    }
  }
  for (std::size_t p = 2; p-- > 0;) {
    if (p == 0) {
      // Through the one-call copies: the gradient in the model dtype, in the caller's memory,
      // in turn with and without the stream argument (null: the host's only stream).
      std::vector<std::byte> grad(kNumel[p] * zero::dtype_size(dt));
      zero::kernels::cast_cpu(grads[p].data(), zero::DType::F32, grad.data(), dt, kNumel[p]);
      static int calls = 0;
      REQUIRE((++calls % 2 == 0
                   ? zero_engine_grad_copy(e, p, grad.data(), grad.size())
                   : zero_engine_grad_copy_on_stream(e, p, grad.data(), grad.size(), nullptr)) ==
              ZERO_OK);
    } else {
      void* slot = nullptr;
      std::size_t bytes = 0;
      REQUIRE(zero_engine_grad(e, p, &slot, &bytes) == ZERO_OK);
      REQUIRE(bytes == kNumel[p] * zero::dtype_size(dt));
      zero::kernels::cast_cpu(grads[p].data(), zero::DType::F32, slot, dt, kNumel[p]);
      REQUIRE(zero_engine_grad_ready(e, p) == ZERO_OK);
    }
    REQUIRE(zero_engine_release(e, static_cast<int>(p)) == ZERO_OK);
  }
  REQUIRE(zero_engine_step(e, result) == ZERO_OK);
  return loss;
}

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
  // The CPU device's memory is the "device" kind; partitions are padded to an alignment.
  const std::size_t master_bytes =
      memory["kinds"]["device"]["tags"]["master_params"]["bytes"].get<std::size_t>();
  CHECK(master_bytes >= (kNumel[0] + kNumel[1]) * sizeof(float));
  CHECK(master_bytes < 2 * (kNumel[0] + kNumel[1]) * sizeof(float));
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

TEST_CASE("zero_engine_unit_persistent names the stage-3 units that stay gathered, in place") {
  // The weight (32 elements) is over a persistence threshold of 10, the bias (8) under it.
  std::string text = config_text(3, "fp32");
  text.replace(text.find(R"("stage": 3)"), 10,
               R"("stage": 3, "stage3_param_persistence_threshold": 10)");
  const std::vector<zero_param_spec> specs = specs_of(ZERO_DTYPE_F32);
  int calls = 0;
  zero_engine* e = nullptr;
  REQUIRE(zero_engine_create(text.c_str(), nullptr, specs.data(), specs.size(), nullptr,
                             init_weights, &calls, &e) == ZERO_OK);
  int persistent = -1;
  REQUIRE(zero_engine_unit_persistent(e, 0, &persistent) == ZERO_OK);
  CHECK(persistent == 0);
  REQUIRE(zero_engine_unit_persistent(e, 1, &persistent) == ZERO_OK);
  CHECK(persistent == 1);

  // The persistent unit is readable without a gather, and every step refreshes it where it is.
  const void* before = nullptr;
  std::size_t bytes = 0;
  REQUIRE(zero_engine_param(e, 1, &before, &bytes) == ZERO_OK);
  REQUIRE(bytes == kNumel[1] * sizeof(float));
  const std::vector<float> initial(static_cast<const float*>(before),
                                   static_cast<const float*>(before) + kNumel[1]);
  CHECK(initial[0] == 1.5f + 0.01f);  // init_weights' value for parameter 1, element 0
  zero_step_result r{};
  for (int k = 0; k < 6; ++k) micro_step(e, ZERO_DTYPE_F32, &r);
  REQUIRE(r.global_steps == 3);
  const void* after = nullptr;
  REQUIRE(zero_engine_param(e, 1, &after, &bytes) == ZERO_OK);
  CHECK(after == before);
  std::vector<float> master(kNumel[1]);
  REQUIRE(zero_engine_gather_master(e, 1, master.data(), master.size()) == ZERO_OK);
  for (std::size_t i = 0; i < kNumel[1]; ++i) {
    INFO("element " << i);
    CHECK(static_cast<const float*>(after)[i] == master[i]);  // the refreshed values
    CHECK(master[i] != initial[i]);                            // which the steps moved
  }

  CHECK(zero_engine_unit_persistent(e, 2, &persistent) != ZERO_OK);
  CHECK_THAT(zero_last_error(), Catch::Contains("unit 2"));
  CHECK(zero_engine_unit_persistent(e, 0, nullptr) != ZERO_OK);
  CHECK_THAT(zero_last_error(), Catch::Contains("persistent must not be null"));
  zero_engine_destroy(e);

  // Stages 0-2: no unit is persistent (every parameter keeps its address anyway).
  REQUIRE(zero_engine_create(config_text(2, "fp32").c_str(), nullptr, specs.data(), specs.size(),
                             nullptr, init_weights, &calls, &e) == ZERO_OK);
  persistent = -1;
  REQUIRE(zero_engine_unit_persistent(e, 1, &persistent) == ZERO_OK);
  CHECK(persistent == 0);
  zero_engine_destroy(e);
}

namespace {

// A unit big enough to be reduced alone (a slice of at least 2^14 elements on one rank) and a
// small one that goes through a bucket.
constexpr std::int64_t kBigShape[] = {128, 256};
constexpr std::size_t kBigNumel = 128 * 256;

enum class GradPath { Copy, Lend, LendMisaligned };

struct LendRun {
  std::vector<std::vector<float>> params;  // after training
  int lent = 0;                            // calls that kept the caller's memory
};

// Four windows of two micro-steps at `stage`, each gradient handed in along `path`.
LendRun train_handing_in(int stage, GradPath path) {
  const std::vector<zero_param_spec> specs = {
      {"big.weight", kBigShape, 2, ZERO_DTYPE_F32, 0, 0, 1, nullptr, 0},
      {"small.bias", kShape1, 1, ZERO_DTYPE_F32, 0, 1, 1, nullptr, 0}};
  const std::size_t numel[] = {kBigNumel, kNumel[1]};
  int calls = 0;
  zero_engine* e = nullptr;
  REQUIRE(zero_engine_create(config_text(stage, "fp32").c_str(), nullptr, specs.data(),
                             specs.size(), nullptr, init_weights, &calls, &e) == ZERO_OK);
  LendRun run;
  zero_step_result r{};
  for (int micro = 0; micro < 8; ++micro) {
    double scale = 0;
    REQUIRE(zero_engine_backward_scale(e, &scale) == ZERO_OK);
    // Each gradient in memory of its own, 64-byte aligned (+1 element when misaligned on purpose),
    // alive and untouched until step() returns.
    std::vector<std::vector<float>> memory(2);
    for (std::size_t p = 2; p-- > 0;) {
      const void* data = nullptr;
      std::size_t bytes = 0;
      REQUIRE(zero_engine_param(e, p, &data, &bytes) == ZERO_OK);
      const auto* w = static_cast<const float*>(data);
      memory[p].resize(numel[p] + 32);
      float* g = memory[p].data();
      while (reinterpret_cast<std::uintptr_t>(g) % 64 != 0) ++g;
      if (path == GradPath::LendMisaligned) ++g;
      for (std::size_t i = 0; i < numel[p]; ++i) {
        g[i] = static_cast<float>((w[i] - target(p, i)) * scale * (1.0 + 0.1 * micro));
      }
      if (path == GradPath::Copy) {
        REQUIRE(zero_engine_grad_copy(e, p, g, numel[p] * sizeof(float)) == ZERO_OK);
      } else {
        int lent = -1;
        REQUIRE(zero_engine_grad_lend(e, p, g, numel[p] * sizeof(float), &lent) == ZERO_OK);
        CHECK(lent == (path == GradPath::Lend && p == 0 ? 1 : 0));
        run.lent += lent;
      }
    }
    REQUIRE(zero_engine_step(e, &r) == ZERO_OK);
  }
  REQUIRE(r.global_steps == 4);
  for (std::size_t p = 0; p < 2; ++p) {
    const void* data = nullptr;
    std::size_t bytes = 0;
    REQUIRE(zero_engine_param(e, p, &data, &bytes) == ZERO_OK);
    const auto* w = static_cast<const float*>(data);
    run.params.emplace_back(w, w + numel[p]);
  }
  zero_engine_destroy(e);
  return run;
}

}  // namespace

TEST_CASE("zero_engine_grad_lend reduces a lone unit's gradient where it is, bitwise as a copy") {
  const int stage = GENERATE(0, 2, 3);
  INFO("stage " << stage);
  const LendRun copied = train_handing_in(stage, GradPath::Copy);
  const LendRun lent = train_handing_in(stage, GradPath::Lend);
  const LendRun misaligned = train_handing_in(stage, GradPath::LendMisaligned);
  CHECK(lent.lent == 8);  // the big unit's gradient, every micro-step
  CHECK(misaligned.lent == 0);
  for (std::size_t p = 0; p < 2; ++p) {
    INFO("parameter " << p);
    CHECK(lent.params[p] == copied.params[p]);
    CHECK(misaligned.params[p] == copied.params[p]);
    // Not vacuous: training moved every weight away from its initial value.
    for (std::size_t i = 0; i < copied.params[p].size(); i += 997) {
      CHECK(copied.params[p][i] != 1.5f + 0.01f * static_cast<float>(i + p));
    }
  }
}
