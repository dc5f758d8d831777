// Runs `zero-config schedule` (ZERO_CONFIG_BIN) on configs built from DeepSpeed 0.19.6's golden
// LR-schedule and loss-scale sequences (tests/golden/deepspeed), and checks its output formats.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/cli_util.h"
#include "tests/temp_dir.h"

namespace {

using nlohmann::json;

constexpr double kLrRelTol = 1e-6;
constexpr double kLrAbsTol = 1e-12;

struct Run {
  int status = -1;
  std::string out;  // stdout only; stderr goes to err
  std::string err;
};

// A config file in a directory of its own, removed with it.
class TempConfig {
 public:
  explicit TempConfig(const json& doc) { std::ofstream(path()) << doc.dump(); }
  std::string path() const { return dir_ / "ds_config.json"; }
  std::string err_path() const { return dir_ / "stderr.txt"; }

 private:
  zero::test::TempDir dir_{"zero_schedule_cli"};
};

Run run_schedule(const TempConfig& cfg, const std::string& args) {
  const std::string cmd = std::string("'") + ZERO_CONFIG_BIN + "' schedule '" + cfg.path() + "' " +
                          args + " 2>'" + cfg.err_path() + "'";
  const zero::test::CommandRun c = zero::test::run_shell(cmd);
  Run r{c.status, c.out, {}};
  std::ifstream err(cfg.err_path());
  r.err.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  return r;
}

// The JSON objects of --json output, one per line.
std::vector<json> json_lines(const std::string& out) {
  std::vector<json> lines;
  std::size_t start = 0;
  while (start < out.size()) {
    std::size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    const std::string line = out.substr(start, end - start);
    if (!line.empty()) lines.push_back(json::parse(line));
    start = end + 1;
  }
  return lines;
}

json load_golden(const std::string& name) {
  std::ifstream in(std::string(ZERO_TEST_GOLDEN_DIR) + "/deepspeed/" + name);
  REQUIRE(in.good());
  return json::parse(in);
}

bool close(double got, double want, double rel) {
  return std::fabs(got - want) <=
         std::max(rel * std::max(std::fabs(got), std::fabs(want)), kLrAbsTol);
}

}  // namespace

TEST_CASE("schedule --json reproduces DeepSpeed 0.19.6's LR schedules step by step") {
  const json golden = load_golden("schedules.json");
  const json& cases = golden.at("cases");
  REQUIRE(cases.size() >= 5);  // WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest
  for (const json& c : cases) {
    const std::string type = c.at("scheduler").at("type");
    const json& steps = c.at("steps");
    INFO("scheduler " << c.at("scheduler").dump() << ", optimizer lr " << c.at("optimizer_lr"));
    REQUIRE(steps.size() >= 10);
    bool lr_varies = false;
    bool betas_vary = false;
    for (std::size_t t = 1; t < steps.size(); ++t) {
      lr_varies |= steps[t].at("lr") != steps[t - 1].at("lr");
      betas_vary |= steps[t].at("betas") != steps[t - 1].at("betas");
    }
    REQUIRE(lr_varies);  // a flat expected sequence would prove nothing
    if (type == "OneCycle") REQUIRE(betas_vary);

    const TempConfig cfg(json{
        {"train_batch_size", 1},
        {"optimizer",
         {{"type", "Adam"}, {"params", {{"lr", c.at("optimizer_lr")}, {"betas", {0.9, 0.999}}}}}},
        {"scheduler", c.at("scheduler")}});
    const Run r = run_schedule(cfg, "--json --steps " + std::to_string(steps.size()));
    INFO(r.err);
    REQUIRE(r.status == 0);
    const std::vector<json> got = json_lines(r.out);
    REQUIRE(got.size() == steps.size());
    for (std::size_t t = 0; t < steps.size(); ++t) {
      INFO("step " << t << ": " << got[t].dump() << " vs DeepSpeed " << steps[t].dump());
      CHECK(got[t].at("step") == t);
      CHECK(close(got[t].at("lr").get<double>(), steps[t].at("lr").get<double>(), kLrRelTol));
      REQUIRE(got[t].contains("betas"));
      if (type == "OneCycle") {
        for (std::size_t k = 0; k < 2; ++k) {
          CHECK(close(got[t].at("betas")[k].get<double>(), steps[t].at("betas")[k].get<double>(),
                      kLrRelTol));
        }
      }
      CHECK(got[t].at("loss_scale") == 1.0);  // fp32: no loss scaling
      CHECK(got[t].at("skipped") == false);
    }
  }
}

