// Runs the built zero-train binary (ZERO_TRAIN_BIN): usage errors, --json output, --dump-params,
// that training on in-process ranks lowers the loss, and --save / --load (resumed runs end where
// uninterrupted ones do, at the same world size and stage and across a reshard).

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "models/mlp.h"
#include "tests/cli_util.h"
#include "tests/temp_dir.h"
#include "zero/io/safetensors.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kTrain = std::string(ZERO_TEST_DATA_DIR) + "/train/";
const std::string kModel = "mlp:8,16,4";
// Over 30 steps of AdamW at lr 0.01 the student closes most of the gap to the teacher: the last
// five steps' mean loss must be well under the first five's (about 0.1x in practice).
constexpr double kRequiredLossRatio = 0.5;
// 2 ranks x micro 4 and 1 rank x micro 8 sum the same gradients in a different order.
constexpr double kWorldSizeTolerance = 1e-5;
// A checkpoint moved from 4 ranks at stage 3 to 3 ranks at stage 1: the same global batch, summed
// in a different order.
constexpr double kReshardTolerance = 1e-5;

using Run = zero::test::CommandRun;

// stream: "both", "stdout" or "stderr".
Run run(const std::string& args, const std::string& stream = "both") {
  return zero::test::run_tool(ZERO_TRAIN_BIN, args, stream);
}

std::vector<json> json_lines(const std::string& text) {
  std::vector<json> objects;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) objects.push_back(json::parse(line));
  return objects;
}

// A scratch directory named after the test case, removed when it ends.
class TempDir : public zero::test::TempDir {
 public:
  explicit TempDir(const std::string& name) : zero::test::TempDir("zero_train_cli_test_" + name) {}
};

// Every tensor of a --dump-params file.
std::map<std::string, std::vector<float>> read_dump(const std::string& path) {
  const auto reader = zero::io::SafetensorsReader::open(path);
  std::map<std::string, std::vector<float>> out;
  for (const zero::io::TensorInfo& t : reader.tensors()) out[t.name] = reader.read_f32(t.name);
  return out;
}

// The largest difference from the initial weights of `kModel` with `seed`: a guard against
// comparing runs that never trained.
double moved_from_init(const std::map<std::string, std::vector<float>>& dump, std::uint64_t seed,
                       const std::string& model = kModel) {
  const zero::models::MlpShape shape = zero::models::MlpShape::parse(model);
  const std::vector<zero::models::MlpParam> params = zero::models::mlp_params(shape);
  double moved = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::vector<float>& x = dump.at(params[i].name);
    std::vector<float> init(x.size());
    zero::models::init_param(shape, i, seed, 0, init);
    for (std::size_t e = 0; e < x.size(); ++e) {
      moved = std::max(moved, static_cast<double>(std::abs(x[e] - init[e])));
    }
  }
  return moved;
}

}  // namespace

TEST_CASE("bad flags exit 2 with one line naming the flag, the value and what is expected") {
  const std::string config = " --config " + kTrain + "fp32_stage0.json";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {config + " --steps 0", "--steps 0: expected a positive number of optimizer steps"},
      {config + " --steps ten", "--steps ten: expected a positive number"},
      {config + " --world-size x", "--world-size x: expected a positive number of ranks"},
      {config + " --comm tcp", "--comm tcp: expected inproc or mpi"},
      {config + " --model mlp:8", "--model mlp:8: "},
      {config + " --model mlp:8,x,4", "'x' is not a positive layer width"},
      {config + " --seed -1", "--seed -1: expected a non-negative integer"},
      {config + " --threads 0", "--threads 0: expected a positive number"},
      {config + " --threads", "--threads needs a value"},
      {config + " --json=yes", "--json=yes: --json takes no value"},
      {config + " --frobnicate", "unknown option '--frobnicate'"},
      {" --steps 3", "--config FILE is required"},
      {config + " --save-every 3", "--save-every 3: needs --save DIR"},
      {config + " --save ck --save-every 0", "--save-every 0: expected a positive number"},
      {config + " --save", "--save needs a value: a checkpoint directory"},
      {config + " --load=", "--load: expected a checkpoint directory, got ''"},
  };
  for (const auto& [args, expected] : cases) {
    const Run r = run(args);
    INFO("zero-train" << args << "\n" << r.out);
    CHECK(r.status == 2);
    CHECK_THAT(r.out, Catch::StartsWith("zero-train: ") && Catch::Contains(expected));
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  }
}

