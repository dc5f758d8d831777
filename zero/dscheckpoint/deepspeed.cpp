#include "zero/dscheckpoint/deepspeed.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "zero/dscheckpoint/pt_file.h"
#include "zero/base/error.h"
#include "zero/io/safetensors.h"

namespace zero::dscheckpoint {

namespace fs = std::filesystem;

namespace {

// Archives kept open between reads; a parameter read visits every rank's file in turn.
constexpr std::size_t kMaxOpenArchives = 64;

std::string trim(std::string s) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  return s;
}

std::int64_t shape_numel(const std::vector<std::int64_t>& shape, const std::string& what) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) {
      throw IoError(fmt::format("{}: shape [{}] is not valid", what, fmt::join(shape, ", ")));
    }
  }
  return n;
}

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) {
  return (x + a - 1) / a * a;
}

bool has_optim_files(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with("optim_states.pt")) return true;
  }
  return false;
}

std::string read_latest(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  return trim(ss.str());
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

}  // namespace

std::int64_t DsParam::numel() const {
  return shape_numel(shape, name);
}

bool is_deepspeed_checkpoint(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  if (fs::is_regular_file(root / "latest", ec)) {
    const std::string tag = read_latest(root / "latest");
    return !tag.empty() && has_optim_files(root / tag);
  }
  return has_optim_files(root);
}

// --- the implementation -------------------------------------------------------------------------

struct DeepSpeedCheckpoint::Impl {
  struct TensorLoc {
    std::size_t file = 0;
    TensorRef ref;
    std::string where;  // "<file>: <key path>"
    std::uint64_t numel = 0;
  };
  // Tensors read as one logical concatenation (a rank's partition of a group).
  struct Source {
    std::vector<TensorLoc> parts;
    std::uint64_t numel = 0;
    void add(TensorLoc t) {
      numel += t.numel;
      parts.push_back(std::move(t));
    }
  };
  // `count` elements of source `source` from `offset`, placed next in the destination.
  struct Piece {
    std::size_t source = 0;
    std::uint64_t offset = 0;
    std::uint64_t count = 0;
  };
  struct Recipe {
    std::vector<Piece> pieces;
    bool has_state = false;  // pieces refer to master sources, with optimizer states beside
  };

  std::string dir;
  std::string tag_dir;
  std::vector<std::string> files;
  int stage = 0;
  int world = 0;
  std::string dtype = "fp32";

  std::vector<DsParam> params;
  std::vector<Recipe> recipes;  // parallel to params; tied params share the owner's recipe
  std::unordered_map<std::string, std::size_t> by_name;
  std::vector<Source> sources;
  // state name → master source id → state source id
  std::map<std::string, std::unordered_map<std::size_t, std::size_t>> state_sources;
  std::vector<std::string> state_names;

  std::int64_t step = 0;
  nlohmann::json scaler;
  bool dynamic_loss_scale = false;
  std::optional<double> clip_grad;
  nlohmann::json param_groups = nlohmann::json::array();
  std::int64_t global_steps = 0;
  std::int64_t global_samples = 0;
  std::int64_t skipped_steps = 0;
  nlohmann::json lr_scheduler;
  nlohmann::json ds_config;
  std::string ds_version;

  mutable std::map<std::size_t, PtArchive> open_archives;
  mutable std::deque<std::size_t> open_order;

  const PtArchive& archive(std::size_t file) const {
    auto it = open_archives.find(file);
    if (it != open_archives.end()) return it->second;
    if (open_archives.size() >= kMaxOpenArchives) {
      open_archives.erase(open_order.front());
      open_order.pop_front();
    }
    open_order.push_back(file);
    return open_archives.emplace(file, PtArchive::open(files[file])).first->second;
  }

  std::size_t add_file(const fs::path& p) {
    files.push_back(p.string());
    return files.size() - 1;
  }

  TensorLoc locate(std::size_t file, const PtFile& pt, const PickleView& v) const {
    TensorLoc t;
    t.file = file;
    t.ref = pt.tensor(v);  // checked against its storage now, so a bad file fails at open()
    t.where = where_of(v);
    t.numel = static_cast<std::uint64_t>(t.ref.numel());
    return t;
  }

