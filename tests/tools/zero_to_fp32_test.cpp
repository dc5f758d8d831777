// Runs the built zero_to_fp32 (ZERO_TO_FP32_BIN) on checkpoints the built zero-train
// (ZERO_TRAIN_BIN) saves: the consolidated weights against --dump-params of the same run, output
// dtypes, Hugging Face sharding, frozen parameters, corrupted and missing rank files, usage errors.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "models/mlp.h"
#include "tests/cli_util.h"
#include "tests/temp_dir.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/io/safetensors.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using zero::io::SafetensorsReader;

const std::string kTrain = std::string(ZERO_TEST_DATA_DIR) + "/train/";
// Odd widths, so partitions at 3 and 4 ranks split parameters in the middle.
const std::string kModel = "mlp:7,13,5";
constexpr std::uint64_t kModelBytes = (7 * 13 + 13 + 13 * 5 + 5) * 4;

struct Run {
  int status = -1;
  std::string out;  // stdout and stderr
};

Run run(const std::string& bin, const std::string& args) {
  const zero::test::CommandRun c = zero::test::run_tool(bin, args);
  return {c.status, c.out};
}

Run to_fp32(const std::string& args) {
  return run(ZERO_TO_FP32_BIN, args);
}

// A scratch directory named after the test case, removed when it ends.
class TempDir : public zero::test::TempDir {
 public:
  explicit TempDir(const std::string& name) : zero::test::TempDir("zero_to_fp32_test_" + name) {}
};

// zero-train with --save and --dump-params in the same run; REQUIREs success.
void train(const std::string& config, int world, int steps, const std::string& save_dir,
           const std::string& dump) {
  const std::string args = "--config " + kTrain + config + " --world-size " +
                           std::to_string(world) + " --steps " + std::to_string(steps) +
                           " --seed 7 --model " + kModel + " --quiet --save " + save_dir +
                           " --dump-params " + dump;
  const Run r = run(ZERO_TRAIN_BIN, args);
  INFO("zero-train " << args << "\n" << r.out);
  REQUIRE(r.status == 0);
}

struct Tensor {
  zero::DType dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
};

std::map<std::string, Tensor> read_all(const std::string& path) {
  const SafetensorsReader reader = SafetensorsReader::open(path);
  std::map<std::string, Tensor> out;
  for (const zero::io::TensorInfo& t : reader.tensors()) {
    Tensor& x = out[t.name];
    x.dtype = t.dtype;
    x.shape = t.shape;
    x.bytes.resize(t.size_bytes());
    reader.read_raw(t.name, x.bytes.data(), x.bytes.size());
  }
  return out;
}

std::vector<float> as_floats(const Tensor& t) {
  REQUIRE(t.dtype == zero::DType::F32);
  std::vector<float> v(t.bytes.size() / 4);
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

// The trained weights are not the initial ones: agreeing with them means something.
void require_trained(const std::map<std::string, Tensor>& dump) {
  const zero::models::MlpShape shape = zero::models::MlpShape::parse(kModel);
  const std::vector<zero::models::MlpParam> params = zero::models::mlp_params(shape);
  REQUIRE(dump.size() == params.size());
  double moved = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::vector<float> x = as_floats(dump.at(params[i].name));
    std::vector<float> init(x.size());
    zero::models::init_param(shape, i, 7, 0, init);
    for (std::size_t e = 0; e < x.size(); ++e) {
      moved = std::max(moved, static_cast<double>(std::abs(x[e] - init[e])));
    }
  }
  REQUIRE(moved > 1e-3);
}

void flip_byte(const std::string& path, std::uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  REQUIRE(f.good());
}

// Where tensor `name`'s bytes start in the file.
std::uint64_t tensor_file_offset(const std::string& path, const std::string& name) {
  std::ifstream in(path, std::ios::binary);
  std::uint64_t header_bytes = 0;
  in.read(reinterpret_cast<char*>(&header_bytes), 8);
  REQUIRE(in.good());
  return 8 + header_bytes + SafetensorsReader::open(path).at(name).data_begin;
}