TEST_CASE("--help prints the flags and exits 0") {
  const Run r = run("--help", "stdout");
  CHECK(r.status == 0);
  for (const char* flag :
       {"--config", "--world-size", "--comm", "--steps", "--seed", "--model", "--threads",
        "--dump-params", "--save", "--save-every", "--load", "--regather", "--json", "--quiet"}) {
    CHECK_THAT(r.out, Catch::Contains(flag));
  }
}

TEST_CASE("config problems exit 1 with every problem named by file and key path") {
  const std::string config = kTrain + "invalid_stage.json";
  const Run r = run("--config " + config + " --steps 2", "stderr");
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("zero-train: error: " + config +
                                    ": zero_optimization.stage: must be between 0 and 3, got 5"));
  CHECK_THAT(r.out, Catch::Contains("zero_optimization.overlap_comum: unknown key; did you mean "
                                    "overlap_comm?"));

  const Run missing = run("--config /nonexistent/ds.json", "stderr");
  CHECK(missing.status == 1);
  CHECK_THAT(missing.out,
             Catch::StartsWith("zero-train: error: ") && Catch::Contains("/nonexistent/ds.json"));
}

TEST_CASE("a 2-rank stage-2 run with --json prints one object per step, then a summary") {
  constexpr int kSteps = 4;
  const std::string args = "--config " + kTrain + "bf16_stage2_ga2.json --world-size 2 --steps " +
                           std::to_string(kSteps) + " --model " + kModel + " --json";
  const Run r = run(args, "stdout");
  INFO("zero-train " << args << "\n" << r.out);
  REQUIRE(r.status == 0);
  const std::vector<json> lines = json_lines(r.out);
  REQUIRE(lines.size() == kSteps + 1);
  for (int t = 0; t < kSteps; ++t) {
    const json& s = lines[static_cast<std::size_t>(t)];
    CHECK(s.at("step") == t + 1);
    for (const char* key : {"loss", "lr", "grad_norm", "loss_scale", "step_time_s"}) {
      CHECK(s.at(key).is_number());
    }
    CHECK(s.at("skipped") == false);
    CHECK(s.at("loss").get<double>() > 0);
  }
  const json& summary = lines.back();
  CHECK(summary.at("summary") == true);
  CHECK(summary.at("steps") == kSteps);
  CHECK(summary.at("final_loss") == lines[kSteps - 1].at("loss"));
  CHECK(summary.at("skipped_steps") == 0);
  CHECK(summary.at("samples_per_s").get<double>() > 0);
  REQUIRE(summary.at("memory").size() == 2);
  for (int rank = 0; rank < 2; ++rank) {
    const json& m = summary.at("memory")[static_cast<std::size_t>(rank)];
    CHECK(m.at("rank") == rank);
    CHECK(m.at("by_tag").at("master_params").at("current_bytes").get<double>() > 0);
  }
  for (const json& m : summary.at("memory")) {
    for (const char* tier : {"device", "host_pinned", "host", "nvme"}) {
      CHECK(m.at(std::string(tier) + "_bytes").is_number());
      CHECK(m.at(std::string(tier) + "_peak_bytes").is_number());
    }
    CHECK(m.at("device_peak_bytes").get<double>() > 0);
  }
  const json& estimate = summary.at("estimate");
  CHECK(estimate.at("params") == 8 * 16 + 16 + 16 * 4 + 4);
  CHECK(estimate.at("world_size") == 2);
  CHECK(estimate.at("stage") == 2);
  CHECK(estimate.at("precision") == "bf16");
  CHECK(estimate.at("total_bytes").get<double>() > 0);
}