  std::size_t add_source(Source s) {
    sources.push_back(std::move(s));
    return sources.size() - 1;
  }

  void read_pieces(const std::vector<Piece>& pieces,
                   const std::unordered_map<std::size_t, std::size_t>* map,
                   std::span<float> out) const {
    std::uint64_t at = 0;
    for (const Piece& p : pieces) {
      const std::size_t id = map != nullptr ? map->at(p.source) : p.source;
      const Source& s = sources[id];
      ZERO_ASSERT(p.offset + p.count <= s.numel && at + p.count <= out.size());
      std::uint64_t offset = p.offset;
      std::uint64_t left = p.count;
      for (const TensorLoc& t : s.parts) {
        if (left == 0) break;
        if (offset >= t.numel) {
          offset -= t.numel;
          continue;
        }
        const std::uint64_t n = std::min(left, t.numel - offset);
        read_tensor_f32(archive(t.file), t.ref, offset, out.subspan(at, n), t.where);
        at += n;
        left -= n;
        offset = 0;
      }
    }
    ZERO_ASSERT(at == out.size());
  }

  void open_layout(const fs::path& tag_path);
};

namespace {

struct Listing {
  std::map<int, fs::path> optim;       // rank → file
  std::map<int, fs::path> zero_model;  // stage 3 model states, rank → file
  std::optional<fs::path> model;       // stage 1/2 model states
  bool bf16_prefix = false;
};

Listing list_tag_dir(const fs::path& tag) {
  static const std::regex optim_re(
      R"(^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_?optim_states\.pt$)");
  static const std::regex zmodel_re(R"(^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$)");
  static const std::regex model_re(R"(^mp_rank_(\d+)_model_states\.pt$)");
  static const std::regex moe_re(
      R"(^(layer_\d+_expert_\d+_mp_rank_\d+_model_states|(bf16_)?expp_rank_\d+_mp_rank_\d+_optim_states)\.pt$)");
  Listing out;
  std::set<bool> prefixes;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(tag, ec)) {
    const std::string name = e.path().filename().string();
    std::smatch m;
    auto check_mp = [&](const std::string& mp) {
      if (std::stoi(mp) != 0) {
        throw IoError(fmt::format(
            "{}: a model-parallel checkpoint (mp_rank_{}); only mp_rank_00 (no tensor or "
            "pipeline model parallelism) is supported, as in DeepSpeed's zero_to_fp32",
            e.path().string(), mp));
      }
    };
    if (std::regex_match(name, m, moe_re)) {
      throw IoError(
          fmt::format("{}: a mixture-of-experts checkpoint; expert files are not supported",
                      e.path().string()));
    } else if (std::regex_match(name, m, optim_re)) {
      check_mp(m[3]);
      const int rank = std::stoi(m[2]);
      prefixes.insert(m[1].matched);
      if (!out.optim.emplace(rank, e.path()).second) {
        throw IoError(fmt::format("{}: two optimizer-state files for rank {} ({} and {})",
                                  tag.string(), rank, out.optim[rank].filename().string(), name));
      }
    } else if (std::regex_match(name, m, zmodel_re)) {
      check_mp(m[2]);
      out.zero_model.emplace(std::stoi(m[1]), e.path());
    } else if (std::regex_match(name, m, model_re)) {
      check_mp(m[1]);
      out.model = e.path();
    }
  }
  ZERO_CHECK_AS(IoError, !ec, "{}: cannot list: {}", tag.string(), ec.message());
  if (out.optim.empty()) {
    throw IoError(fmt::format(
        "{}: no zero_pp_rank_<r>_mp_rank_00_optim_states.pt files; expected a DeepSpeed ZeRO "
        "(stage 1-3) checkpoint folder",
        tag.string()));
  }
  out.bf16_prefix = *prefixes.begin();
  return out;
}

std::vector<int> ranks_of(const std::map<int, fs::path>& files) {
  std::vector<int> out;
  for (const auto& [r, _] : files) out.push_back(r);
  return out;
}

