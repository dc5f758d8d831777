// Internal to zero/dscheckpoint: the checkpoint files of a DeepSpeed tag folder, steps 1 and 3 of
// DeepSpeedCheckpoint::open's layout pass (deepspeed_layout.cpp). File names follow DeepSpeed's
// engine (SPEC_DEEPSPEED.md §8): "[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt",
// "zero_pp_rank_<r>_mp_rank_00_model_states.pt" (stage 3) and "mp_rank_00_model_states.pt"
// (stage 1/2).
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace zero::dscheckpoint {

struct TagListing {
  std::map<int, std::filesystem::path> optim;       // rank → file
  std::map<int, std::filesystem::path> zero_model;  // stage 3 model states, rank → file
  std::optional<std::filesystem::path> model;       // stage 1/2 model states
  bool bf16_prefix = false;
};

// Lists `tag`. Throws IoError for a model-parallel (mp_rank other than 00) or mixture-of-experts
// checkpoint, two optimizer-state files of one rank, a folder that cannot be listed, or (when
// `need_optim`) one without optimizer states.
TagListing list_tag_dir(const std::filesystem::path& tag, bool need_optim = true);

// The ranks `files` holds, ascending (for messages).
std::vector<int> ranks_of(const std::map<int, std::filesystem::path>& files);
// The file name of rank `rank`'s optimizer states.
std::string optim_file_name(bool bf16, int rank);

// Throws IoError unless the optimizer states of ranks 0 .. world-1 are there, and no others.
void check_optimizer_files(const TagListing& listing, const std::filesystem::path& tag, int world);

// The model-states files: stage 1/2 the one mp_rank_00_model_states.pt; stage 3 one per rank, in
// rank order. Throws IoError naming the first one missing.
std::vector<std::filesystem::path> model_state_files(const TagListing& listing,
                                                     const std::filesystem::path& tag, int stage,
                                                     int world);

}  // namespace zero::dscheckpoint
