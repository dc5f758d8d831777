#include "config/ds_config.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <string>

#include "config/schema.h"
#include "tests/config/test_util.h"

using namespace zero::config;
using zero::config::testing::describe;
using zero::config::testing::has_finding;
using zero::config::testing::has_problem;
using zero::config::testing::problems_of;

namespace {

DsConfig load(std::string_view text, Supplied s = {}) {
  return load_config_string(text, s);
}

Supplied world(std::int64_t w) {
  Supplied s;
  s.world_size = w;
  return s;
}

const std::string kDir = std::string(ZERO_TEST_DATA_DIR) + "/configs/";

}  // namespace

// ---- defaults and types ----------------------------------------------------------------------

TEST_CASE("an empty config gets DeepSpeed 0.19.6 defaults (gradient_clipping: off), each with provenance default") {
  const DsConfig c = load("{}");
  CHECK(c.zero_optimization.stage == 0);
  CHECK(c.zero_optimization.reduce_bucket_elems == 500'000'000);
  CHECK(c.zero_optimization.prefetch_bucket_elems == 50'000'000);
  CHECK(c.zero_optimization.overlap_comm == false);
  CHECK(c.fp16.initial_scale_power == 16);
  CHECK(c.fp16.hysteresis == 2);
  CHECK(c.bf16.check_grad_overflow == true);
  CHECK(c.aio.block_size_bytes == 1'048'576);
  CHECK_FALSE(c.steps_per_print.has_value());
  CHECK(c.communication_data_type == zero::DType::F32);
  CHECK(c.provenance.at("gradient_clipping").source == Source::Default);
  CHECK(c.provenance.at("gradient_clipping").detail.find("0.19.3") != std::string::npos);
  CHECK(c.gradient_clipping == 0.0);  // off when absent, unlike DeepSpeed >= 0.19.3 (a note)
  CHECK(has_finding(c.findings, Severity::Note, "gradient_clipping"));
  CHECK(c.to_json()["zero_optimization"]["stage3_model_persistence_threshold"] == INT64_MAX);
}

TEST_CASE("every key of the schema table appears in the resolved config") {
  const DsConfig c = load(R"({"optimizer": {"type": "Adam"}, "scheduler": {"type": "WarmupLR"},
                              "zero_optimization": {"offload_param": {}, "offload_optimizer": {}}})");
  for (const KeyRule& r : key_rules()) {
    if (r.block == "optimizer.params" && r.variant != "adam") continue;
    if (r.block == "scheduler.params" && r.variant != "WarmupLR") continue;
    const std::string path =
        r.block.empty() ? std::string(r.name) : std::string(r.block) + "." + std::string(r.name);
    INFO(path);
    std::string pointer = "/" + path;
    for (char& ch : pointer) {
      if (ch == '.') ch = '/';
    }
    CHECK(c.to_json().contains(nlohmann::json::json_pointer(pointer)));
    if (r.type != ValueType::Object) CHECK(c.provenance.count(path) == 1);
  }
}

TEST_CASE("integers accept integral floats and numeric strings, and refuse fractions") {
  const DsConfig c =
      load(R"({"zero_optimization": {"reduce_bucket_size": 5e8, "allgather_bucket_size": "2e8",
                              "stage": "2"}})");
  CHECK(c.zero_optimization.reduce_bucket_elems == 500'000'000);
  CHECK(c.zero_optimization.allgather_bucket_elems == 200'000'000);
  CHECK(c.zero_optimization.stage == 2);
  const auto p = problems_of(R"({"zero_optimization": {"reduce_bucket_size": 5.5}})");
  CHECK(has_problem(p, "zero_optimization.reduce_bucket_size",
                    "expected an integer, got 5.5 (not a whole number)"));
}

TEST_CASE("booleans accept pydantic's lax spellings and refuse anything else") {
  const DsConfig c =
      load(R"({"fp16": {"enabled": "yes", "auto_cast": 0}, "wall_clock_breakdown": "on",
                              "zero_optimization": {"overlap_comm": "off", "contiguous_gradients": 1}})");
  CHECK(c.fp16.enabled);
  CHECK_FALSE(c.fp16.auto_cast);
  CHECK(c.wall_clock_breakdown);
  CHECK_FALSE(c.zero_optimization.overlap_comm);
  CHECK(c.zero_optimization.contiguous_gradients);
  CHECK(has_problem(problems_of(R"({"fp16": {"enabled": "maybe"}})"), "fp16.enabled",
                    "expected a boolean"));
  CHECK(has_problem(problems_of(R"({"fp16": {"enabled": 2}})"), "fp16.enabled",
                    "expected a boolean"));
}

TEST_CASE("offload device names are case-sensitive, as in DeepSpeed") {
  const auto p =
      problems_of(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "CPU"}}})");
  CHECK(has_problem(p, "zero_optimization.offload_param.device",
                    "(case-sensitive), got \"CPU\"; did you mean cpu?"));
}

TEST_CASE("stage above 3 is refused") {
  CHECK(has_problem(problems_of(R"({"zero_optimization": {"stage": 4}})"),
                    "zero_optimization.stage", "must be between 0 and 3, got 4"));
}

TEST_CASE("negative sizes are refused") {
  CHECK(has_problem(problems_of(R"({"zero_optimization": {"sub_group_size": -1}})"),
                    "zero_optimization.sub_group_size", "must be >= 0"));
}

// ---- unknown keys -----------------------------------------------------------------------------