TEST_CASE(
    "--dump-params writes mlp_params' names and shapes at stages 0 and 2, and 30 steps lower the "
    "loss") {
  const zero::models::MlpShape shape = zero::models::MlpShape::parse(kModel);
  const std::vector<zero::models::MlpParam> expected = zero::models::mlp_params(shape);
  std::vector<std::vector<float>> dumped[2];
  for (int stage : {0, 2}) {
    const TempDir dir("stage" + std::to_string(stage));
    const std::string dump = dir / "dump.safetensors";
    const std::string args = "--config " + kTrain + "fp32_stage" + std::to_string(stage) +
                             ".json --world-size 2 --steps 30 --seed 3 --model " + kModel +
                             " --json --dump-params " + dump;
    const Run r = run(args, "stdout");
    INFO("zero-train " << args << "\n" << r.out);
    REQUIRE(r.status == 0);

    const std::vector<json> lines = json_lines(r.out);
    REQUIRE(lines.size() == 31);
    double first = 0, last = 0;
    for (int t = 0; t < 5; ++t) {
      first += lines[static_cast<std::size_t>(t)].at("loss").get<double>() / 5;
      last += lines[static_cast<std::size_t>(25 + t)].at("loss").get<double>() / 5;
    }
    CHECK(last < kRequiredLossRatio * first);
    CHECK(lines.back().at("dump_params") == dump);

    const auto reader = zero::io::SafetensorsReader::open(dump);
    REQUIRE(reader.tensors().size() == expected.size());
    for (const zero::models::MlpParam& p : expected) {
      const zero::io::TensorInfo* t = reader.find(p.name);
      REQUIRE(t != nullptr);
      CHECK(t->dtype == zero::DType::F32);
      CHECK(t->shape == std::vector<std::int64_t>(p.shape.begin(), p.shape.end()));
      dumped[stage / 2].push_back(reader.read_f32(p.name));
    }
  }
  // fp32 with accumulation 1: the stages give the same bits (DESIGN.md §3, Determinism), so the
  // tool fed them the same data in the same order.
  CHECK(dumped[0] == dumped[1]);
}

TEST_CASE("runs at world sizes 1 and 2 see the same global batches") {
  const TempDir dir("worlds");
  const std::string two = dir / "world2.safetensors", one = dir / "world1.safetensors";
  const std::string common = " --steps 6 --seed 5 --model " + kModel + " --quiet";
  const Run r2 =
      run("--config " + kTrain + "fp32_stage0.json --world-size 2 --dump-params " + two + common);
  INFO(r2.out);
  REQUIRE(r2.status == 0);
  const Run r1 = run("--config " + kTrain +
                     "fp32_stage0_micro8.json --world-size 1 --dump-params " + one + common);
  INFO(r1.out);
  REQUIRE(r1.status == 0);

  const auto a = zero::io::SafetensorsReader::open(two);
  const auto b = zero::io::SafetensorsReader::open(one);
  const zero::models::MlpShape shape = zero::models::MlpShape::parse(kModel);
  double worst = 0, moved = 0;
  for (std::size_t i = 0; i < zero::models::mlp_params(shape).size(); ++i) {
    const std::string name = zero::models::mlp_params(shape)[i].name;
    const std::vector<float> x = a.read_f32(name), y = b.read_f32(name);
    REQUIRE(x.size() == y.size());
    std::vector<float> init(x.size());
    zero::models::init_param(shape, i, 5, 0, init);
    for (std::size_t e = 0; e < x.size(); ++e) {
      worst = std::max(worst, static_cast<double>(std::abs(x[e] - y[e])));
      moved = std::max(moved, static_cast<double>(std::abs(x[e] - init[e])));
    }
  }
  CHECK(moved > 1e-3);  // training changed the weights, so agreeing means something
  CHECK(worst < kWorldSizeTolerance);
}

