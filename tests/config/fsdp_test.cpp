// config/fsdp: Accelerate FSDP configs read and written, and converted to and from ds_configs.
// The fixtures in tests/data/accelerate/ are written in the shapes Accelerate's own examples
// (examples/config_yaml_templates/fsdp.yaml) and `accelerate config` produce, FSDP1 and FSDP2.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/ds_config.h"
#include "config/fsdp/accelerate_config.h"
#include "config/fsdp/convert.h"
#include "tests/config/test_util.h"
#include "zero/base/error.h"

using namespace zero::config;
using namespace zero::config::fsdp;
using nlohmann::json;
using zero::ConfigError;
using zero::config::testing::describe;
using zero::config::testing::has_problem;

namespace {

const std::string kAccelerate = std::string(ZERO_TEST_DATA_DIR) + "/accelerate/";

const std::vector<std::string> kFsdpFixtures = {
    "fsdp_template.yaml",           "fsdp1_accelerate_config_numeric.yaml",
    "fsdp1_shard_grad_op.yaml",     "fsdp1_hybrid_two_nodes.yaml",
    "fsdp2_accelerate_config.yaml", "fsdp2_offload_no_reshard.yaml"};

std::string fixture(const std::string& name) {
  std::ifstream in(kAccelerate + name, std::ios::binary);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

FromFsdp from(const std::string& yaml) {
  return ds_config_from_fsdp(parse_accelerate_config(yaml));
}

bool has_note(const std::vector<Note>& notes, std::string_view key, std::string_view part = {}) {
  for (const Note& n : notes) {
    if (n.key == key && n.message.find(part) != std::string::npos) return true;
  }
  return false;
}

std::string describe(const std::vector<Note>& notes) {
  std::string out;
  for (const Note& n : notes) out += n.key + ": " + n.message + "\n";
  return out;
}

std::vector<ConfigError::Problem> problems_of_yaml(const std::string& yaml) {
  try {
    parse_accelerate_config(yaml);
  } catch (const ConfigError& e) {
    return e.problems();
  }
  FAIL("expected a ConfigError for:\n" << yaml);
  return {};
}

// The ZeRO stage an Accelerate config shards like.
int stage_of(const AccelerateFsdpConfig& a) {
  if (a.reshard_after_forward) return *a.reshard_after_forward ? 3 : 2;
  switch (a.sharding_strategy.value_or(ShardingStrategy::FullShard)) {
    case ShardingStrategy::NoShard: return 0;
    case ShardingStrategy::ShardGradOp:
    case ShardingStrategy::HybridShardZero2: return 2;
    default: return 3;
  }
}

std::string with_strategy(const std::string& value) {
  return "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: " + value + "\n";
}

}  // namespace

// ---- Accelerate FSDP config -> ds_config --------------------------------------------------------

TEST_CASE("Accelerate's fsdp.yaml template becomes ZeRO stage 3 in bf16 with fp32 masters") {
  const FromFsdp r = from(fixture("fsdp_template.yaml"));
  INFO(r.ds_config.dump(2) << "\n" << describe(r.notes));
  const json& z = r.ds_config["zero_optimization"];
  CHECK(z["stage"] == 3);
  CHECK(z["stage3_prefetch_bucket_size"] == 50'000'000);
  CHECK(z["stage3_gather_16bit_weights_on_model_save"] == false);
  CHECK_FALSE(z.contains("offload_param"));
  CHECK(r.ds_config["bf16"]["enabled"] == true);
  CHECK(r.ds_config["gradient_clipping"] == "auto");

  const DsConfig ds = load_config_json(r.ds_config);
  CHECK(ds.zero_optimization.stage == 3);
  CHECK(ds.model_dtype == zero::DType::BF16);
  CHECK_FALSE(ds.bf16.bf16_master_weights_and_grads);
  for (const char* key :
       {"fsdp_config.fsdp_auto_wrap_policy", "fsdp_config.fsdp_cpu_ram_efficient_loading",
        "fsdp_config.fsdp_sync_module_states", "fsdp_config.fsdp_use_orig_params",
        "fsdp_config.fsdp_forward_prefetch", "num_processes"}) {
    INFO(key);
    CHECK(has_note(r.notes, key));
  }
}

TEST_CASE("an FSDP1 config with offload, numeric strategy and FULL_STATE_DICT maps each of them") {
  const FromFsdp r = from(fixture("fsdp1_accelerate_config_numeric.yaml"));
  INFO(r.ds_config.dump(2));
  const json& z = r.ds_config["zero_optimization"];
  CHECK(z["stage"] == 3);
  CHECK(z["offload_param"]["device"] == "cpu");
  CHECK(z["offload_optimizer"]["device"] == "cpu");
  CHECK(z["stage3_gather_16bit_weights_on_model_save"] == true);
  CHECK(z["stage3_prefetch_bucket_size"] == 50'000'000);  // from fsdp_backward_prefetch_policy
  CHECK(r.ds_config["fp16"]["enabled"] == true);
  CHECK_FALSE(r.ds_config.contains("bf16"));
}

TEST_CASE("the numbers 1-5 and the names are the five sharding strategies in Accelerate's order") {
  const std::vector<std::pair<std::string, int>> cases = {{"1", 3},
                                                          {"2", 2},
                                                          {"3", 0},
                                                          {"4", 3},
                                                          {"5", 2},
                                                          {"FULL_SHARD", 3},
                                                          {"shard_grad_op", 2},
                                                          {"NO_SHARD", 0},
                                                          {"HYBRID_SHARD", 3},
                                                          {"HYBRID_SHARD_ZERO2", 2}};
  for (const auto& [value, stage] : cases) {
    INFO(value);
    CHECK(from(with_strategy(value)).ds_config["zero_optimization"]["stage"] == stage);
  }
  CHECK(has_note(from(with_strategy("HYBRID_SHARD_ZERO2")).notes,
                 "fsdp_config.fsdp_sharding_strategy", "stage 3 only"));
}

TEST_CASE("SHARD_GRAD_OP with NO_PREFETCH and LOCAL_STATE_DICT: stage 2, each gap noted") {
  const FromFsdp r = from(fixture("fsdp1_shard_grad_op.yaml"));
  INFO(r.ds_config.dump(2) << "\n" << describe(r.notes));
  const json& z = r.ds_config["zero_optimization"];
  CHECK(z["stage"] == 2);  // given as fsdp_reshard_after_forward: SHARD_GRAD_OP
  CHECK_FALSE(z.contains("stage3_prefetch_bucket_size"));
  CHECK(z["stage3_gather_16bit_weights_on_model_save"] == false);
  CHECK_FALSE(r.ds_config.contains("bf16"));
  CHECK_FALSE(r.ds_config.contains("fp16"));
  CHECK(has_note(r.notes, "fsdp_config.fsdp_backward_prefetch", "no equivalent at stage 2"));
  CHECK(has_note(r.notes, "fsdp_config.fsdp_state_dict_type", "LOCAL_STATE_DICT"));
  CHECK(has_note(r.notes, "fsdp_config.fsdp_activation_checkpointing", "checkpoint itself"));
  CHECK(has_note(r.notes, "fsdp_config.fsdp_min_num_params"));
}

TEST_CASE("NO_PREFETCH at stage 3 turns DeepSpeed's prefetching off") {
  const FromFsdp r = from(with_strategy("FULL_SHARD") + "  fsdp_backward_prefetch: NO_PREFETCH\n");
  CHECK(r.ds_config["zero_optimization"]["stage3_prefetch_bucket_size"] == 0);
  const FromFsdp post =
      from(with_strategy("FULL_SHARD") + "  fsdp_backward_prefetch: BACKWARD_POST\n");
  CHECK(post.ds_config["zero_optimization"]["stage3_prefetch_bucket_size"] == 50'000'000);
  CHECK(has_note(post.notes, "fsdp_config.fsdp_backward_prefetch", "BACKWARD_POST"));
}

TEST_CASE("HYBRID_SHARD on two machines is stage 3 with zero_hpz_partition_size = GPUs per node") {
  const FromFsdp r = from(fixture("fsdp1_hybrid_two_nodes.yaml"));
  INFO(describe(r.notes));
  CHECK(r.ds_config["zero_optimization"]["stage"] == 3);
  CHECK(r.ds_config["zero_optimization"]["zero_hpz_partition_size"] == 8);
  CHECK(has_note(r.notes, "fsdp_config.fsdp_sharding_strategy", "ZeRO++ hpZ"));
  const DsConfig ds = load_config_json(r.ds_config);
  CHECK_FALSE(zero::config::testing::has_finding(ds.findings, Severity::Unsupported,
                                                 "zero_optimization.zero_hpz_partition_size"));

  const FromFsdp one_node = from(with_strategy("HYBRID_SHARD"));
  CHECK_FALSE(one_node.ds_config["zero_optimization"].contains("zero_hpz_partition_size"));
  CHECK(has_note(one_node.notes, "fsdp_config.fsdp_sharding_strategy", "one machine"));
}

TEST_CASE("FSDP2: fsdp_reshard_after_forward true is stage 3, false stage 2 (offload: optimizer)") {
  const FromFsdp full = from(fixture("fsdp2_accelerate_config.yaml"));
  CHECK(full.ds_config["zero_optimization"]["stage"] == 3);
  CHECK(full.ds_config["bf16"]["enabled"] == true);

  const FromFsdp r = from(fixture("fsdp2_offload_no_reshard.yaml"));
  INFO(r.ds_config.dump(2));
  const json& z = r.ds_config["zero_optimization"];
  CHECK(z["stage"] == 2);
  CHECK(z["offload_optimizer"]["device"] == "cpu");
  CHECK_FALSE(z.contains("offload_param"));
  CHECK(z["stage3_gather_16bit_weights_on_model_save"] == true);
  CHECK(has_note(r.notes, "fsdp_config.fsdp_offload_params", "16-bit parameters on the device"));

  const FromFsdp defaulted = from("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n");
  CHECK(defaulted.ds_config["zero_optimization"]["stage"] == 3);
  CHECK(has_note(defaulted.notes, "fsdp_config.fsdp_reshard_after_forward", "absent"));
}

TEST_CASE("every key of every fixture is either mapped or named in a note, never dropped") {
  // Keys the ds_config carries (a false activation checkpointing needs nothing).
  const std::set<std::string> mapped = {"distributed_type",
                                        "fsdp_config",
                                        "mixed_precision",
                                        "fsdp_version",
                                        "fsdp_sharding_strategy",
                                        "fsdp_reshard_after_forward",
                                        "fsdp_offload_params",
                                        "fsdp_state_dict_type",
                                        "fsdp_activation_checkpointing"};
  for (const std::string& name : kFsdpFixtures) {
    const FromFsdp r = from(fixture(name));
    CAPTURE(name, describe(r.notes));
    std::size_t keys = 0;
    std::istringstream lines(fixture(name));
    for (std::string line; std::getline(lines, line);) {
      if (line.empty() || line[0] == '#' || line.find(':') == std::string::npos) continue;
      const std::size_t indent = line.find_first_not_of(' ');
      const std::string key = line.substr(indent, line.find(':') - indent);
      ++keys;
      if (mapped.count(key) != 0) continue;
      const std::string path = indent == 0 ? key : "fsdp_config." + key;
      bool named = false;
      for (const Note& n : r.notes) {
        named = named || n.key == path || (indent == 0 && n.key.find(key) != std::string::npos);
      }
      // Backward prefetch is mapped at stage 3 (the prefetch bucket), noted below it.
      if (key == "fsdp_backward_prefetch" || key == "fsdp_backward_prefetch_policy")
        named = named || r.ds_config["zero_optimization"].contains("stage3_prefetch_bucket_size");
      INFO("key " << path);
      CHECK(named);
    }
    CHECK(keys >= 5);  // the scan found the fixture's keys
  }
}

TEST_CASE("an unknown fsdp_config key is noted with the nearest known key") {
  const FromFsdp r = from(with_strategy("FULL_SHARD") + "  fsdp_ofload_params: true\n");
  CHECK(has_note(r.notes, "fsdp_config.fsdp_ofload_params", "did you mean fsdp_offload_params?"));
  CHECK_FALSE(r.ds_config["zero_optimization"].contains("offload_param"));
}

// ---- bad input
// ------------------------------------------------------------------------------------

TEST_CASE("a YAML that is not an Accelerate FSDP config is refused, naming the key and the fix") {
  const auto multi = problems_of_yaml(fixture("multi_gpu_not_fsdp.yaml"));
  INFO(describe(multi));
  CHECK(has_problem(multi, "distributed_type", "'MULTI_GPU' is not FSDP"));
  CHECK(has_problem(multi, "fsdp_config", "missing"));
  CHECK(has_problem(problems_of_yaml("distributed_type: DEEPSPEED\nfsdp_config: {}\n"),
                    "distributed_type", "deepspeed_config_file"));
  CHECK(has_problem(problems_of_yaml("fsdp_config:\n  fsdp_offload_params: true\n"),
                    "distributed_type", "missing"));
  CHECK(has_problem(problems_of_yaml("- distributed_type\n- FSDP\n"), "", "YAML mapping"));
  CHECK(has_problem(problems_of_yaml(""), "", "YAML mapping"));
  const auto syntax = problems_of_yaml("distributed_type: FSDP\nfsdp_config: [1, 2\n");
  REQUIRE(syntax.size() == 1);
  CHECK(syntax[0].message.rfind("line ", 0) == 0);
}

TEST_CASE("bad values are all reported at once, each with what is accepted and a suggestion") {
  const auto p = problems_of_yaml(fixture("fsdp_bad_values.yaml"));
  INFO(describe(p));
  CHECK(p.size() == 4);
  CHECK(has_problem(p, "fsdp_config.fsdp_sharding_strategy",
                    "'FULL_SHRAD' is not one of FULL_SHARD, SHARD_GRAD_OP"));
  CHECK(has_problem(p, "fsdp_config.fsdp_sharding_strategy", "did you mean FULL_SHARD?"));
  CHECK(has_problem(p, "fsdp_config.fsdp_offload_params", "expected true or false, got 'maybe'"));
  CHECK(has_problem(p, "fsdp_config.fsdp_state_dict_type", "did you mean SHARDED_STATE_DICT?"));
  CHECK(has_problem(p, "mixed_precision", "did you mean bf16?"));
  CHECK(has_problem(problems_of_yaml(with_strategy("6")), "fsdp_config.fsdp_sharding_strategy",
                    "or 1-5"));
  CHECK(has_problem(problems_of_yaml(with_strategy("FULL_SHARD") + "  fsdp_version: 3\n"),
                    "fsdp_config.fsdp_version", "1 or 2"));
}

// ---- ds_config -> Accelerate FSDP config
// ----------------------------------------------------------

TEST_CASE("a ds_config's stage, offload, prefetch, save and precision become FSDP settings") {
  const DsConfig ds = load_config_json(json::parse(R"({
      "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                            "offload_optimizer": {"device": "cpu"},
                            "stage3_prefetch_bucket_size": 0,
                            "stage3_gather_16bit_weights_on_model_save": true,
                            "reduce_bucket_size": 1e7},
      "fp16": {"enabled": true, "loss_scale_window": 500},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
      "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
      "gradient_accumulation_steps": 2})"));
  const ToFsdp r = fsdp_from_ds_config(ds, 1);
  INFO(describe(r.notes));
  const AccelerateFsdpConfig& a = r.accelerate;
  CHECK(a.fsdp_version == 1);
  CHECK(a.sharding_strategy == ShardingStrategy::FullShard);
  CHECK(a.offload_params == true);
  CHECK(a.backward_prefetch == BackwardPrefetch::NoPrefetch);
  CHECK(a.state_dict_type == StateDictType::FullStateDict);
  CHECK(a.mixed_precision == MixedPrecision::Fp16);
  CHECK(a.cpu_ram_efficient_loading == true);
  CHECK(a.num_processes == 4);  // the batch triad's world size
  for (const char* key :
       {"optimizer", "zero_optimization.reduce_bucket_size", "fp16.loss_scale_window",
        "train_batch_size", "fsdp_config.fsdp_auto_wrap_policy"}) {
    INFO(key);
    CHECK(has_note(r.notes, key));
  }
  CHECK_FALSE(has_note(r.notes, "zero_optimization.stage"));
  CHECK_FALSE(has_note(r.notes, "fp16.enabled"));
}

