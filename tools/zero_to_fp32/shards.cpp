#include "tools/zero_to_fp32/shards.h"

#include <fmt/format.h>

#include <filesystem>

#include "zero/base/error.h"

namespace zero::to_fp32 {

namespace fs = std::filesystem;

OutputPlan plan_output(const std::string& output, bool output_is_file,
                       const std::vector<OutputTensor>& tensors, std::uint64_t max_shard_bytes) {
  ZERO_ASSERT(max_shard_bytes > 0);
  OutputPlan plan;
  std::vector<ShardFile>& shards = plan.files;
  ShardFile current;
  auto close_current = [&]() {
    if (!current.tensors.empty()) shards.push_back(std::move(current));
    current = ShardFile{};
  };
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t bytes = tensors[i].bytes;
    if (bytes > max_shard_bytes) {
      close_current();
      current.tensors.push_back(i);
      current.bytes = bytes;
      close_current();
      continue;
    }
    if (current.bytes + bytes > max_shard_bytes) close_current();
    current.tensors.push_back(i);
    current.bytes += bytes;
  }
  close_current();
  if (shards.empty()) shards.emplace_back();  // no tensors: still one (empty) file

  const fs::path out(output);
  fs::path dir = output_is_file ? out.parent_path() : out;
  std::string stem = output_is_file ? out.stem().string() : "model";
  if (shards.size() == 1) {
    const fs::path path = output_is_file ? out : dir / "model.safetensors";
    shards[0].path = path.string();
    shards[0].file_name = path.filename().string();
    return plan;
  }
  const std::size_t n = shards.size();
  for (std::size_t k = 0; k < n; ++k) {
    shards[k].file_name = fmt::format("{}-{:05}-of-{:05}.safetensors", stem, k + 1, n);
    shards[k].path = (dir / shards[k].file_name).string();
  }
  plan.index_path = (dir / (stem + ".safetensors.index.json")).string();
  plan.sharded_instead_of_file = output_is_file;
  return plan;
}

nlohmann::json index_json(const OutputPlan& plan, const std::vector<OutputTensor>& tensors) {
  std::uint64_t total = 0;
  nlohmann::json weight_map = nlohmann::json::object();
  for (const ShardFile& shard : plan.files) {
    for (const std::size_t i : shard.tensors) {
      total += tensors[i].bytes;
      weight_map[tensors[i].name] = shard.file_name;
    }
  }
  return {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
}

}  // namespace zero::to_fp32
