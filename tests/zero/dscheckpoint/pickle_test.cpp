#include "zero/dscheckpoint/pickle.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/zero/dscheckpoint/pt_writer.h"
#include "zero/base/error.h"
#include "zero/dscheckpoint/pt_archive.h"

namespace ds = zero::dscheckpoint;
namespace t = zero::dscheckpoint::testing;
using Kind = ds::PickleValue::Kind;
using namespace std::string_literals;

namespace {

ds::Pickle parse(const std::string& bytes, const std::string& label = "test.pkl") {
  return ds::Pickle::parse(std::as_bytes(std::span(bytes.data(), bytes.size())), label);
}

std::string error_of(const std::string& bytes, const std::string& label = "test.pkl") {
  try {
    (void)parse(bytes, label);
  } catch (const zero::IoError& e) {
    return e.what();
  }
  return "";
}

const std::string kFixtures = std::string(ZERO_TEST_DATA_DIR) + "/deepspeed_checkpoints";

}  // namespace

TEST_CASE("plain values round-trip through the restricted parser") {
  const t::Py v = t::dict({
      {t::str("int"), t::integer(-5)},
      {t::str("big"), t::integer(1ll << 40)},
      {t::str("small"), t::integer(200)},
      {t::str("float"), t::number(0.001)},
      {t::str("flag"), t::boolean(true)},
      {t::str("nothing"), t::none()},
      {t::str("list"), t::list({t::integer(1), t::str("two")})},
      {t::str("shape"), t::size({64, 16})},
      {t::str("ordered"), t::odict({{t::str("b"), t::integer(2)}, {t::str("a"), t::integer(1)}})},
      {t::integer(7), t::str("int key")},
  });
  const ds::Pickle p = parse(t::Pickler::dumps(v));
  const ds::PickleView root = p.root();
  CHECK(root.get("int").as_int() == -5);
  CHECK(root.get("big").as_int() == (1ll << 40));
  CHECK(root.get("small").as_int() == 200);
  CHECK(root.get("float").as_number() == 0.001);
  CHECK(root.get("flag").as_bool());
  CHECK(root.get("nothing").is_none());
  CHECK(root.get("list").size() == 2);
  CHECK(root.get("list").element(1).as_string() == "two");
  CHECK(root.get("shape").as_shape() == std::vector<std::int64_t>{64, 16});
  const auto ordered = root.get("ordered").entries();
  REQUIRE(ordered.size() == 2);
  CHECK(ordered[0].first.as_string() == "b");  // insertion order kept
  CHECK(root.get(std::int64_t{7}).as_string() == "int key");
  CHECK(root.get("ordered").get("a").path() == "ordered.a");
}

TEST_CASE("tensors become references into the archive's storages") {
  const t::Py v = t::odict({{t::str("w"), t::tensor("3", 100, 10, {4, 5})}});
  const ds::Pickle p = parse(t::Pickler::dumps(v));
  const ds::TensorRef& ref = p.root().get("w").as_tensor();
  CHECK(ref.storage_key == "3");
  CHECK(ref.dtype == ds::ScalarType::F32);
  CHECK(ref.storage_numel == 100);
  CHECK(ref.offset == 10);
  CHECK(ref.shape == std::vector<std::int64_t>{4, 5});
  CHECK(ref.stride == std::vector<std::int64_t>{5, 1});
  CHECK(ref.numel() == 20);
  CHECK(ref.span_elems() == 30);
  CHECK(ref.is_contiguous());
}

TEST_CASE("memoized containers filled after BINPUT are seen filled through BINGET") {
  // [] BINPUT 0, MARK 1 2 APPENDS, then a dict holding BINGET 0 twice.
  const std::string bytes =
      "\x80\x02]q\x00(K\x01K\x02"
      "e}q\x01(X\x01\x00\x00\x00"
      "ah\x00"
      "X\x01\x00\x00\x00"
      "bh\x00u\x86q\x02."s;
  const ds::Pickle p = parse(bytes);
  const ds::PickleView root = p.root();  // (list, dict)
  REQUIRE(root.is(Kind::Tuple));
  CHECK(root.element(1).get("a").size() == 2);
  CHECK(root.element(1).get("b").element(1).as_int() == 2);
}

TEST_CASE("a pickle naming a non-allowed global is refused, naming it and the file") {
  // cos\nsystem\n (X'ls' tuple) REDUCE: what a malicious .pt would do.
  const std::string evil =
      "\x80\x02"
      "cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03."s;
  const std::string msg = error_of(evil, "evil_model_states.pt");
  INFO(msg);
  CHECK(msg.find("evil_model_states.pt") != std::string::npos);
  CHECK(msg.find("'os.system'") != std::string::npos);
  CHECK(msg.find("not allowed") != std::string::npos);
  CHECK(msg.find("GLOBAL") != std::string::npos);

  // The same through STACK_GLOBAL (protocol 4).
  const std::string evil4 =
      "\x80\x04\x8c\x08"
      "builtins\x8c\x04"
      "eval\x93\x8c\x01"
      "1\x85R."s;
  CHECK(error_of(evil4).find("'builtins.eval'") != std::string::npos);

  // An allowed global used as something it is not: a dtype cannot be called.
  CHECK(error_of("\x80\x02"
                 "ctorch\nfloat16\n)R."s)
            .find("cannot be called") != std::string::npos);
  // INST / OBJ instantiate arbitrary classes: refused by opcode.
  CHECK(error_of("(ios\nsystem\n."s).find("INST") != std::string::npos);
}