TEST_CASE(
    "ds_config settings FSDP lacks are noted: stage 1, one-sided or NVMe offload, bf16 masters") {
  const ToFsdp stage1 = fsdp_from_ds_config(
      load_config_json(json::parse(R"({"zero_optimization": {"stage": 1}})")), 1);
  CHECK(stage1.accelerate.sharding_strategy == ShardingStrategy::ShardGradOp);
  CHECK(has_note(stage1.notes, "zero_optimization.stage", "stage 1 has no FSDP equivalent"));

  const ToFsdp nvme = fsdp_from_ds_config(load_config_json(json::parse(R"({
      "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x"}}})")),
                                          2);
  CHECK(nvme.accelerate.offload_params == true);
  CHECK(has_note(nvme.notes, "zero_optimization.offload_param", "all or nothing"));
  CHECK(has_note(nvme.notes, "zero_optimization.offload_param.device", "NVMe"));
  CHECK(has_note(nvme.notes, "zero_optimization.offload_param.nvme_path"));

  const ToFsdp masters =
      fsdp_from_ds_config(load_config_json(json::parse(
                              R"({"bf16": {"enabled": true, "bf16_master_weights_and_grads": true},
              "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})")),
                          2);
  CHECK(masters.accelerate.mixed_precision == MixedPrecision::No);
  CHECK(has_note(masters.notes, "bf16.bf16_master_weights_and_grads", "torch_dtype"));

  const ToFsdp none = fsdp_from_ds_config(load_config_json(json::object()), 2);
  CHECK(none.accelerate.reshard_after_forward == false);
  CHECK(has_note(none.notes, "zero_optimization.stage", "--fsdp-version 1 writes NO_SHARD"));
}

