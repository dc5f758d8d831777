// The kinds of DeepSpeed checkpoint beyond ZeRO 1/2/3 (deepspeed.h): stage 0, BF16_Optimizer,
// universal, and ZeRO 2/3 with frozen parameters, read from checkpoints DeepSpeed 0.19.8 made
// (tests/data/deepspeed_checkpoints, scripts/make_ds_checkpoints.py), and their bad input.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/zero/dscheckpoint/pt_writer.h"
#include "tests/zero/dscheckpoint/test_util.h"
#include "zero/base/error.h"
#include "zero/dscheckpoint/deepspeed.h"
#include "zero/io/safetensors.h"

namespace ds = zero::dscheckpoint;
namespace t = zero::dscheckpoint::testing;
namespace fs = std::filesystem;

namespace {

using zero::dscheckpoint::testing::error_of;
using zero::dscheckpoint::testing::TempDir;

using zero::dscheckpoint::testing::kFixtures;

struct Kind {
  const char* fixture;
  ds::DsKind kind;
  const char* kind_name;
  int stage;
  const char* dtype;
  std::size_t frozen;
};

const Kind kKinds[] = {
    {"zero0_fp32", ds::DsKind::Zero0, "ZeRO stage 0 (fp32)", 0, "fp32", 0},
    {"zero0_bf16", ds::DsKind::Zero0,
     "ZeRO stage 0 (bf16, fp32 master copies in optimizer.fp32_groups)", 0, "bf16", 0},
    {"bf16_zero1", ds::DsKind::Bf16Optimizer, "BF16_Optimizer (stage 1)", 1, "bf16", 0},
    {"universal", ds::DsKind::Universal, "universal (from ZeRO stage 2)", 2, "bf16", 0},
    {"zero2_frozen_bf16", ds::DsKind::Zero, "ZeRO stage 2", 2, "bf16", 2},
    {"zero3_frozen_bf16", ds::DsKind::Zero, "ZeRO stage 3", 3, "bf16", 2},
};

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

std::size_t nonzero(const std::vector<float>& v) {
  return static_cast<std::size_t>(std::count_if(v.begin(), v.end(), [](float x) { return x != 0; }));
}

fs::path copy_fixture(const TempDir& tmp, const std::string& name) {
  const fs::path dst = tmp.path() / name;
  fs::copy(kFixtures + "/" + name, dst, fs::copy_options::recursive);
  for (const auto& e : fs::recursive_directory_iterator(dst))
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  return dst;
}

}  // namespace

TEST_CASE("every kind of DeepSpeed checkpoint gives the master weights and moments DeepSpeed stores") {
  for (const Kind& k : kKinds) {
    const std::string dir = kFixtures + "/" + k.fixture;
    INFO(dir);
    REQUIRE(ds::is_deepspeed_checkpoint(dir));
    const auto ckpt = ds::DeepSpeedCheckpoint::open(dir);
    CHECK(ckpt.kind() == k.kind);
    CHECK(ckpt.kind_name() == k.kind_name);
    CHECK(ckpt.stage() == k.stage);
    CHECK(ckpt.world_size() == 2);
    CHECK(ckpt.dtype() == k.dtype);
    CHECK(ckpt.global_steps() == 5);
    const auto weights = zero::io::SafetensorsReader::open(dir + "/expected_fp32.safetensors");
    const auto states = zero::io::SafetensorsReader::open(dir + "/expected_states.safetensors");
    REQUIRE(ckpt.params().size() == weights.tensors().size());
    CHECK(ckpt.step() == static_cast<std::int64_t>(states.read_f32("step").at(0)));
    CHECK(ckpt.state_names() == std::vector<std::string>{"exp_avg", "exp_avg_sq"});

    std::size_t frozen = 0, checked = 0, nonzero_values = 0, nonzero_moments = 0;
    for (std::size_t i = 0; i < ckpt.params().size(); ++i) {
      const ds::DsParam& p = ckpt.params()[i];
      INFO(p.name);
      const zero::io::TensorInfo& want = weights.at(p.name);
      CHECK(p.shape == want.shape);
      CHECK_FALSE(p.buffer);
      const std::vector<float> got = ckpt.read_fp32(i);
      CHECK(bitwise_equal(got, weights.read_f32(p.name)));
      nonzero_values += nonzero(got);
      if (!p.trainable) {
        // DeepSpeed's zero_to_fp32 keeps a frozen parameter in the dtype it was saved in.
        ++frozen;
        CHECK(p.saved_dtype == want.dtype);
        CHECK(p.saved_dtype == zero::DType::BF16);
        CHECK_THROWS_WITH(ckpt.read_state(i, "exp_avg"), Catch::Contains("frozen parameter"));
        continue;
      }
      CHECK(want.dtype == zero::DType::F32);
      for (const char* s : {"exp_avg", "exp_avg_sq"}) {
        const std::vector<float> m = ckpt.read_state(i, s);
        CHECK(bitwise_equal(m, states.read_f32(p.name + "." + s)));
        nonzero_moments += nonzero(m);
        ++checked;
      }
    }
    CHECK(frozen == k.frozen);
    CHECK(checked == 2 * (ckpt.params().size() - k.frozen));
    // The comparisons are not vacuous: trained weights and moments are mostly nonzero.
    CHECK(nonzero_values > 1500);
    CHECK(nonzero_moments > 3000);
  }
}

