// Runs the built zero-config binary (ZERO_CONFIG_BIN) and checks exit codes and line formats.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli_util.h"
#include "tests/temp_dir.h"

namespace {

using Run = zero::test::CommandRun;

// stream: "both", "stdout" or "stderr".
Run run(const std::string& args, const std::string& stream = "both") {
  return zero::test::run_tool(ZERO_CONFIG_BIN, args, stream);
}

const std::string kData = ZERO_TEST_DATA_DIR;
const std::string kCorpus = kData + "/corpus/ds_configs/";

}  // namespace

TEST_CASE("check exits 0 for a valid config and prints notes and warnings prefixed with the file") {
  const std::string f = kData + "/configs/valid/hf_auto.json";
  const Run r = run("check " + f, "stderr");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(
      r.out.find(
          f + ": note: zero_optimization.reduce_bucket_size: \"auto\" means DeepSpeed's default") !=
      std::string::npos);
  CHECK(r.out.find(f + ": note: optimizer.params.lr: \"auto\": to be supplied") !=
        std::string::npos);
}

TEST_CASE("check exits 1 with one 'FILE: error: path: message' line per problem") {
  const std::string f = kData + "/configs/invalid/multiple_problems.json";
  const Run r = run("check " + f, "stderr");
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(
      r.out.find(
          f +
          ": error: zero_optimization.stage3_param_persitence_threshold: unknown key; did you mean "
          "stage3_param_persistence_threshold?\n") != std::string::npos);
  CHECK(r.out.find(f + ": error: communication_data_type: ") != std::string::npos);
  std::size_t lines = 0;
  for (std::size_t pos = 0; (pos = r.out.find(": error: ", pos)) != std::string::npos; ++pos)
    ++lines;
  CHECK(lines == 6);
}

TEST_CASE("check reports a parse error with line and column") {
  const std::string f = kData + "/configs/invalid/hjson_unquoted.json";
  const Run r = run("check " + f, "stderr");
  CHECK(r.status == 1);
  CHECK(r.out.rfind(f + ": error: line 2, column 23: unquoted text 'GLOBAL_BATCH'", 0) == 0);
}

TEST_CASE("check names an unreadable file with the system's reason") {
  const Run r = run("check /nonexistent/ds.json", "stderr");
  CHECK(r.status == 1);
  CHECK(r.out.find("/nonexistent/ds.json: error: cannot open /nonexistent/ds.json: No such file or "
                   "directory") != std::string::npos);
}

TEST_CASE("not-supported-yet keys are reported without failing check, and fail check --strict") {
  const std::string f = kCorpus +
                        "microsoft__DeepSpeedExamples__training__bing_bert__01_adam__nccl__"
                        "deepspeed_bsz4k_01adam_config_seq128_nccl.json";
  const Run lax = run("check " + f, "stderr");
  INFO(lax.out);
  CHECK(lax.status == 0);
  CHECK(lax.out.find(f + ": not supported yet: optimizer.type: ") != std::string::npos);
  CHECK(run("check --strict " + f).status == 1);
}

TEST_CASE(
    "check with several files exits 1 when any is invalid and prints a summary line per file") {
  const Run r = run("check " + kData + "/configs/valid/commented.json " + kData +
                        "/configs/invalid/duplicate_nested.json",
                    "stdout");
  CHECK(r.status == 1);
  CHECK(r.out.find("commented.json: valid") != std::string::npos);
  CHECK(r.out.find("duplicate_nested.json: invalid (1 error)") != std::string::npos);
}

TEST_CASE("--world-size makes the batch triad exact") {
  const std::string f =
      kCorpus + "AndreSoble__PerformerDualEncoder__ds_config.json";  // 20000 = 20 * 100 * W
  CHECK(run("check " + f).status == 0);
  CHECK(run("check --world-size 10 " + f).status == 0);
  const Run r = run("check --world-size 8 " + f, "stderr");
  CHECK(r.status == 1);
  CHECK(
      r.out.find(
          "error: train_batch_size: train_batch_size 20000 != train_micro_batch_size_per_gpu 20 * "
          "gradient_accumulation_steps 100 * world size 8 = 16000") != std::string::npos);
}

TEST_CASE("bad usage exits 2 with the usage text") {
  CHECK(run("check").status == 2);
  CHECK(run("check --world-size zero x.json").status == 2);
  CHECK(run("check --bogus x.json").status == 2);
  CHECK(run("print a.json b.json").status == 2);
  const Run help = run("check --help", "stdout");
  CHECK(help.status == 0);
  CHECK(help.out.find("--strict") != std::string::npos);
  CHECK(help.out.find("not supported yet") != std::string::npos);
}

