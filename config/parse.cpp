#include "config/parse.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "zero/base/error.h"

namespace zero::config {

namespace {

using nlohmann::json;

std::string location(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  std::size_t line = 1;
  std::size_t column = 1;
  for (std::size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return fmt::format("line {}, column {}", line, column);
}

[[noreturn]] void throw_syntax(std::string_view text, std::size_t offset, std::string_view what) {
  throw ConfigError("", fmt::format("{}: {}", location(text, offset), what));
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// Blanks comments and trailing commas with spaces, keeping newlines, so byte offsets into the
// result are byte offsets into the input and error positions need no translation. Also bounds
// the nesting depth. Strings are skipped with their escapes, so "//" inside a value is kept.
std::string blank_extensions(std::string_view text) {
  std::string out(text);
  const std::size_t n = out.size();
  bool in_string = false;
  for (std::size_t i = 0; i < n;) {
    const char c = out[i];
    if (in_string) {
      if (c == '\\') {
        i += 2;
        continue;
      }
      if (c == '"') in_string = false;
      ++i;
      continue;
    }
    if (c == '"') {
      in_string = true;
      ++i;
      continue;
    }
    if (c == '/' && i + 1 < n && out[i + 1] == '/') {
      for (; i < n && out[i] != '\n'; ++i) out[i] = ' ';
      continue;
    }
    if (c == '/' && i + 1 < n && out[i + 1] == '*') {
      const std::size_t start = i;
      out[i] = out[i + 1] = ' ';
      i += 2;
      bool closed = false;
      while (i < n) {
        if (out[i] == '*' && i + 1 < n && out[i + 1] == '/') {
          out[i] = out[i + 1] = ' ';
          i += 2;
          closed = true;
          break;
        }
        if (out[i] != '\n') out[i] = ' ';
        ++i;
      }
      if (!closed) throw_syntax(text, start, "unterminated /* comment");
      continue;
    }
    ++i;
  }

  // A comma is trailing when the next significant character closes the container and the
  // previous one ends a value; "[,]" and "{,}" stay errors, as in hjson.
  in_string = false;
  char last_significant = 0;
  std::size_t pending_comma = std::string::npos;
  std::size_t depth = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const char c = out[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (is_space(c)) continue;
    if (c == '"') {
      in_string = true;
      pending_comma = std::string::npos;
      last_significant = c;
      continue;
    }
    if (c == ',') {
      const bool after_value = last_significant != 0 && last_significant != '{' &&
                               last_significant != '[' && last_significant != ',' &&
                               last_significant != ':';
      pending_comma = after_value ? i : std::string::npos;
      last_significant = c;
      continue;
    }
    if ((c == '}' || c == ']') && pending_comma != std::string::npos) out[pending_comma] = ' ';
    if (c == '{' || c == '[') {
      if (++depth > kMaxNestingDepth) {
        throw_syntax(text, i, fmt::format("nesting deeper than {} levels", kMaxNestingDepth));
      }
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
    pending_comma = std::string::npos;
    last_significant = c;
  }
  return out;
}

// Builds the document and records every duplicate key with its path. Positions of syntax
// errors come from the lexer, which counts bytes of the blanked text (same offsets as the input).
class DocumentBuilder final : public nlohmann::json_sax<json> {
 public:
  json root;
  std::vector<ConfigError::Problem> duplicates;
  bool failed = false;
  std::size_t error_position = 0;
  std::string error_message;

  bool null() override { return add(nullptr); }
  bool boolean(bool v) override { return add(v); }
  bool number_integer(number_integer_t v) override { return add(v); }
  bool number_unsigned(number_unsigned_t v) override { return add(v); }
  bool number_float(number_float_t v, const string_t& /*text*/) override { return add(v); }
  bool string(string_t& v) override { return add(std::move(v)); }
  bool binary(binary_t& /*v*/) override { return add(nullptr); }

  bool start_object(std::size_t /*elements*/) override { return open(json::object()); }
  bool start_array(std::size_t /*elements*/) override { return open(json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  bool key(string_t& k) override {
    Frame& top = frames_.back();
    if (top.node->contains(k)) {
      duplicates.push_back(
          {path_of(k), "duplicate key (DeepSpeed refuses configs with duplicate keys)"});
    }
    top.key = k;
    return true;
  }

  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) override {
    failed = true;
    error_position = position;
    error_message = ex.what();
    return false;
  }

 private:
  struct Frame {
    json* node;
    std::string key;
  };

  std::string path_of(const std::string& leaf) const {
    // Every frame but the innermost holds the container of the next one: an object under
    // `key`, an array as its last element.
    std::string p;
    for (std::size_t i = 0; i + 1 < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      if (f.node->is_object()) {
        if (!p.empty()) p += '.';
        p += f.key;
      } else {
        p += fmt::format("[{}]", f.node->size() - 1);
      }
    }
    if (!p.empty()) p += '.';
    return p + leaf;
  }

  json* insert(json value) {
    if (frames_.empty()) {
      root = std::move(value);
      return &root;
    }
    Frame& top = frames_.back();
    if (top.node->is_object()) {
      json& slot = (*top.node)[top.key];
      slot = std::move(value);
      return &slot;
    }
    top.node->push_back(std::move(value));
    return &top.node->back();
  }

  bool add(json value) {
    insert(std::move(value));
    return true;
  }
  bool open(json container) {
    json* node = insert(std::move(container));
    frames_.push_back({node, {}});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return true;
  }

  std::vector<Frame> frames_;
};

// nlohmann's messages start with "[json.exception.parse_error.101] parse error at line 3,
// column 40: "; the position is re-derived from the token start, so keep only the explanation.
std::string strip_library_prefix(const std::string& message) {
  std::string m = message;
  if (const auto close = m.find("] ");
      m.rfind("[json.exception", 0) == 0 && close != std::string::npos) {
    m = m.substr(close + 2);
  }
  if (m.rfind("parse error", 0) == 0) {
    if (const auto colon = m.find(": "); colon != std::string::npos) m = m.substr(colon + 2);
  }
  return m;
}

bool is_word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '$' || c == '-' ||
         c == '.';
}

// Names the hjson-only form at `start`, which is what real configs that fail strict parsing
// contain (template placeholders, single quotes, missing commas).
std::string explain(std::string_view text, std::size_t start, const std::string& library_message) {
  if (start >= text.size()) return "unexpected end of input";
  const char c = text[start];
  if (std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '$') {
    std::size_t end = start;
    while (end < text.size() && end - start < 40 && is_word_char(text[end])) ++end;
    const std::string_view word = text.substr(start, end - start);
    if (word != "true" && word != "false" && word != "null") {
      return fmt::format(
          "unquoted text '{}' is not JSON (hjson-only syntax; an unfilled template placeholder?): "
          "quote strings and keys or fill in the value",
          word);
    }
  }
  if (c == '\'') return "single-quoted string is not JSON (hjson-only syntax): use double quotes";
  if (c == '#') return "'#' comment is not JSON (hjson-only syntax): use // or /* */";
  if (c == '"' && library_message.find("expected '}'") != std::string::npos) {
    return "expected ',' or '}' before this string (missing comma?)";
  }
  if (c == '"' && library_message.find("expected ']'") != std::string::npos) {
    return "expected ',' or ']' before this string (missing comma?)";
  }
  return strip_library_prefix(library_message);
}

}  // namespace

nlohmann::json parse_relaxed_json(std::string_view text) {
  const std::string blanked = blank_extensions(text);
  DocumentBuilder builder;
  try {
    json::sax_parse(blanked, &builder, nlohmann::json::input_format_t::json, /*strict=*/true);
  } catch (const nlohmann::json::exception& e) {
    // sax_parse reports through parse_error(); this only guards against a library change.
    throw ConfigError("", strip_library_prefix(e.what()));
  }
  if (builder.failed) {
    // The lexer has consumed the offending token when it reports; its start is the position
    // the reader needs. last_token escapes control characters, so clamp.
    // The library's last token can run back over earlier tokens ('"key": B'), so the error is
    // located from the last character read: the start of a word, of a string, or that character.
    const std::size_t consumed = std::min(builder.error_position, text.size());
    std::size_t start = consumed > 0 ? consumed - 1 : 0;
    if (builder.error_message.find("end of input") != std::string::npos) {
      start = text.size();
    } else if (consumed > 0 && is_word_char(text[start])) {
      while (start > 0 && is_word_char(text[start - 1])) --start;
    } else if (consumed > 1 && text[start] == '"' &&
               builder.error_message.find("string literal") != std::string::npos) {
      std::size_t open = start;
      while (open > 0) {
        --open;
        std::size_t backslashes = 0;
        while (open >= backslashes + 1 && text[open - backslashes - 1] == '\\') ++backslashes;
        if (text[open] == '"' && backslashes % 2 == 0) break;
      }
      start = open;
    }
    if (builder.error_message.find("out_of_range") != std::string::npos) {
      throw_syntax(text, start, strip_library_prefix(builder.error_message));
    }
    throw_syntax(text, start, explain(text, start, builder.error_message));
  }
  if (!builder.duplicates.empty()) throw ConfigError(std::move(builder.duplicates));
  return std::move(builder.root);
}

}  // namespace zero::config