TEST_CASE(
    "a run resumed from its step-6 checkpoint ends bitwise where an uninterrupted 12-step run "
    "ends, at the same world size and stage") {
  struct Case {
    std::string config;
    int world;
  };
  // fp32 at every stage; bf16 with accumulation; fp16 whose loss scale grows mid-run.
  const std::vector<Case> cases = {{"fp32_stage0.json", 3},     {"fp32_stage1.json", 3},
                                   {"fp32_stage2.json", 3},     {"fp32_stage3.json", 3},
                                   {"bf16_stage2_ga2.json", 2}, {"fp16_stage2_ga2.json", 2}};
  for (const Case& c : cases) {
    INFO(c.config << " on " << c.world << " ranks, " << kModel);
    const TempDir dir("resume");
    const std::string common = "--config " + kTrain + c.config + " --world-size " +
                               std::to_string(c.world) + " --seed 9 --model " + kModel + " --json";
    const Run full = run(common + " --steps 12 --dump-params " + (dir / "full.st"), "stdout");
    INFO(full.out);
    REQUIRE(full.status == 0);
    const Run half = run(common + " --steps 6 --save " + (dir / "ck"), "stdout");
    INFO(half.out);
    REQUIRE(half.status == 0);
    const Run resumed =
        run(common + " --steps 12 --load " + (dir / "ck") + " --dump-params " + (dir / "res.st"),
            "stdout");
    INFO(resumed.out);
    REQUIRE(resumed.status == 0);

    // The save and the load each print one line, naming the tag after the step.
    const std::vector<json> half_lines = json_lines(half.out);
    REQUIRE(half_lines.size() == 6 + 1 + 1);
    CHECK(half_lines[6] == json({{"checkpoint", "saved"},
                                 {"dir", dir / "ck"},
                                 {"tag", "global_step6"},
                                 {"step", 6},
                                 {"seconds", half_lines[6].at("seconds")}}));
    CHECK(half_lines.back().at("checkpoint") == dir / "ck/global_step6");
    const std::vector<json> full_lines = json_lines(full.out);
    const std::vector<json> resumed_lines = json_lines(resumed.out);
    REQUIRE(full_lines.size() == 12 + 1);
    REQUIRE(resumed_lines.size() == 1 + 6 + 1);
    CHECK(resumed_lines[0].at("checkpoint") == "loaded");
    CHECK(resumed_lines[0].at("tag") == "global_step6");
    CHECK(resumed_lines[0].at("step") == 6);
    CHECK(resumed_lines[0].at("saved_world_size") == c.world);
    // Steps 7..12: the same loss, lr and loss scale as the uninterrupted run, bit for bit.
    for (int t = 7; t <= 12; ++t) {
      const json& a = full_lines[static_cast<std::size_t>(t - 1)];
      const json& b = resumed_lines[static_cast<std::size_t>(t - 6)];
      INFO("step " << t);
      CHECK(b.at("step") == t);
      for (const char* key : {"loss", "lr", "loss_scale", "grad_norm", "skipped"}) {
        CHECK(b.at(key) == a.at(key));
      }
    }

    const auto expected = read_dump(dir / "full.st");
    const auto got = read_dump(dir / "res.st");
    REQUIRE(moved_from_init(expected, 9) > 1e-3);
    REQUIRE(got.size() == expected.size());
    for (const auto& [name, values] : expected) {
      INFO(name);
      CHECK(got.at(name) == values);
    }
  }
}

