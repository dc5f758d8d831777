// The value types of pickle.h: scalar and kind names, TensorRef's view arithmetic, and the dict
// key codes (pickle_impl.h) both the parser and the views index dicts by.
#include "zero/dscheckpoint/pickle.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>

#include "zero/base/error.h"
#include "zero/dscheckpoint/pickle_impl.h"

namespace zero::dscheckpoint {

std::size_t scalar_size(ScalarType t) {
  switch (t) {
    case ScalarType::F64:
    case ScalarType::I64: return 8;
    case ScalarType::F32:
    case ScalarType::I32: return 4;
    case ScalarType::F16:
    case ScalarType::BF16:
    case ScalarType::I16: return 2;
    case ScalarType::I8:
    case ScalarType::U8:
    case ScalarType::Bool: return 1;
  }
  return 1;
}

std::string_view scalar_name(ScalarType t) {
  switch (t) {
    case ScalarType::F32: return "float32";
    case ScalarType::F64: return "float64";
    case ScalarType::F16: return "float16";
    case ScalarType::BF16: return "bfloat16";
    case ScalarType::I64: return "int64";
    case ScalarType::I32: return "int32";
    case ScalarType::I16: return "int16";
    case ScalarType::I8: return "int8";
    case ScalarType::U8: return "uint8";
    case ScalarType::Bool: return "bool";
  }
  return "?";
}

std::string_view kind_name(PickleValue::Kind k) {
  using K = PickleValue::Kind;
  switch (k) {
    case K::None: return "None";
    case K::Bool: return "bool";
    case K::Int: return "int";
    case K::Float: return "float";
    case K::String: return "str";
    case K::Bytes: return "bytes";
    case K::List: return "list";
    case K::Tuple: return "tuple";
    case K::Set: return "set";
    case K::Dict: return "dict";
    case K::Tensor: return "tensor";
    case K::Storage: return "storage";
    case K::Global: return "global";
    case K::Object: return "object";
  }
  return "?";
}

// --- TensorRef ----------------------------------------------------------------------------------

namespace detail {

std::optional<ViewExtent> view_extent(std::int64_t offset, const std::vector<std::int64_t>& shape,
                                      const std::vector<std::int64_t>& stride) {
  if (offset < 0 || shape.size() != stride.size()) return std::nullopt;
  std::int64_t numel = 1;
  std::int64_t last = offset;  // largest index reached
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0 || stride[d] < 0) return std::nullopt;
    if (__builtin_mul_overflow(numel, shape[d], &numel)) return std::nullopt;
  }
  if (numel == 0) return ViewExtent{0, 0};
  for (std::size_t d = 0; d < shape.size(); ++d) {
    std::int64_t reach;
    if (__builtin_mul_overflow(shape[d] - 1, stride[d], &reach)) return std::nullopt;
    if (__builtin_add_overflow(last, reach, &last)) return std::nullopt;
  }
  std::int64_t span;
  if (__builtin_add_overflow(last, std::int64_t{1}, &span)) return std::nullopt;
  return ViewExtent{numel, span};
}

}  // namespace detail

std::int64_t TensorRef::numel() const {
  const auto e = detail::view_extent(offset, shape, stride);
  ZERO_CHECK_AS(IoError, e.has_value(), "tensor on storage '{}': invalid shape, stride or offset",
                storage_key);
  return e->numel;
}

std::int64_t TensorRef::span_elems() const {
  const auto e = detail::view_extent(offset, shape, stride);
  ZERO_CHECK_AS(IoError, e.has_value(), "tensor on storage '{}': invalid shape, stride or offset",
                storage_key);
  return e->span;
}

bool TensorRef::is_contiguous() const {
  std::int64_t expected = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && stride[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

// --- dict key codes -----------------------------------------------------------------------------

namespace detail {

namespace {
constexpr int kMaxKeyDepth = 32;
constexpr std::size_t kMaxKeyCodeBytes = 1 << 16;
}  // namespace

bool key_code(const PickleValue* v, std::string& out, int depth) {
  using K = PickleValue::Kind;
  if (depth > kMaxKeyDepth || out.size() > kMaxKeyCodeBytes) return false;
  const auto& d = v->data();
  switch (v->kind()) {
    case K::None: out += 'N'; return true;
    case K::Bool: out += std::get<bool>(d) ? "i1;" : "i0;"; return true;
    case K::Int: out += fmt::format("i{};", std::get<std::int64_t>(d)); return true;
    case K::Float: {
      const double f = std::get<double>(d);
      if (std::isfinite(f) && std::trunc(f) == f && std::fabs(f) < 9.2e18) {
        out += fmt::format("i{};", static_cast<std::int64_t>(f));
      } else {
        out += fmt::format("f{};", std::bit_cast<std::uint64_t>(f));
      }
      return true;
    }
    case K::String:
    case K::Bytes: {
      const std::string& s = std::get<std::string>(d);
      out += fmt::format("{}{}:", v->kind() == K::String ? 's' : 'b', s.size());
      out += s;
      return true;
    }
    case K::Tuple: {
      out += "t(";
      for (const PickleValue* e : std::get<PickleValue::Items>(d)) {
        if (!key_code(e, out, depth + 1)) return false;
      }
      out += ')';
      return true;
    }
    case K::Global: {
      const auto& g = std::get<PickleValue::Global>(d);
      out += fmt::format("g{}.{};", g.module, g.name);
      return true;
    }
    case K::Tensor:
    case K::Storage:
    case K::Object:
      // Hashed by identity in Python.
      out += fmt::format("p{};", reinterpret_cast<std::uintptr_t>(v));
      return true;
    case K::List:
    case K::Set:
    case K::Dict: return false;
  }
  return false;
}

std::string string_key_code(std::string_view key) {
  return fmt::format("s{}:{}", key.size(), key);
}

std::string int_key_code(std::int64_t key) {
  return fmt::format("i{};", key);
}

}  // namespace detail

}  // namespace zero::dscheckpoint
