// Running a built command-line tool from a test.
#pragma once

#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace zero::test {

struct CommandRun {
  int status = -1;  // exit status; -1 when the command did not exit normally
  std::string out;  // what it wrote to its standard output
};

// Runs `command` through /bin/sh (quote paths yourself; add redirections as needed) and collects
// its standard output.
inline CommandRun run_shell(const std::string& command) {
  CommandRun r;
  FILE* p = popen(command.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int rc = pclose(p);
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return r;
}

// `binary args` with stream "both" (stderr merged into stdout), "stdout" (stderr dropped) or
// "stderr" (only stderr).
inline CommandRun run_tool(const std::string& binary, const std::string& args,
                           const std::string& stream = "both") {
  std::string redirect = " 2>&1";
  if (stream == "stdout") redirect = " 2>/dev/null";
  if (stream == "stderr") redirect = " 2>&1 >/dev/null";
  return run_shell("'" + binary + "' " + args + redirect);
}

// A directory under the temp directory named `prefix` + `name`, empty at the start and removed
// when the test ends.
class TempDir {
 public:
  TempDir(const std::string& prefix, const std::string& name)
      : path_(std::filesystem::temp_directory_path() / (prefix + name)) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace zero::test
