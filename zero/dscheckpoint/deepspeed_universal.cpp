// DeepSpeedCheckpoint::open's layout pass for a universal checkpoint, the output of DeepSpeed's
// ds_to_universal (SPEC_DEEPSPEED.md §8.6): no partitions at all, every trainable parameter
// whole in a folder of its own,
//   <tag>/zero/<name>/fp32.pt        {"param": the fp32 master weights, ...merge metadata}
//   <tag>/zero/<name>/<state>.pt     {"param": ...} for each optimizer state (exp_avg, ...)
//   <tag>/zero/<name>/step.pt        the optimizer step (a 0-d tensor; none from stage 3)
//   <tag>/zero/optimizer_state.pt    loss scaler, clip_grad, zero_stage, partition_count,
//                                    param_groups
//   <tag>/mp_rank_00_model_states.pt the model states of the checkpoint it was made from
// The parameters and their order come from the model states' param_shapes, so a folder missing
// for one of them is an error that names it.
#include <fmt/format.h>

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

// The state names of one parameter folder: its *.pt files but fp32.pt and step.pt, sorted.
std::vector<std::string> folder_states(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".pt") && name != "fp32.pt" && name != "step.pt")
      out.push_back(name.substr(0, name.size() - 3));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The "param" tensor of a universal file, checked to hold `numel` elements.
Impl::TensorLoc param_tensor(Impl& ck, const fs::path& file, const Named& p, std::uint64_t numel) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    throw IoError(fmt::format("{}: missing: universal checkpoint parameter '{}' has no {}",
                              file.string(), p.name, file.filename().string()));
  }
  const std::size_t id = ck.add_file(file);
  const PtFile f = PtFile::open(ck.files[id]);
  const PickleView root = f.root();
  Impl::TensorLoc t = ck.locate(id, f, root.is(PickleValue::Kind::Tensor) ? root : root.get("param"));
  if (t.numel != numel) {
    throw IoError(fmt::format("{}: {} elements, expected {} for '{}' (shape in {})", t.where,
                              t.numel, numel, p.name, p.where));
  }
  return t;
}

}  // namespace

void DeepSpeedCheckpoint::Impl::open_universal(const fs::path& tag) {
  const TagListing listing = list_tag_dir(tag, /*need_optim=*/false);
  std::optional<fs::path> model = listing.model;
  if (!model && listing.zero_model.count(0)) model = listing.zero_model.at(0);
  ZERO_CHECK_AS(IoError, model.has_value(),
                "{}: a universal checkpoint without its model states (mp_rank_00_model_states.pt)",
                tag.string());
  ModelStates ms = read_model_states(*this, *model);
  ZERO_CHECK_AS(IoError, !ms.group_shapes.empty(),
                "{}: param_shapes is empty: a universal checkpoint's model states must list the "
                "parameters",
                model->string());

  const fs::path zero_dir = tag / "zero";
  const std::size_t common = add_file(zero_dir / "optimizer_state.pt");
  {
    const PtFile f = PtFile::open(files[common]);
    const PickleView root = f.root();
    const std::int64_t s = stage_value(root.get("zero_stage"));
    if (s < 1 || s > 3) root.get("zero_stage").fail("ZeRO stage 1, 2 or 3");
    stage = static_cast<int>(s);
    world = partition_count(root.get("partition_count"));
    if (auto ls = root.find("loss_scaler"); ls && !ls->is_none()) scaler = ls->to_json();
    if (auto d = root.find("dynamic_loss_scale"); d && d->is(PickleValue::Kind::Bool))
      dynamic_loss_scale = d->as_bool();
    if (auto c = root.find("clip_grad"); c && !c->is_none()) clip_grad = c->as_number();
    if (auto pg = root.find("param_groups")) read_param_groups(*this, *pg);
  }

  Found found;
  bool first = true;
  for (const auto& group : ms.group_shapes) {
    for (const Named& p : group) {
      const fs::path folder = zero_dir / p.name;
      std::error_code ec;
      if (!fs::is_directory(folder, ec)) {
        throw IoError(fmt::format(
            "{}: missing: the universal checkpoint has no folder for parameter '{}' (listed in "
            "{}); was ds_to_universal interrupted?",
            folder.string(), p.name, p.where));
      }
      const auto n = static_cast<std::uint64_t>(shape_numel(p.shape, p.where));
      if (first) {
        state_names = folder_states(folder);
        if (fs::is_regular_file(folder / "step.pt", ec)) {
          const PtFile f = PtFile::open((folder / "step.pt").string());
          step = std::llround(scalar_number(f, f.root()));
        } else {
          // ds_to_universal writes no step.pt for a stage-3 source: the engine's count of
          // applied steps stands in for it.
          step = global_steps - skipped_steps;
        }
        first = false;
      }
      Source master;
      master.add(param_tensor(*this, folder / "fp32.pt", p, n));
      const std::size_t id = add_source(std::move(master));
      for (const std::string& sn : state_names) {
        Source s;
        s.add(param_tensor(*this, folder / (sn + ".pt"), p, n));
        state_sources[sn][id] = add_source(std::move(s));
      }
      found.add({.name = p.name, .shape = p.shape}, {{{id, 0, n}}, true});
    }
  }
  finish_layout(*this, ms, std::move(found), model->string());
}

}  // namespace zero::dscheckpoint
