#include "zero/checkpoint/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "zero/base/error.h"

namespace zero::ckpt {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& where, const std::string& key, const std::string& what) {
  throw IoError(fmt::format("checkpoint manifest {}: {}: {}", where, key, what));
}

const json& field(const json& j, const char* key, const std::string& where,
                  const std::string& path) {
  if (!j.is_object() || !j.contains(key)) bad(where, path + key, "missing");
  return j.at(key);
}

std::uint64_t get_u64(const json& j, const char* key, const std::string& where,
                      const std::string& path) {
  const json& v = field(j, key, where, path);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0)) {
    bad(where, path + key, fmt::format("expected a non-negative integer, got {}", v.dump()));
  }
  return v.get<std::uint64_t>();
}

int get_int(const json& j, const char* key, const std::string& where, const std::string& path,
            int lo, int hi) {
  const std::uint64_t v = get_u64(j, key, where, path);
  if (v < static_cast<std::uint64_t>(lo) || v > static_cast<std::uint64_t>(hi)) {
    bad(where, path + key, fmt::format("{} is outside [{}, {}]", v, lo, hi));
  }
  return static_cast<int>(v);
}

std::string get_str(const json& j, const char* key, const std::string& where,
                    const std::string& path) {
  const json& v = field(j, key, where, path);
  if (!v.is_string()) bad(where, path + key, "expected a string");
  return v.get<std::string>();
}

DType get_dtype(const json& j, const char* key, const std::string& where, const std::string& path) {
  const std::string s = get_str(j, key, where, path);
  const auto t = parse_dtype(s);
  if (!t || *t == DType::F64) bad(where, path + key, fmt::format("unknown dtype '{}'", s));
  return *t;
}

// a + b, or an error when it overflows.
std::uint64_t add(std::uint64_t a, std::uint64_t b, const std::string& where,
                  const std::string& key) {
  if (b > std::numeric_limits<std::uint64_t>::max() - a) bad(where, key, "sizes overflow");
  return a + b;
}

// A safe file name: no directories, nothing hidden.
void check_file_name(const std::string& name, const std::string& where, const std::string& key) {
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
    bad(where, key, fmt::format("'{}' is not a plain file name", name));
  }
}

json file_json(const RankFile& f) {
  json tensors = json::object();
  for (const auto& [name, sum] : f.tensors)
    tensors[name] = {{"xxh3", io::checksum_hex(sum.xxh3)}, {"bytes", sum.bytes}};
  return {{"rank", f.rank}, {"file", f.file}, {"tensors", tensors}};
}

RankFile parse_file(const json& j, const std::string& where, const std::string& path) {
  RankFile f;
  f.rank = get_int(j, "rank", where, path, 0, 1 << 24);
  f.file = get_str(j, "file", where, path);
  check_file_name(f.file, where, path + "file");
  const json& t = field(j, "tensors", where, path);
  if (!t.is_object()) bad(where, path + "tensors", "expected an object");
  for (const auto& [name, sum] : t.items()) {
    const std::string p = path + "tensors." + name + ".";
    const std::string hex = get_str(sum, "xxh3", where, p);
    if (hex.size() != 16 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
      bad(where, p + "xxh3", fmt::format("'{}' is not 16 hex digits", hex));
    }
    f.tensors[name] = {std::stoull(hex, nullptr, 16), get_u64(sum, "bytes", where, p)};
  }
  return f;
}

}  // namespace

std::string rank_file_name(int rank, int world_size) {
  return fmt::format("rank_{:05d}_of_{:05d}.safetensors", rank, world_size);
}

