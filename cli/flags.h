// Command-line flag parsing shared by the tools (zero-train, zero_to_fp32, zero-config) and the
// zero-bench subcommands: "--flag value", "--flag=value" and switches. Each command keeps its own
// table of flags and its own messages for malformed values; this only splits and consumes.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace zero::cli {

// A bad flag or value. The message names the flag, the value and what is expected; the tools
// print it as one line and exit 2 (zero-bench prints it like any other error and exits 1).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The flag at args[i]: its name, and its value inline ("--flag=value") or in the next argument.
// Only an argument starting with "--" is split at its first '='; anything else is its own name.
class FlagArg {
 public:
  FlagArg(std::span<const std::string> args, std::size_t& i) : args_(args), i_(i), name_(args[i]) {
    if (const auto eq = name_.find('='); name_.starts_with("--") && eq != std::string::npos) {
      inline_value_ = name_.substr(eq + 1);
      name_.resize(eq);
    }
  }

  const std::string& name() const { return name_; }

  // Whether value() has a value to return: an inline one, or a next argument.
  bool has_value() const { return inline_value_.has_value() || i_ + 1 < args_.size(); }

  // A switch takes no value: "--flag=value" is an error.
  void no_value() const {
    if (inline_value_) {
      throw UsageError(fmt::format("{}={}: {} takes no value", name_, *inline_value_, name_));
    }
  }

  // The value, from "--flag=value" or the next argument (which it consumes); `expected` says
  // what it should be when it is missing: "<flag> needs a value: <expected>".
  std::string value(std::string_view expected) {
    if (inline_value_) return *inline_value_;
    if (i_ + 1 >= args_.size()) {
      throw UsageError(fmt::format("{} needs a value: {}", name_, expected));
    }
    return args_[++i_];
  }

 private:
  std::span<const std::string> args_;
  std::size_t& i_;
  std::string name_;
  std::optional<std::string> inline_value_;
};

}  // namespace zero::cli
