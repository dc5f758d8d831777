// Internal to zero/dscheckpoint: the state behind DeepSpeedCheckpoint, shared by deepspeed.cpp
// (the public accessors and reads) and deepspeed_layout.cpp (open(): where every tensor lives).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "zero/dscheckpoint/deepspeed.h"
#include "zero/dscheckpoint/pt_file.h"

namespace zero::dscheckpoint {

// The number of elements of `shape`; throws IoError naming `what` for a negative dimension or
// an overflow.
std::int64_t shape_numel(const std::vector<std::int64_t>& shape, const std::string& what);

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
  DsKind kind = DsKind::Zero;
  int dp_world_size = 1;     // the model states' dp_world_size
  std::string zero0_masters;  // stage 0: where the fp32 master copies were ("" : module)
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

  // The archive of files[file], opened on first use; at most kMaxOpenArchives stay open.
  const PtArchive& archive(std::size_t file) const;
  std::size_t add_file(const std::filesystem::path& p);
  // Where the tensor at `v` of `pt` (files[file]) lives; checked against its storage now, so a
  // bad file fails at open().
  TensorLoc locate(std::size_t file, const PtFile& pt, const PickleView& v) const;
  std::size_t add_source(Source s);
  // Reads `pieces` into `out` in order; `map` (when given) replaces each master source id by
  // the id of an optimizer state's source beside it.
  void read_pieces(const std::vector<Piece>& pieces,
                   const std::unordered_map<std::size_t, std::size_t>* map,
                   std::span<float> out) const;

  // Fill everything above from the tag folder's files, one per kind: ZeRO 1/2/3 and
  // BF16_Optimizer (deepspeed_layout.cpp), stage 0 (deepspeed_zero0.cpp), universal
  // (deepspeed_universal.cpp).
  void open_partitioned(const std::filesystem::path& tag_path);
  void open_zero0(const std::filesystem::path& tag_path);
  void open_universal(const std::filesystem::path& tag_path);
};

}  // namespace zero::dscheckpoint
