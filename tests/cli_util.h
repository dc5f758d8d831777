// Running a built command-line tool from a test.
#pragma once

#include <sys/wait.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdio>
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

}  // namespace zero::test
