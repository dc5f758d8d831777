#include "zero/dscheckpoint/deepspeed_model_states.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "zero/base/error.h"

namespace zero::dscheckpoint {

namespace fs = std::filesystem;
using Impl = DeepSpeedCheckpoint::Impl;

DType saved_dtype(const TensorRef& t) {
  switch (t.dtype) {
    case ScalarType::F16: return DType::F16;
    case ScalarType::BF16: return DType::BF16;
    default: return DType::F32;
  }
}

double scalar_number(const PtFile& file, const PickleView& v) {
  if (v.is(PickleValue::Kind::Tensor)) {
    const TensorRef& t = file.tensor(v);
    if (t.numel() != 1) v.fail("a one-element tensor");
    float x = 0;
    file.read_f32(v, 0, std::span<float>(&x, 1));
    return x;
  }
  return v.as_number();
}

std::int64_t stage_value(const PickleView& v) {
  if (v.is(PickleValue::Kind::Int)) return v.as_int();
  if (v.is(PickleValue::Kind::Object) && v.size() == 1) return v.element(0).as_int();
  v.fail("a ZeroStageEnum or an int");
}

int partition_count(const PickleView& v) {
  std::int64_t w = 0;
  if (v.is(PickleValue::Kind::Int)) {
    w = v.as_int();
  } else {
    for (const PickleView& e : v.elements()) w = std::max(w, e.as_int());
  }
  if (w < 1 || w > (1 << 20)) v.fail("a positive partition count");
  return static_cast<int>(w);
}

void read_state_names_and_step(Impl& ck, const PtFile& f, const PickleView& state) {
  for (const auto& [k, v] : state.entries()) {
    if (k.is(PickleValue::Kind::String) && v.is(PickleValue::Kind::Tensor) &&
        k.as_string() != "step") {
      ck.state_names.push_back(k.as_string());
    }
  }
  if (auto s = state.find("step")) ck.step = std::llround(scalar_number(f, *s));
}

void read_param_groups(Impl& ck, const PickleView& param_groups) {
  for (const PickleView& pg : param_groups.elements()) {
    nlohmann::json j = pg.to_json();
    if (!j.is_object()) pg.fail("a param group dict");
    j.erase("params");
    ck.param_groups.push_back(std::move(j));
  }
}

ModelStates read_model_states(Impl& ck, const fs::path& model_file) {
  const std::size_t file = ck.add_file(model_file);
  return read_model_states(ck, file, PtFile::open(ck.files[file]));
}

ModelStates read_model_states(Impl& ck, std::size_t file, const PtFile& f) {
  ModelStates ms;
  const PickleView root = f.root();
  const PickleView module = root.get("module");
  std::set<std::string> buffer_names;
  if (auto b = root.find("buffer_names"); b && !b->is_none()) {
    for (const PickleView& e : b->elements()) buffer_names.insert(e.as_string());
  }
  bool dtype_set = false;
  for (const auto& [k, v] : module.entries()) {
    const std::string name = k.as_string();
    ms.module_order.push_back(name);
    if (!dtype_set && v.is(PickleValue::Kind::Tensor)) {
      switch (v.as_tensor().dtype) {
        case ScalarType::F32: ck.dtype = "fp32"; break;
        case ScalarType::F16: ck.dtype = "fp16"; break;
        case ScalarType::BF16: ck.dtype = "bf16"; break;
        default: ck.dtype = std::string(scalar_name(v.as_tensor().dtype)); break;
      }
      dtype_set = true;
    }
    if (buffer_names.count(name)) {
      ms.buffers.emplace(name, ck.locate(file, f, v));
    } else if (v.is(PickleValue::Kind::Tensor)) {
      ms.module_params.emplace_back(name, ck.locate(file, f, v));
    }
  }
  for (const std::string& b : buffer_names) {
    if (!ms.buffers.count(b))
      module.error(fmt::format("expected buffer '{}' (listed in buffer_names)", b));
  }
  if (auto shapes = root.find("param_shapes"); shapes && !shapes->is_none()) {
    for (const PickleView& group : shapes->elements()) {
      std::vector<Named> named;
      for (const auto& [k, v] : group.entries())
        named.push_back({k.as_string(), v.as_shape(), where_of(v)});
      ms.group_shapes.push_back(std::move(named));
    }
  }
  if (auto fs_ = root.find("frozen_param_shapes"); fs_ && !fs_->is_none()) {
    for (const auto& [k, v] : fs_->entries())
      ms.frozen.push_back({k.as_string(), v.as_shape(), where_of(v)});
  }
  if (!ms.frozen.empty()) {
    const PickleView frags = root.get("frozen_param_fragments");
    for (const Named& p : ms.frozen)
      ms.frozen_sources[p.name].add(ck.locate(file, f, frags.get(p.name)));
  }
  if (auto sp = root.find("shared_params"); sp && !sp->is_none()) {
    for (const auto& [k, v] : sp->entries()) ms.shared.emplace_back(k.as_string(), v.as_string());
  }
  auto int_or = [&](const char* key, std::int64_t otherwise) -> std::int64_t {
    auto v = root.find(key);
    return v && !v->is_none() ? v->as_int() : otherwise;
  };
  ck.global_steps = int_or("global_steps", 0);
  ck.global_samples = int_or("global_samples", 0);
  ck.skipped_steps = int_or("skipped_steps", 0);
  ck.dp_world_size = static_cast<int>(int_or("dp_world_size", 1));
  if (auto v = root.find("lr_scheduler")) ck.lr_scheduler = v->to_json();
  if (auto v = root.find("ds_config")) ck.ds_config = v->to_json();
  if (auto v = root.find("ds_version"); v && v->is(PickleValue::Kind::String))
    ck.ds_version = v->as_string();
  return ms;
}

namespace {

void add_frozen_and_buffers(Impl& ck, ModelStates& ms, Found& found) {
  for (const Named& p : ms.frozen) {
    const auto n = static_cast<std::uint64_t>(shape_numel(p.shape, p.where));
    Impl::Source& s = ms.frozen_sources.at(p.name);
    // Stage 3 fragments are the ranks' padded shares; the padding is dropped on read.
    const bool ok = ck.stage == 3 ? s.numel >= n : s.numel == n;
    if (!ok) {
      throw IoError(
          fmt::format("{}: frozen_param_fragments['{}'] hold {} elements, expected {} "
                      "for shape [{}]",
                      s.parts.front().where, p.name, s.numel, n, fmt::join(p.shape, ", ")));
    }
    const DType dtype = saved_dtype(s.parts.front().ref);
    const std::size_t id = ck.add_source(std::move(s));
    found.add({.name = p.name, .shape = p.shape, .trainable = false, .saved_dtype = dtype},
              {{{id, 0, n}}, false});
  }
  for (auto& [name, loc] : ms.buffers) {
    const std::vector<std::int64_t> shape = loc.ref.shape;
    const std::uint64_t n = loc.numel;
    const DType dtype = saved_dtype(loc.ref);
    Impl::Source s;
    s.add(std::move(loc));
    const std::size_t id = ck.add_source(std::move(s));
    found.add({.name = name, .shape = shape, .trainable = false, .buffer = true,
               .saved_dtype = dtype},
              {{{id, 0, n}}, false});
  }
}

// Each alias whose owner is known becomes a parameter of its own reading the owner's recipe.
void add_tied(const ModelStates& ms, const std::string& model0, Found& found,
              std::unordered_map<std::string, std::size_t>& index) {
  for (std::size_t i = 0; i < found.params.size(); ++i) {
    if (!index.emplace(found.params[i].name, i).second) {
      throw IoError(
          fmt::format("{}: parameter '{}' appears twice (in param_shapes, "
                      "frozen_param_shapes or buffer_names)",
                      model0, found.params[i].name));
    }
  }
  for (const auto& [alias, owner] : ms.shared) {
    auto it = index.find(owner);
    if (it == index.end() || index.count(alias)) continue;  // as zero_to_fp32: only known owners
    DsParam p = found.params[it->second];
    p.name = alias;
    p.tied_to = owner;
    Impl::Recipe rec = found.recipes[it->second];
    found.add(std::move(p), std::move(rec));
    index.emplace(alias, found.params.size() - 1);
  }
}

// Model order: the saved module state_dict's, then whatever it does not list.
void place_in_model_order(Impl& ck, const ModelStates& ms, const Found& found,
                          const std::unordered_map<std::string, std::size_t>& index) {
  std::vector<bool> placed(found.params.size(), false);
  auto place = [&](std::size_t i) {
    if (placed[i]) return;
    placed[i] = true;
    ck.by_name.emplace(found.params[i].name, ck.params.size());
    ck.params.push_back(found.params[i]);
    ck.recipes.push_back(found.recipes[i]);
  };
  for (const std::string& name : ms.module_order) {
    if (auto it = index.find(name); it != index.end()) place(it->second);
  }
  for (std::size_t i = 0; i < found.params.size(); ++i) place(i);
}

}  // namespace

void finish_layout(Impl& ck, ModelStates& ms, Found found, const std::string& model0) {
  add_frozen_and_buffers(ck, ms, found);
  std::unordered_map<std::string, std::size_t> index;
  add_tied(ms, model0, found, index);
  place_in_model_order(ck, ms, found, index);
}

}  // namespace zero::dscheckpoint