// ---- round trips
// ----------------------------------------------------------------------------------

TEST_CASE("Accelerate -> ds_config -> Accelerate keeps every setting that has a mapping") {
  for (const std::string& name : kFsdpFixtures) {
    INFO(name);
    const AccelerateFsdpConfig a = parse_accelerate_config(fixture(name));
    const FromFsdp there = ds_config_from_fsdp(a);
    const ToFsdp back = fsdp_from_ds_config(load_config_json(there.ds_config), a.fsdp_version);
    const AccelerateFsdpConfig& b = back.accelerate;
    INFO(write_accelerate_config(b));
    CHECK(stage_of(b) == stage_of(a));
    if (a.sharding_strategy == ShardingStrategy::HybridShard && a.num_machines > 1)
      CHECK(b.sharding_strategy == ShardingStrategy::HybridShard);
    CHECK(b.offload_params == a.offload_params.value_or(false));
    CHECK(b.mixed_precision == a.mixed_precision.value_or(MixedPrecision::No));
    if (a.state_dict_type && a.state_dict_type != StateDictType::LocalStateDict)
      CHECK(b.state_dict_type == a.state_dict_type);
    if (a.fsdp_version == 1 && stage_of(a) == 3)
      CHECK(b.backward_prefetch == a.backward_prefetch.value_or(BackwardPrefetch::BackwardPre));
    // And through the YAML text itself.
    const AccelerateFsdpConfig reread = parse_accelerate_config(write_accelerate_config(b));
    CHECK(reread.sharding_strategy == b.sharding_strategy);
    CHECK(reread.reshard_after_forward == b.reshard_after_forward);
    CHECK(reread.offload_params == b.offload_params);
    CHECK(reread.backward_prefetch == b.backward_prefetch);
    CHECK(reread.state_dict_type == b.state_dict_type);
    CHECK(reread.mixed_precision == b.mixed_precision);
    CHECK(reread.fsdp_version == b.fsdp_version);
    CHECK(reread.other_keys == std::vector<std::string>{"compute_environment"});
  }
}

