// Shared by the dscheckpoint tests: a scratch directory and the message of an expected IoError.
#pragma once

#include <string>

#include "tests/temp_dir.h"
#include "zero/base/error.h"

namespace zero::dscheckpoint::testing {

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
