// JSON value helpers of the ds_config loader (config/ds_config_impl.h).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "config/did_you_mean.h"
#include "config/ds_config_impl.h"
#include "zero/base/strings.h"

namespace zero::config::detail {

std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string join(std::string_view block, std::string_view key) {
  if (block.empty()) return std::string(key);
  return fmt::format("{}.{}", block, key);
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool is_auto(const json& v) {
  return v.is_string() && v.get_ref<const std::string&>() == "auto";
}

namespace {

// Numeric strings are accepted as pydantic's lax mode does ("5e8", " 16 ").
std::optional<double> number_from_string(const std::string& s) {
  const std::string t = trim(s);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || errno == ERANGE || !std::isfinite(d)) return std::nullopt;
  return d;
}

constexpr double kInt64Bound = 9223372036854775808.0;  // 2^63

std::optional<std::int64_t> integral(double d) {
  if (!std::isfinite(d) || d != std::trunc(d) || d < -kInt64Bound || d >= kInt64Bound)
    return std::nullopt;
  return static_cast<std::int64_t>(d);
}

}  // namespace

bool coerce_bool(const json& v, json& out, std::string& why) {
  if (v.is_boolean()) {
    out = v;
    return true;
  }
  if (v.is_number()) {
    const double d = v.get<double>();
    if (d == 0 || d == 1) {
      out = d == 1;
      return true;
    }
  }
  if (v.is_string()) {
    const std::string s = lower(trim(v.get_ref<const std::string&>()));
    for (const char* t : {"true", "1", "yes", "on", "y", "t"}) {
      if (s == t) {
        out = true;
        return true;
      }
    }
    for (const char* f : {"false", "0", "no", "off", "n", "f"}) {
      if (s == f) {
        out = false;
        return true;
      }
    }
  }
  why = fmt::format("expected a boolean, got {}", show(v));
  return false;
}
namespace {

bool coerce_int(const json& v, json& out, std::string& why) {
  if (v.is_number_unsigned()) {
    if (v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
      why = fmt::format("{} is out of the 64-bit integer range", show(v));
      return false;
    }
    out = static_cast<std::int64_t>(v.get<std::uint64_t>());
    return true;
  }
  if (v.is_number_integer()) {
    out = v.get<std::int64_t>();
    return true;
  }
  std::optional<double> d;
  if (v.is_number_float()) d = v.get<double>();
  if (v.is_string()) d = number_from_string(v.get_ref<const std::string&>());
  if (d) {
    if (auto i = integral(*d)) {
      out = *i;
      return true;
    }
    why = fmt::format("expected an integer, got {} (not a whole number)", show(v));
    return false;
  }
  why = fmt::format("expected an integer, got {}", show(v));
  return false;
}

bool coerce_float(const json& v, json& out, std::string& why) {
  if (v.is_number()) {
    const double d = v.get<double>();
    if (std::isfinite(d)) {
      out = d;
      return true;
    }
  }
  if (v.is_string()) {
    if (auto d = number_from_string(v.get_ref<const std::string&>())) {
      out = *d;
      return true;
    }
  }
  why = fmt::format("expected a finite number, got {}", show(v));
  return false;
}

}  // namespace

bool coerce(const KeyRule& r, const json& v, json& out, std::string& why) {
  if (v.is_null()) {
    if (r.nullable) {
      out = nullptr;
      return true;
    }
    why = "null is not allowed here";
    return false;
  }
  bool ok = false;
  switch (r.type) {
    case ValueType::Bool: ok = coerce_bool(v, out, why); break;
    case ValueType::Int: ok = coerce_int(v, out, why); break;
    case ValueType::Float: ok = coerce_float(v, out, why); break;
    case ValueType::String:
      ok = v.is_string();
      if (ok)
        out = v;
      else
        why = fmt::format("expected a string, got {}", show(v));
      break;
    case ValueType::Enum: {
      if (v.is_string()) {
        const std::string& s = v.get_ref<const std::string&>();
        for (std::string_view c : r.choices) {
          if (s == c || (r.case_insensitive && lower(s) == lower(c))) {
            out = std::string(c);
            return true;
          }
        }
      }
      std::string list;
      for (std::string_view c : r.choices)
        list += fmt::format("{}\"{}\"", list.empty() ? "" : ", ", c);
      why = fmt::format("expected one of {}{}, got {}", list,
                        r.case_insensitive ? "" : " (case-sensitive)", show(v));
      if (v.is_string()) why += did_you_mean(v.get_ref<const std::string&>(), r.choices);
      return false;
    }
    case ValueType::Dtype: {
      if (v.is_string()) {
        if (auto d = parse_dtype(v.get_ref<const std::string&>())) {
          out = std::string(dtype_name(*d));
          return true;
        }
      }
      static const std::vector<std::string_view> kSpellings = {
          "fp32", "fp16", "bf16", "float32", "float16", "bfloat16", "half", "float"};
      why = fmt::format("expected a dtype (fp32, fp16, bf16 or a torch spelling), got {}", show(v));
      if (v.is_string()) why += did_you_mean(v.get_ref<const std::string&>(), kSpellings);
      return false;
    }
    case ValueType::Betas: {
      json a, b;
      std::string ignored;
      if (v.is_array() && v.size() == 2 && coerce_float(v[0], a, ignored) &&
          coerce_float(v[1], b, ignored)) {
        out = json::array({a, b});
        return true;
      }
      why = fmt::format("expected [beta1, beta2], got {}", show(v));
      return false;
    }
    case ValueType::FloatOrList: {
      if (!v.is_array()) return coerce_float(v, out, why);
      json list = json::array();
      for (const json& e : v) {
        json x;
        if (!coerce_float(e, x, why)) {
          why = fmt::format("expected a number or a list of numbers (one per param group), got {}",
                            show(v));
          return false;
        }
        list.push_back(x);
      }
      if (list.empty()) {
        why = "expected a number or a non-empty list of numbers (one per param group)";
        return false;
      }
      out = list;
      return true;
    }
    case ValueType::PathOrList: {
      const bool strings =
          v.is_string() || (v.is_array() && !v.empty() &&
                            std::all_of(v.begin(), v.end(), [](const json& e) {
                              return e.is_string() && !e.get_ref<const std::string&>().empty();
                            }));
      if (!strings) {
        why = fmt::format("expected a folder or a non-empty list of folders, got {}", show(v));
        return false;
      }
      out = v;
      return true;
    }
    case ValueType::Object:
      ok = v.is_object();
      if (ok)
        out = v;
      else
        why = fmt::format("expected an object, got {}", show(v));
      break;
    case ValueType::Any: out = v; return true;
  }
  if (!ok) return false;
  if (out.is_number() && (r.min || r.max)) {
    const double d = out.get<double>();
    if (r.min && d < *r.min) {
      why = fmt::format("must be >= {}, got {}", *r.min, show(v));
      if (r.max) why = fmt::format("must be between {} and {}, got {}", *r.min, *r.max, show(v));
      return false;
    }
    if (r.max && d > *r.max) {
      why = fmt::format("must be <= {}, got {}", *r.max, show(v));
      if (r.min) why = fmt::format("must be between {} and {}, got {}", *r.min, *r.max, show(v));
      return false;
    }
  }
  return true;
}

const json* lookup(const json& root, std::string_view dotted) {
  const json* node = &root;
  std::size_t start = 0;
  while (start <= dotted.size()) {
    const std::size_t dot = std::min(dotted.find('.', start), dotted.size());
    const std::string key(dotted.substr(start, dot - start));
    if (!node->is_object()) return nullptr;
    auto it = node->find(key);
    if (it == node->end()) return nullptr;
    node = &*it;
    start = dot + 1;
  }
  return node;
}

double number_at(const json& root, std::string_view path, double fallback) {
  const json* v = lookup(root, path);
  return v && v->is_number() ? v->get<double>() : fallback;
}
std::int64_t int_at(const json& root, std::string_view path, std::int64_t fallback) {
  const json* v = lookup(root, path);
  return v && v->is_number_integer() ? v->get<std::int64_t>() : fallback;
}
bool bool_at(const json& root, std::string_view path, bool fallback) {
  const json* v = lookup(root, path);
  return v && v->is_boolean() ? v->get<bool>() : fallback;
}
std::vector<std::string> paths_at(const json& root, std::string_view path) {
  const json* v = lookup(root, path);
  if (v == nullptr || v->is_null()) return {};
  if (v->is_string()) return {v->get<std::string>()};
  std::vector<std::string> out;
  for (const json& e : *v) out.push_back(e.get<std::string>());
  return out;
}

std::string string_at(const json& root, std::string_view path) {
  const json* v = lookup(root, path);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

}  // namespace zero::config::detail