std::string optim_file_name(bool bf16, int rank) {
  return fmt::format("{}zero_pp_rank_{}_mp_rank_00_optim_states.pt", bf16 ? "bf16_" : "", rank);
}

}  // namespace

void DeepSpeedCheckpoint::Impl::open_layout(const fs::path& tag) {
  const Listing listing = list_tag_dir(tag);

  // --- stage and world size from rank 0's optimizer states ---
  if (!listing.optim.count(0)) {
    throw IoError(fmt::format("{}: missing rank file {} (found optimizer states of ranks {})",
                              tag.string(), optim_file_name(listing.bf16_prefix, 0),
                              fmt::join(ranks_of(listing.optim), ", ")));
  }
  {
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
    stage = static_cast<int>(s);
    const PickleView pc = osd.get("partition_count");
    std::int64_t w = 0;
    if (pc.is(PickleValue::Kind::Int)) {
      w = pc.as_int();
    } else {
      for (const PickleView& e : pc.elements()) w = std::max(w, e.as_int());
    }
    if (w < 1 || w > (1 << 20)) pc.fail("a positive partition count");
    world = static_cast<int>(w);
  }
  for (int r = 0; r < world; ++r) {
    if (!listing.optim.count(r)) {
      throw IoError(fmt::format(
          "{}: missing rank file {}: partition_count in {} says {} ranks, found optimizer "
          "states of ranks {}",
          tag.string(), optim_file_name(listing.bf16_prefix, r),
          listing.optim.at(0).filename().string(), world,
          fmt::join(ranks_of(listing.optim), ", ")));
    }
  }
  if (listing.optim.size() != static_cast<std::size_t>(world)) {
    throw IoError(fmt::format(
        "{}: partition_count says {} ranks, but there are optimizer states of ranks {} (an old "
        "checkpoint overwritten in part?)",
        tag.string(), world, fmt::join(ranks_of(listing.optim), ", ")));
  }
  std::vector<fs::path> model_files;
  if (stage <= 2) {
    if (!listing.model) {
      throw IoError(fmt::format("{}: missing mp_rank_00_model_states.pt (stage {} model states)",
                                tag.string(), stage));
    }
    model_files.push_back(*listing.model);
  } else {
    for (int r = 0; r < world; ++r) {
      if (!listing.zero_model.count(r)) {
        throw IoError(
            fmt::format("{}: missing rank file zero_pp_rank_{}_mp_rank_00_model_states.pt "
                        "(stage 3 keeps model states per rank; {} ranks)",
                        tag.string(), r, world));
      }
      model_files.push_back(listing.zero_model.at(r));
    }
  }

  // --- rank 0's model states: names, shapes, frozen and tied parameters, buffers ---
  struct Named {
    std::string name;
    std::vector<std::int64_t> shape;
    std::string where;
  };
  std::vector<std::vector<Named>> group_shapes;  // stage 1/2: per group; stage 3: per sub-group
  std::vector<Named> frozen;
  std::vector<std::pair<std::string, std::string>> shared;  // alias, owner
  std::vector<std::string> module_order;
  std::map<std::string, TensorLoc> buffers;
  std::map<std::string, Source> frozen_sources;  // name → fragments, in rank order
  {
    const std::size_t file = add_file(model_files[0]);
    const PtFile f = PtFile::open(files[file]);
    const PickleView root = f.root();
    const PickleView module = root.get("module");
    std::set<std::string> buffer_names;
    if (auto b = root.find("buffer_names"); b && !b->is_none()) {
      for (const PickleView& e : b->elements()) buffer_names.insert(e.as_string());
    }
    bool dtype_set = false;
    for (const auto& [k, v] : module.entries()) {
      module_order.push_back(k.as_string());
      if (!dtype_set && v.is(PickleValue::Kind::Tensor)) {
        switch (v.as_tensor().dtype) {
          case ScalarType::F32: dtype = "fp32"; break;
          case ScalarType::F16: dtype = "fp16"; break;
          case ScalarType::BF16: dtype = "bf16"; break;
          default: dtype = std::string(scalar_name(v.as_tensor().dtype)); break;
        }
        dtype_set = true;
      }
      if (buffer_names.count(k.as_string())) buffers.emplace(k.as_string(), locate(file, f, v));
    }
    for (const std::string& b : buffer_names) {
      if (!buffers.count(b))
        module.error(fmt::format("expected buffer '{}' (listed in buffer_names)", b));
    }
    const PickleView shapes = root.get("param_shapes");
    for (const PickleView& group : shapes.elements()) {
      std::vector<Named> named;
      for (const auto& [k, v] : group.entries())
        named.push_back({k.as_string(), v.as_shape(), where_of(v)});
      group_shapes.push_back(std::move(named));
    }
    if (auto fs_ = root.find("frozen_param_shapes"); fs_ && !fs_->is_none()) {
      for (const auto& [k, v] : fs_->entries())
        frozen.push_back({k.as_string(), v.as_shape(), where_of(v)});
    }
    if (!frozen.empty()) {
      const PickleView frags = root.get("frozen_param_fragments");
      for (const Named& p : frozen) frozen_sources[p.name].add(locate(file, f, frags.get(p.name)));
    }
    if (auto sp = root.find("shared_params"); sp && !sp->is_none()) {
      for (const auto& [k, v] : sp->entries()) shared.emplace_back(k.as_string(), v.as_string());
    }
    auto int_or_zero = [&](const char* key) -> std::int64_t {
      auto v = root.find(key);
      return v && !v->is_none() ? v->as_int() : 0;
    };
    global_steps = int_or_zero("global_steps");
    global_samples = int_or_zero("global_samples");
    skipped_steps = int_or_zero("skipped_steps");
    if (auto v = root.find("lr_scheduler")) lr_scheduler = v->to_json();
    if (auto v = root.find("ds_config")) ds_config = v->to_json();
    if (auto v = root.find("ds_version"); v && v->is(PickleValue::Kind::String))
      ds_version = v->as_string();
  }
  // Stage 3 frozen fragments: each rank's own partition, in rank order.
  if (stage == 3 && !frozen.empty()) {
    for (int r = 1; r < world; ++r) {
      const std::size_t file = add_file(model_files[r]);
      const PtFile f = PtFile::open(files[file]);
      const PickleView frags = f.root().get("frozen_param_fragments");
      for (const Named& p : frozen) frozen_sources[p.name].add(locate(file, f, frags.get(p.name)));
    }
  }

  // --- every rank's optimizer states: where the master partitions and moments are ---
  // masters[g][r]: source id of rank r's partition of group g (stage 3: one "group", the
  // concatenation of all sub-groups).
  const std::size_t n_groups = stage == 3 ? 1 : group_shapes.size();
  std::vector<std::vector<std::size_t>> masters(n_groups, std::vector<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    const std::size_t file = add_file(listing.optim.at(r));
    const PtFile f = PtFile::open(files[file]);
    const PickleView osd = f.root().get("optimizer_state_dict");
    if (stage_value(osd.get("zero_stage")) != stage) {
      osd.get("zero_stage").fail(fmt::format("stage {} like rank 0", stage));
    }
    // Per master group: its state dict (moments by name) and master tensors.
    std::vector<std::optional<PickleView>> group_state;
    std::vector<std::vector<PickleView>> group_masters;
    std::optional<PickleView> param_groups_view;
    if (stage <= 2) {
      const PickleView fp32 = osd.get("single_partition_of_fp32_groups");
      if (fp32.size() != group_shapes.size()) {
        fp32.fail(fmt::format("{} groups, as many as param_shapes in {} has", group_shapes.size(),
                              model_files[0].filename().string()));
      }
      const PickleView bos = osd.get("base_optimizer_state");
      for (std::size_t g = 0; g < fp32.size(); ++g) {
        group_masters.push_back({fp32.element(g)});
        if (bos.is(PickleValue::Kind::List)) {  // elastic: lean states per group
          group_state.push_back(bos.element(g));
          continue;
        }
        const PickleView state = bos.get("state");
        std::int64_t id = static_cast<std::int64_t>(g);
        if (auto pg = bos.find("param_groups"); pg && g < pg->size()) {
          if (auto ids = pg->element(g).find("params"); ids && ids->size() > 0)
            id = ids->element(0).as_int();
        }
        group_state.push_back(state.find(id));
      }
      if (!bos.is(PickleValue::Kind::List)) param_groups_view = bos.find("param_groups");
    } else {
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
      group_masters.push_back(subgroups);
      // Sub-group states, concatenated like the masters.
      for (std::size_t i = 0; i < subgroups.size(); ++i)
        group_state.push_back(state.find(static_cast<std::int64_t>(i)));
      param_groups_view = inner.find("param_groups");
    }

    for (std::size_t g = 0; g < n_groups; ++g) {
      Source master;
      for (const PickleView& v : group_masters[g]) master.add(locate(file, f, v));
      masters[g][r] = add_source(std::move(master));
    }
    // Moments: stage 1/2 one state dict per group; stage 3 one per sub-group, concatenated.
    auto state_of_master = [&](std::size_t g, std::size_t part) -> std::optional<PickleView> {
      return stage == 3 ? group_state[part] : group_state[g];
    };
    if (r == 0) {
      if (auto st = state_of_master(0, 0)) {
        for (const auto& [k, v] : st->entries()) {
          if (k.is(PickleValue::Kind::String) && v.is(PickleValue::Kind::Tensor) &&
              k.as_string() != "step") {
            state_names.push_back(k.as_string());
          }
        }
        if (auto s = st->find("step")) step = std::llround(scalar_number(f, *s));
      }
      if (auto s = osd.find("base_optimizer_state_step")) step = std::llround(scalar_number(f, *s));
      if (auto ls = osd.find("loss_scaler"); ls && !ls->is_none()) scaler = ls->to_json();
      if (auto d = osd.find("dynamic_loss_scale"); d && d->is(PickleValue::Kind::Bool))
        dynamic_loss_scale = d->as_bool();
      if (auto c = osd.find("clip_grad"); c && !c->is_none()) clip_grad = c->as_number();
      if (param_groups_view) {
        for (const PickleView& pg : param_groups_view->elements()) {
          nlohmann::json j = pg.to_json();
          if (!j.is_object()) pg.fail("a param group dict");
          j.erase("params");
          param_groups.push_back(std::move(j));
        }
      }
    }
    for (const std::string& name : state_names) {
      for (std::size_t g = 0; g < n_groups; ++g) {
        Source s;
        const Source& master = sources[masters[g][r]];
        for (std::size_t part = 0; part < group_masters[g].size(); ++part) {
          const auto st = state_of_master(g, part);
          const PickleView& mv = group_masters[g][part];
          if (!st) {
            mv.error(
                fmt::format("has no optimizer state '{}' beside it (the optimizer state dict "
                            "lacks this group)",
                            name));
          }
          TensorLoc t = locate(file, f, st->get(name));
          // Stage 1/2 moments keep the partition's padding; masters do not (SPEC §8.3).
          const std::uint64_t need = master.parts[part].numel;
          if (t.numel < need || (stage == 3 && t.numel != need)) {
            throw IoError(
                fmt::format("{}: {} elements, expected {} to match the master partition {}",
                            t.where, t.numel, need, master.parts[part].where));
          }
          s.add(std::move(t));
        }
        state_sources[name][masters[g][r]] = add_source(std::move(s));
      }
    }
  }

  // --- trainable parameters: where each lies in the ranks' partitions (SPEC §8.5) ---
  std::vector<DsParam> trainable;
  std::vector<Recipe> trainable_recipes;
  const std::string model0 = model_files[0].string();
  if (stage <= 2) {
    for (std::size_t g = 0; g < group_shapes.size(); ++g) {
      std::vector<std::uint64_t> starts(world + 1, 0);
      for (int r = 0; r < world; ++r) starts[r + 1] = starts[r] + sources[masters[g][r]].numel;
      const std::uint64_t avail = starts[world];
      std::uint64_t offset = 0;
      for (const Named& p : group_shapes[g]) {
        const auto n = static_cast<std::uint64_t>(shape_numel(p.shape, p.where));
        if (offset + n > avail) {
          throw IoError(
              fmt::format("{}: parameter group {} needs more than the {} elements the ranks' "
                          "single_partition_of_fp32_groups[{}] hold together (reached {} at '{}')",
                          p.where, g, avail, g, offset + n, p.name));
        }
        Recipe recipe;
        recipe.has_state = true;
        for (int r = 0; r < world; ++r) {
          const std::uint64_t lo = std::max(offset, starts[r]);
          const std::uint64_t hi = std::min(offset + n, starts[r + 1]);
          if (lo < hi) recipe.pieces.push_back({masters[g][r], lo - starts[r], hi - lo});
        }
        trainable.push_back({p.name, p.shape, true, false, std::nullopt});
        trainable_recipes.push_back(std::move(recipe));
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
  } else {
    const std::uint64_t per_rank = sources[masters[0][0]].numel;
    for (int r = 1; r < world; ++r) {
      if (sources[masters[0][r]].numel != per_rank) {
        throw IoError(
            fmt::format("{}: optimizer_state_dict.fp32_flat_groups hold {} elements, "
                        "expected {} like rank 0",
                        listing.optim.at(r).string(), sources[masters[0][r]].numel, per_rank));
      }
    }
    const auto w = static_cast<std::uint64_t>(world);
    std::uint64_t offset = 0;
    for (const auto& group : group_shapes) {
      for (const Named& p : group) {
        const auto n = static_cast<std::uint64_t>(shape_numel(p.shape, p.where));
        const std::uint64_t c = (n + w - 1) / w;  // each rank's share, padded
        if (offset + c > per_rank) {
          throw IoError(fmt::format(
              "{}: the parameters need more than the {} elements each rank's fp32_flat_groups "
              "hold (reached {} at '{}')",
              p.where, per_rank, offset + c, p.name));
        }
        Recipe recipe;
        recipe.has_state = true;
        for (std::uint64_t r = 0; r < w && r * c < n; ++r) {
          recipe.pieces.push_back({masters[0][r], offset, std::min(c, n - r * c)});
        }
        trainable.push_back({p.name, p.shape, true, false, std::nullopt});
        trainable_recipes.push_back(std::move(recipe));
        offset += c;
      }
    }
    if (offset != per_rank) {
      throw IoError(fmt::format(
          "{}: param_shapes: the parameters consume {} elements of each rank's partition, but "
          "fp32_flat_groups hold {} per rank",
          model0, offset, per_rank));
    }
  }

  // --- frozen parameters, buffers, tied parameters ---
  std::vector<DsParam> others;
  std::vector<Recipe> other_recipes;
  for (const Named& p : frozen) {
    const auto n = static_cast<std::uint64_t>(shape_numel(p.shape, p.where));
    Source& s = frozen_sources.at(p.name);
    const bool ok = stage == 3 ? s.numel >= n : s.numel == n;
    if (!ok) {
      throw IoError(
          fmt::format("{}: frozen_param_fragments['{}'] hold {} elements, expected {} "
                      "for shape [{}]",
                      s.parts.front().where, p.name, s.numel, n, fmt::join(p.shape, ", ")));
    }
    const std::size_t id = add_source(std::move(s));
    others.push_back({p.name, p.shape, false, false, std::nullopt});
    other_recipes.push_back({{{id, 0, n}}, false});
  }
  for (auto& [name, loc] : buffers) {
    const std::vector<std::int64_t> shape = loc.ref.shape;
    const std::uint64_t n = loc.numel;
    Source s;
    s.add(std::move(loc));
    const std::size_t id = add_source(std::move(s));
    others.push_back({name, shape, false, true, std::nullopt});
    other_recipes.push_back({{{id, 0, n}}, false});
  }

  std::vector<DsParam> all = std::move(trainable);
  std::vector<Recipe> all_recipes = std::move(trainable_recipes);
  for (std::size_t i = 0; i < others.size(); ++i) {
    all.push_back(std::move(others[i]));
    all_recipes.push_back(std::move(other_recipes[i]));
  }
  std::unordered_map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!index.emplace(all[i].name, i).second) {
      throw IoError(
          fmt::format("{}: parameter '{}' appears twice (in param_shapes, "
                      "frozen_param_shapes or buffer_names)",
                      model0, all[i].name));
    }
  }
  for (const auto& [alias, owner] : shared) {
    auto it = index.find(owner);
    if (it == index.end() || index.count(alias)) continue;  // as zero_to_fp32: only known owners
    DsParam p = all[it->second];
    p.name = alias;
    p.tied_to = owner;
    Recipe rec = all_recipes[it->second];
    all.push_back(std::move(p));
    all_recipes.push_back(std::move(rec));
    index.emplace(alias, all.size() - 1);
  }

  // Model order: the saved module state_dict's, then whatever it does not list.
  std::vector<bool> placed(all.size(), false);
  auto place = [&](std::size_t i) {
    if (placed[i]) return;
    placed[i] = true;
    by_name.emplace(all[i].name, params.size());
    params.push_back(all[i]);
    recipes.push_back(all_recipes[i]);
  };
  for (const std::string& name : module_order) {
    if (auto it = index.find(name); it != index.end()) place(it->second);
  }
  for (std::size_t i = 0; i < all.size(); ++i) place(i);
}

