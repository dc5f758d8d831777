// CheckpointSource: zero checkpoints the engine saves and DeepSpeed's own (the fixtures) open
// through the one interface, name their format, and read back exactly what was saved; folders
// that are not checkpoints, damaged files and bad ranges are refused by name.
#include "zero/checkpoint/source.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "tests/corrupt_file.h"
#include "tests/temp_dir.h"
#include "tests/zero/engine/engine_test_util.h"
#include "zero/base/error.h"
#include "zero/dscheckpoint/deepspeed.h"
#include "zero/io/safetensors.h"

namespace zero::test {
namespace {

namespace fs = std::filesystem;
using ckpt::CheckpointSource;
using ckpt::Format;

const std::string kFixtures = std::string(ZERO_TEST_DATA_DIR) + "/deepspeed_checkpoints/";
const char* const kFixtureNames[] = {"zero1_world2_fp32", "zero2_world2_fp32", "zero3_world2_fp32"};

// What f() throws as zero::IoError; empty when it does not throw.
template <typename F>
std::string io_error_of(F&& f) {
  try {
    f();
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Trains `steps` optimizer steps on `world` ranks and saves tag "step<steps>" into `dir`.
TrainResult train_and_save(const nlohmann::json& config, int world, int steps,
                           const std::string& dir, std::function<bool(std::size_t)> frozen = {}) {
  TrainSpec spec;
  spec.config = config;
  spec.world = world;
  spec.steps = steps;
  spec.save_dir = dir;
  spec.save_after = steps;
  spec.frozen = std::move(frozen);
  return train(spec);
}

// Parameter p's "master" or state `what`, read in three ranges (so a range starts mid-tensor).
std::vector<float> read_in_pieces(const CheckpointSource& s, std::size_t p,
                                  const std::string& what) {
  const std::uint64_t n = s.params()[p].numel;
  std::vector<float> out(n);
  const std::uint64_t a = n / 3, b = 2 * n / 3;
  s.read(p, what, 0, a, out.data());
  s.read(p, what, a, b - a, out.data() + a);
  s.read(p, what, b, n - b, out.data() + b);
  return out;
}

}  // namespace

TEST_CASE(
    "a zero checkpoint the engine saved opens as zero and reads back masters, states, frozen "
    "values and counters",
    "[checkpoint]") {
  TempDir dir;
  // bf16: the frozen parameter is stored in the model's 16-bit dtype, the masters in fp32.
  constexpr std::size_t kFrozen = 1;
  const TrainResult run = train_and_save(base_config(2, "bf16", 1), 2, 3, dir.str(),
                                         [](std::size_t i) { return i == kFrozen; });
  const auto source = CheckpointSource::open(dir.str());
  CHECK(source->format() == Format::Zero);
  CHECK(ckpt::format_name(source->format()) == "zero");
  CHECK(fs::path(source->path()).filename() == "step3");
  CHECK(source->stage() == 2);
  CHECK(source->world_size() == 2);
  CHECK(source->model_dtype() == "bf16");

  const std::vector<ckpt::SourceParam>& params = source->params();
  REQUIRE(params.size() == run.names.size());
  std::size_t moved = 0, nonzero_moments = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ckpt::SourceParam& p = params[i];
    INFO(p.name);
    CHECK(p.name == run.names[i]);
    CHECK(p.numel == run.params[i].size());
    CHECK_FALSE(p.buffer);
    CHECK(p.aliases.empty());
    CHECK_FALSE(p.tied_to.has_value());
    CHECK(p.trainable == (i != kFrozen));
    if (!p.trainable) {
      CHECK(p.frozen_dtype == DType::BF16);
      const std::vector<std::byte> raw = source->read_frozen_raw(i);
      REQUIRE(raw.size() == p.numel * 2);
      std::vector<float> widened(p.numel);
      kernels::cast_cpu(raw.data(), DType::BF16, widened.data(), DType::F32, p.numel);
      CHECK(bitwise_equal(widened, run.params[i]));
      CHECK(bitwise_equal(source->read_frozen(i), run.params[i]));
      CHECK_THROWS_AS(source->read(i, "master", 0, 1, widened.data()), IoError);
      continue;
    }
    const std::vector<float> master = read_in_pieces(*source, i, "master");
    CHECK(bitwise_equal(master, run.params[i]));
    CHECK(bitwise_equal(source->read_frozen(i), master));
    for (std::size_t e = 0; e < master.size(); ++e) moved += master[e] != run.initial[i][e];
    const std::vector<float> m = read_in_pieces(*source, i, "exp_avg");
    nonzero_moments += static_cast<std::size_t>(
        std::count_if(m.begin(), m.end(), [](float v) { return v != 0.0f; }));
  }
  CHECK(moved > 0);  // the run trained: equal masters are not the initial values twice
  CHECK(nonzero_moments > 0);

  const ckpt::SourceCounters c = source->counters();
  CHECK(c.global_steps == 3);
  CHECK(c.applied_steps == 3);
  CHECK(c.skipped_steps == 0);
  CHECK(c.scaler.has_value());
  CHECK(source->client_state() == nlohmann::json{{"next_step", 3}});

  CHECK(source->check_states({"exp_avg", "exp_avg_sq"}, "adamw").empty());
  CHECK_THAT(source->check_states({"sum"}, "adagrad"),
             Catch::Contains("optimizer is adamw (states exp_avg, exp_avg_sq)") &&
                 Catch::Contains("adagrad"));

  const std::vector<ckpt::ChecksummedFile> files = source->checksummed_files();
  REQUIRE(files.size() == 2);
  CHECK(files[1].file == "rank_00001_of_00002.safetensors");
  CHECK(files[0].tensors == 4);  // master, exp_avg, exp_avg_sq and the frozen parameter
  CHECK(files[1].tensors == 3);
  CHECK(files[1].bytes > 0);
  CHECK_NOTHROW(source->verify(0, 2));
  CHECK_NOTHROW(source->verify(1, 2));
}

TEST_CASE(
    "verify checks exactly a rank's share of the files and names the corrupted file and tensor",
    "[checkpoint]") {
  TempDir dir;
  train_and_save(base_config(1, "fp32", 1), 3, 1, dir.str());
  flip_byte(dir.str() + "/step1/rank_00001_of_00003.safetensors", "exp_avg");
  const auto source = CheckpointSource::open(dir.str());
  REQUIRE(source->checksummed_files().size() == 3);
  // Loaded at 2 ranks: rank 0 checks files 0 and 2, rank 1 file 1.
  CHECK_NOTHROW(source->verify(0, 2));
  const std::string e = io_error_of([&] { source->verify(1, 2); });
  CHECK_THAT(e, Catch::Contains("'exp_avg'") &&
                    Catch::Contains("rank_00001_of_00003.safetensors") &&
                    Catch::Contains("corrupted"));
  CHECK_THROWS_AS(source->verify(0, 1), IoError);
  CHECK_NOTHROW(source->verify_file(2));
}

TEST_CASE(
    "DeepSpeed's checkpoints open as DeepSpeed and read what its own zero_to_fp32 reconstructs",
    "[checkpoint][deepspeed]") {
  for (const std::string name : kFixtureNames) {
    const std::string dir = kFixtures + name;
    INFO(dir);
    const auto source = CheckpointSource::open(dir);
    CHECK(source->format() == Format::DeepSpeed);
    CHECK(ckpt::format_name(source->format()) == "DeepSpeed");
    CHECK(source->stage() == name[4] - '0');
    CHECK(source->world_size() == 2);
    CHECK(source->model_dtype() == "fp32");
    // The tag may be named, or the tag folder passed itself.
    CHECK(CheckpointSource::open(dir, "step5")->path() == source->path());
    CHECK(CheckpointSource::open(dir + "/step5")->params().size() == source->params().size());

    const auto expected = io::SafetensorsReader::open(dir + "/expected_fp32.safetensors");
    const auto ds = dscheckpoint::DeepSpeedCheckpoint::open(dir);
    REQUIRE(source->params().size() == expected.tensors().size());
    std::size_t nonzero = 0;
    for (std::size_t i = 0; i < source->params().size(); ++i) {
      const ckpt::SourceParam& p = source->params()[i];
      const io::TensorInfo& want = expected.tensors()[i];  // same (model) order
      INFO(p.name);
      CHECK(p.name == want.name);
      CHECK(p.shape == want.shape);
      CHECK(p.trainable);
      const std::vector<float> ref = expected.read_f32(want.name);
      nonzero += static_cast<std::size_t>(
          std::count_if(ref.begin(), ref.end(), [](float v) { return v != 0.0f; }));
      CHECK(bitwise_equal(read_in_pieces(*source, i, "master"), ref));
      CHECK(
          bitwise_equal(read_in_pieces(*source, i, "exp_avg_sq"), ds.read_state(i, "exp_avg_sq")));
    }
    CHECK(nonzero > 5000);  // the comparison is not vacuous

    const ckpt::SourceCounters c = source->counters();
    CHECK(c.global_steps == 5);
    CHECK(c.applied_steps == 5);
    CHECK(c.skipped_steps == 0);
    CHECK_FALSE(c.scaler.has_value());  // a static scaler: the run's config keeps its scale
    CHECK(source->client_state() == nlohmann::json::object());

    CHECK(source->checksummed_files().empty());
    CHECK_NOTHROW(source->verify(0, 1));
    CHECK(source->check_states({"exp_avg", "exp_avg_sq"}, "adamw").empty());
    CHECK_THAT(source->check_states({"sum"}, "adagrad"),
               Catch::Contains(
                   "holds optimizer states exp_avg, exp_avg_sq, this run's adagrad needs sum"));
  }
}

TEST_CASE("the format is detected from the folder", "[checkpoint]") {
  TempDir dir;
  train_and_save(base_config(0, "fp32", 1), 1, 1, dir.str() + "/zero");
  fs::create_directories(dir.path() / "empty");
  CHECK(ckpt::detect_format(kFixtures + "zero2_world2_fp32") == Format::DeepSpeed);
  CHECK(ckpt::detect_format(kFixtures + "zero3_world2_fp32/step5") == Format::DeepSpeed);
  CHECK(ckpt::detect_format(dir.str() + "/zero") == Format::Zero);
  // Not DeepSpeed: whether it is a checkpoint at all is for open() to say.
  CHECK(ckpt::detect_format(dir.str() + "/empty") == Format::Zero);
  CHECK(ckpt::detect_format(dir.str() + "/nowhere") == Format::Zero);
  CHECK(CheckpointSource::open(dir.str() + "/zero")->format() == Format::Zero);
}

TEST_CASE(
    "a folder that is not a checkpoint, or lacks a file, is refused naming the path and what "
    "is missing",
    "[checkpoint]") {
  TempDir dir;
  const std::string zero_dir = dir.str() + "/zero";
  train_and_save(base_config(3, "fp32", 1), 2, 1, zero_dir);
  fs::create_directories(dir.path() / "empty");

  const std::string empty = dir.str() + "/empty";
  CHECK_THAT(io_error_of([&] { (void)CheckpointSource::open(empty); }),
             Catch::Contains(empty) && Catch::Contains("no 'latest' file"));
  CHECK_THAT(io_error_of([&] { (void)CheckpointSource::open(zero_dir, "step9"); }),
             Catch::Contains(zero_dir + "/step9") && Catch::Contains("no manifest.json"));
  fs::remove(zero_dir + "/step1/rank_00001_of_00002.safetensors");
  CHECK_THAT(io_error_of([&] { (void)CheckpointSource::open(zero_dir); }),
             Catch::Contains("rank_00001_of_00002.safetensors") && Catch::Contains("missing"));

  CHECK_THAT(
      io_error_of([&] { (void)CheckpointSource::open(kFixtures + "zero2_world2_fp32", "step6"); }),
      Catch::Contains("zero2_world2_fp32") && Catch::Contains("no tag folder 'step6'"));
  const fs::path ds_copy = dir.path() / "ds";
  fs::copy(kFixtures + "zero1_world2_fp32", ds_copy, fs::copy_options::recursive);
  for (const auto& e : fs::recursive_directory_iterator(ds_copy)) {
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  }
  fs::remove(ds_copy / "step5/zero_pp_rank_1_mp_rank_00_optim_states.pt");
  CHECK_THAT(io_error_of([&] { (void)CheckpointSource::open(ds_copy.string()); }),
             Catch::Contains("missing rank file zero_pp_rank_1_mp_rank_00_optim_states.pt"));
}

TEST_CASE("a range outside a parameter is refused naming the parameter", "[checkpoint]") {
  TempDir dir;
  train_and_save(base_config(1, "fp32", 1), 1, 1, dir.str());
  const auto zero = CheckpointSource::open(dir.str());
  const auto ds = CheckpointSource::open(kFixtures + "zero2_world2_fp32");
  for (const CheckpointSource* s : {zero.get(), ds.get()}) {
    INFO(ckpt::format_name(s->format()));
    const ckpt::SourceParam& p = s->params().at(0);
    std::vector<float> out(p.numel + 1);
    CHECK_NOTHROW(s->read(0, "master", 0, p.numel, out.data()));
    CHECK_THAT(io_error_of([&] { s->read(0, "master", p.numel - 1, 2, out.data()); }),
               Catch::Contains("'" + p.name + "'") && Catch::Contains("outside"));
  }
}

}  // namespace zero::test