std::size_t line_count(const std::string& s) {
  return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n'));
}

}  // namespace

TEST_CASE(
    "zero_to_fp32 of a run's checkpoint equals its --dump-params bitwise at stages 0-3 on "
    "1, 3 and 4 ranks") {
  for (int stage = 0; stage <= 3; ++stage) {
    for (int world : {1, 3, 4}) {
      INFO("stage " << stage << ", " << world << " ranks, " << kModel);
      const TempDir dir("stage" + std::to_string(stage) + "_w" + std::to_string(world));
      train("fp32_stage" + std::to_string(stage) + ".json", world, 3, dir / "ckpt",
            dir / "dump.safetensors");
      const std::map<std::string, Tensor> dump = read_all(dir / "dump.safetensors");
      require_trained(dump);

      const Run r = to_fp32(dir / "ckpt" + " " + dir / "out.safetensors");
      INFO(r.out);
      REQUIRE(r.status == 0);
      CHECK_THAT(r.out, Catch::Contains("checksums match") &&
                            Catch::Contains("wrote 4 tensors (fp32), " +
                                            std::to_string(kModelBytes) + " bytes") &&
                            Catch::Contains("GB/s") && Catch::Contains("peak RSS"));
      const std::map<std::string, Tensor> out = read_all(dir / "out.safetensors");
      REQUIRE(out.size() == dump.size());
      for (const auto& [name, expected] : dump) {
        INFO(name);
        REQUIRE(out.count(name) == 1);
        CHECK(out.at(name).dtype == zero::DType::F32);
        CHECK(out.at(name).shape == expected.shape);
        CHECK(out.at(name).bytes == expected.bytes);
      }
      CHECK(SafetensorsReader::open(dir / "out.safetensors").metadata() ==
            std::map<std::string, std::string>{{"format", "pt"}});
    }
  }
}

TEST_CASE("--dtype bf16 and fp16 write the master weights rounded to nearest even") {
  const TempDir dir("dtype");
  train("fp32_stage3.json", 3, 3, dir / "ckpt", dir / "dump.safetensors");
  const std::map<std::string, Tensor> dump = read_all(dir / "dump.safetensors");
  require_trained(dump);
  for (const auto& [flag, dtype] :
       {std::pair{"bf16", zero::DType::BF16}, std::pair{"fp16", zero::DType::F16}}) {
    INFO("--dtype " << flag);
    const std::string out_path = dir / (std::string(flag) + ".safetensors");
    const Run r = to_fp32(dir / "ckpt" + " " + out_path + " --dtype " + flag);
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("(" + std::string(flag) + ")") &&
                          Catch::Contains(std::to_string(kModelBytes / 2) + " bytes"));
    const std::map<std::string, Tensor> out = read_all(out_path);
    REQUIRE(out.size() == dump.size());
    for (const auto& [name, master] : dump) {
      const std::vector<float> values = as_floats(master);
      std::vector<std::byte> rounded(values.size() * 2);
      zero::kernels::cast_cpu(values.data(), zero::DType::F32, rounded.data(), dtype,
                              values.size());
      INFO(name);
      CHECK(out.at(name).dtype == dtype);
      CHECK(out.at(name).shape == master.shape);
      CHECK(out.at(name).bytes == rounded);
    }
  }
}