TEST_CASE("an unknown key in zero_optimization is an error naming the path and the nearest key") {
  const auto p = problems_of(
      R"({"zero_optimization": {"stage": 3, "stage3_param_persitence_threshold": 1e5}})");
  REQUIRE(p.size() == 1);
  CHECK(p[0].path == "zero_optimization.stage3_param_persitence_threshold");
  CHECK(p[0].message == "unknown key; did you mean stage3_param_persistence_threshold?");
}

TEST_CASE(
    "unknown keys in fp16, bf16 and the offload blocks are errors; far-off names get no "
    "suggestion") {
  CHECK(has_problem(problems_of(R"({"fp16": {"enabeld": true}})"), "fp16.enabeld",
                    "unknown key; did you mean enabled?"));
  CHECK(has_problem(problems_of(R"({"bf16": {"check_overflow": true}})"), "bf16.check_overflow",
                    "unknown key"));
  const auto p =
      problems_of(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "zzz": 1}}})");
  REQUIRE(p.size() == 1);
  CHECK(p[0].path == "zero_optimization.offload_optimizer.zzz");
  CHECK(p[0].message == "unknown key");
}

TEST_CASE("an unknown top-level key is a warning with a suggestion, as DeepSpeed ignores it") {
  const DsConfig c = load(R"({"gradient_cliping": 1.0, "zero_force_ds_cpu_optimization": false})");
  CHECK(has_finding(c.findings, Severity::Warning, "gradient_cliping",
                    "did you mean gradient_clipping?"));
  CHECK(has_finding(c.findings, Severity::Warning, "zero_force_ds_cpu_optimization",
                    "did you mean zero_force_ds_cpu_optimizer?"));
}

TEST_CASE(
    "unknown keys in aio, checkpoint and data_types are warnings, as DeepSpeed ignores them") {
  const DsConfig c = load(R"({"aio": {"queue_dept": 4}, "checkpoint": {"tag_validaton": "Fail"}})");
  CHECK(has_finding(c.findings, Severity::Warning, "aio.queue_dept", "did you mean queue_depth?"));
  CHECK(has_finding(c.findings, Severity::Warning, "checkpoint.tag_validaton",
                    "did you mean tag_validation?"));
}

TEST_CASE("blocks of other DeepSpeed subsystems are accepted with a note and passed through") {
  const DsConfig c = load(R"({"activation_checkpointing": {"partition_activations": true},
                              "flops_profiler": {"enabled": true}, "tensorboard": {"enabled": false}})");
  CHECK(has_finding(c.findings, Severity::Note, "activation_checkpointing", "accepted"));
  CHECK(has_finding(c.findings, Severity::Note, "flops_profiler"));
  CHECK(c.to_json()["activation_checkpointing"]["partition_activations"] == true);
}

// ---- aliases and deprecated keys ----------------------------------------------------------------

TEST_CASE(
    "the short and stage3_ spellings of a stage-3 key are both accepted, mapped to one name") {
  const DsConfig c = load(R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1000}})");
  CHECK(c.zero_optimization.prefetch_bucket_elems == 1000);
  CHECK(c.to_json()["zero_optimization"]["stage3_prefetch_bucket_size"] == 1000);
  CHECK_FALSE(c.to_json()["zero_optimization"].contains("prefetch_bucket_size"));
  const Provenance& p = c.provenance.at("zero_optimization.stage3_prefetch_bucket_size");
  CHECK(p.source == Source::AliasOf);
  CHECK(p.detail == "prefetch_bucket_size");
}

TEST_CASE("giving both spellings of one key is an error") {
  const auto p = problems_of(
      R"({"zero_optimization": {"prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}})");
  CHECK(has_problem(p, "zero_optimization.prefetch_bucket_size",
                    "give only one of stage3_prefetch_bucket_size and prefetch_bucket_size"));
}

TEST_CASE("cpu_offload maps to offload_optimizer on the cpu with a warning") {
  const DsConfig c = load(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})");
  REQUIRE(c.zero_optimization.offload_optimizer.has_value());
  CHECK(c.zero_optimization.offload_optimizer->device == OffloadDevice::Cpu);
  CHECK(has_finding(c.findings, Severity::Warning, "zero_optimization.cpu_offload", "deprecated"));
  CHECK(c.provenance.at("zero_optimization.offload_optimizer.device").source ==
        Source::DeprecatedMapped);
  CHECK(c.provenance.at("zero_optimization.offload_optimizer.device").detail == "cpu_offload");
}

TEST_CASE("cpu_offload false leaves the optimizer on the device") {
  const DsConfig c = load(R"({"zero_optimization": {"stage": 2, "cpu_offload": false}})");
  CHECK_FALSE(c.zero_optimization.offload_optimizer.has_value());
}

TEST_CASE("cpu_offload_param maps to offload_param on the cpu") {
  const DsConfig c = load(R"({"zero_optimization": {"stage": 3, "cpu_offload_param": true}})");
  REQUIRE(c.zero_optimization.offload_param.has_value());
  CHECK(c.zero_optimization.offload_param->device == OffloadDevice::Cpu);
}

TEST_CASE("cpu_offload_use_pin_memory is warned about and its value ignored") {
  const DsConfig c = load(R"({"zero_optimization": {"cpu_offload_use_pin_memory": false}})");
  CHECK(has_finding(c.findings, Severity::Warning, "zero_optimization.cpu_offload_use_pin_memory",
                    "ignored"));
  CHECK_FALSE(c.to_json()["zero_optimization"].contains("cpu_offload_use_pin_memory"));
}

