// Status codes, the last error, versions and zero_free (zero/zero_c.h).
#include "zero/c/status.h"

#include <cstdlib>
#include <cstring>

#include "zero/comm/callback_comm.h"

namespace zero::c_abi {
namespace {
thread_local std::string last_error;
}  // namespace

int fail(int status, std::string message) noexcept {
  try {
    last_error = std::move(message);
  } catch (...) {
    last_error.clear();  // out of memory while keeping the message: the status still says it
  }
  return status;
}

const char* last_error_message() noexcept {
  return last_error.c_str();
}

int status_of(const std::exception& e) noexcept {
  if (dynamic_cast<const CallbackError*>(&e)) return ZERO_ERR_CALLBACK;
  if (dynamic_cast<const CommCallbackError*>(&e)) return ZERO_ERR_CALLBACK;
  if (dynamic_cast<const ArgumentError*>(&e)) return ZERO_ERR_INVALID_ARGUMENT;
  if (dynamic_cast<const ConfigError*>(&e)) return ZERO_ERR_CONFIG;
  if (dynamic_cast<const IoError*>(&e)) return ZERO_ERR_IO;
  if (dynamic_cast<const CommError*>(&e)) return ZERO_ERR_COMM;
  if (dynamic_cast<const OutOfMemory*>(&e)) return ZERO_ERR_OUT_OF_MEMORY;
  if (dynamic_cast<const CudaError*>(&e)) return ZERO_ERR_CUDA;
  if (dynamic_cast<const std::bad_alloc*>(&e)) return ZERO_ERR_OUT_OF_MEMORY;
  return ZERO_ERR_RUNTIME;
}

char* copy_out(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p == nullptr) throw std::bad_alloc();
  std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

}  // namespace zero::c_abi

extern "C" {

int zero_abi_version(void) {
  return ZERO_ABI_VERSION;
}

const char* zero_version(void) {
  return ZERO_VERSION_STRING;
}

const char* zero_last_error(void) {
  return zero::c_abi::last_error_message();
}

void zero_free(char* p) {
  std::free(p);
}

}  // extern "C"