DeepSpeedCheckpoint::DeepSpeedCheckpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeepSpeedCheckpoint::DeepSpeedCheckpoint(DeepSpeedCheckpoint&&) noexcept = default;
DeepSpeedCheckpoint& DeepSpeedCheckpoint::operator=(DeepSpeedCheckpoint&&) noexcept = default;
DeepSpeedCheckpoint::~DeepSpeedCheckpoint() = default;

DeepSpeedCheckpoint DeepSpeedCheckpoint::open(const std::string& dir, const std::string& tag) {
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  const fs::path root(dir);
  std::error_code ec;
  ZERO_CHECK_AS(IoError, fs::is_directory(root, ec), "{}: not a directory", dir);
  fs::path tag_path;
  if (!tag.empty()) {
    tag_path = root / tag;
    ZERO_CHECK_AS(IoError, fs::is_directory(tag_path, ec), "{}: no tag folder '{}'", dir, tag);
  } else if (fs::is_regular_file(root / "latest", ec)) {
    const std::string latest = read_latest(root / "latest");
    tag_path = root / latest;
    ZERO_CHECK_AS(IoError, !latest.empty() && fs::is_directory(tag_path, ec),
                  "{}: 'latest' names tag '{}', but there is no such folder", dir, latest);
  } else if (has_optim_files(root)) {
    tag_path = root;
  } else {
    throw IoError(fmt::format(
        "{}: not a DeepSpeed checkpoint: expected a 'latest' file naming the tag folder, or "
        "*_optim_states.pt files (pass the tag to pick a folder)",
        dir));
  }
  impl->tag_dir = tag_path.string();
  impl->open_layout(tag_path);
  return DeepSpeedCheckpoint(std::move(impl));
}

