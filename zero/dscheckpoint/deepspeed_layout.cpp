// DeepSpeedCheckpoint::open's layout pass for ZeRO 1/2/3 and BF16_Optimizer checkpoints
// (SPEC_DEEPSPEED.md §8): which files the tag folder holds, what rank 0's model states and every
// rank's optimizer states say, and from that where each parameter's elements lie in the ranks'
// partitions. One step per function, called in order by Impl::open_partitioned; each parses its
// pickles once and keeps only tensor locations. Steps 1 and 3, the tag folder's files, are
// deepspeed_tag_dir.cpp's; step 4 and the last ones are shared with the other kinds
// (deepspeed_model_states.h).
//
// BF16_Optimizer (bf16, stage 1, fp32 gradient accumulation) saves like ZeRO-1 but without
// `zero_stage`, and its single_partition_of_fp32_groups keep their padding (group_paddings).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "zero/base/error.h"
#include "zero/dscheckpoint/deepspeed_impl.h"
#include "zero/dscheckpoint/deepspeed_model_states.h"
#include "zero/dscheckpoint/deepspeed_tag_dir.h"

namespace zero::dscheckpoint {
namespace {

namespace fs = std::filesystem;
using Impl = DeepSpeedCheckpoint::Impl;

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) {
  return (x + a - 1) / a * a;
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
  if (zs) {
    const std::int64_t s = stage_value(*zs);
    if (s < 1 || s > 3) zs->fail("ZeRO stage 1, 2 or 3");
    ck.stage = static_cast<int>(s);
    ck.kind = DsKind::Zero;
  } else if (osd.has("single_partition_of_fp32_groups") && osd.has("group_paddings")) {
    ck.stage = 1;
    ck.kind = DsKind::Bf16Optimizer;
  } else {
    osd.error(
        "unknown DeepSpeed optimizer states: neither 'zero_stage' (ZeRO stage 1, 2 or 3) nor "
        "BF16_Optimizer's 'single_partition_of_fp32_groups' and 'group_paddings'");
  }
  ck.world = partition_count(osd.get("partition_count"));
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
  if (auto st = state_of_master(ck, groups, 0, 0)) read_state_names_and_step(ck, f, *st);
  if (auto s = osd.find("base_optimizer_state_step")) ck.step = std::llround(scalar_number(f, *s));
  if (auto ls = osd.find("loss_scaler"); ls && !ls->is_none()) ck.scaler = ls->to_json();
  if (auto d = osd.find("dynamic_loss_scale"); d && d->is(PickleValue::Kind::Bool))
    ck.dynamic_loss_scale = d->as_bool();
  if (auto c = osd.find("clip_grad"); c && !c->is_none()) ck.clip_grad = c->as_number();
  if (groups.param_groups) read_param_groups(ck, *groups.param_groups);
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
    if (ck.kind == DsKind::Zero && stage_value(osd.get("zero_stage")) != ck.stage) {
      osd.get("zero_stage").fail(fmt::format("stage {} like rank 0", ck.stage));
    }
    if (ck.kind == DsKind::Bf16Optimizer && osd.has("zero_stage")) {
      osd.get("zero_stage").error("a ZeRO rank file among BF16_Optimizer ones (rank 0 has none)");
    }
    const RankGroups groups = rank_groups(ck, osd, ms, model_files[0]);
    std::optional<PickleView> paddings;
    if (ck.kind == DsKind::Bf16Optimizer) {
      paddings = osd.get("group_paddings");
      if (paddings->size() != n_groups) paddings->fail(fmt::format("{} paddings", n_groups));
    }
    for (std::size_t g = 0; g < n_groups; ++g) {
      Impl::Source master;
      for (const PickleView& v : groups.masters[g]) {
        Impl::TensorLoc t = ck.locate(file, f, v);
        if (paddings) {
          // BF16_Optimizer keeps the padding in its partitions; ZeRO-1/2 drop it when saving.
          const PickleView pad = paddings->element(g);
          const std::int64_t n = pad.as_int();
          if (n < 0 || static_cast<std::uint64_t>(n) > t.numel)
            pad.fail(fmt::format("a padding of at most the partition's {} elements", t.numel));
          t.numel -= static_cast<std::uint64_t>(n);
        }
        master.add(std::move(t));
      }
      masters[g][r] = ck.add_source(std::move(master));
    }
    if (r == 0) read_optimizer_facts(ck, f, osd, groups);
    locate_states(ck, file, f, groups, masters, r);
  }
  return masters;
}

// --- step 6: trainable parameters: where each lies in the ranks' partitions (SPEC §8.5) -------

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
      out.add({.name = p.name, .shape = p.shape}, std::move(recipe));
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
      out.add({.name = p.name, .shape = p.shape}, std::move(recipe));
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

}  // namespace

void DeepSpeedCheckpoint::Impl::open_partitioned(const fs::path& tag) {
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
  finish_layout(*this, ms, std::move(found), model0);
}

}  // namespace zero::dscheckpoint
