// Test helper: writes small PyTorch-style .pt files (a protocol-2 pickle of a value tree plus
// storages, in a zip archive made with libzip) so tests can build checkpoints the fixtures do
// not cover: padding, more ranks, sub-groups, frozen and tied parameters, broken files.
#pragma once

#include <zip.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace zero::dscheckpoint::testing {

// A Python value as torch.save would pickle it.
struct Py {
  enum class K {
    None,
    Bool,
    Int,
    Float,
    Str,
    List,
    Tuple,
    Dict,
    OrderedDict,
    Size,
    Tensor,
    Object,
    Enum,
    Global
  };
  K k = K::None;
  bool b = false;
  std::int64_t i = 0;
  double f = 0;
  std::string s;                           // Str; Object/Enum/Global "module name"
  std::vector<Py> items;                   // List, Tuple, Size (ints)
  std::vector<std::pair<Py, Py>> entries;  // Dict, OrderedDict, Object attributes
  // Tensor: storage key, storage type ("FloatStorage"), storage numel, offset, shape, stride.
  std::string storage_key, storage_type = "FloatStorage";
  std::int64_t storage_numel = 0, offset = 0;
  std::vector<std::int64_t> shape, stride;
};

inline Py none() {
  return {};
}
inline Py boolean(bool v) {
  Py p;
  p.k = Py::K::Bool;
  p.b = v;
  return p;
}
inline Py integer(std::int64_t v) {
  Py p;
  p.k = Py::K::Int;
  p.i = v;
  return p;
}
inline Py number(double v) {
  Py p;
  p.k = Py::K::Float;
  p.f = v;
  return p;
}
inline Py str(std::string v) {
  Py p;
  p.k = Py::K::Str;
  p.s = std::move(v);
  return p;
}
inline Py list(std::vector<Py> v) {
  Py p;
  p.k = Py::K::List;
  p.items = std::move(v);
  return p;
}
inline Py tuple(std::vector<Py> v) {
  Py p;
  p.k = Py::K::Tuple;
  p.items = std::move(v);
  return p;
}
inline Py dict(std::vector<std::pair<Py, Py>> v) {
  Py p;
  p.k = Py::K::Dict;
  p.entries = std::move(v);
  return p;
}
inline Py odict(std::vector<std::pair<Py, Py>> v) {
  Py p;
  p.k = Py::K::OrderedDict;
  p.entries = std::move(v);
  return p;
}
inline Py size(const std::vector<std::int64_t>& shape) {
  Py p;
  p.k = Py::K::Size;
  for (auto d : shape) p.items.push_back(integer(d));
  return p;
}
inline Py global(std::string module_space_name) {
  Py p;
  p.k = Py::K::Global;
  p.s = std::move(module_space_name);
  return p;
}
// An object pickled as NEWOBJ + BUILD (DeepSpeed's loss scaler, fragment_address).
inline Py object(std::string module_space_name, std::vector<std::pair<Py, Py>> attrs) {
  Py p;
  p.k = Py::K::Object;
  p.s = std::move(module_space_name);
  p.entries = std::move(attrs);
  return p;
}
// An Enum pickled as REDUCE(cls, (value,)) (ZeroStageEnum).
inline Py enum_value(std::string module_space_name, std::int64_t v) {
  Py p;
  p.k = Py::K::Enum;
  p.s = std::move(module_space_name);
  p.i = v;
  return p;
}
inline Py tensor(std::string key, std::int64_t storage_numel, std::int64_t offset,
                 std::vector<std::int64_t> shape, std::string storage_type = "FloatStorage") {
  Py p;
  p.k = Py::K::Tensor;
  p.storage_key = std::move(key);
  p.storage_type = std::move(storage_type);
  p.storage_numel = storage_numel;
  p.offset = offset;
  p.shape = std::move(shape);
  std::int64_t st = 1;
  p.stride.resize(p.shape.size());
  for (std::size_t d = p.shape.size(); d-- > 0;) {
    p.stride[d] = st;
    st *= p.shape[d];
  }
  return p;
}

class Pickler {
 public:
  std::string out;

  static std::string dumps(const Py& v) {
    Pickler p;
    p.out += "\x80\x02";
    p.value(v);
    p.out += '.';
    return p.out;
  }