TEST_CASE("stage3_gather_fp16_weights_on_model_save maps to the 16bit key") {
  const DsConfig c = load(
      R"({"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true}})");
  CHECK(c.zero_optimization.gather_16bit_weights_on_model_save);
  CHECK(c.provenance.at("zero_optimization.stage3_gather_16bit_weights_on_model_save").source ==
        Source::DeprecatedMapped);
}

TEST_CASE("a deprecated key together with its replacement is an error") {
  CHECK(has_problem(
      problems_of(
          R"({"zero_optimization": {"cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})"),
      "zero_optimization.cpu_offload", "together with its replacement offload_optimizer"));
  CHECK(has_problem(
      problems_of(R"({"zero_optimization": {"stage3_gather_fp16_weights_on_model_save": true,
                                     "gather_16bit_weights_on_model_save": false}})"),
      "zero_optimization.stage3_gather_fp16_weights_on_model_save",
      "together with its replacement"));
}

TEST_CASE("the boolean zero_optimization form means stage 1 with allgather_size") {
  const DsConfig c = load(R"({"zero_optimization": true, "allgather_size": 1000})");
  CHECK(c.zero_optimization.stage == 1);
  CHECK(c.zero_optimization.allgather_bucket_elems == 1000);
  CHECK(has_finding(c.findings, Severity::Warning, "zero_optimization",
                    "boolean form is deprecated"));
  CHECK(c.provenance.at("zero_optimization.stage").source == Source::Derived);
  CHECK(load(R"({"zero_optimization": false})").zero_optimization.stage == 0);
}

TEST_CASE("the legacy bfloat16 block is read only when bf16 is absent") {
  CHECK(load(R"({"bfloat16": {"enabled": true}})").bf16.enabled);
  const DsConfig c = load(R"({"bf16": {"enabled": false}, "bfloat16": {"enabled": true}})");
  CHECK_FALSE(c.bf16.enabled);
  CHECK(has_finding(c.findings, Severity::Warning, "bfloat16", "ignored"));
}

TEST_CASE("fp16-style loss-scale keys in bf16 are ignored with a warning") {
  const DsConfig c = load(R"({"bf16": {"enabled": true, "loss_scale": 0, "hysteresis": 2}})");
  CHECK(has_finding(c.findings, Severity::Warning, "bf16.loss_scale", "no loss scaling"));
  CHECK(has_finding(c.findings, Severity::Warning, "bf16.hysteresis"));
}

TEST_CASE("aio.thread_count is reported as renamed and ignored") {
  const DsConfig c = load(R"({"aio": {"thread_count": 4}})");
  CHECK(has_finding(c.findings, Severity::Warning, "aio.thread_count", "intra_op_parallelism"));
  CHECK(c.aio.intra_op_parallelism == 1);
}

// ---- "auto" -----------------------------------------------------------------------------------

TEST_CASE("auto inside zero_optimization, fp16 and bf16 becomes DeepSpeed's default, with a note") {
  const DsConfig c = load(R"({"zero_optimization": {"stage": "auto", "reduce_bucket_size": "auto",
                                                   "stage3_prefetch_bucket_size": "auto"},
                              "fp16": {"enabled": "auto"}})");
  CHECK(c.zero_optimization.stage == 0);
  CHECK(c.zero_optimization.reduce_bucket_elems == 500'000'000);
  CHECK(c.zero_optimization.prefetch_bucket_elems == 50'000'000);
  CHECK_FALSE(c.fp16.enabled);
  CHECK(c.provenance.at("zero_optimization.stage").source == Source::DeepSpeedAutoDefault);
  CHECK(has_finding(c.findings, Severity::Note, "zero_optimization.stage",
                    "DeepSpeed's default here (0)"));
}

TEST_CASE("a supplied value replaces auto even inside a pydantic block") {
  Supplied s;
  s.values["zero_optimization.reduce_bucket_size"] = 1024;
  const DsConfig c = load(R"({"zero_optimization": {"reduce_bucket_size": "auto"}})", s);
  CHECK(c.zero_optimization.reduce_bucket_elems == 1024);
  CHECK(c.provenance.at("zero_optimization.reduce_bucket_size").source == Source::Supplied);
}

TEST_CASE("auto elsewhere is listed as to be supplied, and filled by supplied values") {
  const std::string text = R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
      "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_max_lr": "auto"}}})";
  const DsConfig open = load(text);
  CHECK(has_finding(open.unresolved, Severity::Note, "optimizer.params.lr", "to be supplied"));
  CHECK(has_finding(open.unresolved, Severity::Note, "gradient_clipping"));
  CHECK(has_finding(open.unresolved, Severity::Note, "scheduler.params.total_num_steps"));
  CHECK(open.to_json()["optimizer"]["params"]["lr"] == "auto");
  CHECK_FALSE(open.train_batch_size.has_value());
  CHECK_FALSE(open.blockers().empty());

  Supplied s;
  s.world_size = 4;
  s.values = {{"train_micro_batch_size_per_gpu", 8},
              {"gradient_accumulation_steps", 2},
              {"train_batch_size", 64},
              {"gradient_clipping", 0.5},
              {"optimizer.params.lr", 3e-4},
              {"optimizer.params.weight_decay", 0.01},
              {"scheduler.params.total_num_steps", 1000},
              {"scheduler.params.warmup_max_lr", 3e-4}};
  const DsConfig done = load(text, s);
  CHECK(done.unresolved.empty());
  CHECK(done.optimizer->lr == 3e-4);
  CHECK(done.gradient_clipping == 0.5);
  CHECK(done.train_batch_size == 64);
  CHECK(done.provenance.at("optimizer.params.lr").source == Source::Supplied);
  CHECK(done.blockers().empty());
}

