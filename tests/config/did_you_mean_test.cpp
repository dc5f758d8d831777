#include "config/did_you_mean.h"

#include <catch2/catch.hpp>
#include <string_view>
#include <vector>

using zero::config::did_you_mean;
using zero::config::edit_distance;
using zero::config::nearest;

TEST_CASE("edit distance counts an adjacent swap as one edit") {
  CHECK(edit_distance("stage", "stage") == 0);
  CHECK(edit_distance("stgae", "stage") == 1);
  CHECK(edit_distance("persitence", "persistence") == 1);
  CHECK(edit_distance("", "abc") == 3);
}

TEST_CASE("a suggestion is made only when the key is close to a valid one") {
  const std::vector<std::string_view> keys = {"overlap_comm", "reduce_bucket_size", "stage"};
  CHECK(nearest("reduce_buket_size", keys) == "reduce_bucket_size");
  CHECK(nearest("comm_overlap", keys) == "overlap_comm");
  CHECK_FALSE(nearest("completely_different", keys).has_value());
  CHECK(did_you_mean("stag", keys) == "; did you mean stage?");
  CHECK(did_you_mean("xyz", keys).empty());
}

TEST_CASE("ties between equally close candidates go to the longer common prefix") {
  const std::vector<std::string_view> dtypes = {"fp32", "fp16", "bf16"};
  CHECK(nearest("bfp16", dtypes) == "bf16");
  CHECK(nearest("fp61", dtypes) == "fp16");
}

TEST_CASE("then to the candidate whose length is nearest the word's") {
  const std::vector<std::string_view> optimizers = {"Adam", "Adamax", "AdamW"};
  CHECK(nearest("AdamX", optimizers) == "AdamW");
  CHECK(nearest("Adamx", optimizers) == "AdamW");
  CHECK(nearest("Adan", optimizers) == "Adam");
}