TEST_CASE("ds_config -> Accelerate -> ds_config keeps every setting that has a mapping") {
  const std::vector<std::pair<std::string, int>> cases = {
      {R"({"zero_optimization": {"stage": 0}})", 1},
      {R"({"zero_optimization": {"stage": 2}, "bf16": {"enabled": true}})", 1},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
           "fp16": {"enabled": true}})",
       2},
      {R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0,
           "stage3_gather_16bit_weights_on_model_save": true}, "bf16": {"enabled": true}})",
       1},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
           "offload_optimizer": {"device": "cpu"}}})",
       2},
      {R"({"zero_optimization": {"stage": 3}})", 1}};
  for (const auto& [text, version] : cases) {
    INFO(text << " fsdp_version " << version);
    const DsConfig a = load_config_string(text);
    const std::string yaml = write_accelerate_config(fsdp_from_ds_config(a, version).accelerate);
    INFO(yaml);
    const DsConfig b = load_config_json(from(yaml).ds_config);
    const ZeroOptimization& za = a.zero_optimization;
    const ZeroOptimization& zb = b.zero_optimization;
    CHECK(zb.stage == za.stage);
    auto device = [](const auto& block) { return block ? block->device : OffloadDevice::None; };
    CHECK(device(zb.offload_param) == device(za.offload_param));
    CHECK(device(zb.offload_optimizer) == device(za.offload_optimizer));
    if (za.stage == 3) CHECK(zb.prefetch_bucket_elems == za.prefetch_bucket_elems);
    CHECK(zb.gather_16bit_weights_on_model_save == za.gather_16bit_weights_on_model_save);
    CHECK(b.bf16.enabled == a.bf16.enabled);
    CHECK(b.fp16.enabled == a.fp16.enabled);
    CHECK(b.model_dtype == a.model_dtype);
  }
}

TEST_CASE("the YAML written is Accelerate's shape: sorted keys, 'no' quoted") {
  AccelerateFsdpConfig c;
  c.fsdp_version = 2;
  c.reshard_after_forward = true;
  c.offload_params = false;
  c.mixed_precision = MixedPrecision::No;
  const std::string yaml = write_accelerate_config(c);
  INFO(yaml);
  CHECK(yaml.find("distributed_type: FSDP\n") != std::string::npos);
  CHECK(yaml.find("mixed_precision: 'no'\n") != std::string::npos);
  CHECK(yaml.find("  fsdp_offload_params: false\n  fsdp_reshard_after_forward: true\n") !=
        std::string::npos);
  CHECK(parse_accelerate_config(yaml).mixed_precision == MixedPrecision::No);
}

TEST_CASE("a key that is not a plain name is a located error, not a crash") {
  const auto p = problems_of_yaml("distributed_type: FSDP\nfsdp_config:\n  ? [a, b]\n  : 1\n");
  REQUIRE(p.size() == 1);
  CHECK(p[0].message.find("not a plain name") != std::string::npos);
  CHECK(p[0].message.rfind("line 3", 0) == 0);
}
