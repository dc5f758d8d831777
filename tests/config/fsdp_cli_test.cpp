// zero-config from-fsdp / to-fsdp as a user runs them: outputs, notes, exit codes, and that a
// failed conversion writes nothing.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli_util.h"
#include "tests/temp_dir.h"

namespace {

using Run = zero::test::CommandRun;

Run run(const std::string& args, const std::string& stream = "both") {
  return zero::test::run_tool(ZERO_CONFIG_BIN, args, stream);
}

const std::string kAccelerate = std::string(ZERO_TEST_DATA_DIR) + "/accelerate/";

}  // namespace

TEST_CASE("from-fsdp prints a ds_config that check accepts, and notes on stderr") {
  const std::string f = kAccelerate + "fsdp_template.yaml";
  const Run out = run("from-fsdp " + f, "stdout");
  REQUIRE(out.status == 0);
  const nlohmann::json ds = nlohmann::json::parse(out.out);
  CHECK(ds["zero_optimization"]["stage"] == 3);
  CHECK(ds["bf16"]["enabled"] == true);

  const Run notes = run("from-fsdp " + f, "stderr");
  INFO(notes.out);
  CHECK(notes.out.find(f + ": note: fsdp_config.fsdp_use_orig_params: no ds_config key") !=
        std::string::npos);
  CHECK(notes.out.find(": error: ") == std::string::npos);

  zero::test::TempDir dir("zero_fsdp_cli");
  const std::string json_file = dir / "ds_config.json";
  REQUIRE(run("from-fsdp " + f + " -o " + json_file).status == 0);
  CHECK(nlohmann::json::parse(
            run("print " + json_file, "stdout").out)["config"]["zero_optimization"]["stage"] == 3);
  const Run check = run("check " + json_file, "stdout");
  INFO(check.out);
  CHECK(check.status == 0);
  CHECK(check.out.find(json_file + ": valid") == 0);
}

TEST_CASE("from-fsdp refuses what is not an Accelerate FSDP config and writes nothing") {
  zero::test::TempDir dir("zero_fsdp_cli");
  const std::string out = dir / "ds_config.json";
  const std::string multi = kAccelerate + "multi_gpu_not_fsdp.yaml";
  const Run r = run("from-fsdp " + multi + " -o " + out, "stderr");
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(r.out.find(multi + ": error: distributed_type: 'MULTI_GPU' is not FSDP") !=
        std::string::npos);
  CHECK(r.out.find(multi + ": error: fsdp_config: missing") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(out));
  CHECK_FALSE(std::filesystem::exists(out + ".tmp"));

  const std::string bad = kAccelerate + "fsdp_bad_values.yaml";
  const Run values = run("from-fsdp " + bad + " -o " + out, "stderr");
  CHECK(values.status == 1);
  CHECK(values.out.find(bad + ": error: fsdp_config.fsdp_sharding_strategy: 'FULL_SHRAD'") !=
        std::string::npos);
  CHECK_FALSE(std::filesystem::exists(out));

  const Run missing = run("from-fsdp /nonexistent/accelerate.yaml", "stderr");
  CHECK(missing.status == 1);
  CHECK(missing.out.find("/nonexistent/accelerate.yaml: error: cannot open "
                         "/nonexistent/accelerate.yaml: No such file or directory") !=
        std::string::npos);
  CHECK(run("from-fsdp").status == 2);
  CHECK(run("from-fsdp a.yaml b.yaml").status == 2);
  CHECK(run("to-fsdp x.json --fsdp-version 3").status == 2);
}

TEST_CASE("to-fsdp prints Accelerate YAML; an invalid ds_config is refused") {
  const std::string f = std::string(ZERO_TEST_DATA_DIR) + "/configs/valid/hf_auto.json";
  const Run yaml = run("to-fsdp " + f + " --fsdp-version 1", "stdout");
  INFO(yaml.out);
  REQUIRE(yaml.status == 0);
  CHECK(yaml.out.find("distributed_type: FSDP\n") != std::string::npos);
  CHECK(yaml.out.find("  fsdp_version: 1\n") != std::string::npos);
  CHECK(yaml.out.find("  fsdp_sharding_strategy: ") != std::string::npos);

  const std::string invalid =
      std::string(ZERO_TEST_DATA_DIR) + "/configs/invalid/multiple_problems.json";
  zero::test::TempDir dir("zero_fsdp_cli");
  const Run r = run("to-fsdp " + invalid + " -o " + (dir / "a.yaml"), "stderr");
  CHECK(r.status == 1);
  CHECK(r.out.find(invalid + ": error: ") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "a.yaml"));
}

TEST_CASE("from-fsdp, to-fsdp and from-fsdp again give the same ds_config") {
  zero::test::TempDir dir("zero_fsdp_cli");
  for (const char* name : {"fsdp_template.yaml", "fsdp1_accelerate_config_numeric.yaml",
                           "fsdp1_shard_grad_op.yaml", "fsdp1_hybrid_two_nodes.yaml",
                           "fsdp2_accelerate_config.yaml", "fsdp2_offload_no_reshard.yaml"}) {
    INFO(name);
    const std::string first = dir / "first.json";
    const std::string yaml = dir / "back.yaml";
    REQUIRE(run(std::string("from-fsdp ") + kAccelerate + name + " -o " + first).status == 0);
    const bool fsdp2 = std::string(name).starts_with("fsdp2");
    REQUIRE(
        run("to-fsdp " + first + " --fsdp-version " + (fsdp2 ? "2" : "1") + " -o " + yaml).status ==
        0);
    const Run again = run("from-fsdp " + yaml, "stdout");
    REQUIRE(again.status == 0);
    nlohmann::json a = nlohmann::json::parse(run("from-fsdp " + kAccelerate + name, "stdout").out);
    nlohmann::json b = nlohmann::json::parse(again.out);
    // HYBRID_SHARD's node size lives in the launcher settings, which a ds_config does not keep.
    a["zero_optimization"].erase("zero_hpz_partition_size");
    CHECK(a == b);
  }
}