TEST_CASE("a supplied value that contradicts the config is an error") {
  Supplied s;
  s.values["train_micro_batch_size_per_gpu"] = 4;
  CHECK(has_problem(problems_of(R"({"train_micro_batch_size_per_gpu": 8})", s),
                    "train_micro_batch_size_per_gpu",
                    "the embedding supplies 4 but the config sets 8"));
}

TEST_CASE("a scheduler value DeepSpeed requires is to be supplied when missing") {
  const DsConfig c =
      load(R"({"optimizer": {"type": "Adam"}, "scheduler": {"type": "WarmupCosineLR"}})");
  CHECK(has_finding(c.unresolved, Severity::Note, "scheduler.params.total_num_steps",
                    "required by WarmupCosineLR"));
}

// ---- batch triad (SPEC §1.4) --------------------------------------------------------------------

TEST_CASE(
    "the batch triad is resolved with floor divisions from any two values and the world size") {
  DsConfig c = load(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", world(2));
  CHECK(c.gradient_accumulation_steps == 4);
  CHECK(c.provenance.at("gradient_accumulation_steps").source == Source::Derived);
  c = load(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})", world(4));
  CHECK(c.train_micro_batch_size_per_gpu == 4);
  c = load(R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5})", world(2));
  CHECK(c.train_batch_size == 30);
  c = load(R"({"train_batch_size": 16})", world(4));
  CHECK(c.train_micro_batch_size_per_gpu == 4);
  CHECK(c.gradient_accumulation_steps == 1);
  c = load(R"({"train_micro_batch_size_per_gpu": 2})", world(8));
  CHECK(c.train_batch_size == 16);
}

TEST_CASE("floor division that loses a remainder fails the triad equality with the four numbers") {
  const auto p =
      problems_of(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3})", world(1));
  CHECK(has_problem(p, "train_batch_size",
                    "train_batch_size 10 != train_micro_batch_size_per_gpu 3 * "
                    "gradient_accumulation_steps 3 * world size 1 = 9"));
}

TEST_CASE("all three batch values must multiply out with the given world size") {
  const auto p = problems_of(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                                 "gradient_accumulation_steps": 2})",
                             world(2));
  CHECK(has_problem(p, "train_batch_size",
                    "32 != train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 2 * "
                    "world size 2 = 16"));
  CHECK_NOTHROW(load(
      R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})",
      world(4)));
}

TEST_CASE(
    "without a world size the three batch values must admit an integer world size, which is "
    "reported") {
  const DsConfig c = load(R"({"train_batch_size": 20000, "train_micro_batch_size_per_gpu": 100,
                              "gradient_accumulation_steps": 10})");
  CHECK(c.world_size == 20);
  CHECK(has_finding(c.findings, Severity::Note, "train_batch_size", "W = 20"));
  CHECK(has_problem(problems_of(R"({"train_batch_size": 20, "train_micro_batch_size_per_gpu": 3,
                                   "gradient_accumulation_steps": 2})"),
                    "train_batch_size", "no integer world size W"));
  CHECK(has_problem(problems_of(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3})"),
                    "train_batch_size", "not a multiple of train_micro_batch_size_per_gpu 3"));
}

TEST_CASE("missing batch sizes are to be supplied, not an error") {
  const DsConfig c = load("{}");
  CHECK(has_finding(c.unresolved, Severity::Note, "train_batch_size", "to be supplied"));
}

TEST_CASE("batch sizes must be positive") {
  CHECK(has_problem(problems_of(R"({"train_batch_size": 0})"), "train_batch_size", "must be >= 1"));
  CHECK(has_problem(
      problems_of(R"({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 4})", world(1)),
      "train_batch_size", "batch sizes must be positive"));
}

// ---- cross-field checks (SPEC §1.11)
// -------------------------------------------------------------

