// zero's checkpoint format (DESIGN.md §5): plain safetensors files plus a JSON manifest.
//
//   <dir>/latest                       the tag of the newest complete checkpoint (one line)
//   <dir>/<tag>/manifest.json          everything needed to read the files (Manifest below)
//   <dir>/<tag>/rank_RRRRR_of_WWWWW.safetensors
//                                      rank R's partition: "master" and one tensor per optimizer
//                                      state ("exp_avg", ...), fp32, partition_elems each; rank
//                                      0's file also holds "frozen/<name>" (model dtype, whole)
//   <dir>/<tag>/model_16bit.safetensors  optional: the whole low-precision model, one tensor per
//                                      parameter (stage3_gather_16bit_weights_on_model_save)
// Every tensor's bytes carry an XXH3-64 checksum in the manifest ("xxh3": 16 hex digits).
//
// A partition is the concatenation of the rank's slice of every unit; parameter p of unit u
// occupies [offset_p, offset_p + numel_p) of the unit's flat buffer, whose slice r is
// [r·S_u, (r+1)·S_u), so element e of p sits in rank ⌊(offset_p + e) / S_u⌋'s partition at
// partition_offset_u + (offset_p + e) mod S_u. A reader at any world size and stage can therefore
// fetch exactly the byte ranges it needs.
//
// Writes are crash-safe: a save goes to <dir>/<tag>.tmp/, every file is fsynced, the directory
// is renamed into place, and `latest` is replaced (write, fsync, rename) last.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "zero/base/dtype.h"
#include "zero/io/safetensors.h"

namespace zero::ckpt {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kFormatName = "zero-checkpoint";

struct ParamEntry {
  std::string name;
  std::vector<std::int64_t> shape;
  DType dtype = DType::F32;  // of the model copy
  int group = 0;
  int unit = 0;
  bool trainable = true;
  std::uint64_t offset = 0;  // in its unit's flat buffer (trainable only)
  std::uint64_t numel = 0;
  std::vector<std::string> aliases;  // tied names of the same tensor
};

struct UnitEntry {
  std::uint64_t padded_elems = 0;
  std::uint64_t slice_elems = 0;
  std::uint64_t partition_offset = 0;
};

struct TensorSum {
  std::uint64_t xxh3 = 0;  // XXH3-64 of the tensor's bytes (io::Checksum)
  std::uint64_t bytes = 0;
};

struct RankFile {
  int rank = 0;
  std::string file;  // relative to the checkpoint directory
  std::map<std::string, TensorSum> tensors;
};

struct Manifest {
  int format_version = kFormatVersion;
  std::string tag;
  int world_size = 1;
  int stage = 0;
  DType model_dtype = DType::F32;
  std::uint64_t partition_elems = 0;
  std::vector<UnitEntry> units;
  std::vector<ParamEntry> params;
  std::vector<std::string> state_names;  // tensors beside "master" in every rank file
  nlohmann::json optimizer;              // kind and per-group hyper-parameters
  nlohmann::json engine_state;           // step counters, loss scaler, schedule position
  nlohmann::json config;                 // the resolved ds_config the run used
  nlohmann::json client_state;           // whatever the embedding passed to save
  std::vector<RankFile> files;           // one per rank, in rank order
  std::optional<RankFile> model_16bit;

