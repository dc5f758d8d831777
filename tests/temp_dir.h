// A scratch directory for a test, shared by every test that writes files.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>

namespace zero::test {

// A fresh, empty directory under the system temp directory, removed with everything in it when
// the object is destroyed. Named `prefix`_<process id>_<count of TempDirs this process made>, so
// tests running at the same time (ctest -j) or one after another never share one.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "zero_test")
      : path_(std::filesystem::temp_directory_path() /
              (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(next_id()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  // The path of `name` (a file or a relative path) inside the directory.
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  static int next_id() {
    static std::atomic<int> count{0};
    return count++;
  }

  std::filesystem::path path_;
};

}  // namespace zero::test
