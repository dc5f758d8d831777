// How the C ABI reports failure (zero/zero_c.h, "Errors"): every entry point runs its body
// through guarded(), which turns any exception into a ZERO_ERR_* status and keeps the message
// for zero_last_error(); and the small conversions every entry point shares. Internal to zero/c.
#pragma once

#include <fmt/format.h>

#include <exception>
#include <new>
#include <string>

#include "zero/base/dtype.h"
#include "zero/base/error.h"
#include "zero/zero_c.h"

namespace zero::c_abi {

// A failure of a caller's callback (init, communicator); maps to ZERO_ERR_CALLBACK.
class CallbackError : public Error {
 public:
  using Error::Error;
};

// An argument the C caller got wrong before the engine was reached; ZERO_ERR_INVALID_ARGUMENT.
class ArgumentError : public Error {
 public:
  using Error::Error;
};

// Keeps `message` as the calling thread's last error; returns `status`. Never throws.
int fail(int status, std::string message) noexcept;

// The calling thread's last error message ("" when none).
const char* last_error_message() noexcept;

// The status an exception maps to.
int status_of(const std::exception& e) noexcept;

// Runs fn; maps what it throws onto a status, prefixing the message with `function`.
template <typename Fn>
int guarded(const char* function, Fn&& fn) noexcept {
  try {
    fn();
    return ZERO_OK;
  } catch (const std::bad_alloc&) {
    return fail(ZERO_ERR_OUT_OF_MEMORY, std::string(function) + ": out of host memory");
  } catch (const std::exception& e) {
    try {
      return fail(status_of(e), fmt::format("{}: {}", function, e.what()));
    } catch (...) {
      return fail(status_of(e), {});
    }
  } catch (...) {
    return fail(ZERO_ERR_RUNTIME, std::string(function) + ": unknown exception");
  }
}

// The ZERO_DTYPE_* of a dtype.
inline int c_dtype_of(DType dtype) {
  switch (dtype) {
    case DType::F16: return ZERO_DTYPE_F16;
    case DType::BF16: return ZERO_DTYPE_BF16;
    case DType::F64: return ZERO_DTYPE_F64;
    default: return ZERO_DTYPE_F32;
  }
}

// A string for the caller to free with zero_free().
char* copy_out(const std::string& s);

}  // namespace zero::c_abi

#define ZERO_C_REQUIRE(cond, ...) ZERO_CHECK_AS(::zero::c_abi::ArgumentError, cond, __VA_ARGS__)