TEST_CASE("malformed pickles are errors with the byte offset, never crashes") {
  CHECK(error_of("").find("without a STOP") != std::string::npos);
  CHECK(error_of("\x80\x02}"s).find("without a STOP") != std::string::npos);
  CHECK(error_of("\x80\x02X\xff\xff\xff\x7f"
                 "abc."s)
            .find("needs 2147483647 bytes") != std::string::npos);
  CHECK(error_of("\x80\x02h\x05."s).find("memo entry 5") != std::string::npos);
  CHECK(error_of("\x80\x02"
                 "a."s)
            .find("stack is empty") != std::string::npos);
  CHECK(error_of("\x80\x02]]]\x85u."s).find("no MARK") != std::string::npos);
  CHECK(error_of("\x80\x02}]K\x01s."s).find("unhashable") != std::string::npos);
  CHECK(error_of("\x80\x02\xff."s).find("not a pickle opcode") != std::string::npos);
  // A tensor whose stride arithmetic overflows.
  t::Py bad = t::tensor("0", 10, 0, {2, 3});
  bad.stride = {INT64_MAX, 1};
  CHECK(error_of(t::Pickler::dumps(bad)).find("invalid view") != std::string::npos);
}

TEST_CASE("cyclic and exponentially shared structures do not hang the JSON conversion") {
  // A list appended to itself.
  const std::string cyclic =
      "\x80\x02]q\x00h\x00"
      "a."s;
  const ds::Pickle p = parse(cyclic);
  CHECK_THROWS_AS(p.root().to_json(), zero::IoError);

  // 40 levels of a tuple holding the previous level twice: 2^40 paths.
  std::string dag = "\x80\x02N"s;
  for (int i = 0; i < 40; ++i) dag += "\x32\x86"s;  // DUP, TUPLE2
  dag += '.';
  const ds::Pickle q = parse(dag);
  CHECK(q.value_count() < 100);
  CHECK_THROWS_WITH(q.root().to_json(), Catch::Contains("too many shared values"));
}

TEST_CASE("view errors name the file, the key path and what was expected") {
  const ds::Pickle p = parse(
      t::Pickler::dumps(t::dict(
          {{t::str("optimizer_state_dict"), t::dict({{t::str("zero_stage"), t::str("one")}})}})),
      "zero_pp_rank_0_mp_rank_00_optim_states.pt");
  const auto osd = p.root().get("optimizer_state_dict");
  CHECK_THROWS_WITH(osd.get("zero_stage").as_int(),
                    "zero_pp_rank_0_mp_rank_00_optim_states.pt: optimizer_state_dict.zero_stage: "
                    "expected an int, found str 'one'");
  CHECK_THROWS_WITH(osd.get("fp32_flat_groups"),
                    Catch::Contains("optimizer_state_dict: expected key 'fp32_flat_groups', which "
                                    "is missing (keys: zero_stage)"));
  CHECK_THROWS_WITH(p.root().element(0), Catch::Contains("(root): expected a list or tuple"));
}

TEST_CASE("the fixtures' pickles parse: DeepSpeed objects become attribute maps") {
  const auto archive = ds::PtArchive::open(
      kFixtures + "/zero1_world2_fp32/step5/zero_pp_rank_0_mp_rank_00_optim_states.pt");
  const auto bytes = archive.read_pickle();
  const ds::Pickle p = ds::Pickle::parse(bytes, archive.path());
  const auto osd = p.root().get("optimizer_state_dict");
  const auto scaler = osd.get("loss_scaler");
  CHECK(scaler.type_name() == "deepspeed.runtime.fp16.loss_scaler.LossScaler");
  CHECK(scaler.get("cur_scale").as_number() == 1.0);
  CHECK(osd.get("zero_stage").type_name() == "deepspeed.runtime.zero.config.ZeroStageEnum");
  CHECK(osd.get("zero_stage").element(0).as_int() == 1);
  const auto mapping = osd.get("param_slice_mappings").element(0).get("2.weight");
  CHECK(mapping.get("numel").as_int() == 1666);
  CHECK(mapping.get("start").as_int() == 1088);
  const nlohmann::json j = p.root().to_json();
  CHECK(j["optimizer_state_dict"]["loss_scaler"]["__type__"] ==
        "deepspeed.runtime.fp16.loss_scaler.LossScaler");
  CHECK(j["ds_config"]["zero_optimization"]["stage"] == 1);
}