json Manifest::to_json() const {
  json units_j = json::array();
  for (const UnitEntry& u : units) {
    units_j.push_back({{"padded_elems", u.padded_elems},
                       {"slice_elems", u.slice_elems},
                       {"partition_offset", u.partition_offset}});
  }
  json params_j = json::array();
  for (const ParamEntry& p : params) {
    params_j.push_back({{"name", p.name},
                        {"shape", p.shape},
                        {"dtype", std::string(dtype_name(p.dtype))},
                        {"group", p.group},
                        {"unit", p.unit},
                        {"trainable", p.trainable},
                        {"offset", p.offset},
                        {"numel", p.numel},
                        {"aliases", p.aliases}});
  }
  json files_j = json::array();
  for (const RankFile& f : files) files_j.push_back(file_json(f));
  json j = {{"format", kFormatName},
            {"format_version", format_version},
            {"tag", tag},
            {"world_size", world_size},
            {"stage", stage},
            {"model_dtype", std::string(dtype_name(model_dtype))},
            {"partition_elems", partition_elems},
            {"units", units_j},
            {"params", params_j},
            {"state_names", state_names},
            {"optimizer", optimizer},
            {"engine_state", engine_state},
            {"config", config},
            {"client_state", client_state},
            {"files", files_j}};
  if (model_16bit) j["model_16bit"] = file_json(*model_16bit);
  return j;
}

