// Where zero_to_fp32's tensors go: one file, or Hugging Face-style shards with an index
// (transformers' save_pretrained / huggingface_hub's split_torch_state_dict_into_shards).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zero::to_fp32 {

struct OutputTensor {
  std::string name;
  std::uint64_t bytes = 0;
};

struct ShardFile {
  std::string path;                  // where it is written
  std::string file_name;             // path's last component (what the index names)
  std::vector<std::size_t> tensors;  // indices into the tensor list, in order
  std::uint64_t bytes = 0;           // tensor bytes (the header not counted, as HF counts)
};

struct OutputPlan {
  std::vector<ShardFile> files;
  std::string index_path;  // empty: a single file and no index
  // OUTPUT named a .safetensors file, but the weights needed more than one shard: they went
  // next to it under its stem instead.
  bool sharded_instead_of_file = false;
};

// Splits `tensors` (in order) into shards of at most max_shard_bytes: a shard is closed when the
// next tensor would take it over the limit, and a tensor larger than the limit gets a shard of
// its own (Hugging Face's rule; order is kept). Then names the files:
//   output_is_file (OUTPUT ends in .safetensors): one shard → OUTPUT itself; N shards →
//     <dir>/<stem>-0000k-of-0000N.safetensors and <dir>/<stem>.safetensors.index.json;
//   otherwise OUTPUT is a directory: one shard → OUTPUT/model.safetensors; N shards →
//     OUTPUT/model-0000k-of-0000N.safetensors and OUTPUT/model.safetensors.index.json.
// REQUIRES: max_shard_bytes > 0.
OutputPlan plan_output(const std::string& output, bool output_is_file,
                       const std::vector<OutputTensor>& tensors, std::uint64_t max_shard_bytes);

// {"metadata": {"total_size": bytes}, "weight_map": {tensor name: shard file name}}.
nlohmann::json index_json(const OutputPlan& plan, const std::vector<OutputTensor>& tensors);

}  // namespace zero::to_fp32