TEST_CASE("a universal checkpoint is found through latest_universal, or by its tag folder") {
  const std::string dir = kFixtures + "/universal";
  CHECK(ds::DeepSpeedCheckpoint::open(dir).tag_dir() == dir + "/step5_universal");
  const auto by_tag = ds::DeepSpeedCheckpoint::open(dir + "/step5_universal");
  CHECK(by_tag.kind() == ds::DsKind::Universal);
  CHECK(ds::DeepSpeedCheckpoint::open(dir, "step5_universal").params().size() == 8);
}

TEST_CASE("a universal checkpoint missing a parameter's folder or file is refused, naming it") {
  TempDir tmp;
  const fs::path dir = copy_fixture(tmp, "universal");
  const fs::path zero_dir = dir / "step5_universal/zero";
  SECTION("a folder") {
    fs::remove_all(zero_dir / "3.weight");
    const std::string msg = error_of([&] { (void)ds::DeepSpeedCheckpoint::open(dir.string()); });
    INFO(msg);
    CHECK(msg.find((zero_dir / "3.weight").string() + ": missing") != std::string::npos);
    CHECK(msg.find("no folder for parameter '3.weight'") != std::string::npos);
    CHECK(msg.find("param_shapes") != std::string::npos);
  }
  SECTION("a moment") {
    fs::remove(zero_dir / "5.bias/exp_avg_sq.pt");
    const std::string msg = error_of([&] { (void)ds::DeepSpeedCheckpoint::open(dir.string()); });
    INFO(msg);
    CHECK(msg.find((zero_dir / "5.bias/exp_avg_sq.pt").string() + ": missing") !=
          std::string::npos);
    CHECK(msg.find("'5.bias' has no exp_avg_sq.pt") != std::string::npos);
  }
}

namespace {

// A stage-0 model-states file: module {"a.weight": [4, 3], "b.bias": [5]} and an fp16/bf16
// wrapper whose fp32_groups have the given shapes (none: saved without the optimizer).
void write_stage0(const fs::path& tag, const std::vector<std::vector<std::int64_t>>& fp32_shapes) {
  fs::create_directories(tag);
  std::map<std::string, std::vector<float>> storages;
  auto tensor = [&](const std::vector<std::int64_t>& shape) {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    const std::string key = std::to_string(storages.size());
    storages[key] = std::vector<float>(static_cast<std::size_t>(n), 0.5f);
    return t::tensor(key, n, 0, shape);
  };
  std::vector<t::Py> masters, ids;
  for (std::size_t i = 0; i < fp32_shapes.size(); ++i) {
    masters.push_back(tensor(fp32_shapes[i]));
    ids.push_back(t::integer(static_cast<std::int64_t>(i)));
  }
  const t::Py optimizer = t::dict(
      {{t::str("dynamic_loss_scale"), t::boolean(false)},
       {t::str("cur_scale"), t::number(1.0)},
       {t::str("optimizer_state_dict"),
        t::dict({{t::str("state"), t::dict({})},
                 {t::str("param_groups"), t::list({t::dict({{t::str("params"), t::list(ids)}})})}})},
       {t::str("fp32_groups"), t::list({t::list(masters)})}});
  const t::Py root = t::dict(
      {{t::str("module"), t::odict({{t::str("a.weight"), tensor({4, 3})},
                                    {t::str("b.bias"), tensor({5})}})},
       {t::str("buffer_names"), t::list({})},
       {t::str("optimizer"), fp32_shapes.empty() ? t::none() : optimizer},
       {t::str("param_shapes"), t::none()},
       {t::str("global_steps"), t::integer(3)}});
  t::write_pt((tag / "mp_rank_00_model_states.pt").string(), "mp_rank_00_model_states",
              t::Pickler::dumps(root), storages);
}

}  // namespace