TEST_CASE(
    "a tiny --max-shard-size gives Hugging Face shards and an index whose union equals the "
    "single file") {
  const TempDir dir("shards");
  train("fp32_stage2.json", 3, 3, dir / "ckpt", dir / "dump.safetensors");
  const std::map<std::string, Tensor> single = read_all(dir / "dump.safetensors");
  require_trained(single);

  // 364, 52, 260 and 20 bytes under a 300-byte limit: the 364-byte weight alone (it is over the
  // limit), then the 52-byte bias alone (the next weight would take it over), then the rest.
  constexpr std::uint64_t kLimit = 300;
  constexpr std::size_t kShards = 3;
  struct Case {
    std::string output;      // as passed
    std::string index;       // expected index path
    std::string shard_stem;  // expected shard names: <stem>-0000k-of-00003.safetensors
    std::string shard_dir;
  };
  const std::vector<Case> cases = {
      {dir / "hf", dir / "hf/model.safetensors.index.json", "model", dir / "hf"},
      {dir / "file/weights.safetensors", dir / "file/weights.safetensors.index.json", "weights",
       dir / "file"},
  };
  for (const Case& c : cases) {
    INFO("OUTPUT " << c.output);
    // "0.3KB": Hugging Face's decimal units.
    const Run r = to_fp32(dir / "ckpt" + " " + c.output + " --max-shard-size 0.3KB");
    INFO(r.out);
    REQUIRE(r.status == 0);
    if (c.output.ends_with(".safetensors")) {
      CHECK_THAT(r.out, Catch::Contains("writing 3 shards next to " + c.output));
      CHECK_FALSE(fs::exists(c.output));
    }

    std::ifstream in(c.index);
    REQUIRE(in.good());
    const json index = json::parse(in);
    CHECK(index.at("metadata").at("total_size") == kModelBytes);
    const json& weight_map = index.at("weight_map");
    REQUIRE(weight_map.size() == single.size());

    std::map<std::string, Tensor> merged;
    std::set<std::string> files;
    for (std::size_t k = 1; k <= kShards; ++k) {
      const std::string name = c.shard_stem + "-0000" + std::to_string(k) + "-of-00003.safetensors";
      const std::string path = c.shard_dir + "/" + name;
      REQUIRE(fs::exists(path));
      files.insert(name);
      std::uint64_t bytes = 0;
      for (auto& [tensor, t] : read_all(path)) {
        CHECK(weight_map.at(tensor) == name);
        bytes += t.bytes.size();
        CHECK(merged.emplace(tensor, std::move(t)).second);
      }
      CHECK((bytes <= kLimit || k == 1));  // only the oversized weight's shard is over
      CHECK(SafetensorsReader::open(path).metadata().at("format") == "pt");
    }
    for (const auto& [tensor, file] : weight_map.items())
      CHECK(files.count(file.get<std::string>()) == 1);
    REQUIRE(merged.size() == single.size());
    for (const auto& [name, t] : single) {
      INFO(name);
      CHECK(merged.at(name).shape == t.shape);
      CHECK(merged.at(name).bytes == t.bytes);
    }
  }

  SECTION("a directory OUTPUT whose weights fit in one shard gets model.safetensors, no index") {
    const Run r = to_fp32(dir / "ckpt" + " " + dir / "one");
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK(fs::exists(dir / "one/model.safetensors"));
    CHECK_FALSE(fs::exists(dir / "one/model.safetensors.index.json"));
    const std::map<std::string, Tensor> out = read_all(dir / "one/model.safetensors");
    REQUIRE(out.size() == single.size());
    for (const auto& [name, t] : single) CHECK(out.at(name).bytes == t.bytes);
  }
}

