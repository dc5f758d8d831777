#include "zero/dscheckpoint/pickle.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <bit>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "zero/base/error.h"

namespace zero::dscheckpoint {

namespace detail {
struct PickleArena {
  std::string file;
  std::vector<std::unique_ptr<PickleValue>> values;
};
}  // namespace detail

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

namespace {

// The numel and the reached span of a strided view, or nothing when a size is negative or the
// arithmetic overflows.
struct ViewExtent {
  std::int64_t numel;
  std::int64_t span;
};
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

}  // namespace

std::int64_t TensorRef::numel() const {
  const auto e = view_extent(offset, shape, stride);
  ZERO_CHECK_AS(IoError, e.has_value(), "tensor on storage '{}': invalid shape, stride or offset",
                storage_key);
  return e->numel;
}

std::int64_t TensorRef::span_elems() const {
  const auto e = view_extent(offset, shape, stride);
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

// --- the allow-list -----------------------------------------------------------------------------

namespace {

enum Role : int {
  kOrderedDict = 1,
  kSize,
  kSet,
  kFrozenSet,
  kCodecsEncode,
  kRebuildTensor,
  kRebuildTensorV2,
  kRebuildParameter,
  kRebuildParameterWithState,
  kRebuildFromTypeV2,
  kTensorType,
  kStorageType,
  kDtype,
  kPlainObject,
};

struct AllowedGlobal {
  std::string_view module;
  std::string_view name;
  Role role;
  ScalarType scalar = ScalarType::F32;  // kStorageType
};

constexpr AllowedGlobal kAllowed[] = {
    {"collections", "OrderedDict", kOrderedDict},
    {"torch", "Size", kSize},
    {"builtins", "set", kSet},
    {"__builtin__", "set", kSet},
    {"builtins", "frozenset", kFrozenSet},
    {"__builtin__", "frozenset", kFrozenSet},
    {"_codecs", "encode", kCodecsEncode},
    {"torch._utils", "_rebuild_tensor", kRebuildTensor},
    {"torch._utils", "_rebuild_tensor_v2", kRebuildTensorV2},
    {"torch._utils", "_rebuild_parameter", kRebuildParameter},
    {"torch._utils", "_rebuild_parameter_with_state", kRebuildParameterWithState},
    {"torch._tensor", "_rebuild_from_type_v2", kRebuildFromTypeV2},
    {"torch", "Tensor", kTensorType},
    {"torch.nn.parameter", "Parameter", kTensorType},
    {"torch", "FloatStorage", kStorageType, ScalarType::F32},
    {"torch", "DoubleStorage", kStorageType, ScalarType::F64},
    {"torch", "HalfStorage", kStorageType, ScalarType::F16},
    {"torch", "BFloat16Storage", kStorageType, ScalarType::BF16},
    {"torch", "LongStorage", kStorageType, ScalarType::I64},
    {"torch", "IntStorage", kStorageType, ScalarType::I32},
    {"torch", "ShortStorage", kStorageType, ScalarType::I16},
    {"torch", "CharStorage", kStorageType, ScalarType::I8},
    {"torch", "ByteStorage", kStorageType, ScalarType::U8},
    {"torch", "BoolStorage", kStorageType, ScalarType::Bool},
    {"torch", "UntypedStorage", kStorageType, ScalarType::U8},
    {"torch", "float32", kDtype},
    {"torch", "float", kDtype},
    {"torch", "float64", kDtype},
    {"torch", "double", kDtype},
    {"torch", "float16", kDtype},
    {"torch", "half", kDtype},
    {"torch", "bfloat16", kDtype},
    {"torch", "int64", kDtype},
    {"torch", "long", kDtype},
    {"torch", "int32", kDtype},
    {"torch", "int", kDtype},
    {"torch", "int16", kDtype},
    {"torch", "int8", kDtype},
    {"torch", "uint8", kDtype},
    {"torch", "bool", kDtype},
    // DeepSpeed's objects in checkpoints (SPEC_DEEPSPEED.md §8.3), read as attribute maps.
    {"deepspeed.runtime.fp16.loss_scaler", "LossScaler", kPlainObject},
    {"deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler", kPlainObject},
    {"deepspeed.runtime.fp16.loss_scaler", "LossScalerBase", kPlainObject},
    {"deepspeed.runtime.zero.config", "ZeroStageEnum", kPlainObject},
    {"deepspeed.runtime.zero.offload_config", "OffloadDeviceEnum", kPlainObject},
    {"deepspeed.utils.tensor_fragment", "fragment_address", kPlainObject},
    // Megatron-DeepSpeed stores its arguments as a Namespace in the model states.
    {"argparse", "Namespace", kPlainObject},
};

const AllowedGlobal* find_allowed(std::string_view module, std::string_view name) {
  for (const AllowedGlobal& g : kAllowed) {
    if (g.module == module && g.name == name) return &g;
  }
  return nullptr;
}

const char* opcode_name(unsigned char op) {
  switch (op) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
  }
  return nullptr;
}

constexpr int kMaxKeyDepth = 32;
constexpr std::size_t kMaxKeyCodeBytes = 1 << 16;

// A code equal for keys Python's dict treats as equal (1 == 1.0 == True), for the kinds a
// checkpoint uses as keys. Unhashable kinds give false.
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

}  // namespace

// --- the parser ---------------------------------------------------------------------------------

class PickleParser {
 public:
  PickleParser(std::span<const std::byte> bytes, std::string file)
      : in_(bytes), arena_(std::make_shared<detail::PickleArena>()) {
    arena_->file = std::move(file);
  }

