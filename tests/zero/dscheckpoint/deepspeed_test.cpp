#include "zero/dscheckpoint/deepspeed.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/zero/dscheckpoint/pt_writer.h"
#include "tests/zero/dscheckpoint/test_util.h"
#include "zero/base/error.h"
#include "zero/base/shape.h"
#include "zero/dscheckpoint/pt_file.h"
#include "zero/io/safetensors.h"

namespace ds = zero::dscheckpoint;
namespace t = zero::dscheckpoint::testing;
namespace fs = std::filesystem;

namespace {

using zero::dscheckpoint::testing::error_of;
using zero::dscheckpoint::testing::TempDir;

using zero::dscheckpoint::testing::kFixtures;
const char* const kFixtureNames[] = {"zero1_world2_fp32", "zero2_world2_fp32", "zero3_world2_fp32"};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Copies a fixture so a test can damage it.
fs::path copy_fixture(const TempDir& tmp, const std::string& name) {
  const fs::path dst = tmp.path() / name;
  fs::copy(kFixtures + "/" + name, dst, fs::copy_options::recursive);
  for (const auto& e : fs::recursive_directory_iterator(dst)) {
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  }
  return dst;
}

}  // namespace

TEST_CASE("every DeepSpeed fixture reconstructs bitwise equal to zero_to_fp32's output") {
  for (const char* name : kFixtureNames) {
    const std::string dir = kFixtures + "/" + name;
    INFO(dir);
    REQUIRE(ds::is_deepspeed_checkpoint(dir));
    const auto ckpt = ds::DeepSpeedCheckpoint::open(dir);
    const auto expected = zero::io::SafetensorsReader::open(dir + "/expected_fp32.safetensors");
    CHECK(ckpt.stage() == name[4] - '0');
    CHECK(ckpt.world_size() == 2);
    CHECK(ckpt.dtype() == "fp32");
    REQUIRE(ckpt.params().size() == expected.tensors().size());
    std::size_t nonzero = 0;
    for (std::size_t i = 0; i < ckpt.params().size(); ++i) {
      const ds::DsParam& p = ckpt.params()[i];
      const zero::io::TensorInfo& want = expected.tensors()[i];  // same (model) order
      INFO(p.name);
      CHECK(p.name == want.name);
      CHECK(p.shape == want.shape);
      CHECK(p.trainable);
      CHECK_FALSE(p.tied_to.has_value());
      const std::vector<float> got = ckpt.read_fp32(i);
      const std::vector<float> ref = expected.read_f32(want.name);
      nonzero += static_cast<std::size_t>(
          std::count_if(ref.begin(), ref.end(), [](float v) { return v != 0.0f; }));
      CHECK(bitwise_equal(got, ref));
    }
    CHECK(nonzero > 5000);  // the comparison is not vacuous

    CHECK(ckpt.step() == 5);
    CHECK(ckpt.global_steps() == 5);
    CHECK(ckpt.global_samples() == 40);
    REQUIRE(ckpt.loss_scale().has_value());
    CHECK(*ckpt.loss_scale() == 1.0);
    CHECK(ckpt.scaler_state()["__type__"] == "deepspeed.runtime.fp16.loss_scaler.LossScaler");
    CHECK_FALSE(ckpt.dynamic_loss_scale());
    CHECK(ckpt.param_groups().at(0)["lr"] == 0.001);
    CHECK(ckpt.param_groups().at(0)["weight_decay"] == 0.01);
    CHECK(ckpt.ds_config()["zero_optimization"]["stage"] == ckpt.stage());
    CHECK(ckpt.state_names() == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  }
}

TEST_CASE("zero_to_fp32 output of every fixture equals expected_fp32.safetensors byte for byte") {
  TempDir tmp;
  for (const char* name : kFixtureNames) {
    const std::string dir = kFixtures + "/" + name;
    INFO(dir);
    const auto expected = zero::io::SafetensorsReader::open(dir + "/expected_fp32.safetensors");
    const fs::path out = tmp.path() / (std::string(name) + ".safetensors");
    ds::write_fp32_safetensors(ds::DeepSpeedCheckpoint::open(dir), out.string(),
                               expected.metadata());
    CHECK(slurp(out) == slurp(dir + "/expected_fp32.safetensors"));
  }
}

TEST_CASE("Adam moments match what each rank's optimizer-state file holds") {
  for (const char* name : kFixtureNames) {
    const std::string dir = kFixtures + "/" + name;
    INFO(dir);
    const auto ckpt = ds::DeepSpeedCheckpoint::open(dir);
    for (const std::string state : {"exp_avg", "exp_avg_sq"}) {
      // Concatenated over parameters, the moments must equal rank 0's partition followed by
      // rank 1's (the fixtures have no padding: 5508 elements split 2754 + 2754).
      std::vector<float> flat;
      for (std::size_t i = 0; i < ckpt.params().size(); ++i) {
        const std::vector<float> m = ckpt.read_state(i, state);
        flat.insert(flat.end(), m.begin(), m.end());
      }
      std::vector<std::vector<float>> ranks;
      for (int r = 0; r < 2; ++r) {
        const auto f = ds::PtFile::open(
            fmt::format("{}/step5/zero_pp_rank_{}_mp_rank_00_optim_states.pt", dir, r));
        const auto osd = f.root().get("optimizer_state_dict");
        const auto group_state =
            ckpt.stage() == 3 ? osd.get("optimizer_state_dict").get("state").get(std::int64_t{0})
                              : osd.get("base_optimizer_state").get("state").get(std::int64_t{0});
        ranks.push_back(f.read_f32(group_state.get(state)));
      }
      REQUIRE(ranks[0].size() == 2754);
      // DeepSpeed 0.16.5 saved all-zero moments in the stage-3 fixture (the state dict is
      // taken with the fp32 flats swapped in); what the file holds is what must come back.
      if (ckpt.stage() <= 2)
        CHECK(std::any_of(ranks[0].begin(), ranks[0].end(), [](float v) { return v != 0.0f; }));
      if (ckpt.stage() <= 2) {
        std::vector<float> want = ranks[0];
        want.insert(want.end(), ranks[1].begin(), ranks[1].end());
        CHECK(bitwise_equal(flat, want));
      } else {
        // Stage 3: each parameter is split in halves, rank 0's half first.
        std::size_t offset = 0, at = 0;
        bool all_equal = true;
        for (const auto& p : ckpt.params()) {
          const auto half = static_cast<std::size_t>(p.numel() / 2);
          all_equal &= std::equal(ranks[0].begin() + offset, ranks[0].begin() + offset + half,
                                  flat.begin() + at);
          all_equal &= std::equal(ranks[1].begin() + offset, ranks[1].begin() + offset + half,
                                  flat.begin() + at + half);
          offset += half;
          at += 2 * half;
        }
        CHECK(all_equal);
      }
    }
    CHECK_THROWS_WITH(
        ckpt.read_state(0, "momentum_buffer"),
        Catch::Contains(
            "no optimizer state 'momentum_buffer'; the checkpoint holds [exp_avg, exp_avg_sq]"));
  }
}

TEST_CASE("a tag folder opens directly, and a named tag is found") {
  const auto a = ds::DeepSpeedCheckpoint::open(kFixtures + "/zero2_world2_fp32/step5");
  const auto b = ds::DeepSpeedCheckpoint::open(kFixtures + "/zero2_world2_fp32", "step5");
  CHECK(a.params().size() == b.params().size());
  CHECK(ds::is_deepspeed_checkpoint(kFixtures + "/zero2_world2_fp32/step5"));
  CHECK_FALSE(ds::is_deepspeed_checkpoint(kFixtures));
  CHECK_THROWS_WITH(ds::DeepSpeedCheckpoint::open(kFixtures + "/zero2_world2_fp32", "step6"),
                    Catch::Contains("no tag folder 'step6'"));
  CHECK_THROWS_WITH(ds::DeepSpeedCheckpoint::open(kFixtures),
                    Catch::Contains("not a DeepSpeed checkpoint"));
}

TEST_CASE("a missing rank file is refused, naming it") {
  TempDir tmp;
  for (const char* name : kFixtureNames) {
    const fs::path dir = copy_fixture(tmp, name);
    fs::remove(dir / "step5/zero_pp_rank_1_mp_rank_00_optim_states.pt");
    const std::string msg = error_of([&] { (void)ds::DeepSpeedCheckpoint::open(dir.string()); });
    INFO(msg);
    CHECK(msg.find((dir / "step5").string()) != std::string::npos);
    CHECK(msg.find("missing rank file zero_pp_rank_1_mp_rank_00_optim_states.pt") !=
          std::string::npos);
    CHECK(msg.find("says 2 ranks") != std::string::npos);
  }
  const fs::path dir3 = tmp.path() / "zero3_world2_fp32";
  fs::copy_file(kFixtures + "/zero3_world2_fp32/step5/zero_pp_rank_1_mp_rank_00_optim_states.pt",
                dir3 / "step5/zero_pp_rank_1_mp_rank_00_optim_states.pt");
  fs::remove(dir3 / "step5/zero_pp_rank_1_mp_rank_00_model_states.pt");
  CHECK_THROWS_WITH(ds::DeepSpeedCheckpoint::open(dir3.string()),
                    Catch::Contains("missing rank file zero_pp_rank_1_mp_rank_00_model_states.pt"));
}

TEST_CASE("a truncated rank file is refused, naming it") {
  TempDir tmp;
  const fs::path dir = copy_fixture(tmp, "zero2_world2_fp32");
  const fs::path victim = dir / "step5/zero_pp_rank_1_mp_rank_00_optim_states.pt";
  fs::resize_file(victim, fs::file_size(victim) - 30);
  const std::string msg = error_of([&] { (void)ds::DeepSpeedCheckpoint::open(dir.string()); });
  INFO(msg);
  CHECK(msg.find(victim.string()) != std::string::npos);
  CHECK(msg.find("truncated") != std::string::npos);
}

TEST_CASE("an unknown DeepSpeed layout is refused, saying what was expected") {
  TempDir tmp;
  const fs::path tag = tmp.path() / "global_step1";
  fs::create_directories(tag);
  std::ofstream(tmp.path() / "latest") << "global_step1";
  // Neither ZeRO nor BF16_Optimizer: master partitions but no zero_stage and no group_paddings.
  t::write_pt((tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").string(),
              "bf16_zero_pp_rank_0_mp_rank_00_optim_states",
              t::Pickler::dumps(
                  t::dict({{t::str("optimizer_state_dict"),
                            t::dict({{t::str("single_partition_of_fp32_groups"), t::list({})},
                                     {t::str("partition_count"), t::list({t::integer(1)})}})}})),
              {});
  const std::string msg = error_of([&] { (void)ds::DeepSpeedCheckpoint::open(tmp.str()); });
  INFO(msg);
  CHECK(msg.find("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt: optimizer_state_dict:") !=
        std::string::npos);
  CHECK(msg.find("unknown DeepSpeed optimizer states: neither 'zero_stage'") !=
        std::string::npos);
  CHECK(msg.find("BF16_Optimizer's 'single_partition_of_fp32_groups' and 'group_paddings'") !=
        std::string::npos);

  // Model parallelism is refused by file name.
  std::ofstream(tag / "mp_rank_01_model_states.pt") << "x";
  CHECK_THROWS_WITH(ds::DeepSpeedCheckpoint::open(tmp.str()),
                    Catch::Contains("model-parallel checkpoint (mp_rank_01)"));
}

// --- synthetic checkpoints: what the fixtures do not exercise ------------------------------------

namespace {

struct SynthParam {
  std::string name;
  std::vector<std::int64_t> shape;
  bool trainable = true;
  int group = 0;  // stage 1/2 param group; stage 3 sub-group
  std::int64_t numel() const { return static_cast<std::int64_t>(zero::numel_of(shape)); }
};

// Values DeepSpeed would hold: parameter p's element i, its moments, and padding that must never
// show up in a reconstruction.
float value_of(std::size_t p, std::int64_t i) {
  return static_cast<float>(p) * 1000.0f + static_cast<float>(i) * 0.5f + 0.25f;
}
constexpr float kExpAvgShift = 1.0e6f;
constexpr float kExpAvgSqShift = 2.0e6f;
constexpr float kPadding = -7777.0f;

class Storages {
 public:
  t::Py add(const std::vector<float>& v, std::vector<std::int64_t> shape) {
    const std::string key = std::to_string(data_.size());
    data_[key] = v;
    return t::tensor(key, static_cast<std::int64_t>(v.size()), 0, std::move(shape));
  }
  t::Py add(const std::vector<float>& v) { return add(v, {static_cast<std::int64_t>(v.size())}); }
  void write(const fs::path& path, const t::Py& root) const {
    const std::string archive = path.stem().string();
    t::write_pt(path.string(), archive, t::Pickler::dumps(root), data_);
  }

 private:
  std::map<std::string, std::vector<float>> data_;
};

struct Synth {
  int stage = 2;
  int world = 3;
  std::vector<SynthParam> params;                         // model order
  std::vector<std::pair<std::string, std::string>> tied;  // alias, owner
  std::string buffer = "running_mean";  // a persistent buffer of 3 elements, after the params
  bool elastic = false;  // stage 1/2 elastic_checkpoint: lean moments, one state dict per group

  std::vector<float> values(std::size_t p) const {
    std::vector<float> v(static_cast<std::size_t>(params[p].numel()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = value_of(p, static_cast<std::int64_t>(i));
    return v;
  }
  int groups() const {
    int g = 0;
    for (const auto& p : params) g = std::max(g, p.group + 1);
    return g;
  }

  t::Py common_model_keys(Storages& st, int rank, bool partitioned) const {
    std::vector<std::pair<t::Py, t::Py>> module, shapes_frozen, fragments;
    std::vector<t::Py> param_shapes;
    for (int g = 0; g < groups(); ++g) {
      std::vector<std::pair<t::Py, t::Py>> shapes;
      for (const auto& p : params) {
        if (p.trainable && p.group == g) shapes.emplace_back(t::str(p.name), t::size(p.shape));
      }
      param_shapes.push_back(t::odict(shapes));
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      module.emplace_back(t::str(p.name),
                          partitioned ? st.add({}, {0}) : st.add(values(i), p.shape));
      for (const auto& [alias, owner] : tied) {
        if (owner == p.name)
          module.emplace_back(t::str(alias),
                              partitioned ? st.add({}, {0}) : st.add(values(i), p.shape));
      }
      if (p.trainable || stage == 1) continue;
      shapes_frozen.emplace_back(t::str(p.name), t::size(p.shape));
      if (stage == 2) {
        fragments.emplace_back(t::str(p.name), st.add(values(i), p.shape));
      } else {
        fragments.emplace_back(t::str(p.name), st.add(rank_chunk(values(i), rank, kPadding)));
      }
    }
    module.emplace_back(t::str(buffer), st.add({3.5f, 4.5f, 5.5f}, {3}));
    std::vector<std::pair<t::Py, t::Py>> shared;
    if (rank == 0) {
      for (const auto& [alias, owner] : tied) shared.emplace_back(t::str(alias), t::str(owner));
    }
    return t::dict({
        {t::str("module"), t::odict(module)},
        {t::str("buffer_names"), t::list({t::str(buffer)})},
        {t::str("optimizer"), t::none()},
        {t::str("param_shapes"), t::list(param_shapes)},
        {t::str("frozen_param_shapes"), stage == 1 ? t::none() : t::odict(shapes_frozen)},
        {t::str("shared_params"), t::dict(shared)},
        {t::str("frozen_param_fragments"), stage == 1 ? t::none() : t::dict(fragments)},
        {t::str("lr_scheduler"), t::dict({{t::str("last_batch_iteration"), t::integer(6)}})},
        {t::str("global_steps"), t::integer(7)},
        {t::str("global_samples"), t::integer(56)},
        {t::str("skipped_steps"), t::integer(1)},
        {t::str("dp_world_size"), t::integer(world)},
        {t::str("mp_world_size"), t::integer(1)},
        {t::str("ds_config"), t::dict({{t::str("train_batch_size"), t::integer(8)}})},
        {t::str("ds_version"), t::str("0.16.5")},
    });
  }

  // Stage 3: rank r's ceil(n/W) share of a parameter, padded.
  std::vector<float> rank_chunk(const std::vector<float>& v, int rank, float pad) const {
    const std::size_t c = (v.size() + world - 1) / world;
    std::vector<float> out(c, pad);
    for (std::size_t k = 0; k < c; ++k) {
      const std::size_t i = rank * c + k;
      if (i < v.size()) out[k] = v[i];
    }
    return out;
  }

  t::Py scaler() const {
    return t::object("deepspeed.runtime.fp16.loss_scaler DynamicLossScaler",
                     {{t::str("cur_scale"), t::number(1024.0)},
                      {t::str("cur_iter"), t::integer(7)},
                      {t::str("last_overflow_iter"), t::integer(-1)},
                      {t::str("scale_factor"), t::number(2.0)},
                      {t::str("scale_window"), t::integer(1000)},
                      {t::str("dynamic"), t::boolean(true)},
                      {t::str("dtype"), t::global("torch float16")}});
  }
  t::Py param_group(int id) const {
    return t::dict({{t::str("lr"), t::number(0.001)},
                    {t::str("betas"), t::tuple({t::number(0.9), t::number(0.999)})},
                    {t::str("weight_decay"), t::number(0.01)},
                    {t::str("params"), t::list({t::integer(id)})}});
  }
  static std::vector<float> shifted(std::vector<float> v, float shift) {
    for (float& x : v) {
      if (x != kPadding) x += shift;
    }
    return v;
  }

  void write(const fs::path& dir) const {
    const fs::path tag = dir / "global_step7";
    fs::create_directories(tag);
    std::ofstream(dir / "latest") << "global_step7\n";
    if (stage <= 2)
      write_stage12(tag);
    else
      write_stage3(tag);
  }

  void write_stage12(const fs::path& tag) const {
    {
      Storages st;
      st.write(tag / "mp_rank_00_model_states.pt", common_model_keys(st, 0, false));
    }
    // Per group: the flat of its trainable params, aligned to 2·W, split in W equal partitions.
    std::vector<std::vector<float>> flats(groups());
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!params[i].trainable) continue;
      const auto v = values(i);
      flats[params[i].group].insert(flats[params[i].group].end(), v.begin(), v.end());
    }
    for (int r = 0; r < world; ++r) {
      Storages st;
      std::vector<t::Py> lean, paddings, counts, groups_py, elastic_states;
      std::vector<std::pair<t::Py, t::Py>> state;
      for (int g = 0; g < groups(); ++g) {
        const std::size_t n = flats[g].size();
        const std::size_t padded = (n + 2 * world - 1) / (2 * world) * (2 * world);
        const std::size_t part = padded / world;
        std::vector<float> mine(part, kPadding);
        std::size_t lean_n = 0;
        for (std::size_t k = 0; k < part; ++k) {
          if (r * part + k < n) {
            mine[k] = flats[g][r * part + k];
            ++lean_n;
          }
        }
        lean.push_back(st.add(
            std::vector<float>(mine.begin(), mine.begin() + static_cast<std::ptrdiff_t>(lean_n))));
        paddings.push_back(t::integer(static_cast<std::int64_t>(part - lean_n)));
        counts.push_back(t::integer(world));
        state.emplace_back(
            t::integer(g),
            t::dict({{t::str("step"), t::integer(7)},
                     {t::str("exp_avg"), st.add(shifted(mine, kExpAvgShift))},
                     {t::str("exp_avg_sq"), st.add(shifted(mine, kExpAvgSqShift))}}));
        groups_py.push_back(param_group(g));
        const std::vector<float> lean_values(mine.begin(),
                                             mine.begin() + static_cast<std::ptrdiff_t>(lean_n));
        elastic_states.push_back(
            t::dict({{t::str("step"), t::integer(7)},
                     {t::str("exp_avg"), st.add(shifted(lean_values, kExpAvgShift))},
                     {t::str("exp_avg_sq"), st.add(shifted(lean_values, kExpAvgSqShift))}}));
      }
      const t::Py base = elastic ? t::list(elastic_states)
                                 : t::dict({{t::str("state"), t::dict(state)},
                                            {t::str("param_groups"), t::list(groups_py)}});
      const t::Py osd = t::dict({
          {t::str("loss_scaler"), scaler()},
          {t::str("dynamic_loss_scale"), t::boolean(true)},
          {t::str("overflow"), t::boolean(false)},
          {t::str("clip_grad"), t::number(1.0)},
          {t::str("base_optimizer_state"), base},
          {t::str("single_partition_of_fp32_groups"), t::list(lean)},
          {t::str("zero_stage"),
           t::enum_value("deepspeed.runtime.zero.config ZeroStageEnum", stage)},
          {t::str("group_paddings"), t::list(paddings)},
          {t::str("partition_count"), t::list(counts)},
          {t::str("ds_version"), t::str("0.16.5")},
      });
      st.write(tag / fmt::format("bf16_zero_pp_rank_{}_mp_rank_00_optim_states.pt", r),
               t::dict({{t::str("optimizer_state_dict"), osd},
                        {t::str("ds_version"), t::str("0.16.5")}}));
    }
  }

  void write_stage3(const fs::path& tag) const {
    for (int r = 0; r < world; ++r) {
      {
        Storages st;
        st.write(tag / fmt::format("zero_pp_rank_{}_mp_rank_00_model_states.pt", r),
                 common_model_keys(st, r, true));
      }
      Storages st;
      std::vector<t::Py> flat_groups;
      std::vector<std::pair<t::Py, t::Py>> state;
      for (int g = 0; g < groups(); ++g) {
        std::vector<float> flat;
        for (std::size_t i = 0; i < params.size(); ++i) {
          if (!params[i].trainable || params[i].group != g) continue;
          const auto chunk = rank_chunk(values(i), r, kPadding);
          flat.insert(flat.end(), chunk.begin(), chunk.end());
        }
        flat_groups.push_back(st.add(flat));
        state.emplace_back(
            t::integer(g),
            t::dict({{t::str("step"), t::integer(7)},
                     {t::str("exp_avg"), st.add(shifted(flat, kExpAvgShift))},
                     {t::str("exp_avg_sq"), st.add(shifted(flat, kExpAvgSqShift))}}));
      }
      const t::Py osd = t::dict({
          {t::str("zero_stage"), t::enum_value("deepspeed.runtime.zero.config ZeroStageEnum", 3)},
          {t::str("loss_scaler"), scaler()},
          {t::str("dynamic_loss_scale"), t::boolean(true)},
          {t::str("overflow"), t::boolean(false)},
          {t::str("partition_count"), t::integer(world)},
          {t::str("optimizer_state_dict"),
           t::dict({{t::str("state"), t::dict(state)},
                    {t::str("param_groups"), t::list({param_group(0)})}})},
          {t::str("fp32_flat_groups"), t::list(flat_groups)},
      });
      st.write(tag / fmt::format("zero_pp_rank_{}_mp_rank_00_optim_states.pt", r),
               t::dict({{t::str("optimizer_state_dict"), osd},
                        {t::str("ds_version"), t::str("0.16.5")}}));
    }
  }
};

Synth make_synth(int stage, int world) {
  Synth s;
  s.stage = stage;
  s.world = world;
  // Odd sizes so every partition boundary and per-parameter share needs padding; two groups
  // (stage 3: sub-groups) whose order differs from the model order; one frozen parameter.
  s.params = {{"embed.weight", {7, 3}, true, 0},
              {"block.weight", {5, 5}, true, 1},
              {"block.bias", {5}, true, 0},
              {"frozen.weight", {4, 3}, false, 0},
              {"head.bias", {1}, true, 1}};
  s.tied = {{"head.weight", "embed.weight"}};
  return s;
}

}  // namespace

TEST_CASE(
    "synthetic checkpoints with padding, 3 ranks, groups, frozen and tied parameters reconstruct "
    "exactly") {
  for (int stage : {1, 2, 3}) {
    for (int world : {1, 3, 4}) {
      TempDir tmp;
      const Synth s = make_synth(stage, world);
      s.write(tmp.path());
      INFO("stage " << stage << ", " << world << " ranks");
      const auto ckpt = ds::DeepSpeedCheckpoint::open(tmp.str());
      CHECK(ckpt.stage() == stage);
      CHECK(ckpt.world_size() == world);
      CHECK(ckpt.step() == 7);
      CHECK(ckpt.loss_scale() == 1024.0);
      CHECK(ckpt.dynamic_loss_scale());
      CHECK(ckpt.scaler_state()["dtype"] == "torch.float16");
      CHECK(ckpt.lr_scheduler()["last_batch_iteration"] == 6);
      CHECK(ckpt.skipped_steps() == 1);

      // Model order: the module's, with the tied alias after its owner and the buffer last;
      // stage 1 checkpoints carry no frozen parameters.
      std::vector<std::string> names;
      for (const auto& p : ckpt.params()) names.push_back(p.name);
      std::vector<std::string> want = {"embed.weight", "head.weight", "block.weight", "block.bias"};
      if (stage != 1) want.push_back("frozen.weight");
      want.push_back("head.bias");
      want.push_back("running_mean");
      CHECK(names == want);

      for (std::size_t i = 0; i < s.params.size(); ++i) {
        const auto idx = ckpt.find(s.params[i].name);
        if (stage == 1 && !s.params[i].trainable) {
          CHECK_FALSE(idx.has_value());
          continue;
        }
        REQUIRE(idx.has_value());
        const ds::DsParam& p = ckpt.params()[*idx];
        INFO(p.name);
        CHECK(p.shape == s.params[i].shape);
        CHECK(p.trainable == s.params[i].trainable);
        const auto v = s.values(i);
        CHECK(bitwise_equal(ckpt.read_fp32(*idx), v));
        if (p.trainable) {
          CHECK(bitwise_equal(ckpt.read_state(*idx, "exp_avg"), Synth::shifted(v, kExpAvgShift)));
          CHECK(bitwise_equal(ckpt.read_state(*idx, "exp_avg_sq"),
                              Synth::shifted(v, kExpAvgSqShift)));
        } else {
          CHECK_THROWS_WITH(ckpt.read_state(*idx, "exp_avg"), Catch::Contains("frozen parameter"));
        }
      }
      const auto tied = ckpt.find("head.weight");
      REQUIRE(tied.has_value());
      CHECK(ckpt.params()[*tied].tied_to == std::optional<std::string>("embed.weight"));
      CHECK(bitwise_equal(ckpt.read_fp32(*tied), s.values(0)));
      const auto buffer = ckpt.find("running_mean");
      REQUIRE(buffer.has_value());
      CHECK(ckpt.params()[*buffer].buffer);
      CHECK(ckpt.read_fp32(*buffer) == std::vector<float>{3.5f, 4.5f, 5.5f});
    }
  }
}

TEST_CASE("elastic stage 1/2 checkpoints (lean moments per group) reconstruct exactly") {
  for (int stage : {1, 2}) {
    TempDir tmp;
    Synth s = make_synth(stage, 3);
    s.elastic = true;
    s.write(tmp.path());
    INFO("stage " << stage);
    const auto ckpt = ds::DeepSpeedCheckpoint::open(tmp.str());
    CHECK(ckpt.step() == 7);
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      if (!s.params[i].trainable) continue;
      const std::size_t idx = ckpt.find(s.params[i].name).value();
      const auto v = s.values(i);
      CHECK(bitwise_equal(ckpt.read_fp32(idx), v));
      CHECK(bitwise_equal(ckpt.read_state(idx, "exp_avg_sq"), Synth::shifted(v, kExpAvgSqShift)));
    }
  }
}

TEST_CASE("a stage 3 sub-group offloaded to NVMe is refused by name") {
  TempDir tmp;
  Synth s = make_synth(3, 2);
  s.write(tmp.path());
  // Rank 1's second sub-group saved as the empty placeholder DeepSpeed writes for NVMe.
  Storages st;
  const t::Py osd = t::dict({
      {t::str("zero_stage"), t::enum_value("deepspeed.runtime.zero.config ZeroStageEnum", 3)},
      {t::str("partition_count"), t::integer(2)},
      {t::str("optimizer_state_dict"), t::dict({{t::str("state"), t::dict({})}})},
      {t::str("fp32_flat_groups"), t::list({st.add(std::vector<float>(20, 1.0f)), st.add({})})},
  });
  st.write(tmp.path() / "global_step7/zero_pp_rank_1_mp_rank_00_optim_states.pt",
           t::dict({{t::str("optimizer_state_dict"), osd}}));
  CHECK_THROWS_WITH(
      ds::DeepSpeedCheckpoint::open(tmp.str()),
      Catch::Contains("zero_pp_rank_1_mp_rank_00_optim_states.pt: "
                      "optimizer_state_dict.fp32_flat_groups[1]: an empty sub-group") &&
          Catch::Contains("NVMe"));
}

TEST_CASE("param_shapes that disagree with the saved partitions are refused") {
  TempDir tmp;
  Synth s = make_synth(3, 2);
  s.write(tmp.path());
  // Rewrite rank 0's model states with one more parameter than the partitions hold.
  Synth bigger = s;
  bigger.params.push_back({"extra.weight", {6}, true, 1});
  Storages st;
  st.write(tmp.path() / "global_step7/zero_pp_rank_0_mp_rank_00_model_states.pt",
           bigger.common_model_keys(st, 0, true));
  const std::string msg = error_of([&] { (void)ds::DeepSpeedCheckpoint::open(tmp.str()); });
  INFO(msg);
  CHECK(msg.find("zero_pp_rank_0_mp_rank_00_model_states.pt: param_shapes[1]['extra.weight']") !=
        std::string::npos);
  CHECK(msg.find("each rank's fp32_flat_groups hold") != std::string::npos);
}
