// A restricted reader of Python pickles as torch.save writes them (protocol 2; the protocol 3-5
// opcodes that carry plain values are accepted too). It builds plain values only: None, bools,
// ints, floats, strings, bytes, lists, tuples, sets, dicts, and tensors as references into the
// checkpoint's storages. Nothing is ever executed. GLOBAL names only an allow-list:
//   - torch._utils._rebuild_tensor(_v2), _rebuild_parameter(_with_state),
//     torch._tensor._rebuild_from_type_v2 (with torch.Tensor / torch.nn.Parameter): tensors
//   - torch.<Type>Storage (Float, Double, Half, BFloat16, Long, Int, Short, Char, Byte, Bool) and
//     torch.UntypedStorage, as persistent ids ('storage', type, key, location, numel)
//   - torch dtypes (torch.float16 ...), kept as named constants
//   - collections.OrderedDict (a dict; instance attributes such as state_dict's _metadata are
//     dropped), torch.Size (a tuple), builtins set/frozenset, _codecs.encode (bytes)
//   - DeepSpeed's pickled objects (loss scalers, ZeroStageEnum, fragment_address, ...) and
//     argparse.Namespace, kept as Objects: a type name, constructor arguments and attributes
// Any other global is an error naming it, the file and the byte offset. Malformed input of any
// kind throws zero::IoError. Every opcode builds at most one value (under 200 bytes), and a
// pickle may build at most Pickle::kMaxValues values and marks, so memory stays bounded however
// the input is crafted (a real state dict needs about 15 per tensor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace zero::dscheckpoint {

// Element types of torch storages.
enum class ScalarType : std::uint8_t { F32, F64, F16, BF16, I64, I32, I16, I8, U8, Bool };
std::size_t scalar_size(ScalarType t);
// torch spelling: "float32", "bfloat16", "int64", ...
std::string_view scalar_name(ScalarType t);

// A tensor as the pickle describes it: a strided view of a storage held in the archive entry
// "<archive>/data/<storage_key>". Offsets, shape and stride count elements. The parser checks
// the arithmetic (no negative sizes, nothing overflows); whether the storage really holds
// span_elems() elements is checked when the tensor is read (pt_file.h).
struct TensorRef {
  std::string storage_key;
  ScalarType dtype = ScalarType::F32;
  std::string device;              // the saved location: "cpu", "cuda:0", ...
  std::int64_t storage_numel = 0;  // elements, as the persistent id declares them
  std::int64_t offset = 0;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> stride;
  bool requires_grad = false;

  std::int64_t numel() const;
  // Elements of the storage the view reaches: 1 + the largest index, or 0 when empty.
  std::int64_t span_elems() const;
  bool is_contiguous() const;
};

class PickleValue {
 public:
  enum class Kind : std::uint8_t {
    None,
    Bool,
    Int,
    Float,
    String,
    Bytes,
    List,
    Tuple,
    Set,
    Dict,
    Tensor,
    Storage,
    Global,
    Object
  };
  using Items = std::vector<const PickleValue*>;
  struct Dict {
    std::vector<std::pair<const PickleValue*, const PickleValue*>> entries;  // insertion order
    std::unordered_map<std::string, std::size_t> index;                      // key code → entry
  };
  struct Global {
    std::string module;
    std::string name;
    int role = 0;  // pickle_globals.cpp's allow-list entry
  };
  struct Object {
    std::string type;  // "module.Name"
    Items args;        // constructor arguments (an Enum's value)
    Dict attrs;        // from BUILD; string keys
  };
  using Data = std::variant<std::monostate, bool, std::int64_t, double, std::string, Items, Dict,
                            TensorRef, Global, Object>;

  Kind kind() const { return kind_; }
  const Data& data() const { return data_; }

 private:
  friend class PickleParser;
  Kind kind_ = Kind::None;
  Data data_;
};

std::string_view kind_name(PickleValue::Kind k);

namespace detail {
struct PickleArena;
}

// A value in a parsed pickle together with where it is: the file and the key path from the
// root ("optimizer_state_dict.fp32_flat_groups[0]"). Every accessor checks the kind and throws
// zero::IoError "<file>: <path>: expected <what>, found <what>" on a mismatch. Views keep the
// parsed pickle alive.
class PickleView {
 public:
  PickleValue::Kind kind() const { return value_->kind(); }
  const PickleValue& value() const { return *value_; }
  const std::string& file() const;
  // "" at the root.
  const std::string& path() const { return path_; }
  bool is_none() const { return kind() == PickleValue::Kind::None; }
  bool is(PickleValue::Kind k) const { return kind() == k; }

  // Dict entries (string keys) and Object attributes.
  std::optional<PickleView> find(std::string_view key) const;
  PickleView get(std::string_view key) const;
  bool has(std::string_view key) const { return find(key).has_value(); }
  // Dict entries with int keys (optimizer state ids).
  std::optional<PickleView> find(std::int64_t key) const;
  PickleView get(std::int64_t key) const;
  // Dict entries in insertion order (first: key, second: value).
  std::vector<std::pair<PickleView, PickleView>> entries() const;

  // List, Tuple and Set elements; an Object's constructor arguments.
  std::size_t size() const;
  PickleView element(std::size_t i) const;
  std::vector<PickleView> elements() const;

  bool as_bool() const;
  std::int64_t as_int() const;
  // An int or a float.
  double as_number() const;
  const std::string& as_string() const;
  const TensorRef& as_tensor() const;
  // A tuple or list of non-negative ints (torch.Size).
  std::vector<std::int64_t> as_shape() const;
  // "module.name" of a Global; the type of an Object.
  const std::string& type_name() const;
  // Text of a dict key for messages and maps: a string as is, an int in decimal.
  std::string key_text() const;

  // Throws IoError "<file>: <path>: expected <expected>, found <a description of this value>".
  [[noreturn]] void fail(std::string_view expected) const;
  // Throws IoError "<file>: <path>: <message>".
  [[noreturn]] void error(std::string_view message) const;

  // Plain JSON: dicts with string or int keys become objects, sequences arrays, tensors
  // {"__tensor__": {...}}, globals "module.name", objects {"__type__": ..., attributes...}.
  // Throws IoError past kMaxJsonDepth levels or kMaxJsonNodes nodes (a shared or cyclic
  // structure).
  nlohmann::json to_json() const;
  static constexpr int kMaxJsonDepth = 200;
  static constexpr std::size_t kMaxJsonNodes = 1 << 20;

 private:
  friend class Pickle;
  PickleView(std::shared_ptr<const detail::PickleArena> arena, const PickleValue* value,
             std::string path)
      : arena_(std::move(arena)), value_(value), path_(std::move(path)) {}
  PickleView child(const PickleValue* v, std::string path) const {
    return PickleView(arena_, v, std::move(path));
  }
  std::string where() const;

  std::shared_ptr<const detail::PickleArena> arena_;
  const PickleValue* value_;
  std::string path_;
};

class Pickle {
 public:
  // Parses `bytes`; `file` names the input in errors. Throws IoError on anything malformed or
  // not allowed, with the byte offset of the offending opcode.
  static Pickle parse(std::span<const std::byte> bytes, std::string file);
  static constexpr std::size_t kMaxValues = std::size_t{1} << 23;

  PickleView root() const;
  std::size_t value_count() const;

 private:
  std::shared_ptr<const detail::PickleArena> arena_;
  const PickleValue* root_ = nullptr;
};

}  // namespace zero::dscheckpoint
