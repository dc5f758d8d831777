// DeepSpeedCheckpoint::open's layout pass (SPEC_DEEPSPEED.md §8): which files the tag folder
// holds, what rank 0's model states and every rank's optimizer states say, and from that where
// each parameter's elements lie in the ranks' partitions. One step per function, called in
// order by Impl::open_layout; each parses its pickles once and keeps only tensor locations.
// Steps 1 and 3, the tag folder's files, are deepspeed_tag_dir.cpp's.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "zero/base/error.h"
#include "zero/dscheckpoint/deepspeed_impl.h"
#include "zero/dscheckpoint/deepspeed_tag_dir.h"

namespace zero::dscheckpoint {
namespace {

namespace fs = std::filesystem;
using Impl = DeepSpeedCheckpoint::Impl;

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) {
  return (x + a - 1) / a * a;
}

// The stage from `zero_stage`: a pickled ZeroStageEnum (an Object whose argument is the value)
// or a plain int.
std::int64_t stage_value(const PickleView& v) {
  if (v.is(PickleValue::Kind::Int)) return v.as_int();
  if (v.is(PickleValue::Kind::Object) && v.size() == 1) return v.element(0).as_int();
  v.fail("a ZeroStageEnum or an int");
}

// A number that may be saved as an int, a float or a 0-d tensor (torch >= 1.12 keeps Adam's
// step as a tensor).
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

// --- step 2: stage and world size from rank 0's optimizer states ------------------------------

void read_stage_and_world(Impl& ck, const TagListing& listing, const fs::path& tag) {
  if (!listing.optim.count(0)) {
    throw IoError(fmt::format("{}: missing rank file {} (found optimizer states of ranks {})",
                              tag.string(), optim_file_name(listing.bf16_prefix, 0),
                              fmt::join(ranks_of(listing.optim), ", ")));
  }
  const PtFile f = PtFile::open(listing.optim.at(0).string());
  const PickleView osd = f.root().get("optimizer_state_dict");
  const auto zs = osd.find("zero_stage");
  if (!zs) {
    osd.error(fmt::format(
        "unknown DeepSpeed layout: expected key 'zero_stage' (ZeRO stage 1, 2 or 3); without "
        "it this is {} (DeepSpeed's zero_to_fp32 refuses it too; convert it with "
        "ds_to_universal)",
        osd.has("single_partition_of_fp32_groups") ? "a BF16_Optimizer checkpoint"
                                                   : "not a ZeRO checkpoint"));
  }
  const std::int64_t s = stage_value(*zs);
  if (s < 1 || s > 3) zs->fail("ZeRO stage 1, 2 or 3");
  ck.stage = static_cast<int>(s);
  const PickleView pc = osd.get("partition_count");
  std::int64_t w = 0;
  if (pc.is(PickleValue::Kind::Int)) {
    w = pc.as_int();
  } else {
    for (const PickleView& e : pc.elements()) w = std::max(w, e.as_int());
  }
  if (w < 1 || w > (1 << 20)) pc.fail("a positive partition count");
  ck.world = static_cast<int>(w);
}

// --- step 4: rank 0's model states: names, shapes, frozen and tied parameters, buffers ---------

struct Named {
  std::string name;
  std::vector<std::int64_t> shape;
  std::string where;
};

struct ModelStates {
  std::vector<std::vector<Named>> group_shapes;  // stage 1/2: per group; stage 3: per sub-group
  std::vector<Named> frozen;
  std::vector<std::pair<std::string, std::string>> shared;  // alias, owner
  std::vector<std::string> module_order;
  std::map<std::string, Impl::TensorLoc> buffers;
  std::map<std::string, Impl::Source> frozen_sources;  // name → fragments, in rank order
};

// Also sets the model dtype and the engine counters (global_steps, lr_scheduler, ...) of `ck`.
ModelStates read_model_states(Impl& ck, const fs::path& rank0_model) {
  ModelStates ms;
  const std::size_t file = ck.add_file(rank0_model);
  const PtFile f = PtFile::open(ck.files[file]);
  const PickleView root = f.root();
  const PickleView module = root.get("module");
  std::set<std::string> buffer_names;
  if (auto b = root.find("buffer_names"); b && !b->is_none()) {
    for (const PickleView& e : b->elements()) buffer_names.insert(e.as_string());
  }
  bool dtype_set = false;
  for (const auto& [k, v] : module.entries()) {
    ms.module_order.push_back(k.as_string());
    if (!dtype_set && v.is(PickleValue::Kind::Tensor)) {
      switch (v.as_tensor().dtype) {
        case ScalarType::F32: ck.dtype = "fp32"; break;
        case ScalarType::F16: ck.dtype = "fp16"; break;
        case ScalarType::BF16: ck.dtype = "bf16"; break;
        default: ck.dtype = std::string(scalar_name(v.as_tensor().dtype)); break;
      }
      dtype_set = true;
    }
    if (buffer_names.count(k.as_string())) ms.buffers.emplace(k.as_string(), ck.locate(file, f, v));
  }
  for (const std::string& b : buffer_names) {
    if (!ms.buffers.count(b))
      module.error(fmt::format("expected buffer '{}' (listed in buffer_names)", b));
  }
  const PickleView shapes = root.get("param_shapes");
  for (const PickleView& group : shapes.elements()) {
    std::vector<Named> named;
    for (const auto& [k, v] : group.entries())
      named.push_back({k.as_string(), v.as_shape(), where_of(v)});
    ms.group_shapes.push_back(std::move(named));
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
  auto int_or_zero = [&](const char* key) -> std::int64_t {
    auto v = root.find(key);
    return v && !v->is_none() ? v->as_int() : 0;
  };
  ck.global_steps = int_or_zero("global_steps");
  ck.global_samples = int_or_zero("global_samples");
  ck.skipped_steps = int_or_zero("skipped_steps");
  if (auto v = root.find("lr_scheduler")) ck.lr_scheduler = v->to_json();
  if (auto v = root.find("ds_config")) ck.ds_config = v->to_json();
  if (auto v = root.find("ds_version"); v && v->is(PickleValue::Kind::String))
    ck.ds_version = v->as_string();
  return ms;
}

// Stage 3 frozen fragments: each rank's own partition, appended in rank order after rank 0's.
void add_other_ranks_frozen_fragments(Impl& ck, const std::vector<fs::path>& model_files,
                                      ModelStates& ms) {
  if (ck.stage != 3 || ms.frozen.empty()) return;
  for (int r = 1; r < ck.world; ++r) {
    const std::size_t file = ck.add_file(model_files[r]);
    const PtFile f = PtFile::open(ck.files[file]);
    const PickleView frags = f.root().get("frozen_param_fragments");
    for (const Named& p : ms.frozen)
      ms.frozen_sources[p.name].add(ck.locate(file, f, frags.get(p.name)));
  }
}

// --- step 5: every rank's optimizer states: where the master partitions and moments are -------

// One rank's optimizer state dict, per master group: its state dict (moments by name) and its
// master tensors.
struct RankGroups {
  std::vector<std::optional<PickleView>> state;
  std::vector<std::vector<PickleView>> masters;
  std::optional<PickleView> param_groups;
};

RankGroups rank_groups(const Impl& ck, const PickleView& osd, const ModelStates& ms,
                       const fs::path& rank0_model) {
  RankGroups out;
  if (ck.stage <= 2) {
    const PickleView fp32 = osd.get("single_partition_of_fp32_groups");
    if (fp32.size() != ms.group_shapes.size()) {
      fp32.fail(fmt::format("{} groups, as many as param_shapes in {} has", ms.group_shapes.size(),
                            rank0_model.filename().string()));
    }
    const PickleView bos = osd.get("base_optimizer_state");
    for (std::size_t g = 0; g < fp32.size(); ++g) {
      out.masters.push_back({fp32.element(g)});
      if (bos.is(PickleValue::Kind::List)) {  // elastic: lean states per group
        out.state.push_back(bos.element(g));
        continue;
      }
      const PickleView state = bos.get("state");
      std::int64_t id = static_cast<std::int64_t>(g);
      if (auto pg = bos.find("param_groups"); pg && g < pg->size()) {
        if (auto ids = pg->element(g).find("params"); ids && ids->size() > 0)
          id = ids->element(0).as_int();
      }
      out.state.push_back(state.find(id));
    }
    if (!bos.is(PickleValue::Kind::List)) out.param_groups = bos.find("param_groups");
    return out;
  }
  const PickleView fp32 = osd.get("fp32_flat_groups");
  const PickleView inner = osd.get("optimizer_state_dict");
  const PickleView state = inner.get("state");
  std::vector<PickleView> subgroups = fp32.elements();
  for (const PickleView& v : subgroups) {
    // DeepSpeed saves an empty placeholder for a sub-group swapped to NVMe (SPEC §8.3).
    if (v.as_tensor().numel() == 0) {
      v.error(
          "an empty sub-group: its optimizer state was offloaded to NVMe "
          "(offloaded_tensors/), which is not supported");
    }
  }
  out.masters.push_back(subgroups);
  // Sub-group states, concatenated like the masters.
  for (std::size_t i = 0; i < subgroups.size(); ++i)
    out.state.push_back(state.find(static_cast<std::int64_t>(i)));
  out.param_groups = inner.find("param_groups");
  return out;
}

// Moments: stage 1/2 one state dict per group; stage 3 one per sub-group, concatenated.
std::optional<PickleView> state_of_master(const Impl& ck, const RankGroups& groups, std::size_t g,
                                          std::size_t part) {
  return ck.stage == 3 ? groups.state[part] : groups.state[g];
}

// From rank 0: the state names, the step, the loss scaler, clip_grad and the param groups.
void read_optimizer_facts(Impl& ck, const PtFile& f, const PickleView& osd,
                          const RankGroups& groups) {
  if (auto st = state_of_master(ck, groups, 0, 0)) {
    for (const auto& [k, v] : st->entries()) {
      if (k.is(PickleValue::Kind::String) && v.is(PickleValue::Kind::Tensor) &&
          k.as_string() != "step") {
        ck.state_names.push_back(k.as_string());
      }
    }
    if (auto s = st->find("step")) ck.step = std::llround(scalar_number(f, *s));
  }
  if (auto s = osd.find("base_optimizer_state_step")) ck.step = std::llround(scalar_number(f, *s));
  if (auto ls = osd.find("loss_scaler"); ls && !ls->is_none()) ck.scaler = ls->to_json();
  if (auto d = osd.find("dynamic_loss_scale"); d && d->is(PickleValue::Kind::Bool))
    ck.dynamic_loss_scale = d->as_bool();
  if (auto c = osd.find("clip_grad"); c && !c->is_none()) ck.clip_grad = c->as_number();
  if (groups.param_groups) {
    for (const PickleView& pg : groups.param_groups->elements()) {
      nlohmann::json j = pg.to_json();
      if (!j.is_object()) pg.fail("a param group dict");
      j.erase("params");
      ck.param_groups.push_back(std::move(j));
    }
  }
}

// masters[g][r]: source id of rank r's partition of group g (stage 3: one "group", the
// concatenation of all sub-groups).
using Masters = std::vector<std::vector<std::size_t>>;

// Every state of rank r's partitions, located beside the master parts it belongs to.
void locate_states(Impl& ck, std::size_t file, const PtFile& f, const RankGroups& groups,
                   const Masters& masters, int r) {
  for (const std::string& name : ck.state_names) {
    for (std::size_t g = 0; g < masters.size(); ++g) {
      Impl::Source s;
      const Impl::Source& master = ck.sources[masters[g][r]];
      for (std::size_t part = 0; part < groups.masters[g].size(); ++part) {
        const auto st = state_of_master(ck, groups, g, part);
        const PickleView& mv = groups.masters[g][part];
        if (!st) {
          mv.error(
              fmt::format("has no optimizer state '{}' beside it (the optimizer state dict "
                          "lacks this group)",
                          name));
        }
        Impl::TensorLoc t = ck.locate(file, f, st->get(name));
        // Stage 1/2 moments keep the partition's padding; masters do not (SPEC §8.3).
        const std::uint64_t need = master.parts[part].numel;
        if (t.numel < need || (ck.stage == 3 && t.numel != need)) {
          throw IoError(fmt::format("{}: {} elements, expected {} to match the master partition {}",
                                    t.where, t.numel, need, master.parts[part].where));
        }
        s.add(std::move(t));
      }
      ck.state_sources[name][masters[g][r]] = ck.add_source(std::move(s));
    }
  }
}

Masters read_optimizer_states(Impl& ck, const TagListing& listing,
                              const std::vector<fs::path>& model_files, const ModelStates& ms) {
  const std::size_t n_groups = ck.stage == 3 ? 1 : ms.group_shapes.size();
  Masters masters(n_groups, std::vector<std::size_t>(ck.world));
  for (int r = 0; r < ck.world; ++r) {
    const std::size_t file = ck.add_file(listing.optim.at(r));
    const PtFile f = PtFile::open(ck.files[file]);
    const PickleView osd = f.root().get("optimizer_state_dict");
    if (stage_value(osd.get("zero_stage")) != ck.stage) {
      osd.get("zero_stage").fail(fmt::format("stage {} like rank 0", ck.stage));
    }
    const RankGroups groups = rank_groups(ck, osd, ms, model_files[0]);
    for (std::size_t g = 0; g < n_groups; ++g) {
      Impl::Source master;
      for (const PickleView& v : groups.masters[g]) master.add(ck.locate(file, f, v));
      masters[g][r] = ck.add_source(std::move(master));
    }
    if (r == 0) read_optimizer_facts(ck, f, osd, groups);
    locate_states(ck, file, f, groups, masters, r);
  }
  return masters;
}

// --- step 6: trainable parameters: where each lies in the ranks' partitions (SPEC §8.5) -------

// Parameters with how to read each, in the order they were found.
struct Found {
  std::vector<DsParam> params;
  std::vector<Impl::Recipe> recipes;
  void add(DsParam p, Impl::Recipe r) {
    params.push_back(std::move(p));
    recipes.push_back(std::move(r));
  }
};

// Stage 1/2: each group's parameters are packed back to back over the ranks' partitions taken
// in rank order; the padding at the end of the last partition is dropped.
Found place_stage12(const Impl& ck, const ModelStates& ms, const Masters& masters,
                    const std::string& model0) {
  Found out;
  const int world = ck.world;
  for (std::size_t g = 0; g < ms.group_shapes.size(); ++g) {
    std::vector<std::uint64_t> starts(world + 1, 0);
    for (int r = 0; r < world; ++r) starts[r + 1] = starts[r] + ck.sources[masters[g][r]].numel;
    const std::uint64_t avail = starts[world];
    std::uint64_t offset = 0;
    for (const Named& p : ms.group_shapes[g]) {
      const auto n = static_cast<std::uint64_t>(shape_numel(p.shape, p.where));
      if (offset + n > avail) {
        throw IoError(
            fmt::format("{}: parameter group {} needs more than the {} elements the ranks' "
                        "single_partition_of_fp32_groups[{}] hold together (reached {} at '{}')",
                        p.where, g, avail, g, offset + n, p.name));
      }
      Impl::Recipe recipe;
      recipe.has_state = true;
      for (int r = 0; r < world; ++r) {
        const std::uint64_t lo = std::max(offset, starts[r]);
        const std::uint64_t hi = std::min(offset + n, starts[r + 1]);
        if (lo < hi) recipe.pieces.push_back({masters[g][r], lo - starts[r], hi - lo});
      }
      out.add({p.name, p.shape, true, false, std::nullopt}, std::move(recipe));
      offset += n;
    }
    // zero_to_fp32's check: both sides aligned to 2·W (stage 1/2 flat alignment).
    const std::uint64_t align = 2 * static_cast<std::uint64_t>(world);
    if (align_up(offset, align) != align_up(avail, align)) {
      throw IoError(fmt::format(
          "{}: param_shapes[{}]: the parameters consume {} elements, but the ranks' "
          "single_partition_of_fp32_groups[{}] hold {} (aligned to {}: {} vs {})",
          model0, g, offset, g, avail, align, align_up(offset, align), align_up(avail, align)));
    }
  }
  return out;
}

// Stage 3: every parameter is split into W equal padded shares, share r in rank r's partition
// at the same offset; the padding of the last share is dropped.
Found place_stage3(const Impl& ck, const ModelStates& ms, const Masters& masters,
                   const TagListing& listing, const std::string& model0) {
  Found out;
  const std::uint64_t per_rank = ck.sources[masters[0][0]].numel;
  for (int r = 1; r < ck.world; ++r) {
    if (ck.sources[masters[0][r]].numel != per_rank) {
      throw IoError(
          fmt::format("{}: optimizer_state_dict.fp32_flat_groups hold {} elements, "
                      "expected {} like rank 0",
                      listing.optim.at(r).string(), ck.sources[masters[0][r]].numel, per_rank));
    }
  }
  const auto w = static_cast<std::uint64_t>(ck.world);
  std::uint64_t offset = 0;
  for (const auto& group : ms.group_shapes) {
    for (const Named& p : group) {
      const auto n = static_cast<std::uint64_t>(shape_numel(p.shape, p.where));
      const std::uint64_t c = (n + w - 1) / w;  // each rank's share, padded
      if (offset + c > per_rank) {
        throw IoError(fmt::format(
            "{}: the parameters need more than the {} elements each rank's fp32_flat_groups "
            "hold (reached {} at '{}')",
            p.where, per_rank, offset + c, p.name));
      }
      Impl::Recipe recipe;
      recipe.has_state = true;
      for (std::uint64_t r = 0; r < w && r * c < n; ++r) {
        recipe.pieces.push_back({masters[0][r], offset, std::min(c, n - r * c)});
      }
      out.add({p.name, p.shape, true, false, std::nullopt}, std::move(recipe));
      offset += c;
    }
  }
  if (offset != per_rank) {
    throw IoError(fmt::format(
        "{}: param_shapes: the parameters consume {} elements of each rank's partition, but "
        "fp32_flat_groups hold {} per rank",
        model0, offset, per_rank));
  }
  return out;
}

// --- step 7: frozen parameters and buffers, appended to `found` -------------------------------

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
    const std::size_t id = ck.add_source(std::move(s));
    found.add({p.name, p.shape, false, false, std::nullopt}, {{{id, 0, n}}, false});
  }
  for (auto& [name, loc] : ms.buffers) {
    const std::vector<std::int64_t> shape = loc.ref.shape;
    const std::uint64_t n = loc.numel;
    Impl::Source s;
    s.add(std::move(loc));
    const std::size_t id = ck.add_source(std::move(s));
    found.add({name, shape, false, true, std::nullopt}, {{{id, 0, n}}, false});
  }
}

// --- step 8: tied parameters, then the model's order ------------------------------------------

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

void DeepSpeedCheckpoint::Impl::open_layout(const fs::path& tag) {
  const TagListing listing = list_tag_dir(tag);
  read_stage_and_world(*this, listing, tag);
  check_optimizer_files(listing, tag, world);
  const std::vector<fs::path> model_files = model_state_files(listing, tag, stage, world);

  ModelStates ms = read_model_states(*this, model_files[0]);
  add_other_ranks_frozen_fragments(*this, model_files, ms);
  const Masters masters = read_optimizer_states(*this, listing, model_files, ms);

  const std::string model0 = model_files[0].string();
  Found found = stage <= 2 ? place_stage12(*this, ms, masters, model0)
                           : place_stage3(*this, ms, masters, listing, model0);
  add_frozen_and_buffers(*this, ms, found);
  std::unordered_map<std::string, std::size_t> index;
  add_tied(ms, model0, found, index);
  place_in_model_order(*this, ms, found, index);
}

}  // namespace zero::dscheckpoint