TEST_CASE("frozen parameters keep their dtype, are widened or narrowed with --dtype, or left out") {
  // zero-train registers no frozen parameters, so one is added to a real checkpoint the way
  // save_checkpoint writes them: a manifest entry and "frozen/<name>" in rank 0's file.
  const TempDir dir("frozen");
  train("bf16_stage2_ga2.json", 2, 2, dir / "ckpt", dir / "dump.safetensors");
  const std::string tag_dir = dir / "ckpt/global_step2";
  std::ifstream manifest_in(tag_dir + "/manifest.json");
  REQUIRE(manifest_in.good());
  zero::ckpt::Manifest manifest =
      zero::ckpt::Manifest::from_json(json::parse(manifest_in), "test manifest");
  manifest_in.close();
  REQUIRE(manifest.model_dtype == zero::DType::BF16);

  const std::vector<std::int64_t> shape = {3, 5};
  std::vector<float> values(15);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.375f * static_cast<float>(i) - 2.5f;
  values[7] = 1.0f / 3.0f;  // not exact in bf16 or fp16: rounding is visible
  std::vector<std::byte> frozen_bf16(values.size() * 2);
  zero::kernels::cast_cpu(values.data(), zero::DType::F32, frozen_bf16.data(), zero::DType::BF16,
                          values.size());

  zero::ckpt::ParamEntry entry;
  entry.name = "embed.frozen";
  entry.shape = shape;
  entry.dtype = zero::DType::BF16;
  entry.trainable = false;
  entry.numel = 15;
  manifest.params.push_back(entry);

  zero::ckpt::RankFile& rank0 = manifest.files[0];
  const std::string rank0_path = tag_dir + "/" + rank0.file;
  zero::io::SafetensorsWriter writer;
  for (const auto& [name, t] : read_all(rank0_path)) {
    writer.add(name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
  }
  writer.add("frozen/embed.frozen", zero::DType::BF16, shape, frozen_bf16.data(),
             frozen_bf16.size());
  writer.write(rank0_path);
  rank0.tensors["frozen/embed.frozen"] = {
      zero::io::checksum(frozen_bf16.data(), frozen_bf16.size()), frozen_bf16.size()};
  std::ofstream(tag_dir + "/manifest.json") << manifest.to_json().dump(2);

  const std::map<std::string, Tensor> dump = read_all(dir / "dump.safetensors");
  SECTION("no --dtype: the stored bf16 bytes as they are, next to the fp32 master weights") {
    // As DeepSpeed's zero_to_fp32 writes frozen parameters.
    const Run r = to_fp32(dir / "ckpt" + " " + dir / "out.safetensors");
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("(fp32; 1 frozen in bf16)"));
    const std::map<std::string, Tensor> out = read_all(dir / "out.safetensors");
    REQUIRE(out.size() == dump.size() + 1);
    CHECK(out.at("embed.frozen").dtype == zero::DType::BF16);
    CHECK(out.at("embed.frozen").bytes == frozen_bf16);
    for (const auto& [name, t] : dump) CHECK(out.at(name).bytes == t.bytes);
  }
  SECTION("--dtype fp32: widened exactly, next to the master weights") {
    const Run r = to_fp32(dir / "ckpt" + " " + dir / "out.safetensors --dtype fp32");
    INFO(r.out);
    REQUIRE(r.status == 0);
    const std::map<std::string, Tensor> out = read_all(dir / "out.safetensors");
    REQUIRE(out.size() == dump.size() + 1);
    const Tensor& f = out.at("embed.frozen");
    CHECK(f.shape == shape);
    std::vector<float> widened(15);
    zero::kernels::cast_cpu(frozen_bf16.data(), zero::DType::BF16, widened.data(), zero::DType::F32,
                            15);
    CHECK(as_floats(f) == widened);
    for (const auto& [name, t] : dump) CHECK(out.at(name).bytes == t.bytes);
  }
  SECTION("bf16: the stored bytes as they are; fp16: rounded from the widened value") {
    REQUIRE(to_fp32(dir / "ckpt" + " " + dir / "bf16.safetensors --dtype bf16").status == 0);
    CHECK(read_all(dir / "bf16.safetensors").at("embed.frozen").bytes == frozen_bf16);
    REQUIRE(to_fp32(dir / "ckpt" + " " + dir / "fp16.safetensors --dtype fp16").status == 0);
    std::vector<float> widened(15);
    zero::kernels::cast_cpu(frozen_bf16.data(), zero::DType::BF16, widened.data(), zero::DType::F32,
                            15);
    std::vector<std::byte> fp16(30);
    zero::kernels::cast_cpu(widened.data(), zero::DType::F32, fp16.data(), zero::DType::F16, 15);
    const std::map<std::string, Tensor> out = read_all(dir / "fp16.safetensors");
    const Tensor& f = out.at("embed.frozen");
    CHECK(f.dtype == zero::DType::F16);
    CHECK(f.bytes == fp16);
  }
  SECTION("--exclude-frozen leaves it out and says so") {
    const Run r = to_fp32(dir / "ckpt" + " " + dir / "ex.safetensors --exclude-frozen");
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("1 frozen left out"));
    const std::map<std::string, Tensor> out = read_all(dir / "ex.safetensors");
    CHECK(out.size() == dump.size());
    CHECK(out.count("embed.frozen") == 0);
  }
}