const std::string& DeepSpeedCheckpoint::tag_dir() const {
  return impl_->tag_dir;
}
int DeepSpeedCheckpoint::stage() const {
  return impl_->stage;
}
int DeepSpeedCheckpoint::world_size() const {
  return impl_->world;
}
std::string DeepSpeedCheckpoint::dtype() const {
  return impl_->dtype;
}
const std::vector<DsParam>& DeepSpeedCheckpoint::params() const {
  return impl_->params;
}

std::optional<std::size_t> DeepSpeedCheckpoint::find(const std::string& name) const {
  auto it = impl_->by_name.find(name);
  if (it == impl_->by_name.end()) return std::nullopt;
  return it->second;
}

void DeepSpeedCheckpoint::read_fp32(std::size_t param, std::span<float> out) const {
  ZERO_CHECK_AS(IoError, param < impl_->params.size(), "{}: parameter index {} of {}",
                impl_->tag_dir, param, impl_->params.size());
  const DsParam& p = impl_->params[param];
  ZERO_CHECK(static_cast<std::int64_t>(out.size()) == p.numel(),
             "read_fp32('{}'): buffer of {} floats for {} elements", p.name, out.size(), p.numel());
  impl_->read_pieces(impl_->recipes[param].pieces, nullptr, out);
}

