// One way to read a checkpoint, whichever wrote it: zero's own format (checkpoint.h: a manifest
// and per-rank safetensors files) or DeepSpeed's (zero/dscheckpoint/deepspeed.h: .pt files).
// Engine::load_checkpoint and zero_to_fp32 read through it, so both accept the same folders and
// see the same parameters and values.
//
// Callers: one CheckpointSource per reader. With in-process ranks every rank opens its own.
// Thread safety: none; a source caches open files (and, for DeepSpeed, the last parameter it
// reconstructed), so one thread at a time, const methods included.
// What is checked when:
//   open()            the folder's structure: zero — the manifest (types, bounds, one file per
//                     rank) and that every file holds the tensors it lists with their sizes;
//                     DeepSpeed — every rank's pickles, the partition sizes against param_shapes.
//   verify()          zero — the XXH3 checksum of every tensor in this rank's share of the files;
//                     DeepSpeed stores no checksums (libzip checks each entry's CRC on read).
//   read*()           the requested range against the parameter; the bytes as they are read.
// Errors: zero::IoError naming the checkpoint path or file and, where one is involved, the
// tensor or parameter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zero/base/dtype.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/schedule/loss_scaler.h"

namespace zero::ckpt {

enum class Format { Zero, DeepSpeed };

// "zero" or "DeepSpeed", as messages name them.
std::string_view format_name(Format format);

// DeepSpeed when `dir` is a DeepSpeed save directory (its `latest` names a folder holding
// *_optim_states.pt) or a DeepSpeed tag folder; zero otherwise — whether it is a checkpoint at
// all is for CheckpointSource::open to find out and say.
Format detect_format(const std::string& dir);

struct SourceParam {
  std::string name;
  std::vector<std::int64_t> shape;
  std::uint64_t numel = 0;
  // Master weights and optimizer states were saved for it (read() serves it).
  bool trainable = true;
  // DeepSpeed: a persistent buffer of the module (not trainable; zero_to_fp32 writes it).
  bool buffer = false;
  // The dtype read_frozen_raw() returns a non-trainable parameter in: zero — the model copy's;
  // DeepSpeed — the dtype it was saved in (fp32 when that was another, e.g. float64).
  DType frozen_dtype = DType::F32;
  // zero: other names of this tensor (tied parameters), stored once under `name`.
  std::vector<std::string> aliases = {};
  // DeepSpeed: this entry is a tied parameter listed under its own name; it reads the values of
  // its owner `tied_to`.
  std::optional<std::string> tied_to = {};

  // The dtype a consolidated copy keeps it in, as DeepSpeed's zero_to_fp32 does: F32 for a
  // trainable parameter's master weights and for a buffer, frozen_dtype for a frozen parameter.
  DType stored_dtype() const { return trainable || buffer ? DType::F32 : frozen_dtype; }
};

// The training position a checkpoint records.
struct SourceCounters {
  std::int64_t global_steps = 0, skipped_steps = 0, applied_steps = 0, last_batch_iteration = -1;
  // Nothing when the checkpoint holds no dynamic loss scaler to continue.
  std::optional<LossScalerState> scaler;
  // Each param group's lr for the next step, as saved (a client LR scheduler's last setting);
  // empty when the checkpoint does not record it (DeepSpeed's: the config's lr stays).
  std::vector<double> group_lrs;
};

// A file whose tensors carry checksums, for verify_file() and progress reports.
struct ChecksummedFile {
  std::string file;  // relative to path()
  std::size_t tensors = 0;
  std::uint64_t bytes = 0;
};

class CheckpointSource {
 public:
  // Opens the checkpoint of tag `tag` in save directory `dir` (tag empty: the one <dir>/latest
  // names), in the format detect_format(dir) finds. A DeepSpeed tag folder may also be passed
  // as `dir` itself. Throws IoError naming the path and what is missing or malformed.
  static std::unique_ptr<CheckpointSource> open(const std::string& dir,
                                                const std::string& tag = {});

  virtual ~CheckpointSource() = default;

  virtual Format format() const = 0;
  // The tag folder.
  virtual std::string path() const = 0;
  // What wrote it, for messages: "zero (ZeRO stage 2)", "DeepSpeed ZeRO stage 3", "DeepSpeed
  // BF16_Optimizer (stage 1)", "DeepSpeed ZeRO stage 0 (bf16, fp32 master copies in
  // optimizer.fp32_groups)", "DeepSpeed universal (from ZeRO stage 2)".
  virtual std::string kind() const = 0;
  // The ZeRO stage (0 for DeepSpeed's stage 0) and the number of ranks the checkpoint was saved
  // from.
  virtual int stage() const = 0;
  virtual int world_size() const = 0;
  // The model's dtype as saved: "fp32", "fp16" or "bf16" (DeepSpeed: another torch dtype name
  // when the model held one).
  virtual std::string model_dtype() const = 0;

  // Every parameter, in the order the checkpoint lists them (zero: registration order;
  // DeepSpeed: the order its own zero_to_fp32 writes).
  virtual const std::vector<SourceParam>& params() const = 0;

  // Empty when this checkpoint holds the optimizer states `names` of optimizer `kind`
  // ("adamw", ...) that a load into an engine needs; otherwise why not, as one sentence.
  virtual std::string check_states(const std::vector<std::string>& names,
                                   const std::string& kind) const = 0;

  // The files verify() checks, in order (zero: the rank files by rank; DeepSpeed: none).
  virtual std::vector<ChecksummedFile> checksummed_files() const = 0;
  // Checks every tensor of checksummed_files()[i] against its checksum; throws IoError naming
  // the file and the tensor on a mismatch.
  virtual void verify_file(std::size_t i) const = 0;
  // Rank `rank` of `world` verifies its share: files i with i mod world == rank, so together the
  // ranks check each file once whatever the world size was at save.
  void verify(int rank, int world) const;

  // Elements [begin, begin + count) of trainable parameter p's "master" weights or of its
  // optimizer state `what` ("exp_avg", ...), as fp32, into out[0, count). `also`, if given, sees
  // the same values once more, stretch by stretch while they are in cache: also(values, first, n)
  // with values holding elements [first, first + n) of out (fp32 bytes, any alignment).
  // REQUIRES: params()[p].trainable. Reading a parameter's ranges in order is cheapest (a
  // DeepSpeed parameter is reconstructed whole once and kept for the ranges that follow).
  using ValuesFn = CheckpointReader::ValuesFn;
  void read(std::size_t p, const std::string& what, std::uint64_t begin, std::uint64_t count,
            float* out, const ValuesFn& also = nullptr) const {
    read_values(p, what, begin, count, out, also);
  }
  // Parameter p whole as fp32, for a reader that keeps it frozen: a non-trainable parameter's
  // saved values widened exactly, a trainable one's master weights.
  virtual std::vector<float> read_frozen(std::size_t p) const = 0;
  // The saved bytes of non-trainable parameter p, numel elements of params()[p].frozen_dtype.
  virtual std::vector<std::byte> read_frozen_raw(std::size_t p) const = 0;

  // Step counters, the LR schedule's position and the loss scaler. Throws when the checkpoint's
  // record of them is malformed.
  virtual SourceCounters counters() const = 0;
  // What the embedding passed to save_checkpoint (zero); an empty object for DeepSpeed.
  virtual nlohmann::json client_state() const = 0;

 private:
  // read()'s work, `also` possibly empty.
  virtual void read_values(std::size_t p, const std::string& what, std::uint64_t begin,
                           std::uint64_t count, float* out, const ValuesFn& also) const = 0;
};

}  // namespace zero::ckpt
