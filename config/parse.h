// Reading a ds_config document: strict JSON plus the two hjson extensions real configs use.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string_view>

namespace zero::config {

// Deepest object/array nesting a document may have. Real configs nest four levels; the bound
// keeps every recursive walk over a document far from the stack limit.
inline constexpr std::size_t kMaxNestingDepth = 64;

// Parses `text` as JSON that may also contain `//` and `/* */` comments and trailing commas
// (DeepSpeed reads files with hjson, and these are the hjson features found in real configs).
// Every other hjson-only form (unquoted keys or strings, single quotes, `#` comments, missing
// commas) is refused. Duplicate keys at any nesting level are refused, as DeepSpeed does.
//
// Throws zero::ConfigError. A syntax error is one problem with an empty path and a message
// "line L, column C: ..." (1-based; the column counts bytes); duplicate keys are one problem
// each, with the dotted path of the repeated key. Never throws anything else for any input.
nlohmann::json parse_relaxed_json(std::string_view text);

}  // namespace zero::config
