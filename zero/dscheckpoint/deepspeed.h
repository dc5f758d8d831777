// DeepSpeed's own checkpoint directories (SPEC_DEEPSPEED.md §8), read without Python. Kinds:
//   ZeRO 1/2/3   <dir>/latest names <tag>;
//                <tag>/mp_rank_00_model_states.pt                         stage 1/2
//                <tag>/zero_pp_rank_<r>_mp_rank_00_model_states.pt        stage 3, one per rank
//                <tag>/[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt every rank
//   BF16_Optimizer  (bf16 + stage 1 + fp32 gradient accumulation) the same files, its own
//                partition layout (no zero_stage; partitions keep their padding)
//   ZeRO stage 0 only <tag>/mp_rank_00_model_states.pt: the weights in `module`, the optimizer
//                (torch's state dict, or DeepSpeed's fp16/bf16 wrapper holding the fp32 master
//                copies in fp32_groups / fp32_groups_flat) in `optimizer`
//   universal    ds_to_universal's output: <dir>/latest_universal names <tag>;
//                <tag>/zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt whole tensors,
//                <tag>/zero/optimizer_state.pt, <tag>/mp_rank_00_model_states.pt
// Parameters are reconstructed as DeepSpeed's zero_to_fp32.py does (§8.5): rank partitions
// concatenated in order, padding dropped, frozen parameters from the model states (in the dtype
// they were saved in), tied parameters resolved to their owner. Model-parallel (mp_rank_01...)
// and MoE checkpoints are refused with an error naming the kind and why.
//
// Memory: open() parses each rank's pickles once, one at a time, and keeps only where each
// tensor lives (a few dozen bytes per tensor); read_fp32/read_state read one parameter's bytes
// from each rank's file. Nothing is executed: see pickle.h for what the pickles may contain.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zero/base/dtype.h"

namespace zero::dscheckpoint {

// True when `dir` is a DeepSpeed save directory (its `latest` or `latest_universal` names a tag
// folder of any kind above) or a tag folder itself (it holds *_optim_states.pt files,
// mp_rank_NN_model_states.pt, or zero/optimizer_state.pt).
bool is_deepspeed_checkpoint(const std::string& dir);

enum class DsKind { Zero, Bf16Optimizer, Zero0, Universal };

struct DsParam {
  std::string name;
  std::vector<std::int64_t> shape;
  bool trainable = true;  // false: frozen parameter or buffer (no optimizer state)
  bool buffer = false;    // a persistent buffer from the model states (zero_to_fp32 keeps them)
  // Frozen parameters and buffers: the dtype they were saved in, fp32, fp16 or bf16 (read_fp32
  // widens it exactly; another dtype shows as F32); F32 for trainable parameters.
  DType saved_dtype = DType::F32;
  // A tied parameter: reading it reads its owner (SPEC §8.2 shared_params).
  std::optional<std::string> tied_to = {};

  std::int64_t numel() const;
};

// Thread safety: none (the open files are cached). Errors throw zero::IoError naming the file,
// the key path inside its pickle and what was expected.
class DeepSpeedCheckpoint {
 public:
  // `dir` is the save directory (with `latest`) or a tag folder; `tag` picks a tag folder of
  // `dir` instead of the one `latest` names. Reads every rank's pickles once and checks the
  // layout (ranks 0..W-1 all present, partition sizes consistent with param_shapes).
  static DeepSpeedCheckpoint open(const std::string& dir, const std::string& tag = {});

  DeepSpeedCheckpoint(DeepSpeedCheckpoint&&) noexcept;
  DeepSpeedCheckpoint& operator=(DeepSpeedCheckpoint&&) noexcept;
  ~DeepSpeedCheckpoint();

  const std::string& tag_dir() const;
  DsKind kind() const;
  // The kind as messages name it: "ZeRO stage 2", "BF16_Optimizer (stage 1)", "ZeRO stage 0
  // (bf16, fp32 master copies in optimizer.fp32_groups)", "universal (from ZeRO stage 2)".
  std::string kind_name() const;
  // 0 for a stage-0 checkpoint; a universal checkpoint's is the stage it was converted from.
  int stage() const;
  // Ranks the optimizer states are partitioned over (partition_count); stage 0: the model
  // states' dp_world_size.
  int world_size() const;
  // The model's (low-precision) dtype as saved in the model states: "fp32", "fp16" or "bf16".
  std::string dtype() const;

  // Every tensor zero_to_fp32 would output, in the order of the saved module state_dict
  // (model order), then any left over in param_shapes order. Stage 1 checkpoints carry no
  // frozen parameters (DeepSpeed's zero_to_fp32 omits them too).
  const std::vector<DsParam>& params() const;
  // Index into params(), or nothing.
  std::optional<std::size_t> find(const std::string& name) const;

  // The fp32 master weights of params()[param], reconstructed (SPEC §8.5); frozen parameters
  // and buffers converted to float from their saved dtype. Size == numel.
  std::vector<float> read_fp32(std::size_t param) const;
  // The same into a caller's buffer. REQUIRES: out.size() == params()[param].numel().
  void read_fp32(std::size_t param, std::span<float> out) const;
  // An optimizer state tensor of a trainable parameter ("exp_avg", "exp_avg_sq" for Adam),
  // reconstructed like the master weights. Throws for frozen parameters and buffers, and names
  // the states the checkpoint has when `name` is not among them.
  std::vector<float> read_state(std::size_t param, const std::string& name) const;
  void read_state(std::size_t param, const std::string& name, std::span<float> out) const;
  // Tensor-valued optimizer states per parameter ("exp_avg", "exp_avg_sq", ...).
  const std::vector<std::string>& state_names() const;

  // The optimizer step count (state "step" of the first group; 0 when the optimizer never
  // stepped).
  std::int64_t step() const;
  // The loss scaler's cur_scale; nothing when the checkpoint has no scaler object.
  std::optional<double> loss_scale() const;
  // The loss scaler's attributes ({"__type__": "...LossScaler", "cur_scale": 1.0, ...}), null
  // when absent.
  nlohmann::json scaler_state() const;
  bool dynamic_loss_scale() const;
  // Stage 1/2: clip_grad saved in the optimizer states (DeepSpeed restores it over the config).
  std::optional<double> clip_grad() const;
  // Hyperparameters of each optimizer param group (lr, betas, eps, weight_decay, ...; "params"
  // removed), from rank 0's optimizer states.
  nlohmann::json param_groups() const;

  // From rank 0's model states.
  std::int64_t global_steps() const;
  std::int64_t global_samples() const;
  std::int64_t skipped_steps() const;
  nlohmann::json lr_scheduler() const;  // null when absent
  nlohmann::json ds_config() const;
  std::string ds_version() const;

  struct Impl;

 private:
  explicit DeepSpeedCheckpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// zero_to_fp32: writes every params() tensor as F32 to a safetensors file at `path`, in
// params() order, one tensor in memory at a time (SafetensorsStreamWriter: temp file, fsync,
// rename). `metadata` becomes the header's __metadata__.
void write_fp32_safetensors(const DeepSpeedCheckpoint& checkpoint, const std::string& path,
                            const std::map<std::string, std::string>& metadata = {});

}  // namespace zero::dscheckpoint
