#include <catch2/catch.hpp>

#include "zero/base/dtype.h"
#include "zero/base/error.h"

TEST_CASE("ZERO_CHECK throws the named error type with the formatted message") {
  auto fails = [] {
    ZERO_CHECK_AS(zero::IoError, 1 + 1 == 3, "open {}: {}", "a.bin", "no such file");
  };
  REQUIRE_THROWS_AS(fails(), zero::IoError);
  REQUIRE_THROWS_WITH(fails(), "open a.bin: no such file");
  REQUIRE_NOTHROW([] { ZERO_CHECK(2 > 1, "never"); }());
}

TEST_CASE("ConfigError keeps every problem and lists them one per line") {
  zero::ConfigError e(std::vector<zero::ConfigError::Problem>{
      {"fp16.enabled", "expected a boolean"}, {"", "parse error at line 3"}});
  REQUIRE(e.problems().size() == 2);
  REQUIRE(std::string(e.what()) == "fp16.enabled: expected a boolean\nparse error at line 3");
}

TEST_CASE("parse_dtype accepts DeepSpeed's dtype spellings and nothing else") {
  REQUIRE(zero::parse_dtype("fp32") == zero::DType::F32);
  REQUIRE(zero::parse_dtype("torch.float32") == zero::DType::F32);
  REQUIRE(zero::parse_dtype("Half") == zero::DType::F16);
  REQUIRE(zero::parse_dtype("bfloat16") == zero::DType::BF16);
  REQUIRE_FALSE(zero::parse_dtype("bfp16").has_value());
  REQUIRE_FALSE(zero::parse_dtype("").has_value());
  REQUIRE(zero::dtype_size(zero::DType::BF16) == 2);
}