std::vector<float> DeepSpeedCheckpoint::read_fp32(std::size_t param) const {
  ZERO_CHECK_AS(IoError, param < impl_->params.size(), "{}: parameter index {} of {}",
                impl_->tag_dir, param, impl_->params.size());
  std::vector<float> out(static_cast<std::size_t>(impl_->params[param].numel()));
  read_fp32(param, out);
  return out;
}

void DeepSpeedCheckpoint::read_state(std::size_t param, const std::string& name,
                                     std::span<float> out) const {
  ZERO_CHECK_AS(IoError, param < impl_->params.size(), "{}: parameter index {} of {}",
                impl_->tag_dir, param, impl_->params.size());
  const DsParam& p = impl_->params[param];
  ZERO_CHECK_AS(IoError, impl_->recipes[param].has_state,
                "{}: '{}' is a {} and has no optimizer state", impl_->tag_dir, p.name,
                p.buffer ? "buffer" : "frozen parameter");
  auto it = impl_->state_sources.find(name);
  ZERO_CHECK_AS(IoError, it != impl_->state_sources.end(),
                "{}: no optimizer state '{}'; the checkpoint holds [{}]", impl_->tag_dir, name,
                fmt::join(impl_->state_names, ", "));
  ZERO_CHECK(static_cast<std::int64_t>(out.size()) == p.numel(),
             "read_state('{}', '{}'): buffer of {} floats for {} elements", p.name, name,
             out.size(), p.numel());
  impl_->read_pieces(impl_->recipes[param].pieces, &it->second, out);
}