  std::pair<std::shared_ptr<detail::PickleArena>, const PickleValue*> run();

 private:
  using K = PickleValue::Kind;
  using Items = PickleValue::Items;

  [[noreturn]] void fail(const std::string& message) const {
    const char* name = opcode_name(op_);
    throw IoError(fmt::format("{}: pickle byte {} (opcode {}): {}", arena_->file, op_pos_,
                              name != nullptr ? name : fmt::format("0x{:02x}", op_), message));
  }

  PickleValue* make(K kind, PickleValue::Data data = {}) {
    count_value();
    auto v = std::make_unique<PickleValue>();
    v->kind_ = kind;
    v->data_ = std::move(data);
    arena_->values.push_back(std::move(v));
    return arena_->values.back().get();
  }

  void count_value() {
    if (++values_ > Pickle::kMaxValues) {
      fail(
          fmt::format("more than {} values and marks; refusing to build more", Pickle::kMaxValues));
    }
  }

  // Input.
  std::size_t left() const { return in_.size() - pos_; }
  std::span<const std::byte> take(std::uint64_t n) {
    if (n > left()) fail(fmt::format("needs {} bytes, the input has {} left", n, left()));
    auto s = in_.subspan(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  std::uint64_t take_le(int bytes) {
    auto s = take(static_cast<std::uint64_t>(bytes));
    std::uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(s[i]);
    return v;
  }
  std::string_view take_line() {
    const auto* begin = reinterpret_cast<const char*>(in_.data()) + pos_;
    const void* nl = std::memchr(begin, '\n', left());
    if (nl == nullptr) fail("the line has no end");
    const auto n = static_cast<std::size_t>(static_cast<const char*>(nl) - begin);
    pos_ += n + 1;
    return {begin, n};
  }
  std::string take_string(std::uint64_t n) {
    auto s = take(n);
    return {reinterpret_cast<const char*>(s.data()), s.size()};
  }

  // Stack (Python's pickle: MARK moves the stack aside, so no opcode pops below a mark).
  void push(PickleValue* v) { stack_.push_back(v); }
  PickleValue* pop() {
    if (stack_.empty()) fail("the stack is empty");
    PickleValue* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  PickleValue* top() {
    if (stack_.empty()) fail("the stack is empty");
    return stack_.back();
  }
  std::vector<PickleValue*> pop_mark() {
    if (metastack_.empty()) fail("no MARK to pop to");
    std::vector<PickleValue*> items = std::move(stack_);
    stack_ = std::move(metastack_.back());
    metastack_.pop_back();
    return items;
  }
  Items as_items(const std::vector<PickleValue*>& v) { return Items(v.begin(), v.end()); }

  PickleValue* memo_get(std::uint64_t i) {
    auto it = memo_.find(i);
    if (it == memo_.end()) fail(fmt::format("memo entry {} was never stored", i));
    return it->second;
  }

  void set_item(PickleValue* dict, const PickleValue* key, const PickleValue* value) {
    if (dict->kind() != K::Dict) fail(fmt::format("sets an item on a {}", kind_name(dict->kind())));
    set_entry(std::get<PickleValue::Dict>(dict->data_), key, value);
  }
  void set_entry(PickleValue::Dict& d, const PickleValue* key, const PickleValue* value) {
    std::string code;
    if (!key_code(key, code, 0))
      fail(fmt::format("unhashable dict key of type {}", kind_name(key->kind())));
    auto [it, inserted] = d.index.emplace(std::move(code), d.entries.size());
    if (inserted) {
      d.entries.emplace_back(key, value);
    } else {
      d.entries[it->second].second = value;
    }
  }

  static std::int64_t int_of(const PickleValue* v, bool* ok) {
    if (v->kind() == K::Int) return std::get<std::int64_t>(v->data());
    if (v->kind() == K::Bool) return std::get<bool>(v->data()) ? 1 : 0;
    *ok = false;
    return 0;
  }
  std::vector<std::int64_t> int_tuple(const PickleValue* v, const char* what) {
    if (v->kind() != K::Tuple && v->kind() != K::List) {
      fail(fmt::format("{} must be a tuple of ints, found a {}", what, kind_name(v->kind())));
    }
    std::vector<std::int64_t> out;
    for (const PickleValue* e : std::get<Items>(v->data())) {
      bool ok = true;
      out.push_back(int_of(e, &ok));
      if (!ok)
        fail(fmt::format("{} must be a tuple of ints, holds a {}", what, kind_name(e->kind())));
    }
    return out;
  }

  void load_int_text(std::string_view line) {
    if (line == "01") return push(make(K::Bool, true));
    if (line == "00") return push(make(K::Bool, false));
    if (!line.empty() && line.back() == 'L') line.remove_suffix(1);
    std::int64_t v = 0;
    const auto r = std::from_chars(line.data(), line.data() + line.size(), v);
    if (r.ec != std::errc() || r.ptr != line.data() + line.size()) {
      fail(fmt::format("'{}' is not a 64-bit integer", line.substr(0, 40)));
    }
    push(make(K::Int, v));
  }

  // Two's complement little-endian of any length that fits 64 bits.
  void load_long(std::uint64_t n) {
    auto s = take(n);
    if (n == 0) return push(make(K::Int, std::int64_t{0}));
    const bool negative = (static_cast<std::uint8_t>(s[n - 1]) & 0x80) != 0;
    const std::uint8_t fill = negative ? 0xff : 0x00;
    for (std::uint64_t i = 8; i < n; ++i) {
      if (static_cast<std::uint8_t>(s[i]) != fill)
        fail(fmt::format("a {}-byte integer does not fit 64 bits", n));
    }
    std::uint64_t u = negative ? ~std::uint64_t{0} : 0;
    for (std::uint64_t i = std::min<std::uint64_t>(n, 8); i-- > 0;) {
      u = (u << 8) | static_cast<std::uint8_t>(s[i]);
    }
    if (n < 8) {
      // Sign-extend from n bytes.
      const unsigned bits = static_cast<unsigned>(n) * 8;
      u &= (std::uint64_t{1} << bits) - 1;
      if (negative) u |= ~((std::uint64_t{1} << bits) - 1);
    } else if (n > 8 && ((u >> 63) != 0) != negative) {
      fail(fmt::format("a {}-byte integer does not fit 64 bits", n));
    }
    push(make(K::Int, static_cast<std::int64_t>(u)));
  }

  void load_global(std::string module, std::string name) {
    const AllowedGlobal* g = find_allowed(module, name);
    if (g == nullptr) {
      fail(fmt::format(
          "global '{}.{}' is not allowed: a PyTorch/DeepSpeed checkpoint references only tensor "
          "rebuild functions, storage types, dtypes, OrderedDict, torch.Size, sets and DeepSpeed's "
          "loss-scaler/config objects (nothing was executed)",
          module, name));
    }
    push(make(K::Global, PickleValue::Global{std::move(module), std::move(name), g->role}));
  }

  const AllowedGlobal& allowed_of(const PickleValue* v) {
    if (v->kind() != K::Global) fail(fmt::format("calls a {}, not a global", kind_name(v->kind())));
    const auto& g = std::get<PickleValue::Global>(v->data());
    return *find_allowed(g.module, g.name);
  }

  PickleValue* make_storage(const PickleValue* pid) {
    if (pid->kind() != K::Tuple)
      fail(fmt::format("persistent id is a {}, expected a tuple", kind_name(pid->kind())));
    const Items& f = std::get<Items>(pid->data());
    const bool shape_ok = f.size() == 5 && f[0]->kind() == K::String &&
                          std::get<std::string>(f[0]->data()) == "storage" &&
                          f[1]->kind() == K::Global && f[2]->kind() == K::String &&
                          f[3]->kind() == K::String && f[4]->kind() == K::Int;
    if (!shape_ok) {
      fail("persistent id is not ('storage', <storage type>, key, location, numel)");
    }
    const AllowedGlobal& type = allowed_of(f[1]);
    if (type.role != kStorageType) {
      fail(fmt::format("persistent id names {}.{}, not a storage type", type.module, type.name));
    }
    TensorRef s;
    s.storage_key = std::get<std::string>(f[2]->data());
    s.device = std::get<std::string>(f[3]->data());
    s.storage_numel = std::get<std::int64_t>(f[4]->data());
    s.dtype = type.scalar;
    if (s.storage_key.empty() || s.storage_numel < 0) {
      fail(fmt::format("storage '{}' with {} elements", s.storage_key, s.storage_numel));
    }
    std::int64_t bytes;
    if (__builtin_mul_overflow(s.storage_numel, static_cast<std::int64_t>(scalar_size(s.dtype)),
                               &bytes)) {
      fail(fmt::format("storage '{}' declares {} elements, more than 64-bit byte counts hold",
                       s.storage_key, s.storage_numel));
    }
    return make(K::Storage, std::move(s));
  }

  PickleValue* make_tensor(const Items& a, bool v2) {
    if (a.size() < 4 || (v2 && a.size() < 6)) {
      fail(fmt::format("tensor rebuild takes (storage, offset, size, stride{}), got {} arguments",
                       v2 ? ", requires_grad, hooks" : "", a.size()));
    }
    if (a[0]->kind() != K::Storage)
      fail(fmt::format("tensor rebuild on a {}, not a storage", kind_name(a[0]->kind())));
    TensorRef t = std::get<TensorRef>(a[0]->data());
    bool ok = true;
    t.offset = int_of(a[1], &ok);
    if (!ok) fail("tensor storage offset is not an int");
    t.shape = int_tuple(a[2], "tensor size");
    t.stride = int_tuple(a[3], "tensor stride");
    if (a.size() > 4 && a[4]->kind() == K::Bool) t.requires_grad = std::get<bool>(a[4]->data());
    if (!view_extent(t.offset, t.shape, t.stride)) {
      fail(fmt::format(
          "tensor on storage '{}' has an invalid view: offset {}, size [{}], stride [{}]",
          t.storage_key, t.offset, fmt::join(t.shape, ", "), fmt::join(t.stride, ", ")));
    }
    return make(K::Tensor, std::move(t));
  }

  PickleValue* call(const PickleValue* callable, const PickleValue* args_value,
                    bool nested = false) {
    const AllowedGlobal& g = allowed_of(callable);
    if (args_value->kind() != K::Tuple) {
      fail(fmt::format("{}.{} called with a {}, not an argument tuple", g.module, g.name,
                       kind_name(args_value->kind())));
    }
    const Items& a = std::get<Items>(args_value->data());
    switch (g.role) {
      case kOrderedDict: {
        PickleValue* d = make(K::Dict, PickleValue::Dict{});
        if (a.empty()) return d;
        if (a.size() != 1 || (a[0]->kind() != K::List && a[0]->kind() != K::Tuple)) {
          fail("OrderedDict takes () or (a list of pairs,)");
        }
        for (const PickleValue* pair : std::get<Items>(a[0]->data())) {
          if ((pair->kind() != K::Tuple && pair->kind() != K::List) ||
              std::get<Items>(pair->data()).size() != 2) {
            fail("OrderedDict items must be pairs");
          }
          const Items& kv = std::get<Items>(pair->data());
          set_item(d, kv[0], kv[1]);
        }
        return d;
      }
      case kSize: {
        if (a.size() != 1) fail("torch.Size takes one tuple");
        (void)int_tuple(a[0], "torch.Size");
        return make(K::Tuple, std::get<Items>(a[0]->data()));
      }
      case kSet:
      case kFrozenSet: {
        if (a.empty()) return make(K::Set, Items{});
        if (a.size() != 1 ||
            (a[0]->kind() != K::List && a[0]->kind() != K::Tuple && a[0]->kind() != K::Set)) {
          fail("set takes () or (a list,)");
        }
        return make(K::Set, std::get<Items>(a[0]->data()));
      }
      case kCodecsEncode: {
        if (a.size() != 2 || a[0]->kind() != K::String || a[1]->kind() != K::String) {
          fail("_codecs.encode takes (str, encoding)");
        }
        const std::string& enc = std::get<std::string>(a[1]->data());
        if (enc != "latin1" && enc != "latin-1")
          fail(fmt::format("_codecs.encode to '{}', expected latin1", enc));
        // The text is UTF-8 of code points below 256 (Python 2-compatible bytes pickling).
        const std::string& text = std::get<std::string>(a[0]->data());
        std::string out;
        for (std::size_t i = 0; i < text.size(); ++i) {
          const auto c = static_cast<unsigned char>(text[i]);
          if (c < 0x80) {
            out += static_cast<char>(c);
          } else if ((c == 0xc2 || c == 0xc3) && i + 1 < text.size() &&
                     (static_cast<unsigned char>(text[i + 1]) & 0xc0) == 0x80) {
            out += static_cast<char>(((c & 0x03) << 6) |
                                     (static_cast<unsigned char>(text[++i]) & 0x3f));
          } else {
            fail("_codecs.encode text is not latin1");
          }
        }
        return make(K::Bytes, std::move(out));
      }
      case kRebuildTensor: return make_tensor(a, false);
      case kRebuildTensorV2: return make_tensor(a, true);
      case kRebuildParameter:
      case kRebuildParameterWithState: {
        if (a.size() < 2 || a[0]->kind() != K::Tensor)
          fail("_rebuild_parameter takes (tensor, requires_grad, ...)");
        TensorRef t = std::get<TensorRef>(a[0]->data());
        if (a[1]->kind() == K::Bool) t.requires_grad = std::get<bool>(a[1]->data());
        return make(K::Tensor, std::move(t));
      }
      case kRebuildFromTypeV2: {
        if (nested || a.size() != 4 || a[0]->kind() != K::Global || a[1]->kind() != K::Global) {
          fail("_rebuild_from_type_v2 takes (rebuild function, tensor type, args, state)");
        }
        if (allowed_of(a[1]).role != kTensorType)
          fail("_rebuild_from_type_v2 of a type other than Tensor/Parameter");
        PickleValue* t = call(a[0], a[2], true);
        if (t->kind() != K::Tensor) fail("_rebuild_from_type_v2 did not rebuild a tensor");
        return t;
      }
      case kPlainObject: {
        return make(K::Object,
                    PickleValue::Object{std::string(g.module) + '.' + std::string(g.name), a,
                                        PickleValue::Dict{}});
      }
      default: break;
    }
    fail(fmt::format("{}.{} cannot be called", g.module, g.name));
  }

  PickleValue* instantiate(const PickleValue* cls, const PickleValue* args) {
    const AllowedGlobal& g = allowed_of(cls);
    if (g.role != kPlainObject && g.role != kOrderedDict && g.role != kSet &&
        g.role != kFrozenSet) {
      fail(fmt::format("{}.{} cannot be instantiated", g.module, g.name));
    }
    return call(cls, args);
  }

  void build(PickleValue* inst, const PickleValue* state) {
    if (inst->kind() == K::Object) {
      auto& obj = std::get<PickleValue::Object>(inst->data_);
      auto apply = [&](const PickleValue* s) {
        if (s->kind() == K::None) return;
        if (s->kind() != K::Dict)
          fail(fmt::format("object state is a {}, expected a dict", kind_name(s->kind())));
        for (const auto& [k, v] : std::get<PickleValue::Dict>(s->data()).entries) {
          if (k->kind() != K::String) fail("object attribute names must be strings");
          set_entry(obj.attrs, k, v);
        }
      };
      if (state->kind() == K::Tuple && std::get<Items>(state->data()).size() == 2) {
        apply(std::get<Items>(state->data())[0]);
        apply(std::get<Items>(state->data())[1]);
      } else {
        apply(state);
      }
      return;
    }
    if (inst->kind() == K::Dict) return;  // OrderedDict attributes (state_dict._metadata)
    fail(fmt::format("BUILD on a {}", kind_name(inst->kind())));
  }

  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
  std::size_t op_pos_ = 0;
  unsigned char op_ = 0;
  std::shared_ptr<detail::PickleArena> arena_;
  std::vector<PickleValue*> stack_;
  std::vector<std::vector<PickleValue*>> metastack_;
  std::unordered_map<std::uint64_t, PickleValue*> memo_;
  std::size_t values_ = 0;
};

std::pair<std::shared_ptr<detail::PickleArena>, const PickleValue*> PickleParser::run() {
  while (true) {
    op_pos_ = pos_;
    if (left() == 0) {
      op_ = 0;
      throw IoError(
          fmt::format("{}: pickle ends at byte {} without a STOP opcode", arena_->file, pos_));
    }
    op_ = static_cast<unsigned char>(in_[pos_++]);
    switch (op_) {
      case 0x80: {  // PROTO
        const auto v = take_le(1);
        if (v > 5) fail(fmt::format("protocol {} is newer than 5", v));
        break;
      }
      case 0x95: (void)take_le(8); break;  // FRAME: framing only
      case '.': {
        PickleValue* result = pop();
        return {std::move(arena_), result};
      }
      case '(':
        count_value();
        metastack_.push_back(std::move(stack_));
        stack_.clear();
        break;
      case '0':
        if (!stack_.empty()) {
          stack_.pop_back();
        } else {
          (void)pop_mark();
        }
        break;
      case '1': (void)pop_mark(); break;
      case '2': push(top()); break;

      case 'N': push(make(K::None)); break;
      case 0x88: push(make(K::Bool, true)); break;
      case 0x89: push(make(K::Bool, false)); break;
      case 'I': load_int_text(take_line()); break;
      case 'L': load_int_text(take_line()); break;
      case 'J':
        push(make(K::Int, static_cast<std::int64_t>(static_cast<std::int32_t>(take_le(4)))));
        break;
      case 'K': push(make(K::Int, static_cast<std::int64_t>(take_le(1)))); break;
      case 'M': push(make(K::Int, static_cast<std::int64_t>(take_le(2)))); break;
      case 0x8a: load_long(take_le(1)); break;
      case 0x8b: {
        const auto n = static_cast<std::int32_t>(take_le(4));
        if (n < 0) fail("negative length");
        load_long(static_cast<std::uint64_t>(n));
        break;
      }
      case 'G': {
        auto s = take(8);
        std::uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<std::uint8_t>(s[i]);
        push(make(K::Float, std::bit_cast<double>(bits)));
        break;
      }
      case 'F': {
        const std::string_view line = take_line();
        double v = 0;
        const auto r = std::from_chars(line.data(), line.data() + line.size(), v);
        if (r.ec != std::errc() || r.ptr != line.data() + line.size()) {
          fail(fmt::format("'{}' is not a float", line.substr(0, 40)));
        }
        push(make(K::Float, v));
        break;
      }

      case 'X': push(make(K::String, take_string(take_le(4)))); break;
      case 0x8c: push(make(K::String, take_string(take_le(1)))); break;
      case 0x8d: push(make(K::String, take_string(take_le(8)))); break;
      case 'T': {
        const auto n = static_cast<std::int32_t>(take_le(4));
        if (n < 0) fail("negative length");
        push(make(K::String, take_string(static_cast<std::uint64_t>(n))));
        break;
      }
      case 'U': push(make(K::String, take_string(take_le(1)))); break;
      case 'V': {
        const std::string_view line = take_line();
        if (line.find('\\') != std::string_view::npos)
          fail("escaped UNICODE text is not supported");
        push(make(K::String, std::string(line)));
        break;
      }
      case 'B': push(make(K::Bytes, take_string(take_le(4)))); break;
      case 'C': push(make(K::Bytes, take_string(take_le(1)))); break;
      case 0x8e: push(make(K::Bytes, take_string(take_le(8)))); break;

      case ']': push(make(K::List, Items{})); break;
      case 'l': push(make(K::List, as_items(pop_mark()))); break;
      case 'a': {
        PickleValue* v = pop();
        PickleValue* list = top();
        if (list->kind() != K::List) fail(fmt::format("appends to a {}", kind_name(list->kind())));
        std::get<Items>(list->data_).push_back(v);
        break;
      }
      case 'e': {
        auto items = pop_mark();
        PickleValue* list = top();
        if (list->kind() != K::List) fail(fmt::format("appends to a {}", kind_name(list->kind())));
        auto& dst = std::get<Items>(list->data_);
        dst.insert(dst.end(), items.begin(), items.end());
        break;
      }
      case ')': push(make(K::Tuple, Items{})); break;
      case 't': push(make(K::Tuple, as_items(pop_mark()))); break;
      case 0x85:
      case 0x86:
      case 0x87: {
        const std::size_t n = op_ - 0x84u;
        if (stack_.size() < n)
          fail(fmt::format("needs {} values, the stack holds {}", n, stack_.size()));
        Items items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
        stack_.resize(stack_.size() - n);
        push(make(K::Tuple, std::move(items)));
        break;
      }
      case '}': push(make(K::Dict, PickleValue::Dict{})); break;
      case 'd': {
        auto items = pop_mark();
        if (items.size() % 2 != 0) fail("DICT with an odd number of values");
        PickleValue* d = make(K::Dict, PickleValue::Dict{});
        for (std::size_t i = 0; i < items.size(); i += 2) set_item(d, items[i], items[i + 1]);
        push(d);
        break;
      }
      case 's': {
        PickleValue* v = pop();
        PickleValue* k = pop();
        set_item(top(), k, v);
        break;
      }
      case 'u': {
        auto items = pop_mark();
        if (items.size() % 2 != 0) fail("SETITEMS with an odd number of values");
        PickleValue* d = top();
        for (std::size_t i = 0; i < items.size(); i += 2) set_item(d, items[i], items[i + 1]);
        break;
      }
      case 0x8f: push(make(K::Set, Items{})); break;
      case 0x90: {
        auto items = pop_mark();
        PickleValue* set = top();
        if (set->kind() != K::Set) fail(fmt::format("adds items to a {}", kind_name(set->kind())));
        auto& dst = std::get<Items>(set->data_);
        dst.insert(dst.end(), items.begin(), items.end());
        break;
      }
      case 0x91: push(make(K::Set, as_items(pop_mark()))); break;

      case 'c': {
        std::string module(take_line());
        std::string name(take_line());
        load_global(std::move(module), std::move(name));
        break;
      }
      case 0x93: {
        PickleValue* name = pop();
        PickleValue* module = pop();
        if (module->kind() != K::String || name->kind() != K::String)
          fail("STACK_GLOBAL needs two strings");
        load_global(std::get<std::string>(module->data()), std::get<std::string>(name->data()));
        break;
      }
      case 'R': {
        PickleValue* args = pop();
        PickleValue* callable = pop();
        push(call(callable, args));
        break;
      }
      case 0x81: {
        PickleValue* args = pop();
        PickleValue* cls = pop();
        push(instantiate(cls, args));
        break;
      }
      case 0x92: {
        PickleValue* kwargs = pop();
        PickleValue* args = pop();
        PickleValue* cls = pop();
        if (kwargs->kind() != K::Dict ||
            !std::get<PickleValue::Dict>(kwargs->data()).entries.empty()) {
          fail("NEWOBJ_EX with keyword arguments");
        }
        push(instantiate(cls, args));
        break;
      }
      case 'b': {
        PickleValue* state = pop();
        build(top(), state);
        break;
      }
      case 'Q': push(make_storage(pop())); break;

      case 'p': {
        const std::string_view line = take_line();
        std::uint64_t i = 0;
        const auto r = std::from_chars(line.data(), line.data() + line.size(), i);
        if (r.ec != std::errc() || r.ptr != line.data() + line.size()) fail("bad memo index");
        memo_[i] = top();
        break;
      }
      case 'q': memo_[take_le(1)] = top(); break;
      case 'r': memo_[take_le(4)] = top(); break;
      case 0x94: memo_[memo_.size()] = top(); break;
      case 'g': {
        const std::string_view line = take_line();
        std::uint64_t i = 0;
        const auto r = std::from_chars(line.data(), line.data() + line.size(), i);
        if (r.ec != std::errc() || r.ptr != line.data() + line.size()) fail("bad memo index");
        push(memo_get(i));
        break;
      }
      case 'h': push(memo_get(take_le(1))); break;
      case 'j': push(memo_get(take_le(4))); break;

      default: {
        const char* name = opcode_name(op_);
        fail(name != nullptr ? "this opcode is not supported by the restricted reader (it "
                               "instantiates arbitrary classes, or torch.save never writes it)"
                             : "not a pickle opcode");
      }
    }
  }
}

Pickle Pickle::parse(std::span<const std::byte> bytes, std::string file) {
  PickleParser parser(bytes, std::move(file));
  auto [arena, root] = parser.run();
  Pickle p;
  p.arena_ = std::move(arena);
  p.root_ = root;
  return p;
}

PickleView Pickle::root() const {
  return PickleView(arena_, root_, "");
}

std::size_t Pickle::value_count() const {
  return arena_->values.size();
}

// --- views --------------------------------------------------------------------------------------

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
  auto it = d->index.find(string_key_code(key));
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
  auto it = d->index.find(int_key_code(key));
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
