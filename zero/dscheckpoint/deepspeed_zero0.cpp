// DeepSpeedCheckpoint::open's layout pass for ZeRO stage 0 (plain data parallel: no
// zero_optimization block). The tag folder holds only mp_rank_00_model_states.pt; DeepSpeed
// saves the whole optimizer in its `optimizer` entry (SPEC_DEEPSPEED.md §8.2), as one of:
//   - torch's optimizer state_dict ({"state", "param_groups"}): fp32 training; the weights are
//     `module`'s;
//   - FP16_UnfusedOptimizer's (fp16 or bf16 with a torch optimizer): "fp32_groups", the fp32
//     master copy of every parameter, group by group, and "optimizer_state_dict" for the moments;
//   - FP16_Optimizer's (fp16 or bf16 with a fused optimizer): "fp32_groups_flat", one flat fp32
//     master tensor per group, moments flat per group too;
//   - None (saved without the optimizer): the weights are `module`'s.
// DeepSpeed stores no parameter names with the optimizer at stage 0: its parameters are the
// module's trainable ones in model order. When the optimizer holds fewer than the module (frozen
// parameters), they are matched by shape, and only a matching that is the one possible is used.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "zero/base/error.h"
#include "zero/dscheckpoint/deepspeed_impl.h"
#include "zero/dscheckpoint/deepspeed_model_states.h"
#include "zero/dscheckpoint/deepspeed_tag_dir.h"