TEST_CASE("fp16 and bf16 cannot both be enabled") {
  CHECK(has_problem(problems_of(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"),
                    "bf16.enabled", "cannot both be enabled"));
}

TEST_CASE("master-weight options need ZeRO stage 1 to 3") {
  CHECK(has_problem(
      problems_of(R"({"fp16": {"enabled": true, "fp16_master_weights_and_grads": true}})"),
      "fp16.fp16_master_weights_and_grads", "needs ZeRO stage 1, 2 or 3"));
  CHECK(has_problem(
      problems_of(R"({"bf16": {"enabled": true, "bf16_master_weights_and_grads": true}})"),
      "bf16.bf16_master_weights_and_grads", "needs ZeRO stage 1, 2 or 3"));
}

TEST_CASE("bf16_optimizer_states needs bf16_master_weights_and_grads") {
  CHECK(has_problem(
      problems_of(
          R"({"zero_optimization": {"stage": 2}, "bf16": {"enabled": true, "bf16_optimizer_states": true}})"),
      "bf16.bf16_optimizer_states", "needs bf16.bf16_master_weights_and_grads"));
}

TEST_CASE(
    "gradient_allreduce_op sum is refused with stage 3 and accepted case-insensitively otherwise") {
  CHECK(has_problem(
      problems_of(R"({"gradient_allreduce_op": "sum", "zero_optimization": {"stage": 3}})"),
      "gradient_allreduce_op", "not allowed with ZeRO stage 3"));
  CHECK(load(R"({"gradient_allreduce_op": "SUM", "zero_optimization": {"stage": 2}})")
            .gradient_allreduce_sum);
}

TEST_CASE(
    "prescale_gradients and gradient_predivide_factor are refused with reduce_scatter in stages 2 "
    "and 3") {
  CHECK(
      has_problem(problems_of(R"({"prescale_gradients": true, "zero_optimization": {"stage": 2}})"),
                  "prescale_gradients", "must be false with ZeRO stage 2"));
  CHECK(has_problem(
      problems_of(R"({"gradient_predivide_factor": 2.0, "zero_optimization": {"stage": 3}})"),
      "gradient_predivide_factor", "must be 1.0 with ZeRO stage 3"));
  CHECK_NOTHROW(load(
      R"({"prescale_gradients": true, "zero_optimization": {"stage": 2, "reduce_scatter": false}})"));
  CHECK_NOTHROW(load(R"({"prescale_gradients": true, "zero_optimization": {"stage": 1}})"));
}

TEST_CASE("allgather_bucket_size must be even in stages 1 and 2") {
  CHECK(
      has_problem(problems_of(R"({"zero_optimization": {"stage": 2, "allgather_bucket_size": 7}})"),
                  "zero_optimization.allgather_bucket_size", "multiple of 2"));
}

TEST_CASE("offload_optimizer.ratio is a share in [0, 1], honoured at every stage") {
  CHECK(has_problem(
      problems_of(
          R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}})"),
      "zero_optimization.offload_optimizer.ratio", "must be between 0 and 1"));
  const DsConfig two = load(
      R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})");
  CHECK(two.zero_optimization.offload_optimizer->ratio == 0.5);
  CHECK(has_finding(two.findings, Severity::Note, "zero_optimization.offload_optimizer.ratio",
                    "only at stage 3"));
  const DsConfig three = load(
      R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})");
  CHECK_FALSE(
      has_finding(three.findings, Severity::Unsupported, "zero_optimization.offload_optimizer.ratio"));
  CHECK_FALSE(
      has_finding(three.findings, Severity::Note, "zero_optimization.offload_optimizer.ratio"));
}

TEST_CASE("dynamic loss scaling needs a positive loss_scale_window") {
  CHECK(has_problem(problems_of(R"({"fp16": {"enabled": true, "loss_scale_window": 0}})"),
                    "fp16.loss_scale_window", "must be > 0 with dynamic loss scaling"));
  CHECK_NOTHROW(load(R"({"fp16": {"enabled": true, "loss_scale": 128, "loss_scale_window": 0}})"));
}

TEST_CASE(
    "a min_loss_scale DeepSpeed 0.19.6 refuses is kept with a warning, as older releases did") {
  const DsConfig zero_floor = load(R"({"fp16": {"enabled": true, "min_loss_scale": 0.0}})");
  CHECK(has_finding(zero_floor.findings, Severity::Warning, "fp16.min_loss_scale", "no floor"));
  const DsConfig fraction = load(R"({"fp16": {"enabled": true, "min_loss_scale": 1e-7}})");
  CHECK(fraction.fp16.min_loss_scale == 1e-7);
  CHECK(has_finding(fraction.findings, Severity::Warning, "fp16.min_loss_scale", "not an integer"));
}

TEST_CASE("communication_data_type accepts fp32, fp16, bf16 in any case and suggests for typos") {
  CHECK(load(R"({"communication_data_type": "BF16"})").communication_data_type ==
        zero::DType::BF16);
  CHECK(load(R"({"communication_data_type": null, "fp16": {"enabled": true}})")
            .communication_data_type == zero::DType::F16);
  const auto p = problems_of(R"({"communication_data_type": "bfp16"})");
  REQUIRE(p.size() == 1);
  CHECK(p[0].path == "communication_data_type");
  CHECK(p[0].message ==
        "expected one of \"fp32\", \"fp16\", \"bf16\", got \"bfp16\"; did you mean bf16?");
}

TEST_CASE("nvme_path is a folder or a list of folders to stripe over") {
  const DsConfig one = load(
      R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/a"}}})");
  CHECK(one.zero_optimization.offload_optimizer->nvme_paths == std::vector<std::string>{"/a"});
  const DsConfig two = load(
      R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": ["/a", "/b"]}}})");
  CHECK(two.zero_optimization.offload_param->nvme_paths == std::vector<std::string>{"/a", "/b"});
  CHECK(has_problem(
      problems_of(
          R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": []}}})"),
      "zero_optimization.offload_optimizer.nvme_path", "a non-empty list of folders"));
  CHECK(has_problem(
      problems_of(
          R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": 7}}})"),
      "zero_optimization.offload_optimizer.nvme_path", "expected a folder"));
}

TEST_CASE("nvme offload needs an nvme_path") {
  CHECK(has_problem(
      problems_of(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})"),
      "zero_optimization.offload_param.nvme_path", "required"));
}

TEST_CASE("data_types.param_dtype must match the enabled precision") {
  CHECK(has_problem(
      problems_of(R"({"bf16": {"enabled": true}, "data_types": {"param_dtype": "fp16"}})"),
      "data_types.param_dtype", "differs from the enabled precision bf16"));
  CHECK(load(R"({"data_types": {"grad_accum_dtype": "float32"}})").data_types.grad_accum_dtype ==
        zero::DType::F32);
}