  nlohmann::json to_json() const;
  // Parses and checks a manifest: types, bounds (every offset and size against the layout, no
  // overflow), files for every rank. Throws IoError naming `where` and the key.
  static Manifest from_json(const nlohmann::json& j, const std::string& where);
};

// "rank_00003_of_00008.safetensors".
std::string rank_file_name(int rank, int world_size);

// The tag <dir>/latest names. Throws IoError when there is none.
std::string read_latest(const std::string& dir);

// A checkpoint opened for reading: the manifest and one reader per file, opened lazily.
//
// Checksums on the way: read_param() and read_frozen() hash what they read of a rank file piece
// by piece while it is still in cache. A tensor read from its first byte to its last in
// ascending order (gaps of at most kMaxGapBytes between the ranges — the padding a reader skips
// — are read and hashed too) is verified when its last byte arrives, at no cost of its own: a
// mismatch then throws IoError naming the file and the tensor, with `out` holding the corrupt
// bytes, so a caller reads into memory it can drop. verify_rank_file() reads only what was not
// hashed on the way. A reader that must not see a byte before it is verified calls
// verify_rank_file() first (zero_to_fp32); one that reads into memory of its own may verify
// after reading (Engine::load_checkpoint).
// Thread safety: one thread at a time.
class CheckpointReader {
 public:
  // Opens <dir>/<tag> (tag empty: the one <dir>/latest names). Throws IoError when the path is
  // not a checkpoint, the manifest is malformed or from a newer format version, or a file is
  // missing or does not hold the tensors the manifest lists with the sizes it lists.
  static CheckpointReader open(const std::string& dir, const std::string& tag = {});

  const Manifest& manifest() const { return manifest_; }
  const std::string& path() const { return path_; }

  // Compares every tensor of rank `rank`'s file with its checksum in the manifest, reading what
  // was not hashed on the way by earlier reads. Throws IoError naming the file and the tensor on
  // a mismatch.
  void verify_rank_file(int rank) const;
  // Same for the consolidated 16-bit model file, when there is one.
  void verify_model_16bit() const;

  // Elements [begin, begin + count) of trainable parameter `param` (manifest index) from tensor
  // `what` ("master" or a state name), as fp32. Reads only the byte ranges holding them (and the
  // small gaps before them, for the checksum). `also` as CheckpointSource::read's.
  using ValuesFn = std::function<void(const std::byte* values, std::size_t first, std::size_t n)>;
  void read_param(std::size_t param, const std::string& what, std::uint64_t begin,
                  std::uint64_t count, float* out, const ValuesFn& also = nullptr) const;
  // The whole model copy of a frozen parameter, raw bytes in its dtype.
  std::vector<std::byte> read_frozen(std::size_t param) const;

 private:
  // One tensor's checksum on the way.
  struct Stream {
    io::Checksum sum;
    std::uint64_t hashed_bytes = 0;  // bytes [0, hashed_bytes) went into `sum`
    bool out_of_order = false;       // verify_rank_file() reads it whole
    bool verified = false;
  };
  using Streams = std::map<std::string, Stream>;

  const io::SafetensorsReader& rank_reader(int rank) const;
  // Bytes [offset, offset + bytes) of tensor `what` of rank `rank`'s file into dst, hashed on the
  // way when they continue the tensor's stream; also(piece, n), if given, sees them piece by piece
  // in order (in cache where they are hashed).
  void read_tracked(int rank, const std::string& what, std::uint64_t offset, void* dst,
                    std::size_t bytes, const io::SafetensorsReader::PieceFn& also = nullptr) const;
  // Compares a stream that has hashed all of tensor `name` with its checksum `sum`; throws
  // IoError naming the file and the tensor on a mismatch.
  void finish_stream(Stream& s, const RankFile& f, const std::string& name,
                     const TensorSum& sum) const;
  // Completes every stream of file `f` (reading what is missing) and compares the checksums.
  void verify_streams(const io::SafetensorsReader& reader, const RankFile& f,
                      Streams& streams) const;

  std::string path_;
  Manifest manifest_;
  mutable std::vector<std::unique_ptr<io::SafetensorsReader>> readers_;
  mutable std::vector<Streams> streams_;  // per rank file
};

// The largest gap between ranged reads of a tensor that read_param() fills to keep its checksum
// going (padding is below 16 elements per unit slice; this leaves room).
inline constexpr std::uint64_t kMaxGapBytes = std::uint64_t{1} << 20;

}  // namespace zero::ckpt
