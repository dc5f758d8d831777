// Shared by the dscheckpoint tests: a scratch directory and the message of an expected IoError.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <unistd.h>

#include "zero/base/error.h"

namespace zero::dscheckpoint::testing {

// A fresh directory under the temp directory, removed with the object.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("zero_dsckpt_" + std::to_string(::getpid()) + "_" +
            std::to_string(reinterpret_cast<std::uintptr_t>(this)));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

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
