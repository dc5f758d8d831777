// Steps 1 and 3 of DeepSpeedCheckpoint::open's layout pass (deepspeed_layout.cpp): which
// checkpoint files the tag folder holds, and, once rank 0's optimizer states have given the
// stage and world size, that every rank's files are there and no stray ones.
#include "zero/dscheckpoint/deepspeed_tag_dir.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <regex>
#include <set>

#include "zero/base/error.h"

namespace zero::dscheckpoint {

namespace fs = std::filesystem;

// --- step 1: the tag folder's files ---------------------------------------------------------

TagListing list_tag_dir(const fs::path& tag, bool need_optim) {
  static const std::regex optim_re(
      R"(^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_?optim_states\.pt$)");
  static const std::regex zmodel_re(R"(^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$)");
  static const std::regex model_re(R"(^mp_rank_(\d+)_model_states\.pt$)");
  static const std::regex moe_re(
      R"(^(layer_\d+_expert_\d+_mp_rank_\d+_model_states|(bf16_)?expp_rank_\d+_mp_rank_\d+_optim_states)\.pt$)");
  TagListing out;
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
  if (out.optim.empty() && need_optim) {
    throw IoError(fmt::format(
        "{}: no zero_pp_rank_<r>_mp_rank_00_optim_states.pt files; expected a DeepSpeed ZeRO "
        "(stage 1-3) checkpoint folder",
        tag.string()));
  }
  out.bf16_prefix = !prefixes.empty() && *prefixes.begin();
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

// --- step 3: every rank's files are there -----------------------------------------------------

void check_optimizer_files(const TagListing& listing, const fs::path& tag, int world) {
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
}

std::vector<fs::path> model_state_files(const TagListing& listing, const fs::path& tag, int stage,
                                        int world) {
  std::vector<fs::path> model_files;
  if (stage <= 2) {
    if (!listing.model) {
      throw IoError(fmt::format("{}: missing mp_rank_00_model_states.pt (stage {} model states)",
                                tag.string(), stage));
    }
    model_files.push_back(*listing.model);
    return model_files;
  }
  for (int r = 0; r < world; ++r) {
    if (!listing.zero_model.count(r)) {
      throw IoError(
          fmt::format("{}: missing rank file zero_pp_rank_{}_mp_rank_00_model_states.pt "
                      "(stage 3 keeps model states per rank; {} ranks)",
                      tag.string(), r, world));
    }
    model_files.push_back(listing.zero_model.at(r));
  }
  return model_files;
}

}  // namespace zero::dscheckpoint
