// Command-line flag parsing shared by the tools: "--flag value", "--flag=value" and switches.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace zero::tools {

// A bad flag or value. The message names the flag, the value and what is expected; a tool
// prints it as one line and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The flag at args[i]: its name, and its value inline ("--flag=value") or in the next argument.
class FlagArg {
 public:
  FlagArg(std::span<const std::string> args, std::size_t& i) : args_(args), i_(i), name_(args[i]) {
    if (const auto eq = name_.find('='); name_.starts_with("--") && eq != std::string::npos) {
      inline_value_ = name_.substr(eq + 1);
      name_.resize(eq);
    }
  }

  const std::string& name() const { return name_; }

  // A switch takes no value: "--flag=value" is an error.
  void no_value() const {
    if (inline_value_) {
      throw UsageError(fmt::format("{}={}: {} takes no value", name_, *inline_value_, name_));
    }
  }

  // The value, from "--flag=value" or the next argument (which it consumes); `expected` says
  // what it should be when it is missing.
  std::string value(std::string_view expected) {
    if (inline_value_) return *inline_value_;
    if (i_ + 1 >= args_.size()) throw UsageError(fmt::format("{} needs a value: {}", name_, expected));
    return args_[++i_];
  }

 private:
  std::span<const std::string> args_;
  std::size_t& i_;
  std::string name_;
  std::optional<std::string> inline_value_;
};

}  // namespace zero::tools