Manifest Manifest::from_json(const json& j, const std::string& where) {
  if (!j.is_object()) bad(where, "(document)", "expected a JSON object");
  Manifest m;
  if (get_str(j, "format", where, "") != kFormatName) {
    bad(where, "format",
        fmt::format("expected \"{}\"; this is not a zero checkpoint", kFormatName));
  }
  m.format_version = get_int(j, "format_version", where, "", 1, 1 << 20);
  if (m.format_version > kFormatVersion) {
    bad(where, "format_version",
        fmt::format("{} is newer than this build reads ({}): use a newer zero", m.format_version,
                    kFormatVersion));
  }
  m.tag = get_str(j, "tag", where, "");
  m.world_size = get_int(j, "world_size", where, "", 1, 1 << 24);
  m.stage = get_int(j, "stage", where, "", 0, 3);
  m.model_dtype = get_dtype(j, "model_dtype", where, "");
  m.partition_elems = get_u64(j, "partition_elems", where, "");
  const json& units = field(j, "units", where, "");
  if (!units.is_array()) bad(where, "units", "expected an array");
  std::uint64_t expected_offset = 0;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::string p = fmt::format("units[{}].", u);
    UnitEntry e{get_u64(units[u], "padded_elems", where, p),
                get_u64(units[u], "slice_elems", where, p),
                get_u64(units[u], "partition_offset", where, p)};
    if (e.slice_elems > e.padded_elems / static_cast<std::uint64_t>(m.world_size) ||
        e.slice_elems * static_cast<std::uint64_t>(m.world_size) != e.padded_elems) {
      bad(where, p + "slice_elems", "is not padded_elems / world_size");
    }
    if (e.partition_offset != expected_offset)
      bad(where, p + "partition_offset", "does not follow the previous unit");
    expected_offset = add(expected_offset, e.slice_elems, where, p + "slice_elems");
    m.units.push_back(e);
  }
  if (expected_offset != m.partition_elems)
    bad(where, "partition_elems", "differs from the units' slices");
  const json& params = field(j, "params", where, "");
  if (!params.is_array()) bad(where, "params", "expected an array");
  std::set<std::string> names;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string p = fmt::format("params[{}].", i);
    ParamEntry e;
    e.name = get_str(params[i], "name", where, p);
    if (e.name.empty() || !names.insert(e.name).second)
      bad(where, p + "name", fmt::format("'{}' is empty or repeated", e.name));
    const json& shape = field(params[i], "shape", where, p);
    if (!shape.is_array()) bad(where, p + "shape", "expected an array");
    std::uint64_t numel = 1;
    for (const json& d : shape) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0)
        bad(where, p + "shape", "expected non-negative integers");
      const auto dim = d.get<std::uint64_t>();
      if (dim != 0 && numel > std::numeric_limits<std::uint64_t>::max() / dim)
        bad(where, p + "shape", "overflows");
      numel *= dim;
      e.shape.push_back(d.get<std::int64_t>());
    }
    e.dtype = get_dtype(params[i], "dtype", where, p);
    e.group = get_int(params[i], "group", where, p, 0, 1 << 20);
    e.unit = get_int(params[i], "unit", where, p, 0, 1 << 30);
    const json& tr = field(params[i], "trainable", where, p);
    if (!tr.is_boolean()) bad(where, p + "trainable", "expected true or false");
    e.trainable = tr.get<bool>();
    e.offset = get_u64(params[i], "offset", where, p);
    if (params[i].contains("aliases")) {
      const json& a = params[i].at("aliases");
      if (!a.is_array()) bad(where, p + "aliases", "expected an array of names");
      for (const json& n : a) {
        if (!n.is_string() || n.get<std::string>().empty() ||
            !names.insert(n.get<std::string>()).second) {
          bad(where, p + "aliases", fmt::format("{} is not a new, non-empty name", n.dump()));
        }
        e.aliases.push_back(n.get<std::string>());
      }
    }
    e.numel = get_u64(params[i], "numel", where, p);
    if (e.numel != numel)
      bad(where, p + "numel",
          fmt::format("{} disagrees with its shape ({} elements)", e.numel, numel));
    if (e.trainable) {
      if (static_cast<std::size_t>(e.unit) >= m.units.size())
        bad(where, p + "unit", "no such unit");
      if (add(e.offset, e.numel, where, p + "offset") >
          m.units[static_cast<std::size_t>(e.unit)].padded_elems) {
        bad(where, p + "offset", "the parameter does not fit in its unit");
      }
    }
    m.params.push_back(std::move(e));
  }
  const json& states = field(j, "state_names", where, "");
  if (!states.is_array()) bad(where, "state_names", "expected an array");
  for (const json& s : states) {
    if (!s.is_string() || s.get<std::string>() == "master")
      bad(where, "state_names", "expected names other than master");
    m.state_names.push_back(s.get<std::string>());
  }
  m.optimizer = field(j, "optimizer", where, "");
  m.engine_state = field(j, "engine_state", where, "");
  m.config = j.value("config", json::object());
  m.client_state = j.value("client_state", json::object());
  const json& files = field(j, "files", where, "");
  if (!files.is_array() || files.size() != static_cast<std::size_t>(m.world_size)) {
    bad(where, "files", fmt::format("expected one entry per rank ({})", m.world_size));
  }
  const std::uint64_t partition_bytes = m.partition_elems * 4;
  for (std::size_t r = 0; r < files.size(); ++r) {
    const std::string p = fmt::format("files[{}].", r);
    RankFile f = parse_file(files[r], where, p);
    if (f.rank != static_cast<int>(r)) bad(where, p + "rank", "files are not in rank order");
    std::vector<std::string> needed{"master"};
    needed.insert(needed.end(), m.state_names.begin(), m.state_names.end());
    for (const std::string& t : needed) {
      auto it = f.tensors.find(t);
      if (it == f.tensors.end()) bad(where, p + "tensors", fmt::format("no tensor '{}'", t));
      if (it->second.bytes != partition_bytes) {
        bad(where, p + "tensors." + t + ".bytes",
            fmt::format("{} bytes, the partition needs {}", it->second.bytes, partition_bytes));
      }
    }
    m.files.push_back(std::move(f));
  }
  if (j.contains("model_16bit"))
    m.model_16bit = parse_file(j.at("model_16bit"), where, "model_16bit.");
  return m;
}

std::string read_latest(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / "latest");
  ZERO_CHECK_AS(IoError, in.good(),
                "{}: no 'latest' file: not a checkpoint directory, or no save has completed in it",
                dir);
  std::string tag;
  std::getline(in, tag);
  while (!tag.empty() && (tag.back() == '\r' || tag.back() == ' ')) tag.pop_back();
  ZERO_CHECK_AS(IoError, !tag.empty() && tag.find('/') == std::string::npos && tag[0] != '.',
                "{}/latest: '{}' is not a checkpoint tag", dir, tag);
  return tag;
}

