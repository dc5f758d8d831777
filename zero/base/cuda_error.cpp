#include "zero/base/cuda_error.h"

#include <fmt/format.h>

#include <string_view>

#include "zero/base/error.h"

namespace zero {

namespace {

// __FILE__ is an absolute path in a CMake build; from the first top-level folder of the tree on
// it is shorter and the same on every machine.
std::string_view repository_path(std::string_view file) {
  for (std::string_view folder :
       {"/zero/", "/kernels/", "/models/", "/tests/", "/tools/", "/benchmarks/"}) {
    const auto at = file.rfind(folder);
    if (at != std::string_view::npos) return file.substr(at + 1);
  }
  return file;
}

}  // namespace

std::string cuda_error_message(const char* call, const char* file, int line, const char* error_name,
                               const char* error_text) {
  return fmt::format("{} failed at {}:{}: {} ({})", call, repository_path(file), line,
                     error_name ? error_name : "unknown error",
                     error_text ? error_text : "no description");
}

void throw_cuda_error(const char* call, const char* file, int line, const char* error_name,
                      const char* error_text) {
  throw CudaError(cuda_error_message(call, file, line, error_name, error_text));
}

}  // namespace zero