TEST_CASE("overlap_comm defaults to true for stage 3 only, recorded as derived") {
  CHECK(load(R"({"zero_optimization": {"stage": 3}})").zero_optimization.overlap_comm);
  CHECK_FALSE(load(R"({"zero_optimization": {"stage": 2}})").zero_optimization.overlap_comm);
  CHECK(load(R"({"zero_optimization": {"stage": 3}})")
            .provenance.at("zero_optimization.overlap_comm")
            .source == Source::Derived);
}

TEST_CASE("offload settings DeepSpeed ignores at a stage are warned about") {
  CHECK(has_finding(
      load(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})").findings,
      Severity::Warning, "zero_optimization.offload_param", "ignored below ZeRO stage 3"));
  CHECK(has_finding(
      load(
          R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}})")
          .findings,
      Severity::Note, "zero_optimization.offload_optimizer.device", "swaps them to nvme_path"));
}

// ---- optimizer and scheduler --------------------------------------------------------------------

TEST_CASE("Adam is AdamW unless adam_w_mode is false; AdamW always is") {
  CHECK(load(R"({"optimizer": {"type": "Adam", "params": {"weight_decay": 0.1}}})")
            .optimizer->adam_w_mode);
  const DsConfig plain =
      load(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})");
  CHECK_FALSE(plain.optimizer->adam_w_mode);
  CHECK(plain.optimizer->kind == OptimizerKind::Adam);
  const DsConfig w = load(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})");
  CHECK(w.optimizer->adam_w_mode);
  CHECK(w.optimizer->type == "adamw");
}

TEST_CASE("optimizer types are lower-cased only for DeepSpeed's own names") {
  CHECK(load(R"({"optimizer": {"type": "ADAGRAD"}})").optimizer->kind == OptimizerKind::Adagrad);
  CHECK(load(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}})")
            .optimizer->momentum == 0.9);
  CHECK(load(R"({"optimizer": {"type": "mUoN"}})").optimizer->type == "muon");
  // torch.optim is looked up case-sensitively: "sgd" is no class of it.
  CHECK(has_problem(problems_of(R"({"optimizer": {"type": "sgd"}})"), "optimizer.type",
                    "did you mean SGD?"));
}

TEST_CASE("an optimizer type that is neither DeepSpeed's nor torch.optim's is an error") {
  const auto adamx = problems_of(R"({"optimizer": {"type": "AdamX", "params": {"lr": 1e-3}}})");
  INFO(describe(adamx));
  REQUIRE(adamx.size() == 1);
  CHECK(has_problem(adamx, "optimizer.type", "\"AdamX\" is neither a DeepSpeed optimizer"));
  CHECK(has_problem(adamx, "optimizer.type", "did you mean AdamW?"));
  CHECK(has_problem(problems_of(R"({"optimizer": {"type": "rmsprop"}})"), "optimizer.type",
                    "did you mean RMSprop?"));
  CHECK(has_problem(problems_of(R"({"optimizer": {"type": "Lamd"}})"), "optimizer.type",
                    "did you mean Lamb?"));
  const auto far = problems_of(R"({"optimizer": {"type": "Shampoo"}})");
  CHECK(has_problem(far, "optimizer.type", "DeepSpeed's own are Adam, AdamW, Lamb"));
}

TEST_CASE("a torch.optim optimizer zero does not implement stays not supported yet") {
  for (const char* type : {"RMSprop", "Adamax", "NAdam", "LBFGS", "Adafactor", "Muon"}) {
    INFO(type);
    const DsConfig c = load(fmt::format(R"({{"optimizer": {{"type": "{}"}}}})", type));
    CHECK(has_finding(c.findings, Severity::Unsupported, "optimizer.type"));
  }
  CHECK(load(R"({"optimizer": {"type": "RMSprop"}})").optimizer->type == "RMSprop");
}

TEST_CASE("a scheduler type that is neither DeepSpeed's nor torch's is an error") {
  const auto cosine = problems_of(R"({"scheduler": {"type": "WarmupCosine"}})");
  INFO(describe(cosine));
  REQUIRE(cosine.size() == 1);
  CHECK(has_problem(cosine, "scheduler.type",
                    "\"WarmupCosine\" is neither a DeepSpeed scheduler nor a class of "
                    "torch.optim.lr_scheduler"));
  CHECK(has_problem(cosine, "scheduler.type", "did you mean WarmupCosineLR?"));
  // DeepSpeed matches its scheduler names case-sensitively.
  CHECK(has_problem(problems_of(R"({"scheduler": {"type": "warmuplr"}})"), "scheduler.type",
                    "did you mean WarmupLR?"));
  CHECK(has_problem(problems_of(R"({"scheduler": {"type": "CosineAnealingLR"}})"), "scheduler.type",
                    "did you mean CosineAnnealingLR?"));
}

TEST_CASE("a torch.optim.lr_scheduler schedule zero does not implement stays not supported yet") {
  for (const char* type : {"StepLR", "CosineAnnealingLR", "OneCycleLR", "LambdaLR"}) {
    INFO(type);
    const DsConfig c = load(fmt::format(R"({{"scheduler": {{"type": "{}"}}}})", type));
    CHECK(has_finding(c.findings, Severity::Unsupported, "scheduler.type"));
    CHECK(c.scheduler->type == type);
  }
}

TEST_CASE("optimizer params get their type's defaults") {
  const DsConfig c = load(R"({"optimizer": {"type": "Lion"}})");
  CHECK(c.optimizer->lr == 1e-3);
  CHECK(c.optimizer->betas[1] == 0.999);
  CHECK(load(R"({"optimizer": {"type": "Adagrad"}})").optimizer->eps == 1e-10);
}