TEST_CASE("a stage-0 file whose fp32_groups do not match the module's shapes is refused") {
  TempDir tmp;
  std::ofstream(tmp.path() / "latest") << "global_step3";
  const fs::path tag = tmp.path() / "global_step3";
  SECTION("matching shapes read") {
    write_stage0(tag, {{4, 3}, {5}});
    const auto ck = ds::DeepSpeedCheckpoint::open(tmp.str());
    CHECK(ck.kind() == ds::DsKind::Zero0);
    REQUIRE(ck.params().size() == 2);
    CHECK(ck.read_fp32(1) == std::vector<float>(5, 0.5f));
  }
  SECTION("saved without the optimizer: the weights alone") {
    write_stage0(tag, {});
    const auto ck = ds::DeepSpeedCheckpoint::open(tmp.str());
    REQUIRE(ck.params().size() == 2);
    CHECK(ck.params()[0].trainable);
    CHECK(ck.state_names().empty());
    CHECK(ck.read_fp32(0) == std::vector<float>(12, 0.5f));
    CHECK_THROWS_WITH(ck.read_state(0, "exp_avg"),
                      Catch::Contains("'a.weight' has no optimizer state (the checkpoint was saved "
                                      "without the optimizer's)"));
  }
  SECTION("a transposed weight") {
    write_stage0(tag, {{3, 4}, {5}});
    const std::string msg = error_of([&] { (void)ds::DeepSpeedCheckpoint::open(tmp.str()); });
    INFO(msg);
    CHECK(msg.find((tag / "mp_rank_00_model_states.pt").string()) != std::string::npos);
    CHECK(msg.find("optimizer.fp32_groups[0][0] has shape [3, 4], but the module's parameter 0 "
                   "of 2 ('a.weight') is [4, 3]") != std::string::npos);
  }
  SECTION("more optimizer parameters than the module has") {
    write_stage0(tag, {{4, 3}, {5}, {5}});
    CHECK_THROWS_WITH(ds::DeepSpeedCheckpoint::open(tmp.str()),
                      Catch::Contains("the optimizer holds 3 parameters, the module only 2"));
  }
  SECTION("fewer: the frozen one is found by shape when only one choice fits") {
    write_stage0(tag, {{5}});
    const auto ck = ds::DeepSpeedCheckpoint::open(tmp.str());
    REQUIRE(ck.params().size() == 2);
    CHECK_FALSE(ck.params()[0].trainable);
    CHECK(ck.params()[1].trainable);
  }
  SECTION("fewer, and no choice fits") {
    write_stage0(tag, {{7}});
    CHECK_THROWS_WITH(ds::DeepSpeedCheckpoint::open(tmp.str()),
                      Catch::Contains("no choice of parameters fits their shapes"));
  }
}