std::vector<float> DeepSpeedCheckpoint::read_state(std::size_t param,
                                                   const std::string& name) const {
  ZERO_CHECK_AS(IoError, param < impl_->params.size(), "{}: parameter index {} of {}",
                impl_->tag_dir, param, impl_->params.size());
  std::vector<float> out(static_cast<std::size_t>(impl_->params[param].numel()));
  read_state(param, name, out);
  return out;
}

const std::vector<std::string>& DeepSpeedCheckpoint::state_names() const {
  return impl_->state_names;
}
std::int64_t DeepSpeedCheckpoint::step() const {
  return impl_->step;
}

std::optional<double> DeepSpeedCheckpoint::loss_scale() const {
  const nlohmann::json& s = impl_->scaler;
  if (!s.is_object() || !s.contains("cur_scale") || !s["cur_scale"].is_number())
    return std::nullopt;
  return s["cur_scale"].get<double>();
}

nlohmann::json DeepSpeedCheckpoint::scaler_state() const {
  return impl_->scaler;
}
bool DeepSpeedCheckpoint::dynamic_loss_scale() const {
  return impl_->dynamic_loss_scale;
}
std::optional<double> DeepSpeedCheckpoint::clip_grad() const {
  return impl_->clip_grad;
}
nlohmann::json DeepSpeedCheckpoint::param_groups() const {
  return impl_->param_groups;
}
std::int64_t DeepSpeedCheckpoint::global_steps() const {
  return impl_->global_steps;
}
std::int64_t DeepSpeedCheckpoint::global_samples() const {
  return impl_->global_samples;
}
std::int64_t DeepSpeedCheckpoint::skipped_steps() const {
  return impl_->skipped_steps;
}
nlohmann::json DeepSpeedCheckpoint::lr_scheduler() const {
  return impl_->lr_scheduler;
}
nlohmann::json DeepSpeedCheckpoint::ds_config() const {
  return impl_->ds_config;
}
std::string DeepSpeedCheckpoint::ds_version() const {
  return impl_->ds_version;
}

void write_fp32_safetensors(const DeepSpeedCheckpoint& checkpoint, const std::string& path,
                            const std::map<std::string, std::string>& metadata) {
  std::vector<io::TensorDecl> decls;
  for (const DsParam& p : checkpoint.params()) decls.push_back({p.name, DType::F32, p.shape});
  io::SafetensorsStreamWriter writer(path, decls, metadata);
  std::vector<float> values;
  for (std::size_t i = 0; i < checkpoint.params().size(); ++i) {
    values.resize(static_cast<std::size_t>(checkpoint.params()[i].numel()));
    checkpoint.read_fp32(i, values);
    writer.append(values.data(), values.size() * sizeof(float));
  }
  writer.finish();
}

}  // namespace zero::dscheckpoint