TEST_CASE(
    "max_grad_norm in optimizer params is refused by the engine, pointing to gradient_clipping") {
  const DsConfig c =
      load(R"({"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "max_grad_norm": 1.0}}})");
  CHECK(has_finding(c.findings, Severity::EngineError, "optimizer.params.max_grad_norm",
                    "gradient_clipping"));
  CHECK_FALSE(c.blockers().empty());
}

TEST_CASE(
    "an unknown optimizer or scheduler parameter is refused by the engine with a suggestion") {
  const DsConfig c = load(R"({"optimizer": {"type": "Adam", "params": {"weight_decy": 0.1}},
                              "scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 10}}})");
  CHECK(has_finding(c.findings, Severity::EngineError, "optimizer.params.weight_decy",
                    "did you mean weight_decay?"));
  CHECK(has_finding(c.findings, Severity::EngineError, "scheduler.params.warmup_num_step",
                    "did you mean warmup_num_steps?"));
}

TEST_CASE("WarmupLR's warmup_max_lr defaults to the optimizer's lr") {
  const DsConfig c = load(
      R"({"optimizer": {"type": "Adam", "params": {"lr": 2e-4}}, "scheduler": {"type": "WarmupLR"}})");
  CHECK(c.scheduler->params["warmup_max_lr"] == 2e-4);
  CHECK(c.provenance.at("scheduler.params.warmup_max_lr").source == Source::Derived);
}

TEST_CASE("scheduler params have every default of SPEC §1.8 and accept per-group lists") {
  const DsConfig c = load(
      R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": [1e-4, 2e-4], "cycle_max_lr": 1e-3}}})");
  const auto& p = c.scheduler->params;
  CHECK(p["cycle_first_step_size"] == 2000);
  CHECK(p["cycle_second_step_size"] == 2000);
  CHECK(p["cycle_momentum"] == true);
  CHECK(p["cycle_min_mom"] == 0.8);
  CHECK(p["cycle_min_lr"].size() == 2);
  const DsConfig r = load(R"({"scheduler": {"type": "LRRangeTest"}})");
  CHECK(r.scheduler->params["lr_range_test_step_size"] == 2000);
  const DsConfig d = load(
      R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_type": "cosine"}}})");
  CHECK(d.scheduler->params["warmup_max_lr"] == 0.001);
  CHECK(has_finding(d.findings, Severity::Warning, "scheduler.params.warmup_type", "log"));
}

// ---- not supported yet -------------------------------------------------------------------------

TEST_CASE("keys zero does not honour yet are listed as unsupported, never silently dropped") {
  const DsConfig c = load(R"({"zero_optimization": {"stage": 3, "zero_quantized_nontrainable_weights": true,
                                  "zero_hpz_partition_size": 8, "mics_shard_size": 4},
                              "optimizer": {"type": "OneBitAdam"}, "torch_autocast": {"enabled": true},
                              "elasticity": {"enabled": true}, "aio": {"use_gds": true}})");
  for (const char* path :
       {"optimizer.type", "torch_autocast.enabled", "elasticity.enabled", "aio.use_gds"}) {
    INFO(path);
    CHECK(has_finding(c.findings, Severity::Unsupported, path));
  }
  // MiCS, hpZ, qwZ, qgZ and quantized frozen weights are honoured (zero/comm/mics_comm.h,
  // zero/engine/param_fetcher.h, zero/engine/quantized_frozen.h).
  const DsConfig quantized = load(R"({"zero_optimization": {"stage": 3,
                                       "zero_quantized_weights": true,
                                       "zero_quantized_nontrainable_weights": true,
                                       "zero_quantized_gradients": true}})");
  for (const auto& f : quantized.findings) CHECK(f.severity != Severity::Unsupported);
  CHECK_FALSE(has_finding(c.findings, Severity::Unsupported, "zero_optimization.mics_shard_size"));
  CHECK_FALSE(
      has_finding(c.findings, Severity::Unsupported, "zero_optimization.zero_hpz_partition_size"));
  CHECK(
      has_finding(c.findings, Severity::EngineError, "optimizer.type", "not compatible with ZeRO"));
  CHECK(c.blockers().size() >= 5);
  CHECK_FALSE(has_finding(load(R"({"zero_optimization": {"zero_hpz_partition_size": 1}})").findings,
                          Severity::Unsupported, "zero_optimization.zero_hpz_partition_size"));
}

TEST_CASE("ZeRO++ and MiCS keys below stage 3 are ignored with a warning, as DeepSpeed ignores them") {
  const DsConfig c = load(R"({"zero_optimization": {"stage": 2, "zero_quantized_weights": true,
                                  "zero_quantized_gradients": false, "zero_hpz_partition_size": 2,
                                  "mics_shard_size": 4}})");
  for (const char* path : {"zero_optimization.zero_quantized_weights",
                           "zero_optimization.zero_hpz_partition_size",
                           "zero_optimization.mics_shard_size"}) {
    INFO(path);
    CHECK(has_finding(c.findings, Severity::Warning, path, "ignored below ZeRO stage 3 (stage is 2)"));
    CHECK_FALSE(has_finding(c.findings, Severity::Unsupported, path));
  }
  CHECK_FALSE(has_finding(c.findings, Severity::Warning, "zero_optimization.zero_quantized_gradients"));
  for (const auto& b : c.blockers()) CHECK(b.path.rfind("zero_optimization", 0) != 0);
}