CheckpointReader CheckpointReader::open(const std::string& dir, const std::string& tag) {
  CheckpointReader r;
  r.path_ = (std::filesystem::path(dir) / (tag.empty() ? read_latest(dir) : tag)).string();
  const std::string manifest_path = r.path_ + "/manifest.json";
  std::ifstream in(manifest_path);
  ZERO_CHECK_AS(IoError, in.good(),
                "{}: no manifest.json: not a zero checkpoint (or an incomplete one)", r.path_);
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {
    throw IoError(
        fmt::format("checkpoint manifest {}: not valid JSON: {}", manifest_path, e.what()));
  }
  r.manifest_ = Manifest::from_json(j, manifest_path);
  r.readers_.resize(r.manifest_.files.size());
  r.streams_.resize(r.manifest_.files.size());
  // Every file exists and holds what the manifest says, in size and dtype.
  for (std::size_t q = 0; q < r.manifest_.files.size(); ++q) {
    const io::SafetensorsReader& reader = r.rank_reader(static_cast<int>(q));
    for (const auto& [name, sum] : r.manifest_.files[q].tensors) {
      const io::TensorInfo* t = reader.find(name);
      ZERO_CHECK_AS(IoError, t != nullptr,
                    "checkpoint {}: {} has no tensor '{}' that the manifest lists", r.path_,
                    r.manifest_.files[q].file, name);
      ZERO_CHECK_AS(IoError, t->size_bytes() == sum.bytes,
                    "checkpoint {}: tensor '{}' of {} has {} bytes, the manifest says {}", r.path_,
                    name, r.manifest_.files[q].file, t->size_bytes(), sum.bytes);
    }
  }
  return r;
}

const io::SafetensorsReader& CheckpointReader::rank_reader(int rank) const {
  auto& slot = readers_[static_cast<std::size_t>(rank)];
  if (!slot) {
    const std::string file = path_ + "/" + manifest_.files[static_cast<std::size_t>(rank)].file;
    ZERO_CHECK_AS(IoError, std::filesystem::exists(file),
                  "checkpoint {}: rank {}'s file {} is missing (the checkpoint is incomplete)",
                  path_, rank, manifest_.files[static_cast<std::size_t>(rank)].file);
    slot = std::make_unique<io::SafetensorsReader>(io::SafetensorsReader::open(file));
  }
  return *slot;
}

void CheckpointReader::read_tracked(int rank, const std::string& what, std::uint64_t offset,
                                    void* dst, std::size_t bytes,
                                    const io::SafetensorsReader::PieceFn& also) const {
  const io::SafetensorsReader& reader = rank_reader(rank);
  const RankFile& f = manifest_.files[static_cast<std::size_t>(rank)];
  const auto listed = f.tensors.find(what);
  Stream& s = streams_[static_cast<std::size_t>(rank)][what];
  const bool continues = listed != f.tensors.end() && !s.verified && !s.out_of_order &&
                         offset >= s.hashed_bytes && offset - s.hashed_bytes <= kMaxGapBytes;
  if (!continues) {
    if (!s.verified) s.out_of_order = true;
    reader.read_range(what, offset, dst, bytes);
    if (also) also(static_cast<const std::byte*>(dst), bytes);
    return;
  }
  // Until the read below succeeded the stream is unusable: an exception leaves it half fed.
  s.out_of_order = true;
  if (offset > s.hashed_bytes) {
    std::vector<std::byte> gap(offset - s.hashed_bytes);
    reader.read_range(what, s.hashed_bytes, gap.data(), gap.size());
    s.sum.update(gap.data(), gap.size());
  }
  reader.read_range(what, offset, dst, bytes, s.sum, also);
  s.hashed_bytes = offset + bytes;
  s.out_of_order = false;
  if (s.hashed_bytes < listed->second.bytes) return;
  finish_stream(s, f, what, listed->second);
}

void CheckpointReader::finish_stream(Stream& s, const RankFile& f, const std::string& name,
                                     const TensorSum& sum) const {
  s.verified = s.sum.digest() == sum.xxh3;
  s.out_of_order = !s.verified;  // a second look reads it again, and fails again
  ZERO_CHECK_AS(IoError, s.verified,
                "checkpoint {}: tensor '{}' in {} is corrupted (checksum {}, the manifest says {})",
                path_, name, f.file, io::checksum_hex(s.sum.digest()), io::checksum_hex(sum.xxh3));
}

