// The real-config corpus (a copy of ../shared/corpus in tests/data/corpus): zero must accept
// what DeepSpeed accepts and reject what it rejects, with the same reason.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/ds_config.h"
#include "config/parse.h"
#include "tests/config/test_util.h"

namespace fs = std::filesystem;
using namespace zero::config;
using zero::config::testing::describe;
using zero::config::testing::has_problem;

namespace {

const fs::path kCorpus = fs::path(ZERO_TEST_DATA_DIR) / "corpus";

struct CorpusEntry {
  std::string folder;
  std::string file;
  bool strict_json = false;
  bool hjson_ok = false;
};

std::vector<CorpusEntry> read_sources() {
  std::ifstream in(kCorpus / "sources.tsv");
  REQUIRE(in);
  std::vector<CorpusEntry> out;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::vector<std::string> cols;
    std::stringstream ss(line);
    std::string col;
    while (std::getline(ss, col, '\t')) cols.push_back(col);
    REQUIRE(cols.size() >= 9);
    out.push_back({cols[0], cols[1], cols[7] == "true", cols[8] == "true"});
  }
  return out;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// DeepSpeed 0.19.6 refuses these at config time; the problem zero must name for each.
const std::map<std::string, std::pair<std::string, std::string>> kRejects = {
    {"microsoft__DeepSpeedExamples__Megatron-LM__model_size_test_with_acumulated_grad__ds_zero-"
     "offload_150B_config.json",
     {"zero_optimization.comm_overlap", "unknown key; did you mean overlap_comm?"}},
    {"microsoft__DeepSpeedExamples__megatron__Megatron-LM-v1.1.5-ZeRO3__examples__ds_zero_stage_3_"
     "config_release.json",
     {"zero_optimization.cpu_offload_params", "unknown key; did you mean cpu_offload_param?"}},
    {"microsoft__DeepSpeedExamples__megatron__Megatron-LM-v1.1.5-ZeRO3__examples__ds_zero_stage_"
     "infinity_config.json",
     {"zero_optimization.stage3_param_persitence_threshold",
      "unknown key; did you mean stage3_param_persistence_threshold?"}},
    {"microsoft__Megatron-DeepSpeed__ds_zero2_config_bf16.json",
     {"communication_data_type", "got \"bfp16\"; did you mean bf16?"}},
};

// Not strict JSON only because of a trailing comma, which zero accepts as hjson does.
const std::set<std::string> kRelaxedOnly = {
    "microsoft__DeepSpeed__docs___tutorials__onebit-adam.md__L92.json"};

}  // namespace

TEST_CASE("the corpus copy is complete: every file is listed in sources.tsv and vice versa") {
  const auto sources = read_sources();
  std::set<std::string> listed;
  for (const CorpusEntry& s : sources) listed.insert(s.folder + "/" + s.file);
  std::set<std::string> present;
  for (const char* folder : {"ds_configs", "ds_configs_docs", "ds_configs_nonstrict"}) {
    for (const auto& e : fs::directory_iterator(kCorpus / folder))
      present.insert(std::string(folder) + "/" + e.path().filename().string());
  }
  CHECK(listed == present);
  CHECK(present.size() == 97);
}

TEST_CASE(
    "every corpus config DeepSpeed accepts is accepted; the four it rejects are rejected with its "
    "reason") {
  std::size_t accepted = 0;
  std::size_t rejected = 0;
  for (const char* folder : {"ds_configs", "ds_configs_docs"}) {
    for (const auto& e : fs::directory_iterator(kCorpus / folder)) {
      const std::string name = e.path().filename().string();
      INFO(name);
      const auto reject = kRejects.find(name);
      try {
        load_config_file(e.path());
        CHECK(reject == kRejects.end());
        ++accepted;
      } catch (const zero::ConfigError& err) {
        INFO(describe(err.problems()));
        REQUIRE(reject != kRejects.end());
        CHECK(has_problem(err.problems(), reject->second.first, reject->second.second));
        ++rejected;
      }
    }
  }
  CHECK(accepted == 82);
  CHECK(rejected == 4);
}

TEST_CASE("the Megatron bf16 reject also carries the legacy bfloat16.loss_scale warning path") {
  // bfloat16.loss_scale is ignored with a warning (see schema.cpp), so bfp16 is the one error.
  try {
    load_config_file(kCorpus / "ds_configs" /
                     "microsoft__Megatron-DeepSpeed__ds_zero2_config_bf16.json");
    FAIL("accepted");
  } catch (const zero::ConfigError& e) {
    CHECK(e.problems().size() == 1);
  }
}

TEST_CASE(
    "every non-strict corpus file gets a parse error with line and column, unless it only has "
    "trailing commas") {
  std::size_t parse_errors = 0;
  for (const auto& e : fs::directory_iterator(kCorpus / "ds_configs_nonstrict")) {
    const std::string name = e.path().filename().string();
    INFO(name);
    if (kRelaxedOnly.count(name) != 0) {
      CHECK_NOTHROW(load_config_file(e.path()));
      continue;
    }
    try {
      parse_relaxed_json(read_file(e.path()));
      FAIL("parsed");
    } catch (const zero::ConfigError& err) {
      REQUIRE(err.problems().size() == 1);
      CHECK(err.problems()[0].path.empty());
      CHECK(err.problems()[0].message.rfind("line ", 0) == 0);
      CHECK(err.problems()[0].message.find(", column ") != std::string::npos);
      ++parse_errors;
    }
  }
  CHECK(parse_errors == 10);
}

TEST_CASE("sources.tsv strict_json and hjson_ok agree with zero's parser") {
  for (const CorpusEntry& s : read_sources()) {
    INFO(s.folder << "/" << s.file);
    const std::string text = read_file(kCorpus / s.folder / s.file);
    const bool strict =
        !nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false).is_discarded();
    CHECK(strict == s.strict_json);
    bool relaxed = true;
    try {
      parse_relaxed_json(text);
    } catch (const zero::ConfigError&) {
      relaxed = false;
    }
    // zero accepts strict JSON plus comments and trailing commas: a subset of hjson, a superset of
    // JSON.
    if (s.strict_json) CHECK(relaxed);
    if (!s.hjson_ok) CHECK_FALSE(relaxed);
    if (relaxed && !s.strict_json) CHECK(kRelaxedOnly.count(s.file) == 1);
  }
}
