#include "config/parse.h"

#include <catch2/catch.hpp>
#include <string>

#include "tests/config/test_util.h"

using zero::ConfigError;
using zero::config::parse_relaxed_json;

namespace {

std::string parse_error(std::string_view text) {
  try {
    parse_relaxed_json(text);
  } catch (const ConfigError& e) {
    REQUIRE(e.problems().size() == 1);
    CHECK(e.problems()[0].path.empty());
    return e.problems()[0].message;
  }
  FAIL("expected a parse error for: " << text);
  return {};
}

}  // namespace

TEST_CASE("line and block comments are accepted and ignored") {
  const auto j = parse_relaxed_json(R"({
    // the stage
    "zero_optimization": {"stage": 2 /* inline */},
    /* a block
       over lines */
    "url": "http://example.com/a//b"
  })");
  CHECK(j["zero_optimization"]["stage"] == 2);
  CHECK(j["url"] == "http://example.com/a//b");
}

TEST_CASE("trailing commas in objects and arrays are accepted, also before a comment") {
  const auto j = parse_relaxed_json("{\"a\": [1, 2,], \"b\": {\"c\": true, // x\n },}");
  CHECK(j["a"].size() == 2);
  CHECK(j["b"]["c"] == true);
}

TEST_CASE("a lone comma in an empty container is still an error") {
  CHECK(parse_error("{,}").rfind("line 1, column 2", 0) == 0);
  CHECK(parse_error("[,]").rfind("line 1, column 2", 0) == 0);
}

TEST_CASE("error positions are those of the original text even after comments are blanked") {
  const std::string m = parse_error("{ /* comment */\n  // another\n  \"a\": BATCH_SIZE\n}");
  CHECK(m.rfind("line 3, column 8: unquoted text 'BATCH_SIZE'", 0) == 0);
}

TEST_CASE("hjson-only syntax is refused with a message naming it") {
  CHECK(parse_error("{a: 1}").rfind("line 1, column 2: unquoted text 'a'", 0) == 0);
  CHECK(parse_error("{\"a\": 'x'}").find("single-quoted string") != std::string::npos);
  CHECK(parse_error("{\"a\": 1 # note\n}").find("'#' comment") != std::string::npos);
  CHECK(parse_error("{\"a\": 1\n \"b\": 2}") ==
        "line 2, column 2: expected ',' or '}' before this string (missing comma?)");
  CHECK(parse_error("{\"a\": hello world}").find("unquoted text 'hello'") != std::string::npos);
}

TEST_CASE("truncated input, empty input and unterminated comments are parse errors") {
  CHECK(parse_error("").rfind("line 1, column 1", 0) == 0);
  CHECK(parse_error("{\"a\": 1").rfind("line 1", 0) == 0);
  CHECK(parse_error("{\"a\": 1 /* never closed").find("unterminated /* comment") !=
        std::string::npos);
}

TEST_CASE("numbers beyond double range and invalid UTF-8 are parse errors, not crashes") {
  CHECK(parse_error("{\"a\": 1e999}").find("line 1") == 0);
  CHECK(parse_error("{\"a\": \"\xff\xfe\"}").find("line 1") == 0);
}

TEST_CASE("nesting deeper than the bound is refused before any recursive walk") {
  const std::string deep(zero::config::kMaxNestingDepth + 1, '[');
  CHECK(parse_error(deep).find("nesting deeper than") != std::string::npos);
  const std::string ok = std::string(zero::config::kMaxNestingDepth, '[') +
                         std::string(zero::config::kMaxNestingDepth, ']');
  CHECK_NOTHROW(parse_relaxed_json(ok));
}

TEST_CASE("duplicate keys are refused at every nesting level, each named by its path") {
  try {
    parse_relaxed_json(
        R"({"a": 1, "a": 2, "z": {"stage": 1, "stage": 2}, "l": [{"x": 1, "x": 1}]})");
    FAIL("duplicates accepted");
  } catch (const ConfigError& e) {
    INFO(zero::config::testing::describe(e.problems()));
    REQUIRE(e.problems().size() == 3);
    CHECK(e.problems()[0].path == "a");
    CHECK(e.problems()[1].path == "z.stage");
    CHECK(e.problems()[2].path == "l[0].x");
    CHECK(e.problems()[0].message.find("duplicate key") != std::string::npos);
  }
}

TEST_CASE("the same key in sibling objects is not a duplicate") {
  CHECK_NOTHROW(parse_relaxed_json(R"({"a": {"enabled": true}, "b": {"enabled": false}})"));
}
