// zero_to_fp32: consolidates a checkpoint into whole tensors, as DeepSpeed's zero_to_fp32.py does
// for its own checkpoints. The checkpoint is read through ckpt::CheckpointSource, so a zero
// checkpoint (DESIGN.md §5) and a DeepSpeed one (ZeRO 1/2/3; zero/dscheckpoint reads its .pt
// files without executing their pickles) go the same way. Every checksummed file is verified
// first; then each parameter is streamed chunk by chunk into a SafetensorsStreamWriter, so
// memory stays bounded by a fixed buffer (frozen parameters, which checkpoints keep whole, and
// DeepSpeed parameters, reconstructed whole, by the largest of them). A DeepSpeed checkpoint
// gives exactly the values DeepSpeed's own zero_to_fp32 reconstructs.
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "tools/zero_to_fp32/options.h"
#include "tools/zero_to_fp32/shards.h"
#include "zero/base/dtype.h"
#include "zero/base/error.h"
#include "zero/base/format.h"
#include "zero/base/timer.h"
#include "zero/checkpoint/source.h"
#include "zero/io/safetensors.h"

namespace {

namespace fs = std::filesystem;
namespace ckpt = zero::ckpt;
using zero::DType;
using zero::format_bytes;
using zero::IoError;
using zero::seconds_since;
using zero::to_fp32::Options;
using zero::to_fp32::UsageError;
using Clock = std::chrono::steady_clock;

// Elements read from the rank files per call: 16 MiB of fp32, plus 8 MiB for a 16-bit output.
constexpr std::uint64_t kChunkElems = std::uint64_t{4} << 20;

std::string clock_text(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

// A progress bar over a byte count on stderr, drawn only when stderr is a terminal; the line is
// cleared when the bar is done or destroyed (an error message then starts on a clean line).
class Progress {
 public:
  Progress(std::string label, std::uint64_t total_bytes)
      : enabled_(isatty(STDERR_FILENO) != 0),
        label_(std::move(label)),
        total_(total_bytes),
        start_(Clock::now()) {}
  ~Progress() { clear(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(std::uint64_t bytes) {
    done_ += bytes;
    if (!enabled_) return;
    // About ten frames a second: redrawing per chunk would flood a slow terminal.
    const Clock::time_point now = Clock::now();
    if (shown_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    draw();
  }

  void clear() {
    if (!shown_) return;
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
    shown_ = false;
  }

 private:
  void draw() {
    constexpr int kWidth = 30;
    const double fraction =
        total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
    const int filled = std::clamp(static_cast<int>(fraction * kWidth), 0, kWidth);
    std::string bar(static_cast<std::size_t>(filled), '=');
    if (filled < kWidth) bar += '>';
    bar.resize(kWidth, ' ');
    const double elapsed = seconds_since(start_);
    const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0;
    const double eta = rate > 0 ? static_cast<double>(total_ - std::min(done_, total_)) / rate : 0;
    fmt::print(stderr, "\r\033[K{} [{}] {:3.0f}%  {}/{}  {:.2f} GB/s  ETA {}", label_, bar,
               fraction * 100, format_bytes(done_), format_bytes(total_), rate / 1e9,
               clock_text(eta));
    std::fflush(stderr);
    shown_ = true;
  }

  bool enabled_;
  std::string label_;
  std::uint64_t total_;
  std::uint64_t done_ = 0;
  Clock::time_point start_;
  Clock::time_point last_draw_{};
  bool shown_ = false;
};

// The checkpoint is not there or not one: exit 1 (not 2, the arguments were well formed).
class NotACheckpoint : public zero::Error {
 public:
  using zero::Error::Error;
};

struct Location {
  std::string dir;  // the directory holding the tag directory
  std::string tag;  // empty: the one `dir`/latest names
};

// CHECKPOINT_DIR is the directory holding `latest` and the tags, or one tag directory itself.
// DeepSpeed's folders (either kind) are resolved by CheckpointSource::open as they are given.
Location locate_checkpoint(const Options& o) {
  if (ckpt::detect_format(o.checkpoint_dir) == ckpt::Format::DeepSpeed) {
    return {o.checkpoint_dir, o.tag};
  }
  const fs::path given(o.checkpoint_dir);
  std::error_code ec;
  if (!fs::exists(given, ec)) {
    throw NotACheckpoint(fmt::format("{}: no such directory", o.checkpoint_dir));
  }
  if (!fs::is_directory(given, ec)) {
    throw NotACheckpoint(
        fmt::format("{} is not a checkpoint: it is a file, not a directory holding `latest` or "
                    "manifest.json",
                    o.checkpoint_dir));
  }
  const fs::path dir = fs::canonical(given);
  if (fs::exists(dir / "manifest.json")) {
    const std::string name = dir.filename().string();
    if (!o.tag.empty() && o.tag != name) {
      throw UsageError(fmt::format(
          "--tag {}: {} is itself the checkpoint of tag {} (it holds manifest.json); drop --tag "
          "or pass the directory above it",
          o.tag, o.checkpoint_dir, name));
    }
    return {dir.parent_path().string(), name};
  }
  if (!o.tag.empty()) {
    if (fs::exists(dir / o.tag / "manifest.json")) return {dir.string(), o.tag};
    std::string why = "no such tag directory";
    if (fs::exists(dir / (o.tag + ".tmp"))) {
      why = fmt::format("only {}.tmp, an unfinished save", o.tag);
    } else if (fs::is_directory(dir / o.tag)) {
      why = fmt::format("{}/{} holds no manifest.json", o.checkpoint_dir, o.tag);
    }
    throw NotACheckpoint(
        fmt::format("{}: tag {} is not a checkpoint ({})", o.checkpoint_dir, o.tag, why));
  }
  if (fs::exists(dir / "latest")) return {dir.string(), ""};

  std::vector<std::string> tags;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.is_directory(ec) && fs::exists(e.path() / "manifest.json", ec)) {
      tags.push_back(e.path().filename().string());
    }
  }
  std::sort(tags.begin(), tags.end());
  std::string hint;
  if (!tags.empty()) {
    hint = "; it has tag directories, pass one with --tag:";
    for (const std::string& t : tags) hint += " " + t;
  }
  throw NotACheckpoint(
      fmt::format("{} is not a checkpoint: it holds neither `latest` nor manifest.json{}",
                  o.checkpoint_dir, hint));
}

// One tensor of the output.
struct Item {
  std::size_t param = 0;  // index into CheckpointSource::params()
  std::string name;
  std::vector<std::int64_t> shape;
  std::uint64_t numel = 0;
  bool trainable = true;
  DType source_dtype = DType::F32;        // master: fp32; frozen: SourceParam::frozen_dtype
  DType out_dtype = DType::F32;           // --dtype; without it fp32, frozen ones as saved
  std::vector<std::string> aliases = {};  // tied names: the tensor is written once
};

// Converts and appends tensor bytes in pieces of at most kChunkElems.
class Appender {
 public:
  // chunk_elems: the most elements one append() converts. REQUIRES: ≤ kChunkElems.
  explicit Appender(std::uint64_t chunk_elems) : f32_(chunk_elems) {}

  float* f32() { return f32_.data(); }

  // Appends count elements of src (src_dtype) as out_dtype.
  // REQUIRES: count ≤ chunk_elems; src is naturally aligned for src_dtype.
  void append(zero::io::SafetensorsStreamWriter& writer, const void* src, DType src_dtype,
              DType out_dtype, std::size_t count, Progress& progress) {
    const void* data = src;
    if (src_dtype != out_dtype && src_dtype != DType::F32) {
      zero::kernels::cast_cpu(src, src_dtype, f32_.data(), DType::F32, count);
      data = f32_.data();
      src_dtype = DType::F32;
    }
    if (src_dtype != out_dtype) {
      narrow_.resize(std::max(narrow_.size(), f32_.size() * zero::dtype_size(out_dtype)));
      zero::kernels::cast_cpu(data, DType::F32, narrow_.data(), out_dtype, count);
      data = narrow_.data();
    }
    const std::size_t bytes = count * zero::dtype_size(out_dtype);
    writer.append(data, bytes);
    progress.advance(bytes);
  }

 private:
  std::vector<float> f32_;
  std::vector<std::byte> narrow_;  // sized on first use
};

void write_tensor(const ckpt::CheckpointSource& reader, const Item& item,
                  zero::io::SafetensorsStreamWriter& writer, Appender& appender,
                  Progress& progress) {
  if (item.trainable) {
    for (std::uint64_t begin = 0; begin < item.numel;) {
      const std::uint64_t count = std::min(kChunkElems, item.numel - begin);
      reader.read(item.param, "master", begin, count, appender.f32());
      appender.append(writer, appender.f32(), DType::F32, item.out_dtype,
                      static_cast<std::size_t>(count), progress);
      begin += count;
    }
    return;
  }
  const std::vector<std::byte> whole = reader.read_frozen_raw(item.param);
  const std::size_t element_bytes = zero::dtype_size(item.source_dtype);
  ZERO_CHECK_AS(IoError, whole.size() == item.numel * element_bytes,
                "{}: frozen parameter {} has {} bytes, its shape and dtype {} say {}",
                reader.path(), item.name, whole.size(), zero::dtype_name(item.source_dtype),
                item.numel * element_bytes);
  for (std::uint64_t begin = 0; begin < item.numel;) {
    const std::uint64_t count = std::min(kChunkElems, item.numel - begin);
    appender.append(writer, whole.data() + begin * element_bytes, item.source_dtype,
                    item.out_dtype, static_cast<std::size_t>(count), progress);
    begin += count;
  }
}

// Written to `path`.tmp, fsynced and renamed, like the shards.
void write_index(const std::string& path, const nlohmann::json& index) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << index.dump(2) << '\n';
    out.flush();
    ZERO_CHECK_AS(IoError, out.good(), "{}: cannot write", tmp);
  }
  std::FILE* f = std::fopen(tmp.c_str(), "rb");
  ZERO_CHECK_AS(IoError, f != nullptr, "{}: cannot reopen to fsync", tmp);
  const bool synced = ::fsync(fileno(f)) == 0;
  std::fclose(f);
  ZERO_CHECK_AS(IoError, synced, "{}: fsync failed", tmp);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  ZERO_CHECK_AS(IoError, !ec, "{}: cannot rename {} over it: {}", path, tmp, ec.message());
  const std::string dir = fs::path(path).parent_path().string();
  zero::io::fsync_directory(dir.empty() ? "." : dir);
}

std::uint64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

// Every checksummed file, every tensor, before anything is written: a corrupted checkpoint must
// not produce plausible-looking weights. A DeepSpeed checkpoint has none (its zip entries carry
// CRCs, checked as they are read); the line then says what was found.
void verify_all(const ckpt::CheckpointSource& source) {
  const std::vector<ckpt::ChecksummedFile> files = source.checksummed_files();
  const int world = source.world_size();
  if (files.empty()) {
    fmt::print(stderr, "zero_to_fp32: {} is a {} checkpoint ({} rank{}, {}, {} tensors)\n",
               source.path(), source.kind(), world, world == 1 ? "" : "s", source.model_dtype(),
               source.params().size());
    return;
  }
  std::uint64_t checked_bytes = 0;
  std::size_t checked_tensors = 0;
  for (const ckpt::ChecksummedFile& f : files) {
    checked_bytes += f.bytes;
    checked_tensors += f.tensors;
  }
  const Clock::time_point verify_start = Clock::now();
  Progress progress("verifying", checked_bytes);
  for (std::size_t i = 0; i < files.size(); ++i) {
    source.verify_file(i);
    progress.advance(files[i].bytes);
  }
  progress.clear();
  fmt::print(stderr,
             "zero_to_fp32: verified {} (ZeRO stage {}, {} rank{}): {} tensors, {} in {} "
             "file{}, checksums match ({:.2f} s)\n",
             source.path(), source.stage(), world, world == 1 ? "" : "s", checked_tensors,
             format_bytes(checked_bytes), files.size(), files.size() == 1 ? "" : "s",
             seconds_since(verify_start));
}

int write_output(const Options& o, const ckpt::CheckpointSource& reader, std::vector<Item> items,
                 std::size_t frozen_left_out, Clock::time_point start);

// "fp32", or "fp32; 2 frozen in bf16" when frozen parameters keep another dtype.
std::string dtypes_text(const Options& o, const std::vector<Item>& items) {
  const DType main = o.dtype.value_or(DType::F32);
  std::map<DType, std::size_t> others;
  for (const Item& item : items) {
    if (item.out_dtype != main) ++others[item.out_dtype];
  }
  std::string text(zero::dtype_name(main));
  for (const auto& [dtype, n] : others)
    text += fmt::format("; {} frozen in {}", n, zero::dtype_name(dtype));
  return text;
}

int run(const Options& o) {
  const Clock::time_point start = Clock::now();
  const Location where = locate_checkpoint(o);
  const std::unique_ptr<ckpt::CheckpointSource> source =
      ckpt::CheckpointSource::open(where.dir, where.tag);
  verify_all(*source);

  // Every tensor, in the checkpoint's order; DeepSpeed's buffers are written like parameters
  // (its zero_to_fp32 keeps them), frozen parameters unless --exclude-frozen.
  std::vector<Item> items;
  std::size_t frozen_left_out = 0;
  for (std::size_t i = 0; i < source->params().size(); ++i) {
    const ckpt::SourceParam& p = source->params()[i];
    if (!p.trainable && !p.buffer && o.exclude_frozen) {
      ++frozen_left_out;
      continue;
    }
    items.push_back({.param = i,
                     .name = p.name,
                     .shape = p.shape,
                     .numel = p.numel,
                     .trainable = p.trainable,
                     .source_dtype = p.trainable ? DType::F32 : p.frozen_dtype,
                     .out_dtype = o.dtype.value_or(p.stored_dtype()),
                     .aliases = p.aliases});
  }
  return write_output(o, *source, std::move(items), frozen_left_out, start);
}

int write_output(const Options& o, const ckpt::CheckpointSource& reader, std::vector<Item> items,
                 std::size_t frozen_left_out, Clock::time_point start) {
  if (items.empty()) {
    throw zero::Error(fmt::format(
        "{}: nothing to write: {}", reader.path(),
        frozen_left_out == 0 ? "the checkpoint lists no parameters"
                             : "every parameter is frozen and --exclude-frozen leaves them out"));
  }
  std::vector<zero::to_fp32::OutputTensor> sizes;
  for (const Item& item : items)
    sizes.push_back({item.name, item.numel * zero::dtype_size(item.out_dtype)});

  // A path that names an existing directory is one, whatever its name.
  const bool output_is_file = o.output.ends_with(".safetensors") && !fs::is_directory(o.output);
  const zero::to_fp32::OutputPlan plan =
      zero::to_fp32::plan_output(o.output, output_is_file, sizes, o.max_shard_bytes);
  std::uint64_t total_bytes = 0;
  for (const auto& s : sizes) total_bytes += s.bytes;

  const fs::path out_dir = output_is_file ? fs::path(o.output).parent_path() : fs::path(o.output);
  if (!out_dir.empty()) {
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    ZERO_CHECK_AS(IoError, !ec && fs::is_directory(out_dir), "{}: cannot create the directory: {}",
                  out_dir.string(), ec ? ec.message() : "a file of that name is in the way");
  }
  if (plan.sharded_instead_of_file) {
    fmt::print(
        stderr,
        "zero_to_fp32: {} of weights exceed --max-shard-size {}: writing {} shards next "
        "to {} instead ({}, ..., {}) with the index {}{}\n",
        format_bytes(total_bytes), format_bytes(o.max_shard_bytes), plan.files.size(), o.output,
        plan.files.front().file_name, plan.files.back().file_name, plan.index_path,
        fs::exists(o.output) ? fmt::format("; the existing {} is left as it was", o.output) : "");
  }

  const Clock::time_point write_start = Clock::now();
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  // Tied parameters are stored once; "aliases" maps each other name to the tensor holding it.
  nlohmann::json aliases = nlohmann::json::object();
  for (const Item& item : items) {
    for (const std::string& alias : item.aliases) aliases[alias] = item.name;
  }
  if (!aliases.empty()) metadata["aliases"] = aliases.dump();
  std::uint64_t largest_numel = 0;
  for (const Item& item : items) largest_numel = std::max(largest_numel, item.numel);
  Appender appender(std::min(kChunkElems, largest_numel));
  {
    Progress progress("writing", total_bytes);
    for (const zero::to_fp32::ShardFile& shard : plan.files) {
      std::vector<zero::io::TensorDecl> decls;
      for (const std::size_t t : shard.tensors) {
        decls.push_back(
            {.name = items[t].name, .dtype = items[t].out_dtype, .shape = items[t].shape});
      }
      zero::io::SafetensorsStreamWriter writer(shard.path, std::move(decls), metadata);
      for (const std::size_t t : shard.tensors) {
        write_tensor(reader, items[t], writer, appender, progress);
      }
      writer.finish();
    }
    if (!plan.index_path.empty()) {
      write_index(plan.index_path, zero::to_fp32::index_json(plan, sizes));
    }
    progress.clear();
  }
  const double write_seconds = seconds_since(write_start);

  const std::string destination =
      plan.index_path.empty()
          ? plan.files.front().path
          : fmt::format("{} shards indexed by {}", plan.files.size(), plan.index_path);
  fmt::print(stderr,
             "zero_to_fp32: wrote {} tensors ({}{}), {} bytes ({}) to {} in {:.3f} s "
             "({:.3f} GB/s); {:.3f} s in all; peak RSS {}\n",
             items.size(), dtypes_text(o, items),
             frozen_left_out > 0 ? fmt::format("; {} frozen left out", frozen_left_out) : "",
             total_bytes, format_bytes(total_bytes), destination, write_seconds,
             write_seconds > 0 ? static_cast<double>(total_bytes) / write_seconds / 1e9 : 0.0,
             seconds_since(start), format_bytes(peak_rss_bytes()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  Options options;
  try {
    options = zero::to_fp32::parse_options(args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "zero_to_fp32: %s\n", e.what());
    return 2;
  }
  if (options.help) {
    std::fputs(zero::to_fp32::kUsage, stdout);
    return 0;
  }
  try {
    return run(options);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "zero_to_fp32: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_to_fp32: error: %s\n", e.what());
    return 1;
  }
}