TEST_CASE("ZeRO with an untested optimizer is refused by the engine unless allowed") {
  CHECK(has_finding(
      load(R"({"zero_optimization": {"stage": 1}, "optimizer": {"type": "SGD"}})").findings,
      Severity::EngineError, "optimizer.type", "zero_allow_untested_optimizer"));
  CHECK_FALSE(has_finding(load(R"({"zero_optimization": {"stage": 1}, "optimizer": {"type": "SGD"},
                                   "zero_allow_untested_optimizer": true})")
                              .findings,
                          Severity::EngineError, "optimizer.type"));
}

// ---- reporting
// -----------------------------------------------------------------------------------

TEST_CASE("every problem is reported at once") {
  const auto p = problems_of(R"({
      "train_batch_size": 1.5,
      "fp16": {"enabled": true, "loss_scale_window": 0},
      "bf16": {"enabled": true},
      "communication_data_type": "bfp16",
      "zero_optimization": {"stage": 3, "comm_overlap": true, "stage3_param_persitence_threshold": 1}})");
  INFO(describe(p));
  CHECK(p.size() == 6);
  CHECK(has_problem(p, "train_batch_size", "not a whole number"));
  CHECK(has_problem(p, "fp16.loss_scale_window", "must be > 0"));
  CHECK(has_problem(p, "bf16.enabled", "cannot both"));
  CHECK(has_problem(p, "communication_data_type", "did you mean bf16?"));
  CHECK(has_problem(p, "zero_optimization.comm_overlap", "did you mean overlap_comm?"));
  CHECK(has_problem(p, "zero_optimization.stage3_param_persitence_threshold", "did you mean"));
}

TEST_CASE("a config that is not an object, or a block that is not an object, is an error") {
  CHECK(problems_of("[1, 2]")[0].message.find("must be a JSON object") != std::string::npos);
  CHECK(has_problem(problems_of(R"({"fp16": 1})"), "fp16", "expected an object"));
}

TEST_CASE("files load from a path, and an unreadable path is an IoError naming it") {
  const DsConfig c = load_config_file(kDir + "valid/commented.json");
  CHECK(c.zero_optimization.stage == 3);
  CHECK(c.fp16.enabled);
  CHECK(c.optimizer->kind == OptimizerKind::AdamW);
  CHECK_THROWS_AS(load_config_file(kDir + "does_not_exist.json"), zero::IoError);
  CHECK_THROWS_WITH(load_config_file(kDir + "does_not_exist.json"),
                    Catch::Contains("No such file or directory"));
}

TEST_CASE("each invalid example file is rejected and each valid one accepted") {
  for (const char* name : {"valid/commented.json", "valid/hf_auto.json"}) {
    INFO(name);
    CHECK_NOTHROW(load_config_file(kDir + name));
  }
  for (const char* name : {"invalid/multiple_problems.json", "invalid/duplicate_nested.json",
                           "invalid/hjson_unquoted.json"}) {
    INFO(name);
    CHECK_THROWS_AS(load_config_file(kDir + name), zero::ConfigError);
  }
}

TEST_CASE("zeropp_loco_param: LoCo's err_beta and reset_T are read, and bad ones named") {
  const DsConfig c = load(R"({"zero_optimization": {"stage": 3, "zero_quantized_gradients": true,
                                "zeropp_loco_param": {"err_beta": 0.5, "reset_T": 64}}})");
  REQUIRE(c.zero_optimization.zeropp_loco_param.has_value());
  CHECK(c.zero_optimization.zeropp_loco_param->err_beta == 0.5);
  CHECK(c.zero_optimization.zeropp_loco_param->reset_T == 64);
  for (const auto& f : c.findings) CHECK(f.severity != Severity::Unsupported);
  CHECK_FALSE(load(R"({"zero_optimization": {"stage": 3}})").zero_optimization.zeropp_loco_param);

  const std::string head = R"({"zero_optimization": {"stage": 3, "zero_quantized_gradients": true,
                               "zeropp_loco_param": )";
  const auto problems = [&](const std::string& loco) { return problems_of(head + loco + "}}"); };
  CHECK(has_problem(problems(R"({"err_beta": 1.0, "reset_T": 8})"),
                    "zero_optimization.zeropp_loco_param.err_beta", "[0, 1)"));
  CHECK(has_problem(problems(R"({"reset_T": 8})"),
                    "zero_optimization.zeropp_loco_param.err_beta", "missing"));
  CHECK(has_problem(problems(R"({"err_beta": 0.8, "reset_T": 0})"),
                    "zero_optimization.zeropp_loco_param.reset_T", ">= 1"));
  CHECK(has_problem(problems(R"({"err_beta": 0.8, "reset_T": 8, "beta": 1})"),
                    "zero_optimization.zeropp_loco_param.beta", "err_beta and reset_T"));
  CHECK(has_problem(problems("true"), "zero_optimization.zeropp_loco_param", "not an object"));

  // Without qgZ it does nothing (a warning); below stage 3 DeepSpeed ignores it (a warning).
  CHECK(has_finding(load(R"({"zero_optimization": {"stage": 3,
                             "zeropp_loco_param": {"err_beta": 0.8, "reset_T": 8}}})")
                        .findings,
                    Severity::Warning, "zero_optimization.zeropp_loco_param", "no effect"));
  CHECK(has_finding(load(R"({"zero_optimization": {"stage": 2,
                             "zeropp_loco_param": {"err_beta": 0.8, "reset_T": 8}}})")
                        .findings,
                    Severity::Warning, "zero_optimization.zeropp_loco_param", "below ZeRO stage 3"));
}