TEST_CASE("a stage-0 FP16_Optimizer file: flat fp32 groups and flat moments cut per parameter") {
  // FP16_Optimizer (fp16/bf16 with a fused optimizer): group 0 holds a.weight [4, 3] and b.bias
  // [5] in one flat of 17, group 1 c.weight [2, 2] in a flat of 4; the moments are flat too.
  TempDir tmp;
  std::ofstream(tmp.path() / "latest") << "global_step3";
  const fs::path tag = tmp.path() / "global_step3";
  fs::create_directories(tag);
  std::map<std::string, std::vector<float>> storages;
  auto tensor = [&](std::vector<float> v, std::vector<std::int64_t> shape) {
    const std::string key = std::to_string(storages.size());
    const auto n = static_cast<std::int64_t>(v.size());
    storages[key] = std::move(v);
    return t::tensor(key, n, 0, std::move(shape));
  };
  auto ramp = [](std::size_t n, float base) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i);
    return v;
  };
  auto state = [&](std::size_t n, float base) {
    return t::dict({{t::str("step"), t::integer(3)},
                    {t::str("exp_avg"), tensor(ramp(n, base + 100), {static_cast<std::int64_t>(n)})},
                    {t::str("exp_avg_sq"),
                     tensor(ramp(n, base + 200), {static_cast<std::int64_t>(n)})}});
  };
  const t::Py optimizer = t::dict(
      {{t::str("dynamic_loss_scale"), t::boolean(true)},
       {t::str("cur_scale"), t::number(4096.0)},
       {t::str("cur_iter"), t::integer(3)},
       {t::str("last_overflow_iter"), t::integer(-1)},
       {t::str("optimizer_state_dict"),
        t::dict({{t::str("state"), t::dict({{t::integer(0), state(17, 0)},
                                            {t::integer(1), state(4, 1000)}})},
                 {t::str("param_groups"),
                  t::list({t::dict({{t::str("params"), t::list({t::integer(0)})}}),
                           t::dict({{t::str("params"), t::list({t::integer(1)})}})})}})},
       {t::str("fp32_groups_flat"),
        t::list({tensor(ramp(17, 0), {17}), tensor(ramp(4, 1000), {4})})},
       {t::str("clip_grad"), t::number(1.0)}});
  const t::Py root = t::dict(
      {{t::str("module"), t::odict({{t::str("a.weight"), tensor(std::vector<float>(12), {4, 3})},
                                    {t::str("b.bias"), tensor(std::vector<float>(5), {5})},
                                    {t::str("c.weight"), tensor(std::vector<float>(4), {2, 2})}})},
       {t::str("buffer_names"), t::list({})},
       {t::str("optimizer"), optimizer},
       {t::str("global_steps"), t::integer(3)}});
  t::write_pt((tag / "mp_rank_00_model_states.pt").string(), "mp_rank_00_model_states",
              t::Pickler::dumps(root), storages);

  const auto ck = ds::DeepSpeedCheckpoint::open(tmp.str());
  CHECK(ck.kind_name() == "ZeRO stage 0 (fp32, fp32 master copies in optimizer.fp32_groups_flat)");
  REQUIRE(ck.params().size() == 3);
  auto slice = [&](std::size_t from, std::size_t n, float base) {
    const std::vector<float> all = ramp(from + n, base);
    return std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(from), all.end());
  };
  CHECK(ck.read_fp32(0) == slice(0, 12, 0));
  CHECK(ck.read_fp32(1) == slice(12, 5, 0));
  CHECK(ck.read_fp32(2) == slice(0, 4, 1000));
  CHECK(ck.read_state(1, "exp_avg") == slice(12, 5, 100));
  CHECK(ck.read_state(2, "exp_avg_sq") == slice(0, 4, 1200));
  CHECK(ck.step() == 3);
  CHECK(ck.loss_scale() == 4096.0);
  CHECK(ck.dynamic_loss_scale());
  CHECK(ck.clip_grad() == 1.0);
}

TEST_CASE("detection names the kind: a folder of neither kind is not taken for DeepSpeed's") {
  TempDir tmp;
  CHECK_FALSE(ds::is_deepspeed_checkpoint(tmp.str()));
  std::ofstream(tmp.path() / "latest_universal") << "nowhere";
  CHECK_FALSE(ds::is_deepspeed_checkpoint(tmp.str()));
  CHECK(ds::is_deepspeed_checkpoint(kFixtures + "/zero0_fp32/step5"));
  CHECK(ds::is_deepspeed_checkpoint(kFixtures + "/universal/step5_universal"));
  // Model parallelism is refused at stage 0 too, by file name.
  const fs::path dir = copy_fixture(tmp, "zero0_fp32");
  fs::copy_file(dir / "step5/mp_rank_00_model_states.pt", dir / "step5/mp_rank_01_model_states.pt");
  CHECK_THROWS_WITH(ds::DeepSpeedCheckpoint::open(dir.string()),
                    Catch::Contains("model-parallel checkpoint (mp_rank_01)"));
}