namespace zero::dscheckpoint {
namespace {

namespace fs = std::filesystem;
using Impl = DeepSpeedCheckpoint::Impl;

// One parameter the optimizer holds: its id in the state dict, its group, and (fp32_groups and
// moments) its shape when the file shows it.
struct OptParam {
  std::int64_t id = 0;
  std::size_t group = 0;
  std::size_t index = 0;  // in its group
  std::optional<std::vector<std::int64_t>> shape;
  std::string where;  // the key path that shows it, for messages
};

std::string shape_text(const std::vector<std::int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

// Which module parameter each optimizer parameter is: the identity when they are as many, else
// the one order-preserving matching by shape (greedy from the left and from the right agree);
// throws naming `model_file` when there is none or more than one.
std::vector<std::size_t> match_to_module(
    const std::vector<OptParam>& opt,
    const std::vector<std::pair<std::string, Impl::TensorLoc>>& module,
    const std::string& model_file) {
  const std::size_t m = module.size(), p = opt.size();
  auto fits = [&](std::size_t k, std::size_t j) {
    return !opt[k].shape || *opt[k].shape == module[j].second.ref.shape;
  };
  if (p == m) {
    std::vector<std::size_t> out(p);
    for (std::size_t k = 0; k < p; ++k) {
      if (!fits(k, k)) {
        throw IoError(fmt::format(
            "{}: {} has shape {}, but the module's parameter {} of {} ('{}') is {}: the "
            "optimizer's parameters do not match the module's",
            model_file, opt[k].where, shape_text(*opt[k].shape), k, m, module[k].first,
            shape_text(module[k].second.ref.shape)));
      }
      out[k] = k;
    }
    return out;
  }
  if (p > m) {
    throw IoError(fmt::format(
        "{}: the optimizer holds {} parameters, the module only {}: they do not belong together",
        model_file, p, m));
  }
  std::vector<std::size_t> left(p), right(p);
  bool ok = true;
  for (std::size_t k = 0, j = 0; k < p && ok; ++k, ++j) {
    while (j < m && !fits(k, j)) ++j;
    ok = j < m;
    if (ok) left[k] = j;
  }
  for (std::size_t k = p, j = m; k-- > 0 && ok;) {
    while (j > 0 && !fits(k, j - 1)) --j;
    ok = j > 0;
    if (ok) right[k] = --j;
  }
  if (!ok || left != right) {
    throw IoError(fmt::format(
        "{}: the optimizer holds {} of the module's {} parameters (the others are frozen), and "
        "{}; a stage-0 checkpoint names no parameters, so they cannot be told apart",
        model_file, p, m,
        ok ? "more than one choice of parameters fits their shapes"
           : "no choice of parameters fits their shapes"));
  }
  return left;
}

}  // namespace

void DeepSpeedCheckpoint::Impl::open_zero0(const fs::path& tag) {
  const TagListing listing = list_tag_dir(tag, /*need_optim=*/false);
  ZERO_CHECK_AS(IoError, listing.model.has_value(), "{}: no mp_rank_00_model_states.pt",
                tag.string());
  stage = 0;
  const std::size_t model_file = add_file(*listing.model);
  const std::string model0 = files[model_file];
  const PtFile f = PtFile::open(model0);
  ModelStates ms = read_model_states(*this, model_file, f);
  world = dp_world_size;
  const PickleView root = f.root();
  const PickleView optimizer = root.get("optimizer");

  // Where the masters are, and the torch optimizer state dict with the moments.
  std::optional<PickleView> inner;
  std::optional<PickleView> groups;      // fp32_groups: per group, a list of tensors
  std::optional<PickleView> flat_groups; // fp32_groups_flat: per group, one tensor
  if (optimizer.is_none()) {
    // Saved without the optimizer: weights only.
  } else if (optimizer.has("fp32_groups")) {
    groups = optimizer.get("fp32_groups");
    inner = optimizer.get("optimizer_state_dict");
    zero0_masters = "optimizer.fp32_groups";
  } else if (optimizer.has("fp32_groups_flat")) {
    flat_groups = optimizer.get("fp32_groups_flat");
    inner = optimizer.get("optimizer_state_dict");
    zero0_masters = "optimizer.fp32_groups_flat";
  } else if (optimizer.has("state") && optimizer.has("param_groups")) {
    inner = optimizer;
  } else {
    optimizer.error(
        "unknown stage-0 optimizer state: expected a torch optimizer state_dict ('state', "
        "'param_groups') or DeepSpeed's fp16/bf16 wrapper ('fp32_groups' or 'fp32_groups_flat')");
  }

  // The optimizer's parameters, group by group.
  std::vector<OptParam> opt;
  std::optional<PickleView> state;
  if (inner) {
    state = inner->get("state");
    const PickleView pgs = inner->get("param_groups");
    for (const auto& masters : {groups, flat_groups}) {
      if (masters && masters->size() != pgs.size())
        masters->fail(fmt::format("{} groups, as many as the optimizer's param_groups", pgs.size()));
    }
    for (std::size_t g = 0; g < pgs.size() && flat_groups; ++g) {
      // FP16_Optimizer: each group is one flat parameter, the module's trainable parameters of
      // that group back to back; they are taken in model order until its flat is full.
      const PickleView ids = pgs.element(g).get("params");
      if (ids.size() != 1) ids.fail("one flat parameter per group (FP16_Optimizer)");
      const std::uint64_t flat_numel =
          static_cast<std::uint64_t>(flat_groups->element(g).as_tensor().numel());
      std::uint64_t used = 0;
      while (used < flat_numel && opt.size() < ms.module_params.size()) {
        used += ms.module_params[opt.size()].second.numel;
        opt.push_back({ids.element(0).as_int(), g, 0, std::nullopt, where_of(ids.element(0))});
      }
    }
    for (std::size_t g = 0; g < pgs.size() && !flat_groups; ++g) {
      const PickleView ids = pgs.element(g).get("params");
      for (std::size_t i = 0; i < ids.size(); ++i) {
        OptParam o{ids.element(i).as_int(), g, i, std::nullopt, where_of(ids.element(i))};
        if (groups) {
          const PickleView t = groups->element(g).element(i);
          o.shape = t.as_tensor().shape;
          o.where = where_of(t);
        } else {
          if (auto st = state->find(o.id); st && st->has("exp_avg")) {
            o.shape = st->get("exp_avg").as_tensor().shape;
            o.where = where_of(st->get("exp_avg"));
          }
        }
        opt.push_back(std::move(o));
      }
    }
    read_param_groups(*this, pgs);
    for (const OptParam& o : opt) {
      if (auto st = state->find(o.id)) {
        read_state_names_and_step(*this, f, *st);
        break;
      }
    }
  } else {
    opt.resize(ms.module_params.size());  // no optimizer: every parameter, shapes unknown
  }
  const std::vector<std::size_t> module_of = match_to_module(opt, ms.module_params, model0);

  // The fp32_groups_flat groups: one source each, sliced by the parameters in order.
  std::vector<std::size_t> flat_source;
  std::vector<std::uint64_t> flat_used;
  if (flat_groups) {
    for (const PickleView& t : flat_groups->elements()) {
      Source s;
      s.add(locate(model_file, f, t));
      flat_source.push_back(add_source(std::move(s)));
      flat_used.push_back(0);
    }
  }

  Found found;
  std::vector<bool> trainable(ms.module_params.size(), false);
  for (std::size_t k = 0; k < opt.size(); ++k) {
    const std::size_t j = module_of[k];
    trainable[j] = true;
    const auto& [name, loc] = ms.module_params[j];
    const std::uint64_t n = loc.numel;
    Recipe recipe;
    std::size_t master = 0;
    std::uint64_t offset = 0;
    if (groups) {
      Source s;
      s.add(locate(model_file, f, groups->element(opt[k].group).element(opt[k].index)));
      master = add_source(std::move(s));
    } else if (flat_groups) {
      master = flat_source[opt[k].group];
      offset = flat_used[opt[k].group];
      flat_used[opt[k].group] += n;
      if (flat_used[opt[k].group] > sources[master].numel) {
        throw IoError(fmt::format(
            "{}: optimizer.fp32_groups_flat[{}] holds {} elements, fewer than its parameters "
            "need (reached {} at '{}')",
            model0, opt[k].group, sources[master].numel, flat_used[opt[k].group], name));
      }
    } else {
      Source s;
      s.add(loc);
      master = add_source(std::move(s));
    }
    recipe.pieces.push_back({master, offset, n});
    recipe.has_state = !state_names.empty();
    for (const std::string& sn : state_names) {
      // fp32_groups_flat: the moments are flat per group too, under the group's one id.
      auto& by_master = state_sources[sn];
      if (by_master.count(master)) continue;
      const PickleView t = state->get(opt[k].id).get(sn);
      Source s;
      s.add(locate(model_file, f, t));
      if (s.numel != sources[master].numel) {
        throw IoError(fmt::format("{}: {} elements, expected {} like the master {}", where_of(t),
                                  s.numel, sources[master].numel, sources[master].parts[0].where));
      }
      by_master[master] = add_source(std::move(s));
    }
    if (sources[master].parts[0].numel < offset + n || (!flat_groups && sources[master].numel != n)) {
      throw IoError(fmt::format("{}: {} elements, expected {} for '{}' of shape {}",
                                sources[master].parts[0].where, sources[master].numel, n, name,
                                shape_text(loc.ref.shape)));
    }
    found.add({.name = name, .shape = loc.ref.shape}, std::move(recipe));
  }
  for (std::size_t g = 0; g < flat_used.size(); ++g) {
    if (flat_used[g] != sources[flat_source[g]].numel) {
      throw IoError(fmt::format(
          "{}: optimizer.fp32_groups_flat[{}] holds {} elements, its parameters {}", model0, g,
          sources[flat_source[g]].numel, flat_used[g]));
    }
  }
  // Parameters the optimizer does not hold are frozen: their values are the module's.
  for (std::size_t j = 0; j < ms.module_params.size(); ++j) {
    if (trainable[j]) continue;
    const auto& [name, loc] = ms.module_params[j];
    Source s;
    s.add(loc);
    const std::uint64_t n = loc.numel;
    found.add({.name = name, .shape = loc.ref.shape, .trainable = false,
               .saved_dtype = saved_dtype(loc.ref)},
              {{{add_source(std::move(s)), 0, n}}, false});
  }

  // The wrapper's loss scaler and clip_grad.
  if (!optimizer.is_none() && (groups || flat_groups)) {
    nlohmann::json sc = nlohmann::json::object();
    for (const char* key : {"cur_scale", "scale_factor"}) {
      if (auto v = optimizer.find(key); v && !v->is_none()) sc[key] = v->as_number();
    }
    for (const char* key : {"cur_iter", "last_overflow_iter", "scale_window"}) {
      if (auto v = optimizer.find(key); v && !v->is_none()) sc[key] = v->as_int();
    }
    if (!sc.empty()) scaler = sc;
    if (auto d = optimizer.find("dynamic_loss_scale"); d && d->is(PickleValue::Kind::Bool))
      dynamic_loss_scale = d->as_bool();
    if (auto c = optimizer.find("clip_grad"); c && !c->is_none()) clip_grad = c->as_number();
  }
  finish_layout(*this, ms, std::move(found), model0);
}

}  // namespace zero::dscheckpoint
