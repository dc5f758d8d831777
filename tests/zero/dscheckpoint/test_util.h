// Shared by the dscheckpoint tests: a scratch directory and the message of an expected IoError.
#pragma once

#include <string>

#include "tests/temp_dir.h"
#include "zero/base/error.h"

namespace zero::dscheckpoint::testing {

// The real DeepSpeed checkpoints the tests read (tests/data/deepspeed_checkpoints/README.md).
inline const std::string kFixtures = std::string(ZERO_TEST_DATA_DIR) + "/deepspeed_checkpoints";

using TempDir = zero::test::TempDir;  // tests/temp_dir.h

// What f() throws as zero::IoError; empty when it does not throw.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const zero::IoError& e) {
    return e.what();
  }
  return "";
}

}  // namespace zero::dscheckpoint::testing
