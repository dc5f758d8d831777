// The allow-list of globals (pickle.h lists it) and what the parser builds from them: GLOBAL and
// STACK_GLOBAL look names up here, persistent ids become storages, and REDUCE, NEWOBJ and BUILD
// call an allowed global with its arguments to build a plain value. Nothing is ever executed.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "zero/base/error.h"
#include "zero/dscheckpoint/pickle.h"
#include "zero/dscheckpoint/pickle_impl.h"

namespace zero::dscheckpoint {

// --- the allow-list -----------------------------------------------------------------------------

namespace detail {

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

namespace {

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
}  // namespace

}  // namespace detail

// --- what the parser builds from allowed globals ------------------------------------------------

using namespace detail;

std::vector<std::int64_t> PickleParser::int_tuple(const PickleValue* v, const char* what) {
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

void PickleParser::load_global(std::string module, std::string name) {
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

const detail::AllowedGlobal& PickleParser::allowed_of(const PickleValue* v) {
  if (v->kind() != K::Global) fail(fmt::format("calls a {}, not a global", kind_name(v->kind())));
  const auto& g = std::get<PickleValue::Global>(v->data());
  return *find_allowed(g.module, g.name);
}

PickleValue* PickleParser::make_storage(const PickleValue* pid) {
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

PickleValue* PickleParser::make_tensor(const Items& a, bool v2) {
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
    fail(
        fmt::format("tensor on storage '{}' has an invalid view: offset {}, size [{}], stride [{}]",
                    t.storage_key, t.offset, fmt::join(t.shape, ", "), fmt::join(t.stride, ", ")));
  }
  return make(K::Tensor, std::move(t));
}

PickleValue* PickleParser::call(const PickleValue* callable, const PickleValue* args_value,
                                bool nested) {
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
          out +=
              static_cast<char>(((c & 0x03) << 6) | (static_cast<unsigned char>(text[++i]) & 0x3f));
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
      return make(K::Object, PickleValue::Object{std::string(g.module) + '.' + std::string(g.name),
                                                 a, PickleValue::Dict{}});
    }
    default: break;
  }
  fail(fmt::format("{}.{} cannot be called", g.module, g.name));
}

PickleValue* PickleParser::instantiate(const PickleValue* cls, const PickleValue* args) {
  const AllowedGlobal& g = allowed_of(cls);
  if (g.role != kPlainObject && g.role != kOrderedDict && g.role != kSet && g.role != kFrozenSet) {
    fail(fmt::format("{}.{} cannot be instantiated", g.module, g.name));
  }
  return call(cls, args);
}

void PickleParser::build(PickleValue* inst, const PickleValue* state) {
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

}  // namespace zero::dscheckpoint