TEST_CASE(
    "a flipped byte in a rank file fails with exit 1 naming the file and the tensor, and "
    "writes nothing") {
  for (const std::string& tensor : std::vector<std::string>{"master", "exp_avg_sq"}) {
    INFO("corrupted tensor " << tensor);
    const TempDir dir("corrupt_" + tensor);
    train("fp32_stage1.json", 3, 2, dir / "ckpt", dir / "dump.safetensors");
    const std::string file = "rank_00001_of_00003.safetensors";
    const std::string path = dir / ("ckpt/global_step2/" + file);
    flip_byte(path, tensor_file_offset(path, tensor) + 5);

    const Run r = to_fp32(dir / "ckpt" + " " + dir / "out.safetensors");
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::StartsWith("zero_to_fp32: error: ") &&
                          Catch::Contains("tensor '" + tensor + "' in " + file) &&
                          Catch::Contains("corrupted"));
    CHECK(line_count(r.out) == 1);
    CHECK_FALSE(fs::exists(dir / "out.safetensors"));
    CHECK_FALSE(fs::exists(dir / "out.safetensors.tmp"));
  }
}

TEST_CASE("a deleted rank file fails with exit 1 naming the file") {
  const TempDir dir("missing");
  train("fp32_stage3.json", 3, 2, dir / "ckpt", dir / "dump.safetensors");
  const std::string file = "rank_00002_of_00003.safetensors";
  REQUIRE(fs::remove(dir / ("ckpt/global_step2/" + file)));
  const Run r = to_fp32(dir / "ckpt" + " " + dir / "out");
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::StartsWith("zero_to_fp32: error: ") && Catch::Contains(file) &&
                        Catch::Contains("missing"));
  CHECK_FALSE(fs::exists(dir / "out/model.safetensors"));
}

TEST_CASE(
    "CHECKPOINT_DIR may be the directory holding latest, a tag directory, or either with "
    "--tag; anything else is not a checkpoint") {
  const TempDir dir("locate");
  train("fp32_stage0.json", 1, 2, dir / "ckpt", dir / "dump.safetensors");
  const std::map<std::string, Tensor> dump = read_all(dir / "dump.safetensors");
  const std::string tag_dir = dir / "ckpt/global_step2";

  for (const std::string& args :
       {dir / "ckpt", tag_dir, tag_dir + "/", dir / "ckpt -t global_step2",
        dir / "ckpt --tag=global_step2", tag_dir + " --tag global_step2"}) {
    INFO("zero_to_fp32 " << args);
    fs::remove(dir / "out.safetensors");
    const Run r = to_fp32(args + " " + dir / "out.safetensors");
    INFO(r.out);
    REQUIRE(r.status == 0);
    const std::map<std::string, Tensor> out = read_all(dir / "out.safetensors");
    for (const auto& [name, t] : dump) CHECK(out.at(name).bytes == t.bytes);
  }

  const std::vector<std::pair<std::string, std::string>> not_a_checkpoint = {
      {dir / "nowhere", "nowhere: no such directory"},
      {dir / "dump.safetensors", "is not a checkpoint: it is a file"},
      {dir.str(), "is not a checkpoint: it holds neither `latest` nor manifest.json"},
      {dir / "ckpt --tag global_step9", "tag global_step9 is not a checkpoint"},
  };
  for (const auto& [args, expected] : not_a_checkpoint) {
    INFO("zero_to_fp32 " << args);
    const Run r = to_fp32(args + " " + dir / "x.safetensors");
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::StartsWith("zero_to_fp32: error: ") && Catch::Contains(expected));
    CHECK(line_count(r.out) == 1);
  }

  // A tag directory with a different --tag is a contradiction in the arguments.
  const Run conflict = to_fp32(tag_dir + " -t global_step1 " + dir / "x.safetensors");
  INFO(conflict.out);
  CHECK(conflict.status == 2);
  CHECK_THAT(conflict.out, Catch::StartsWith("zero_to_fp32: --tag global_step1: "));

  // Without `latest`, the tags present are suggested.
  fs::remove(dir / "ckpt/latest");
  const Run no_latest = to_fp32(dir / "ckpt" + " " + dir / "x.safetensors");
  INFO(no_latest.out);
  CHECK(no_latest.status == 1);
  CHECK_THAT(no_latest.out, Catch::Contains("pass one with --tag: global_step2"));
}

