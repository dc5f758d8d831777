// Error types and checks shared by every layer.
//
// One hierarchy: zero::Error and its kinds. Each message says what was attempted and with which
// values. ZERO_CHECK throws at API boundaries (arguments a caller can get wrong); ZERO_ASSERT
// guards internal invariants and aborts with file:line, since a broken invariant is a bug in zero,
// not in the caller.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace zero {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A problem with a ds_config. Carries every problem found, not only the first: validation
// reports them all at once. `path` is the dotted JSON path ("zero_optimization.stage"), empty for
// a problem with the document as a whole (a parse error).
class ConfigError : public Error {
 public:
  struct Problem {
    std::string path;
    std::string message;
  };
  explicit ConfigError(std::vector<Problem> problems);
  ConfigError(std::string path, std::string message);

  const std::vector<Problem>& problems() const noexcept { return problems_; }

 private:
  std::vector<Problem> problems_;
};

class CommError : public Error {
 public:
  using Error::Error;
};

class IoError : public Error {
 public:
  using Error::Error;
};

class OutOfMemory : public Error {
 public:
  using Error::Error;
};

class CudaError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void assert_failed(const char* cond, const char* file, int line);
std::string check_message(const char* cond, const char* file, int line, const std::string& what);
}  // namespace detail

}  // namespace zero

// Throws `ErrorType` with a formatted message when `cond` is false:
//   ZERO_CHECK(n > 0, "adam: numel must be positive, got {}", n);
#define ZERO_CHECK_AS(ErrorType, cond, ...)                                                      \
  do {                                                                                           \
    if (!(cond)) [[unlikely]] {                                                                  \
      throw ErrorType(                                                                           \
          ::zero::detail::check_message(#cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__))); \
    }                                                                                            \
  } while (0)

#define ZERO_CHECK(cond, ...) ZERO_CHECK_AS(::zero::Error, cond, __VA_ARGS__)

#define ZERO_ASSERT(cond)                                       \
  do {                                                          \
    if (!(cond)) [[unlikely]]                                   \
      ::zero::detail::assert_failed(#cond, __FILE__, __LINE__); \
  } while (0)
