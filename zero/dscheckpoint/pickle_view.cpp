// PickleView: typed access to a parsed pickle's values with the key path in every error, and
// the conversion to plain JSON.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <nlohmann/json.hpp>

#include "zero/base/error.h"
#include "zero/dscheckpoint/pickle.h"
#include "zero/dscheckpoint/pickle_impl.h"

namespace zero::dscheckpoint {

namespace {

bool is_identifier(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

std::string key_path(const std::string& base, std::string_view key) {
  if (is_identifier(key)) return base.empty() ? std::string(key) : base + "." + std::string(key);
  return fmt::format("{}['{}']", base, key);
}

std::string describe(const PickleValue& v) {
  using K = PickleValue::Kind;
  const auto& d = v.data();
  switch (v.kind()) {
    case K::None: return "None";
    case K::Bool: return std::get<bool>(d) ? "True" : "False";
    case K::Int: return fmt::format("int {}", std::get<std::int64_t>(d));
    case K::Float: return fmt::format("float {}", std::get<double>(d));
    case K::String: {
      const std::string& s = std::get<std::string>(d);
      return s.size() <= 40 ? fmt::format("str '{}'", s)
                            : fmt::format("str '{}...'", s.substr(0, 40));
    }
    case K::Bytes: return fmt::format("{} bytes", std::get<std::string>(d).size());
    case K::List:
    case K::Tuple:
    case K::Set:
      return fmt::format("a {} of {}", kind_name(v.kind()), std::get<PickleValue::Items>(d).size());
    case K::Dict:
      return fmt::format("a dict of {} entries", std::get<PickleValue::Dict>(d).entries.size());
    case K::Tensor:
    case K::Storage: {
      const auto& t = std::get<TensorRef>(d);
      return fmt::format("a {} {} [{}] on storage '{}'", scalar_name(t.dtype), kind_name(v.kind()),
                         fmt::join(t.shape, ", "), t.storage_key);
    }
    case K::Global: {
      const auto& g = std::get<PickleValue::Global>(d);
      return fmt::format("global {}.{}", g.module, g.name);
    }
    case K::Object: return fmt::format("a {} object", std::get<PickleValue::Object>(d).type);
  }
  return "?";
}

}  // namespace

const std::string& PickleView::file() const {
  return arena_->file;
}

std::string PickleView::where() const {
  return fmt::format("{}: {}", arena_->file, path_.empty() ? "(root)" : path_);
}

void PickleView::fail(std::string_view expected) const {
  throw IoError(fmt::format("{}: expected {}, found {}", where(), expected, describe(*value_)));
}

void PickleView::error(std::string_view message) const {
  throw IoError(fmt::format("{}: {}", where(), message));
}

namespace {
const PickleValue::Dict* dict_of(const PickleValue& v) {
  if (v.kind() == PickleValue::Kind::Dict) return &std::get<PickleValue::Dict>(v.data());
  if (v.kind() == PickleValue::Kind::Object) return &std::get<PickleValue::Object>(v.data()).attrs;
  return nullptr;
}
}  // namespace

std::optional<PickleView> PickleView::find(std::string_view key) const {
  const PickleValue::Dict* d = dict_of(*value_);
  if (d == nullptr) fail(fmt::format("a dict (looking up '{}')", key));
  auto it = d->index.find(detail::string_key_code(key));
  if (it == d->index.end()) return std::nullopt;
  return child(d->entries[it->second].second, key_path(path_, key));
}

PickleView PickleView::get(std::string_view key) const {
  auto v = find(key);
  if (!v) {
    std::vector<std::string> keys;
    for (const auto& [k, _] : dict_of(*value_)->entries) {
      if (keys.size() == 12) {
        keys.push_back("...");
        break;
      }
      keys.push_back(k->kind() == PickleValue::Kind::String ? std::get<std::string>(k->data())
                                                            : describe(*k));
    }
    error(
        fmt::format("expected key '{}', which is missing (keys: {})", key, fmt::join(keys, ", ")));
  }
  return *v;
}

std::optional<PickleView> PickleView::find(std::int64_t key) const {
  const PickleValue::Dict* d = dict_of(*value_);
  if (d == nullptr) fail(fmt::format("a dict (looking up {})", key));
  auto it = d->index.find(detail::int_key_code(key));
  if (it == d->index.end()) return std::nullopt;
  return child(d->entries[it->second].second, fmt::format("{}[{}]", path_, key));
}

PickleView PickleView::get(std::int64_t key) const {
  auto v = find(key);
  if (!v) error(fmt::format("expected key {}, which is missing", key));
  return *v;
}

std::vector<std::pair<PickleView, PickleView>> PickleView::entries() const {
  const PickleValue::Dict* d = dict_of(*value_);
  if (d == nullptr) fail("a dict");
  std::vector<std::pair<PickleView, PickleView>> out;
  out.reserve(d->entries.size());
  for (const auto& [k, v] : d->entries) {
    PickleView key = child(k, path_);
    const std::string text = key.key_text();
    std::string path = k->kind() == PickleValue::Kind::String ? key_path(path_, text)
                                                              : fmt::format("{}[{}]", path_, text);
    out.emplace_back(key, child(v, std::move(path)));
  }
  return out;
}

std::size_t PickleView::size() const {
  using K = PickleValue::Kind;
  switch (kind()) {
    case K::List:
    case K::Tuple:
    case K::Set: return std::get<PickleValue::Items>(value_->data()).size();
    case K::Object: return std::get<PickleValue::Object>(value_->data()).args.size();
    case K::Dict: return std::get<PickleValue::Dict>(value_->data()).entries.size();
    default: fail("a list, tuple, set or dict");
  }
}

PickleView PickleView::element(std::size_t i) const {
  using K = PickleValue::Kind;
  const PickleValue::Items* items = nullptr;
  if (kind() == K::List || kind() == K::Tuple || kind() == K::Set) {
    items = &std::get<PickleValue::Items>(value_->data());
  } else if (kind() == K::Object) {
    items = &std::get<PickleValue::Object>(value_->data()).args;
  } else {
    fail(fmt::format("a list or tuple (reading element {})", i));
  }
  if (i >= items->size()) {
    error(fmt::format("expected an element {}, but the {} has {}", i, kind_name(kind()),
                      items->size()));
  }
  return child((*items)[i], fmt::format("{}[{}]", path_, i));
}

std::vector<PickleView> PickleView::elements() const {
  std::vector<PickleView> out;
  const std::size_t n = size();
  if (kind() == PickleValue::Kind::Dict) fail("a list or tuple");
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) out.push_back(element(i));
  return out;
}

bool PickleView::as_bool() const {
  if (kind() != PickleValue::Kind::Bool) fail("a bool");
  return std::get<bool>(value_->data());
}

std::int64_t PickleView::as_int() const {
  if (kind() != PickleValue::Kind::Int) fail("an int");
  return std::get<std::int64_t>(value_->data());
}

double PickleView::as_number() const {
  if (kind() == PickleValue::Kind::Int)
    return static_cast<double>(std::get<std::int64_t>(value_->data()));
  if (kind() == PickleValue::Kind::Float) return std::get<double>(value_->data());
  fail("a number");
}

const std::string& PickleView::as_string() const {
  if (kind() != PickleValue::Kind::String) fail("a str");
  return std::get<std::string>(value_->data());
}

const TensorRef& PickleView::as_tensor() const {
  if (kind() != PickleValue::Kind::Tensor) fail("a tensor");
  return std::get<TensorRef>(value_->data());
}

std::vector<std::int64_t> PickleView::as_shape() const {
  if (kind() != PickleValue::Kind::Tuple && kind() != PickleValue::Kind::List) {
    fail("a shape (torch.Size or a tuple of ints)");
  }
  std::vector<std::int64_t> out;
  for (const PickleValue* e : std::get<PickleValue::Items>(value_->data())) {
    if (e->kind() != PickleValue::Kind::Int || std::get<std::int64_t>(e->data()) < 0) {
      fail("a shape (torch.Size or a tuple of non-negative ints)");
    }
    out.push_back(std::get<std::int64_t>(e->data()));
  }
  return out;
}

const std::string& PickleView::type_name() const {
  if (kind() == PickleValue::Kind::Object)
    return std::get<PickleValue::Object>(value_->data()).type;
  fail("an object");
}

std::string PickleView::key_text() const {
  using K = PickleValue::Kind;
  switch (kind()) {
    case K::String: return std::get<std::string>(value_->data());
    case K::Int: return std::to_string(std::get<std::int64_t>(value_->data()));
    case K::Bool: return std::get<bool>(value_->data()) ? "True" : "False";
    default: return describe(*value_);
  }
}

namespace {

struct JsonWriter {
  std::string where;
  std::size_t nodes = 0;