  void op(char c) { out += c; }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  void string(const std::string& s) {
    op('X');
    u32(static_cast<std::uint32_t>(s.size()));
    out += s;
  }
  void global_op(const std::string& module_space_name) {
    const auto sp = module_space_name.find(' ');
    out += 'c';
    out += module_space_name.substr(0, sp) + '\n' + module_space_name.substr(sp + 1) + '\n';
  }
  void integer_op(std::int64_t v) {
    if (v >= 0 && v < 256) {
      op('K');
      out += static_cast<char>(v);
      return;
    }
    if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      u32(static_cast<std::uint32_t>(static_cast<std::int32_t>(v)));
      return;
    }
    op('\x8a');
    out += '\x08';
    for (int i = 0; i < 8; ++i)
      out += static_cast<char>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff);
  }
  void ints_tuple(const std::vector<std::int64_t>& v) {
    op('(');
    for (auto d : v) integer_op(d);
    op('t');
  }
  void entries(const std::vector<std::pair<Py, Py>>& e) {
    if (e.empty()) return;
    op('(');
    for (const auto& [k, v] : e) {
      value(k);
      value(v);
    }
    op('u');
  }

  void value(const Py& v) {
    switch (v.k) {
      case Py::K::None: op('N'); break;
      case Py::K::Bool: op(v.b ? '\x88' : '\x89'); break;
      case Py::K::Int: integer_op(v.i); break;
      case Py::K::Float: {
        op('G');
        std::uint64_t bits;
        std::memcpy(&bits, &v.f, 8);
        for (int i = 7; i >= 0; --i) out += static_cast<char>((bits >> (8 * i)) & 0xff);
        break;
      }
      case Py::K::Str: string(v.s); break;
      case Py::K::List:
        op(']');
        if (!v.items.empty()) {
          op('(');
          for (const auto& e : v.items) value(e);
          op('e');
        }
        break;
      case Py::K::Tuple:
        op('(');
        for (const auto& e : v.items) value(e);
        op('t');
        break;
      case Py::K::Dict:
        op('}');
        entries(v.entries);
        break;
      case Py::K::OrderedDict:
        global_op("collections OrderedDict");
        op(')');
        op('R');
        entries(v.entries);
        break;
      case Py::K::Size:
        global_op("torch Size");
        op('(');
        op('(');
        for (const auto& e : v.items) value(e);
        op('t');
        op('t');
        op('R');
        break;
      case Py::K::Global: global_op(v.s); break;
      case Py::K::Object:
        global_op(v.s);
        op(')');
        op('\x81');
        op('}');
        entries(v.entries);
        op('b');
        break;
      case Py::K::Enum:
        global_op(v.s);
        op('(');
        integer_op(v.i);
        op('t');
        op('R');
        break;
      case Py::K::Tensor:
        global_op("torch._utils _rebuild_tensor_v2");
        op('(');
        op('(');
        string("storage");
        global_op("torch " + v.storage_type);
        string(v.storage_key);
        string("cpu");
        integer_op(v.storage_numel);
        op('t');
        op('Q');
        integer_op(v.offset);
        ints_tuple(v.shape);
        ints_tuple(v.stride);
        op('\x89');
        global_op("collections OrderedDict");
        op(')');
        op('R');
        op('t');
        op('R');
        break;
    }
  }
};

// Writes a zip archive at `path` with entries "<archive>/data.pkl", "<archive>/data/<key>" and
// "<archive>/version", all stored uncompressed, as torch.save lays them out.
inline void write_pt(const std::string& path, const std::string& archive, const std::string& pickle,
                     const std::map<std::string, std::vector<float>>& storages,
                     const std::map<std::string, std::string>& raw_storages = {}) {
  int err = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  if (z == nullptr) throw std::runtime_error("write_pt: cannot create " + path);
  // libzip copies nothing until zip_close, so the buffers live until then.
  std::vector<std::unique_ptr<std::string>> keep;
  auto add = [&](const std::string& name, std::string bytes) {
    keep.push_back(std::make_unique<std::string>(std::move(bytes)));
    zip_source_t* src = zip_source_buffer(z, keep.back()->data(), keep.back()->size(), 0);
    const zip_int64_t idx = zip_file_add(z, name.c_str(), src, ZIP_FL_OVERWRITE);
    if (idx < 0) throw std::runtime_error("write_pt: cannot add " + name);
    zip_set_file_compression(z, static_cast<zip_uint64_t>(idx), ZIP_CM_STORE, 0);
  };
  add(archive + "/data.pkl", pickle);
  for (const auto& [key, values] : storages) {
    add(archive + "/data/" + key,
        std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  }
  for (const auto& [key, bytes] : raw_storages) add(archive + "/data/" + key, bytes);
  add(archive + "/version", "3\n");
  if (zip_close(z) != 0) throw std::runtime_error("write_pt: cannot write " + path);
}

}  // namespace zero::dscheckpoint::testing