TEST_CASE("bad flags exit 2 with one line naming the flag, the value and what is expected") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "CHECKPOINT_DIR and OUTPUT are required"},
      {"ckpt", "OUTPUT is required after CHECKPOINT_DIR"},
      {"ckpt out extra", "unexpected argument 'extra'"},
      {"ckpt out --dtype fp64", "--dtype fp64: expected fp32, bf16 or fp16"},
      {"ckpt out --dtype", "--dtype needs a value"},
      {"ckpt out --max-shard-size 0", "--max-shard-size 0: expected a positive size"},
      {"ckpt out --max-shard-size 5XB", "--max-shard-size 5XB: expected a positive size"},
      {"ckpt out --max_shard_size=-1GB", "--max_shard_size -1GB: expected a positive size"},
      {"ckpt out -t", "-t needs a value"},
      {"ckpt out --tag a/b", "--tag 'a/b': expected a checkpoint tag"},
      {"ckpt out --exclude-frozen=yes", "--exclude-frozen=yes: --exclude-frozen takes no value"},
      {"ckpt out --frobnicate", "unknown option '--frobnicate'"},
  };
  for (const auto& [args, expected] : cases) {
    const Run r = to_fp32(args);
    INFO("zero_to_fp32 " << args << "\n" << r.out);
    CHECK(r.status == 2);
    CHECK_THAT(r.out, Catch::StartsWith("zero_to_fp32: ") && Catch::Contains(expected));
    CHECK(line_count(r.out) == 1);
  }
}

TEST_CASE("--help prints the flags and exits 0") {
  const Run r = to_fp32("--help");
  CHECK(r.status == 0);
  for (const char* flag : {"CHECKPOINT_DIR", "OUTPUT", "--tag", "--max-shard-size", "--dtype",
                           "--exclude-frozen", "model.safetensors.index.json"}) {
    CHECK_THAT(r.out, Catch::Contains(flag));
  }
}

TEST_CASE("DeepSpeed checkpoints convert to exactly what DeepSpeed's own zero_to_fp32 writes") {
  const TempDir dir("deepspeed");
  for (const std::string name : {"zero1_world2_fp32", "zero2_world2_fp32", "zero3_world2_fp32"}) {
    INFO(name);
    const std::string fixture = std::string(ZERO_TEST_DATA_DIR) + "/deepspeed_checkpoints/" + name;
    const Run r = to_fp32("'" + fixture + "' " + (dir / (name + ".safetensors")));
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains(std::string("is a DeepSpeed ZeRO stage ") + name[4] +
                                      " checkpoint (2 ranks, fp32, 6 tensors)"));
    const std::map<std::string, Tensor> got = read_all(dir / (name + ".safetensors"));
    const std::map<std::string, Tensor> want = read_all(fixture + "/expected_fp32.safetensors");
    REQUIRE(want.size() >= 6);
    REQUIRE(got.size() == want.size());
    for (const auto& [tensor, t] : want) {
      INFO(tensor);
      REQUIRE(got.count(tensor) == 1);
      CHECK(got.at(tensor).shape == t.shape);
      CHECK(got.at(tensor).bytes == t.bytes);
    }
    // The tag may be named, and bf16 output is the same values rounded.
    const Run bf16 =
        to_fp32("'" + fixture + "' " + (dir / "bf16.safetensors") + " -t step5 --dtype bf16");
    INFO(bf16.out);
    REQUIRE(bf16.status == 0);
    CHECK(read_all(dir / "bf16.safetensors").begin()->second.dtype == zero::DType::BF16);
  }
}

