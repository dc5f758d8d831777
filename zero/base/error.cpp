#include "zero/base/error.h"

#include <cstdio>
#include <cstdlib>

namespace zero {

namespace {
std::string join_problems(const std::vector<ConfigError::Problem>& problems) {
  std::string out;
  for (const auto& p : problems) {
    if (!out.empty()) out += '\n';
    out += p.path.empty() ? p.message : p.path + ": " + p.message;
  }
  return out;
}
}  // namespace

ConfigError::ConfigError(std::vector<Problem> problems)
    : Error(join_problems(problems)), problems_(std::move(problems)) {}

ConfigError::ConfigError(std::string path, std::string message)
    : ConfigError(std::vector<Problem>{{std::move(path), std::move(message)}}) {}

namespace detail {

void assert_failed(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "zero: internal invariant violated: %s at %s:%d\n", cond, file, line);
  std::abort();
}

std::string check_message(const char* /*cond*/, const char* /*file*/, int /*line*/,
                          const std::string& what) {
  // The message itself names the argument and value; the condition text and source location
  // would only repeat it in less friendly words.
  return what;
}

}  // namespace detail
}  // namespace zero
