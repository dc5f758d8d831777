// Internal to zero/dscheckpoint: what every kind of DeepSpeed checkpoint shares, used by the
// layout passes of each kind (deepspeed_layout.cpp: ZeRO 1/2/3 and BF16_Optimizer;
// deepspeed_zero0.cpp: stage 0; deepspeed_universal.cpp: ds_to_universal's output):
//   - the model-states file (SPEC_DEEPSPEED.md §8.2): module, buffers, param_shapes, frozen and
//     tied parameters, the engine's counters;
//   - the optimizer's step, param groups and loss scaler;
//   - the last steps of every layout: frozen parameters and buffers as parameters of their own,
//     tied aliases, and the model's order.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zero/dscheckpoint/deepspeed_impl.h"

namespace zero::dscheckpoint {

struct Named {
  std::string name;
  std::vector<std::int64_t> shape;
  std::string where;
};

struct ModelStates {
  // param_shapes: stage 1/2 per group; stage 3 per sub-group; empty when None (stage 0).
  std::vector<std::vector<Named>> group_shapes;
  std::vector<Named> frozen;
  std::vector<std::pair<std::string, std::string>> shared;  // alias, owner
  std::vector<std::string> module_order;
  // module entries that are not buffers (stage 0 reads its weights from them), in order.
  std::vector<std::pair<std::string, DeepSpeedCheckpoint::Impl::TensorLoc>> module_params;
  std::map<std::string, DeepSpeedCheckpoint::Impl::TensorLoc> buffers;
  std::map<std::string, DeepSpeedCheckpoint::Impl::Source> frozen_sources;  // name → fragments
};

// Reads a model-states file (rank 0's, or the one of a stage-0 or universal tag folder). Also
// sets the model dtype and the engine counters (global_steps, lr_scheduler, ...) of `ck`.
ModelStates read_model_states(DeepSpeedCheckpoint::Impl& ck, const std::filesystem::path& file);
// The same from a file already opened and added as ck.files[file].
ModelStates read_model_states(DeepSpeedCheckpoint::Impl& ck, std::size_t file, const PtFile& f);

// The DType of a saved tensor: fp32, fp16 or bf16 as they are, any other as F32 (read widened or
// rounded to fp32).
DType saved_dtype(const TensorRef& t);

// A number that may be saved as an int, a float or a 0-d tensor (torch >= 1.12 keeps Adam's
// step as a tensor).
double scalar_number(const PtFile& file, const PickleView& v);

// The stage from `zero_stage`: a pickled ZeroStageEnum (an Object whose argument is the value)
// or a plain int.
std::int64_t stage_value(const PickleView& v);
// The world size from `partition_count`: an int (stage 3) or a list of them (stage 1/2: the
// largest).
int partition_count(const PickleView& v);

// The state names (tensor entries but "step") and the step of one optimizer state entry.
void read_state_names_and_step(DeepSpeedCheckpoint::Impl& ck, const PtFile& f,
                               const PickleView& state);
// A torch optimizer's param_groups, "params" removed, into ck.param_groups.
void read_param_groups(DeepSpeedCheckpoint::Impl& ck, const PickleView& param_groups);

// Parameters with how to read each, in the order they were found.
struct Found {
  std::vector<DsParam> params;
  std::vector<DeepSpeedCheckpoint::Impl::Recipe> recipes;
  void add(DsParam p, DeepSpeedCheckpoint::Impl::Recipe r) {
    params.push_back(std::move(p));
    recipes.push_back(std::move(r));
  }
};

// Appends the frozen parameters (their fragments checked against their shapes; stage 3 ones
// may carry padding) and the buffers to `found`, then the tied aliases, and stores everything
// in `ck` in the model's order: the saved module's, then whatever it does not list. `model0`
// names the model-states file in messages.
void finish_layout(DeepSpeedCheckpoint::Impl& ck, ModelStates& ms, Found found,
                   const std::string& model0);

}  // namespace zero::dscheckpoint