TEST_CASE("every kind of DeepSpeed checkpoint converts, naming its kind; bad ones write nothing") {
  const TempDir dir("deepspeed_kinds");
  const std::string fixtures = std::string(ZERO_TEST_DATA_DIR) + "/deepspeed_checkpoints/";
  const std::pair<const char*, const char*> kinds[] = {
      {"zero0_bf16", "is a DeepSpeed ZeRO stage 0 (bf16, fp32 master copies in "
                     "optimizer.fp32_groups) checkpoint"},
      {"bf16_zero1", "is a DeepSpeed BF16_Optimizer (stage 1) checkpoint"},
      {"universal", "is a DeepSpeed universal (from ZeRO stage 2) checkpoint"},
      {"zero3_frozen_bf16", "is a DeepSpeed ZeRO stage 3 checkpoint"}};
  for (const auto& [name, says] : kinds) {
    INFO(name);
    const std::string out = dir / (std::string(name) + ".safetensors");
    const Run r = to_fp32("'" + fixtures + name + "' " + out);
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains(says));
    const std::map<std::string, Tensor> got = read_all(out);
    const std::map<std::string, Tensor> want =
        read_all(fixtures + name + "/expected_fp32.safetensors");
    REQUIRE(got.size() == want.size());
    for (const auto& [tensor, t] : want) {
      INFO(tensor);
      CHECK(got.at(tensor).dtype == t.dtype);  // frozen ones stay bf16
      CHECK(got.at(tensor).bytes == t.bytes);
    }
  }
  // A universal checkpoint missing a parameter's folder: exit 1 naming it, and no output.
  const std::string broken = dir / "broken";
  std::filesystem::copy(fixtures + "universal", broken, std::filesystem::copy_options::recursive);
  std::filesystem::remove_all(broken + "/step5_universal/zero/3.bias");
  const std::string out = dir / "broken.safetensors";
  const Run r = to_fp32(broken + " " + out);
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("step5_universal/zero/3.bias: missing") &&
                        Catch::Contains("no folder for parameter '3.bias'"));
  CHECK_FALSE(std::filesystem::exists(out));
  CHECK_FALSE(std::filesystem::exists(out + ".tmp"));
}

TEST_CASE("tied parameters are written once, with their other names in the metadata") {
  const TempDir dir("tied");
  train("fp32_stage2.json", 2, 2, dir / "ckpt", dir / "dump.safetensors");
  const std::string manifest_path = dir / "ckpt/global_step2/manifest.json";
  json m = json::parse(std::ifstream(manifest_path));
  const std::string owner = m["params"][0]["name"];
  m["params"][0]["aliases"] = {"head.weight",
                               "lm_head.weight"};  // as save_checkpoint records tied_names
  std::ofstream(manifest_path) << m.dump();
  const Run r = to_fp32(dir / "ckpt" + " " + dir / "out.safetensors");
  INFO(r.out);
  REQUIRE(r.status == 0);
  const auto reader = SafetensorsReader::open(dir / "out.safetensors");
  CHECK(reader.tensors().size() == read_all(dir / "dump.safetensors").size());
  CHECK(reader.find("head.weight") == nullptr);
  const json aliases = json::parse(reader.metadata().at("aliases"));
  CHECK(aliases == json({{"head.weight", owner}, {"lm_head.weight", owner}}));
}