TEST_CASE(
    "a checkpoint saved on 4 ranks at stage 3 resumes on 3 ranks at stage 1 within 1e-5 of "
    "the uninterrupted run") {
  // 4 x micro 3 and 3 x micro 4: the same 12 samples per step, so the same data after the move.
  const TempDir dir("reshard");
  const std::string model = " --seed 4 --model " + kModel;
  const std::string common = model + " --quiet";
  const std::string stage3 = "--config " + kTrain + "fp32_stage3_micro3.json --world-size 4";
  const Run full = run(stage3 + " --steps 12 --dump-params " + (dir / "full.st") + common);
  INFO(full.out);
  REQUIRE(full.status == 0);
  const Run half = run(stage3 + " --steps 6 --save " + (dir / "ck") + common);
  INFO(half.out);
  REQUIRE(half.status == 0);
  const Run resumed = run("--config " + kTrain + "fp32_stage1.json --world-size 3 --steps 12 " +
                          "--load " + (dir / "ck") + " --dump-params " + (dir / "res.st") + model);
  INFO(resumed.out);
  REQUIRE(resumed.status == 0);
  CHECK_THAT(resumed.out, Catch::Contains("loaded checkpoint " + (dir / "ck") +
                                          "/global_step6 (step 6, saved "
                                          "at ZeRO stage 3 on 4 ranks;"));
  CHECK_THAT(resumed.out, !Catch::Contains("note: continuing with the saved run's"));

  const auto expected = read_dump(dir / "full.st");
  const auto got = read_dump(dir / "res.st");
  REQUIRE(moved_from_init(expected, 4) > 1e-3);
  REQUIRE(got.size() == expected.size());
  double worst = 0;
  for (const auto& [name, values] : expected) {
    const std::vector<float>& other = got.at(name);
    REQUIRE(other.size() == values.size());
    for (std::size_t e = 0; e < values.size(); ++e) {
      worst = std::max(worst, static_cast<double>(std::abs(values[e] - other[e])));
    }
  }
  CHECK(worst < kReshardTolerance);

  // A config whose batch sizes give another global batch (2 ranks x micro 4 = 8): the resumed run
  // keeps the saved 12 samples per step, split 6 + 6 with weighted losses, so it still ends where
  // the uninterrupted run ends; the load line says so.
  const Run other_batch =
      run("--config " + kTrain + "fp32_stage1.json --world-size 2 --steps 12 " + "--load " +
          (dir / "ck") + " --dump-params " + (dir / "other.st") + model);
  INFO(other_batch.out);
  REQUIRE(other_batch.status == 0);
  CHECK_THAT(other_batch.out,
             Catch::Contains("note: continuing with the saved run's 12 samples per step"));
  const auto other = read_dump(dir / "other.st");
  double worst_other = 0;
  for (const auto& [name, values] : expected) {
    for (std::size_t e = 0; e < values.size(); ++e) {
      worst_other =
          std::max(worst_other, static_cast<double>(std::abs(values[e] - other.at(name)[e])));
    }
  }
  CHECK(worst_other < kReshardTolerance);
}

TEST_CASE("--save-every K saves every K steps and at the end, and latest names the last") {
  const TempDir dir("every");
  const Run r = run("--config " + kTrain + "fp32_stage2.json --world-size 2 --steps 10 --model " +
                    kModel + " --save " + (dir / "ck") + " --save-every 4");
  INFO(r.out);
  REQUIRE(r.status == 0);
  for (const char* tag : {"global_step4", "global_step8", "global_step10"}) {
    CHECK(fs::exists(dir / ("ck/" + std::string(tag) + "/manifest.json")));
    CHECK_THAT(r.out, Catch::Contains("saved checkpoint " + (dir / "ck/") + tag + " (step "));
  }
  CHECK(std::distance(fs::directory_iterator(dir / "ck"), fs::directory_iterator{}) == 4);
  std::ifstream latest(dir / "ck/latest");
  std::string tag;
  std::getline(latest, tag);
  CHECK(tag == "global_step10");
}