  nlohmann::json run(const PickleValue& v, int depth) {
    using K = PickleValue::Kind;
    if (depth > PickleView::kMaxJsonDepth || ++nodes > PickleView::kMaxJsonNodes) {
      throw IoError(
          fmt::format("{}: too deeply nested or too many shared values to convert to JSON "
                      "(more than {} levels or {} values)",
                      where, PickleView::kMaxJsonDepth, PickleView::kMaxJsonNodes));
    }
    const auto& d = v.data();
    switch (v.kind()) {
      case K::None: return nullptr;
      case K::Bool: return std::get<bool>(d);
      case K::Int: return std::get<std::int64_t>(d);
      case K::Float: return std::get<double>(d);
      case K::String: return std::get<std::string>(d);
      case K::Bytes: return {{"__bytes__", std::get<std::string>(d).size()}};
      case K::List:
      case K::Tuple:
      case K::Set: {
        auto out = nlohmann::json::array();
        for (const PickleValue* e : std::get<PickleValue::Items>(d))
          out.push_back(run(*e, depth + 1));
        return out;
      }
      case K::Dict: return dict(std::get<PickleValue::Dict>(d), depth);
      case K::Tensor:
      case K::Storage: {
        const auto& t = std::get<TensorRef>(d);
        return {{v.kind() == K::Tensor ? "__tensor__" : "__storage__",
                 {{"storage", t.storage_key},
                  {"dtype", std::string(scalar_name(t.dtype))},
                  {"device", t.device},
                  {"offset", t.offset},
                  {"shape", t.shape},
                  {"stride", t.stride}}}};
      }
      case K::Global: {
        const auto& g = std::get<PickleValue::Global>(d);
        return g.module + "." + g.name;
      }
      case K::Object: {
        const auto& o = std::get<PickleValue::Object>(d);
        nlohmann::json out = dict(o.attrs, depth);
        out["__type__"] = o.type;
        if (!o.args.empty()) {
          auto args = nlohmann::json::array();
          for (const PickleValue* e : o.args) args.push_back(run(*e, depth + 1));
          out["__args__"] = std::move(args);
        }
        return out;
      }
    }
    return nullptr;
  }

  nlohmann::json dict(const PickleValue::Dict& dict, int depth) {
    auto out = nlohmann::json::object();
    for (const auto& [k, val] : dict.entries) {
      std::string key;
      switch (k->kind()) {
        case PickleValue::Kind::String: key = std::get<std::string>(k->data()); break;
        case PickleValue::Kind::Int: key = std::to_string(std::get<std::int64_t>(k->data())); break;
        default: key = describe(*k); break;
      }
      out[key] = run(*val, depth + 1);
    }
    return out;
  }
};

}  // namespace

nlohmann::json PickleView::to_json() const {
  JsonWriter w{where()};
  return w.run(*value_, 0);
}

}  // namespace zero::dscheckpoint