TEST_CASE("schedule --json reproduces DeepSpeed 0.19.6's fp16 loss-scale sequences") {
  const json golden = load_golden("loss_scale.json");
  const json& cases = golden.at("cases");
  REQUIRE(cases.size() >= 3);
  for (const json& c : cases) {
    const json& p = c.at("params");
    const json& seq = c.at("sequence");
    INFO("params " << p.dump());
    REQUIRE(!seq.empty());
    std::string bits;
    bool scale_changes = false;
    for (const json& s : seq) {
      bits += s.at("overflow").get<bool>() ? '1' : '0';
      scale_changes |= s.at("scale_before") != s.at("scale_after");
    }
    REQUIRE(bits.find('1') != std::string::npos);  // some step must be skipped
    REQUIRE(scale_changes);

    const double init_scale = p.at("init_scale").get<double>();
    const int power = static_cast<int>(std::lround(std::log2(init_scale)));
    REQUIRE(std::ldexp(1.0, power) == init_scale);
    const TempConfig cfg(json{{"train_batch_size", 1},
                              {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1e-3}}}}},
                              {"fp16",
                               {{"enabled", true},
                                {"loss_scale", 0},
                                {"initial_scale_power", power},
                                {"loss_scale_window", p.at("scale_window")},
                                {"min_loss_scale", p.at("min_scale")},
                                {"hysteresis", p.at("delayed_shift")},
                                {"consecutive_hysteresis", p.at("consecutive_hysteresis")}}}});
    const Run r =
        run_schedule(cfg, "--json --steps " + std::to_string(bits.size()) + " --overflows " + bits);
    INFO(r.err);
    REQUIRE(r.status == 0);
    const std::vector<json> got = json_lines(r.out);
    REQUIRE(got.size() == seq.size());
    for (std::size_t t = 0; t < seq.size(); ++t) {
      INFO("step " << t << ": " << got[t].dump() << " vs DeepSpeed " << seq[t].dump());
      CHECK(got[t].at("loss_scale").get<double>() == seq[t].at("scale_before").get<double>());
      CHECK(got[t].at("skipped").get<bool>() == seq[t].at("overflow").get<bool>());
    }
  }
}

TEST_CASE("schedule does not advance the LR schedule on a skipped step") {
  const TempConfig cfg(json{
      {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1.0}}}}},
      {"fp16", {{"enabled", true}}},
      {"scheduler",
       {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 10}, {"warmup_type", "linear"}}}}}});
  const Run r = run_schedule(cfg, "--json --overflows 01100");
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(
      r.out.rfind(R"({"step":0,"lr":0.0,"betas":[0.9,0.999],"loss_scale":65536.0,"skipped":false})"
                  "\n",
                  0) == 0);
  const std::vector<json> got = json_lines(r.out);
  REQUIRE(got.size() == 5);  // default --steps: the length of --overflows
  CHECK(got[1].at("skipped") == true);
  CHECK(got[2].at("skipped") == true);
  // Step 0 moved the schedule to i = 0; the skipped steps 1 and 2 leave it there, so step 3
  // runs at i = 0 (linear warmup: lr 0) and step 4 at i = 1 (lr 1/10).
  for (std::size_t t = 1; t <= 3; ++t) CHECK(got[t].at("lr") == 0.0);
  CHECK(got[4].at("lr").get<double>() == Approx(0.1));
  // hysteresis 2: the first overflow only skips, the second halves the scale.
  CHECK(got[2].at("loss_scale") == 65536.0);
  CHECK(got[3].at("loss_scale") == 32768.0);
}

TEST_CASE("schedule works without batch sizes and prints SGD's momentum instead of betas") {
  const TempConfig cfg(
      json{{"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}}}}}});
  const Run r = run_schedule(cfg, "--json");
  INFO(r.err);
  REQUIRE(r.status == 0);
  REQUIRE(json_lines(r.out).size() == 20);
  CHECK(r.out.find("\n"
                   R"({"step":19,"lr":0.1,"momentum":0.9,"loss_scale":1.0,"skipped":false})"
                   "\n") != std::string::npos);
}

TEST_CASE("schedule prints an aligned table with a header by default") {
  const TempConfig cfg(json{{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
                            {"bf16", {{"enabled", true}}}});
  const Run r = run_schedule(cfg, "--steps 12");
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("step  lr     betas       loss_scale  skipped\n") != std::string::npos);
  CHECK(r.out.find("\n  11  0.001  0.9, 0.999           1  no\n") != std::string::npos);
}

TEST_CASE("schedule stops with exit 1 at an overflow with the loss scale at its minimum") {
  const TempConfig cfg(
      json{{"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1e-3}}}}},
           {"fp16", {{"enabled", true}, {"initial_scale_power", 1}, {"hysteresis", 1}}}});
  const Run r = run_schedule(cfg, "--json --steps 5 --overflows 111");
  CHECK(r.status == 1);
  const std::vector<json> got = json_lines(r.out);
  REQUIRE(got.size() == 2);  // 2 → 1, then the overflow at scale 1 stops training
  CHECK(got[1].at("loss_scale") == 1.0);
  CHECK(got[1].contains("stopped"));
  CHECK(r.err.find("training stops at step 1: ") != std::string::npos);
  CHECK(r.err.find("min_loss_scale") != std::string::npos);
}

TEST_CASE("schedule names a value the schedule needs that is still \"auto\", and --set fills it") {
  const TempConfig cfg(json{{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}}}}}});
  const Run unresolved = run_schedule(cfg, "--json");
  CHECK(unresolved.status == 1);
  CHECK(unresolved.err.find(": error: optimizer.params.lr: ") != std::string::npos);
  const Run supplied = run_schedule(cfg, "--json --steps 1 --set optimizer.params.lr=0.5");
  INFO(supplied.err);
  REQUIRE(supplied.status == 0);
  CHECK(json_lines(supplied.out).at(0).at("lr") == 0.5);
}

TEST_CASE("schedule rejects bad usage with exit 2") {
  const TempConfig cfg(json{{"optimizer", {{"type", "Adam"}}}});
  CHECK(run_schedule(cfg, "--overflows 01x").status == 2);
  CHECK(run_schedule(cfg, "--steps -1").status == 2);
  CHECK(run_schedule(cfg, "--bogus").status == 2);
}