TEST_CASE("--load of a directory without a checkpoint exits 1 naming it") {
  const TempDir dir("noload");
  const Run r = run("--config " + kTrain + "fp32_stage0.json --steps 2 --model " + kModel +
                        " --load " + (dir / "empty"),
                    "stderr");
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::StartsWith("zero-train: error: ") && Catch::Contains(dir / "empty"));
}

TEST_CASE("--memory-budget: beyond it an error naming the tag; with NVMe offload the run fits") {
  TempDir tmp("budget");
  const std::string model = "mlp:64,256,256,8";
  // A rank's device memory peaks at about 1.35 MB in memory and 0.84 MB with the master weights
  // and Adam moments (0.5 MB) on NVMe.
  const std::string budget = "--memory-budget 1000000";
  const std::string base = "--world-size 2 --steps 3 --model " + model + " --quiet " + budget;
  const Run refused = run("--config " + kTrain + "fp32_stage2.json " + base);
  INFO(refused.out);
  CHECK(refused.status == 1);
  CHECK_THAT(refused.out, Catch::Contains("out of device memory") &&
                              Catch::Contains("per-rank budget is 1000000 bytes"));
  json c = json::parse(std::ifstream(kTrain + "fp32_stage2.json"), nullptr, true,
                       /*ignore_comments=*/true);
  c["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", tmp.str()}};
  c["zero_optimization"]["sub_group_size"] = 20000;
  const std::string path = tmp / "nvme.json";
  std::ofstream(path) << c.dump();
  const Run fits = run("--config " + path + " " + base + " --json", "stdout");
  INFO(fits.out);
  REQUIRE(fits.status == 0);
  for (const json& m : json_lines(fits.out).back().at("memory")) {
    CHECK(m.at("device_peak_bytes").get<double>() <= 1000000);
    CHECK(m.at("nvme_bytes").get<double>() > 0);
  }
}

TEST_CASE(
    "--regather: stage 3 gathers layers again in backward, bitwise the run that keeps them, and "
    "under hpZ those gathers stay inside the node") {
  // Three layers: the first goes after its forward (backward needs no weight of it), the middle
  // one is gathered again, the last stays for backward's start.
  const std::string model = "mlp:8,32,32,4";
  TempDir dir("regather");
  const std::string common = " --world-size 4 --ranks-per-node 2 --steps 6 --seed 5 --json --quiet"
                             " --model " + model;
  struct Result {
    std::map<std::string, std::vector<float>> dump;
    double inter = 0, intra = 0;
  };
  auto train = [&](const std::string& config, const std::string& extra, const std::string& name) {
    const std::string args = "--config " + kTrain + config + common + extra + " --dump-params " +
                             (dir / (name + ".st"));
    const Run r = run(args, "stdout");
    INFO("zero-train " << args << "\n" << r.out);
    REQUIRE(r.status == 0);
    const json summary = json_lines(r.out).back();
    return Result{read_dump((dir / (name + ".st"))),
                  summary.at("inter_node_bytes").get<double>(),
                  summary.at("intra_node_bytes").get<double>()};
  };
  const Result kept = train("fp32_stage3_regather.json", "", "kept");
  const Result again = train("fp32_stage3_regather.json", " --regather", "again");
  const Result hpz = train("fp32_stage3_hpz_regather.json", " --regather", "hpz");
  REQUIRE(moved_from_init(kept.dump, 5, model) > 1e-3);
  CHECK(again.dump == kept.dump);
  CHECK(hpz.dump == kept.dump);
  // The middle layer's gather again crosses nodes without hpZ, and stays inside with it.
  CHECK(again.inter > kept.inter);
  CHECK(hpz.inter == kept.inter);
  CHECK(hpz.intra > kept.intra);

  const Run below = run("--config " + kTrain + "fp32_stage2.json --steps 2 --regather", "stderr");
  INFO(below.out);
  CHECK(below.status == 1);
  CHECK_THAT(below.out, Catch::Contains("--regather releases and gathers stage 3's units") &&
                            Catch::Contains("stage is 2"));
}