void CheckpointReader::verify_streams(const io::SafetensorsReader& reader, const RankFile& f,
                                      Streams& streams) const {
  std::vector<std::byte> piece(io::kPieceBytes);
  for (const auto& [name, sum] : f.tensors) {
    Stream& s = streams[name];
    if (s.verified) continue;
    if (s.out_of_order) s = Stream{};
    // Through a cache-sized buffer: the bytes are only hashed, never kept.
    for (std::uint64_t off = s.hashed_bytes; off < sum.bytes; off += piece.size()) {
      const auto n =
          static_cast<std::size_t>(std::min<std::uint64_t>(piece.size(), sum.bytes - off));
      reader.read_range(name, off, piece.data(), n);
      s.sum.update(piece.data(), n);
    }
    s.hashed_bytes = sum.bytes;
    finish_stream(s, f, name, sum);
  }
}

void CheckpointReader::verify_rank_file(int rank) const {
  ZERO_CHECK_AS(IoError, rank >= 0 && static_cast<std::size_t>(rank) < manifest_.files.size(),
                "checkpoint {}: no rank {}", path_, rank);
  verify_streams(rank_reader(rank), manifest_.files[static_cast<std::size_t>(rank)],
                 streams_[static_cast<std::size_t>(rank)]);
}

void CheckpointReader::verify_model_16bit() const {
  if (!manifest_.model_16bit) return;
  const auto reader = io::SafetensorsReader::open(path_ + "/" + manifest_.model_16bit->file);
  Streams streams;
  verify_streams(reader, *manifest_.model_16bit, streams);
}

void CheckpointReader::read_param(std::size_t param, const std::string& what, std::uint64_t begin,
                                  std::uint64_t count, float* out, const ValuesFn& also) const {
  ZERO_CHECK_AS(IoError, param < manifest_.params.size() && manifest_.params[param].trainable,
                "checkpoint {}: parameter {} is not a trainable parameter", path_, param);
  const ParamEntry& p = manifest_.params[param];
  ZERO_CHECK_AS(IoError, begin <= p.numel && count <= p.numel - begin,
                "checkpoint {}: elements [{}, {}) are outside '{}' ({} elements)", path_, begin,
                begin + count, p.name, p.numel);
  const UnitEntry& u = manifest_.units[static_cast<std::size_t>(p.unit)];
  std::uint64_t flat = p.offset + begin;
  std::size_t done = 0;  // elements of out written
  io::SafetensorsReader::PieceFn pass_on;
  if (also) {
    pass_on = [&](const std::byte* piece, std::size_t n) {
      also(piece, done, n / sizeof(float));
      done += n / sizeof(float);
    };
  }
  while (count > 0) {
    const std::uint64_t rank = flat / u.slice_elems;
    const std::uint64_t in_slice = flat % u.slice_elems;
    const std::uint64_t n = std::min(count, u.slice_elems - in_slice);
    read_tracked(static_cast<int>(rank), what, (u.partition_offset + in_slice) * sizeof(float), out,
                 n * sizeof(float), pass_on);
    out += n;
    flat += n;
    count -= n;
  }
}

std::vector<std::byte> CheckpointReader::read_frozen(std::size_t param) const {
  ZERO_CHECK_AS(IoError, param < manifest_.params.size() && !manifest_.params[param].trainable,
                "checkpoint {}: parameter {} is not a frozen parameter", path_, param);
  const ParamEntry& p = manifest_.params[param];
  const std::string name = "frozen/" + p.name;
  const io::SafetensorsReader& reader = rank_reader(0);
  const io::TensorInfo& t = reader.at(name);
  ZERO_CHECK_AS(IoError, t.dtype == p.dtype && t.numel() == p.numel,
                "checkpoint {}: tensor '{}' does not match its parameter's dtype and shape", path_,
                name);
  std::vector<std::byte> out(t.size_bytes());
  read_tracked(0, name, 0, out.data(), out.size());
  return out;
}

}  // namespace zero::ckpt