TEST_CASE("print emits the resolved config, supplied values, provenance and findings as JSON") {
  const std::string f = kData + "/configs/valid/hf_auto.json";
  const Run r =
      run("print --world-size 2 --set train_micro_batch_size_per_gpu=4 --set "
          "gradient_accumulation_steps=1 "
          "--set train_batch_size=8 --set optimizer.params.lr=3e-4 " +
              f,
          "stdout");
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["config"]["optimizer"]["params"]["lr"] == 3e-4);
  CHECK(j["config"]["zero_optimization"]["reduce_bucket_size"] == 500000000);
  CHECK(j["provenance"]["zero_optimization.reduce_bucket_size"]["source"] ==
        "deepspeed-auto-default");
  CHECK(j["provenance"]["optimizer.params.lr"]["source"] == "supplied");
  CHECK(j["provenance"]["fp16.enabled"]["source"] == "deepspeed-auto-default");
  CHECK(j["world_size"]["value"] == 2);
  CHECK(j["config"]["optimizer"]["params"]["betas"] == "auto");
  bool betas_unresolved = false;
  for (const auto& u : j["unresolved"]) betas_unresolved |= u["path"] == "optimizer.params.betas";
  CHECK(betas_unresolved);
  CHECK(j["notes"].size() > 0);
}

TEST_CASE("--set takes a JSON value when it parses, else a string") {
  const std::string f = kData + "/configs/valid/hf_auto.json";
  const Run r = run(
      "print --set optimizer.params.betas=[0.9,0.95] --set scheduler.params.warmup_num_steps=10 " +
          f,
      "stdout");
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["config"]["optimizer"]["params"]["betas"][1] == 0.95);
  const Run s = run("check --set optimizer.params.lr=fast " + f, "stderr");
  CHECK(s.status == 1);
  CHECK(s.out.find("optimizer.params.lr: expected a finite number, got \"fast\"") !=
        std::string::npos);
}

TEST_CASE("estimate --config takes stage, precision, optimizer and offload from a ds_config") {
  const std::string f = kCorpus +
                        "huggingface__accelerate__examples__deepspeed_config_templates__zero_"
                        "stage3_offload_config.json";
  const Run with_config =
      run("estimate --params 1e9 --world-size 8 --json --config " + f, "stdout");
  INFO(with_config.out);
  REQUIRE(with_config.status == 0);
  const nlohmann::json j = nlohmann::json::parse(with_config.out);
  // The same figures as spelling the config's choices out by hand: stage 3, fp16, cpu offload of
  // optimizer states and parameters.
  const Run by_hand =
      run("estimate --params 1e9 --world-size 8 --json --stage 3 --precision fp16 "
          "--offload-optimizer cpu --offload-param cpu",
          "stdout");
  REQUIRE(by_hand.status == 0);
  CHECK(j == nlohmann::json::parse(by_hand.out));
  // ... and not those of the defaults (stage 0, no offload).
  const Run defaults = run("estimate --params 1e9 --world-size 8 --json", "stdout");
  CHECK(j != nlohmann::json::parse(defaults.out));
  // A config that cannot be read is named with its problem.
  const Run bad = run("estimate --params 1e9 --world-size 8 --config " + kData +
                      "/configs/invalid/multiple_problems.json");
  CHECK(bad.status != 0);
  CHECK(bad.out.find("--config") != std::string::npos);
  CHECK(bad.out.find("stage3_param_persitence_threshold") != std::string::npos);
}

TEST_CASE("check fails on an optimizer or scheduler name neither DeepSpeed nor torch has") {
  zero::test::TempDir dir("zero_cli_names");
  const std::string f = dir / "names.json";
  std::ofstream(f) << R"({"optimizer": {"type": "AdamX"}, "scheduler": {"type": "WarmupCosine"},
                         "train_batch_size": 8})";
  const Run r = run("check " + f, "stderr");
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(r.out.find(f + ": error: optimizer.type: \"AdamX\" is neither a DeepSpeed optimizer") !=
        std::string::npos);
  CHECK(r.out.find("did you mean AdamW?") != std::string::npos);
  CHECK(r.out.find(f + ": error: scheduler.type: ") != std::string::npos);
  CHECK(r.out.find("did you mean WarmupCosineLR?") != std::string::npos);
  CHECK(r.out.find("not supported yet") == std::string::npos);
}
