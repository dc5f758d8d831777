#include "zero/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
// The library's runtime dispatch picks AVX2 or AVX-512 where the CPU has them; the digest is the
// same bits on every path.
#include <xxh_x86dispatch.h>
#define ZERO_XXH3_UPDATE XXH3_64bits_update_dispatch
#define ZERO_XXH3 XXH3_64bits_dispatch
#else
#define ZERO_XXH3_UPDATE XXH3_64bits_update
#define ZERO_XXH3 XXH3_64bits
#endif

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "zero/base/error.h"
#include "zero/base/half.h"
#include "zero/base/shape.h"
#include "zero/base/stream_copy.h"

namespace zero::io {

namespace {

// The reference implementation refuses larger headers; so do we, before allocating.
constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

std::optional<DType> parse_st_dtype(const std::string& name) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    if (name == dtype_safetensors_name(t)) return t;
  }
  return std::nullopt;
}

std::uint64_t read_le64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(p[i]);
  return v;
}

}  // namespace

std::uint64_t TensorInfo::numel() const {
  return numel_of(shape);
}

SafetensorsReader SafetensorsReader::open(const std::string& path) {
  SafetensorsReader r;
  r.path_ = path;
  std::error_code ec;
  const std::uint64_t file_bytes = std::filesystem::file_size(path, ec);
  ZERO_CHECK_AS(IoError, !ec, "safetensors {}: cannot stat: {}", path, ec.message());
  ZERO_CHECK_AS(IoError, file_bytes >= 8, "safetensors {}: {} bytes, too short for a header", path,
                file_bytes);
  std::ifstream in(path, std::ios::binary);
  ZERO_CHECK_AS(IoError, in.good(), "safetensors {}: cannot open: {}", path, std::strerror(errno));
  std::byte prefix[8];
  in.read(reinterpret_cast<char*>(prefix), 8);
  ZERO_CHECK_AS(IoError, in.good(), "safetensors {}: cannot read the header length", path);
  const std::uint64_t header_bytes = read_le64(prefix);
  ZERO_CHECK_AS(IoError, header_bytes <= kMaxHeaderBytes && header_bytes <= file_bytes - 8,
                "safetensors {}: header length {} exceeds the file ({} bytes) or the 100 MiB limit",
                path, header_bytes, file_bytes);
  std::vector<std::byte> header(header_bytes);
  in.read(reinterpret_cast<char*>(header.data()), static_cast<std::streamsize>(header_bytes));
  ZERO_CHECK_AS(IoError, in.good(), "safetensors {}: cannot read the {}-byte header", path,
                header_bytes);
  r.data_offset_ = 8 + header_bytes;
  r.parse(header, file_bytes - r.data_offset_);
  return r;
}

SafetensorsReader SafetensorsReader::from_bytes(std::vector<std::byte> bytes, std::string label) {
  SafetensorsReader r;
  r.path_ = std::move(label);
  ZERO_CHECK_AS(IoError, bytes.size() >= 8, "safetensors {}: {} bytes, too short for a header",
                r.path_, bytes.size());
  const std::uint64_t header_bytes = read_le64(bytes.data());
  ZERO_CHECK_AS(IoError, header_bytes <= kMaxHeaderBytes && header_bytes <= bytes.size() - 8,
                "safetensors {}: header length {} exceeds the file ({} bytes) or the 100 MiB limit",
                r.path_, header_bytes, bytes.size());
  const std::vector<std::byte> header(
      bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_bytes));
  r.data_offset_ = 8 + header_bytes;
  r.parse(header, bytes.size() - r.data_offset_);
  r.memory_ = std::move(bytes);
  return r;
}

void SafetensorsReader::parse(const std::vector<std::byte>& header_json, std::uint64_t data_bytes) {
  const auto* first = reinterpret_cast<const char*>(header_json.data());
  nlohmann::json header = nlohmann::json::parse(first, first + header_json.size(), nullptr, false);
  ZERO_CHECK_AS(IoError, !header.is_discarded() && header.is_object(),
                "safetensors {}: the header is not a JSON object", path_);
  for (auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      ZERO_CHECK_AS(IoError, value.is_object(), "safetensors {}: __metadata__ is not an object",
                    path_);
      for (auto& [mkey, mvalue] : value.items()) {
        ZERO_CHECK_AS(IoError, mvalue.is_string(),
                      "safetensors {}: __metadata__.{} is not a string", path_, mkey);
        metadata_[mkey] = mvalue.get<std::string>();
      }
      continue;
    }
    ZERO_CHECK_AS(IoError, value.is_object(), "safetensors {}: tensor {} is not an object", path_,
                  key);
    TensorInfo info;
    info.name = key;
    const auto dtype = value.find("dtype");
    ZERO_CHECK_AS(IoError, dtype != value.end() && dtype->is_string(),
                  "safetensors {}: tensor {} has no dtype string", path_, key);
    const auto parsed = parse_st_dtype(dtype->get<std::string>());
    ZERO_CHECK_AS(IoError, parsed.has_value(),
                  "safetensors {}: tensor {} has dtype {}; supported: F32, F16, BF16, F64", path_,
                  key, dtype->get<std::string>());
    info.dtype = *parsed;
    const auto shape = value.find("shape");
    ZERO_CHECK_AS(IoError, shape != value.end() && shape->is_array(),
                  "safetensors {}: tensor {} has no shape array", path_, key);
    std::uint64_t numel = 1;
    for (const auto& dim : *shape) {
      ZERO_CHECK_AS(
          IoError, dim.is_number_unsigned(),
          "safetensors {}: tensor {} has a shape entry {} that is not a non-negative integer",
          path_, key, dim.dump());
      const auto d = dim.get<std::uint64_t>();
      ZERO_CHECK_AS(IoError,
                    d <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) &&
                        (d == 0 || numel <= std::numeric_limits<std::uint64_t>::max() / 8 / d),
                    "safetensors {}: tensor {} has an overflowing shape {}", path_, key,
                    shape->dump());
      numel *= d;
      info.shape.push_back(static_cast<std::int64_t>(d));
    }
    const auto offsets = value.find("data_offsets");
    ZERO_CHECK_AS(
        IoError,
        offsets != value.end() && offsets->is_array() && offsets->size() == 2 &&
            (*offsets)[0].is_number_unsigned() && (*offsets)[1].is_number_unsigned(),
        "safetensors {}: tensor {} needs data_offsets [begin, end] of non-negative integers", path_,
        key);
    info.data_begin = (*offsets)[0].get<std::uint64_t>();
    info.data_end = (*offsets)[1].get<std::uint64_t>();
    ZERO_CHECK_AS(
        IoError, info.data_begin <= info.data_end && info.data_end <= data_bytes,
        "safetensors {}: tensor {} data_offsets [{}, {}] outside the {}-byte data section", path_,
        key, info.data_begin, info.data_end, data_bytes);
    ZERO_CHECK_AS(IoError, info.size_bytes() == numel * dtype_size(info.dtype),
                  "safetensors {}: tensor {} holds {} bytes but shape {} of {} needs {}", path_,
                  key, info.size_bytes(), shape->dump(), dtype_safetensors_name(info.dtype),
                  numel * dtype_size(info.dtype));
    tensors_.push_back(std::move(info));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  });
  for (std::size_t i = 1; i < tensors_.size(); ++i) {
    ZERO_CHECK_AS(IoError, tensors_[i].data_begin >= tensors_[i - 1].data_end,
                  "safetensors {}: tensors {} and {} overlap", path_, tensors_[i - 1].name,
                  tensors_[i].name);
  }
}

const TensorInfo* SafetensorsReader::find(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const TensorInfo& SafetensorsReader::at(const std::string& name) const {
  const TensorInfo* t = find(name);
  ZERO_CHECK_AS(IoError, t != nullptr, "safetensors {}: no tensor named {}", path_, name);
  return *t;
}

void SafetensorsReader::read_raw(const std::string& name, void* dst, std::size_t dst_bytes) const {
  const TensorInfo& t = at(name);
  ZERO_CHECK_AS(IoError, dst_bytes == t.size_bytes(),
                "safetensors {}: tensor {} has {} bytes, the destination {}", path_, name,
                t.size_bytes(), dst_bytes);
  read_range(name, 0, dst, dst_bytes);
}

std::uint64_t SafetensorsReader::file_offset(const std::string& name, std::uint64_t byte_offset,
                                             std::size_t bytes) const {
  const TensorInfo& t = at(name);
  ZERO_CHECK_AS(IoError, byte_offset <= t.size_bytes() && bytes <= t.size_bytes() - byte_offset,
                "safetensors {}: bytes [{}, {}) are outside tensor {} ({} bytes)", path_,
                byte_offset, byte_offset + bytes, name, t.size_bytes());
  return data_offset_ + t.data_begin + byte_offset;
}

void SafetensorsReader::read_range(const std::string& name, std::uint64_t byte_offset, void* dst,
                                   std::size_t bytes) const {
  const std::uint64_t at_byte = file_offset(name, byte_offset, bytes);
  if (bytes == 0) return;
  if (!memory_.empty()) {
    std::memcpy(dst, memory_.data() + at_byte, bytes);
    return;
  }
  // One large read: the kernel's copy is the whole cost.
  read_file(name, at_byte, static_cast<std::byte*>(dst), bytes, bytes, nullptr);
}

void SafetensorsReader::read_range(const std::string& name, std::uint64_t byte_offset, void* dst,
                                   std::size_t bytes, Checksum& sum,
                                   const PieceFn& on_piece) const {
  const std::uint64_t at_byte = file_offset(name, byte_offset, bytes);
  if (bytes == 0) return;
  auto* out = static_cast<std::byte*>(dst);
  if (!memory_.empty()) {
    copy_pieces(memory_.data() + at_byte, out, bytes, sum, on_piece);
    return;
  }
  if (bytes >= kMapMinBytes) {
    if (const std::byte* map = mapping()) {
      copy_pieces(map + at_byte, out, bytes, sum, on_piece);
      return;
    }
  }
  read_file(name, at_byte, out, bytes, kPieceBytes, [&](const std::byte* piece, std::size_t n) {
    sum.update(piece, n);
    if (on_piece) on_piece(piece, n);
  });
}

void SafetensorsReader::read_file(const std::string& name, std::uint64_t at_byte, std::byte* out,
                                  std::size_t bytes, std::size_t piece,
                                  const PieceFn& on_piece) const {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  ZERO_CHECK_AS(IoError, fd >= 0, "safetensors {}: cannot open: {}", path_, std::strerror(errno));
  try {
    for (std::size_t done = 0; done < bytes;) {
      const std::size_t n = std::min(piece, bytes - done);
      for (std::size_t got = 0; got < n;) {
        const ssize_t r =
            ::pread(fd, out + done + got, n - got, static_cast<off_t>(at_byte + done + got));
        ZERO_CHECK_AS(IoError, r > 0, "safetensors {}: cannot read tensor {} ({} bytes at {}): {}",
                      path_, name, bytes, at_byte, r < 0 ? std::strerror(errno) : "file truncated");
        got += static_cast<std::size_t>(r);
      }
      if (on_piece) on_piece(out + done, n);
      done += n;
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

void SafetensorsReader::copy_pieces(const std::byte* src, std::byte* dst, std::size_t bytes,
                                    Checksum& sum, const PieceFn& on_piece) {
  const bool stream = bytes >= kStreamingMinBytes;
  for (std::size_t done = 0; done < bytes; done += kPieceBytes) {
    const std::size_t n = std::min(kPieceBytes, bytes - done);
    if (stream) {
      // Non-temporal stores write the destination without reading it; the checksum reads each
      // stretch just before it is copied.
      copy_streaming_seen(dst + done, src + done, n,
                          [&](const std::byte* stretch, std::size_t m) { sum.update(stretch, m); });
    } else {
      sum.update(src + done, n);
      std::memcpy(dst + done, src + done, n);
    }
    if (on_piece) on_piece(src + done, n);
  }
}

const std::byte* SafetensorsReader::mapping() const {
  if (mapping_tried_) return mapping_.get();
  mapping_tried_ = true;
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  const std::size_t bytes = ::fstat(fd, &st) == 0 ? static_cast<std::size_t>(st.st_size) : 0;
  // No MAP_POPULATE: pages are faulted in (with the kernel's fault-around) as the copies first
  // read them, so a load that reads part of the file maps only that part.
  void* map = bytes == 0 ? MAP_FAILED : ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return nullptr;
  mapping_ = std::shared_ptr<const std::byte>(
      static_cast<const std::byte*>(map),
      [bytes](const std::byte* p) { ::munmap(const_cast<std::byte*>(p), bytes); });
  return mapping_.get();
}

std::vector<float> SafetensorsReader::read_f32(const std::string& name) const {
  const TensorInfo& t = at(name);
  const std::size_t n = static_cast<std::size_t>(t.numel());
  std::vector<float> out(n);
  switch (t.dtype) {
    case DType::F32: read_raw(name, out.data(), n * 4); break;
    case DType::F64: {
      std::vector<double> wide(n);
      read_raw(name, wide.data(), n * 8);
      std::transform(wide.begin(), wide.end(), out.begin(),
                     [](double x) { return static_cast<float>(x); });
      break;
    }
    case DType::BF16:
    case DType::F16: {
      std::vector<std::uint16_t> narrow(n);
      read_raw(name, narrow.data(), n * 2);
      for (std::size_t i = 0; i < n; ++i) {
        if (t.dtype == DType::F16) {
          out[i] = half::f16_to_float(narrow[i]);
        } else {
          out[i] = half::bf16_to_float(narrow[i]);
        }
      }
      break;
    }
  }
  return out;
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<std::int64_t> shape,
                            const void* data, std::size_t bytes) {
  ZERO_CHECK_AS(IoError, name != "__metadata__" && !name.empty(),
                "safetensors writer: invalid tensor name '{}'", name);
  for (const auto& e : entries_) {
    ZERO_CHECK_AS(IoError, e.name != name, "safetensors writer: tensor {} added twice", name);
  }
  for (auto d : shape) {
    ZERO_CHECK_AS(IoError, d >= 0, "safetensors writer: tensor {} has negative dimension {}", name,
                  d);
  }
  const std::uint64_t numel = numel_of(shape);
  ZERO_CHECK_AS(IoError, numel * dtype_size(dtype) == bytes,
                "safetensors writer: tensor {} has {} bytes, its shape needs {}", name, bytes,
                numel * dtype_size(dtype));
  ZERO_CHECK_AS(IoError, bytes == 0 || data != nullptr,
                "safetensors writer: tensor {} data is null", name);
  Entry e{name, dtype, std::move(shape), std::vector<std::byte>(bytes)};
  if (bytes > 0) std::memcpy(e.bytes.data(), data, bytes);
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::add_f32(const std::string& name, std::vector<std::int64_t> shape,
                                const std::vector<float>& values) {
  add(name, DType::F32, std::move(shape), values.data(), values.size() * sizeof(float));
}

std::uint64_t TensorDecl::size_bytes() const {
  return dtype_size(dtype) * numel_of(shape);
}

std::vector<std::byte> safetensors_header(const std::vector<TensorDecl>& tensors,
                                          const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const TensorDecl& t : tensors) {
    ZERO_CHECK_AS(IoError, t.name != "__metadata__" && !t.name.empty() && !header.contains(t.name),
                  "safetensors writer: invalid or repeated tensor name '{}'", t.name);
    for (std::int64_t d : t.shape) {
      ZERO_CHECK_AS(IoError, d >= 0, "safetensors writer: tensor {} has negative dimension {}",
                    t.name, d);
    }
    header[t.name] = {{"dtype", std::string(dtype_safetensors_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.size_bytes()}}};
    offset += t.size_bytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<std::byte> out(8 + text.size());
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, text.data(), text.size());
  return out;
}

std::vector<std::byte> SafetensorsWriter::to_bytes() const {
  std::vector<TensorDecl> decls;
  std::uint64_t offset = 0;
  for (const auto& e : entries_) {
    decls.push_back({e.name, e.dtype, e.shape});
    offset += e.bytes.size();
  }
  std::vector<std::byte> out = safetensors_header(decls, metadata_);
  std::size_t at = out.size();
  out.resize(out.size() + offset);
  for (const auto& e : entries_) {
    if (!e.bytes.empty()) std::memcpy(out.data() + at, e.bytes.data(), e.bytes.size());
    at += e.bytes.size();
  }
  return out;
}

void SafetensorsWriter::write(const std::string& path) const {
  const std::vector<std::byte> bytes = to_bytes();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    ZERO_CHECK_AS(IoError, out.good(), "safetensors {}: cannot create: {}", tmp,
                  std::strerror(errno));
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.flush();
    ZERO_CHECK_AS(IoError, out.good(), "safetensors {}: write of {} bytes failed", tmp,
                  bytes.size());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  ZERO_CHECK_AS(IoError, !ec, "safetensors {}: cannot rename {} over it: {}", path, tmp,
                ec.message());
}

Checksum::Checksum() : state_(XXH3_createState()) {
  ZERO_CHECK(state_ != nullptr, "checksum: out of memory");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Checksum::~Checksum() {
  if (state_ != nullptr) XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}
Checksum::Checksum(Checksum&& other) noexcept : state_(other.state_) {
  other.state_ = nullptr;
}
Checksum& Checksum::operator=(Checksum&& other) noexcept {
  std::swap(state_, other.state_);
  return *this;
}
void Checksum::update(const void* data, std::size_t bytes) {
  if (bytes > 0) ZERO_XXH3_UPDATE(static_cast<XXH3_state_t*>(state_), data, bytes);
}
std::uint64_t Checksum::digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

std::uint64_t checksum(const void* data, std::size_t bytes) {
  return ZERO_XXH3(data, bytes);
}

std::string checksum_hex(std::uint64_t sum) {
  return fmt::format("{:016x}", sum);
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ZERO_CHECK_AS(IoError, fd >= 0, "cannot open directory {}: {}", dir, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  ZERO_CHECK_AS(IoError, rc == 0, "fsync of directory {} failed: {}", dir, std::strerror(err));
}

SafetensorsStreamWriter::SafetensorsStreamWriter(std::string path, std::vector<TensorDecl> tensors,
                                                 const std::map<std::string, std::string>& metadata,
                                                 WriteFault fault)
    : path_(std::move(path)),
      tmp_(path_ + ".tmp"),
      fault_(std::move(fault)),
      tensors_(std::move(tensors)),
      running_(tensors_.size()),
      sums_(tensors_.size(), 0) {
  const std::vector<std::byte> header = safetensors_header(tensors_, metadata);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZERO_CHECK_AS(IoError, fd_ >= 0, "safetensors {}: cannot create: {}", tmp_, std::strerror(errno));
  try {
    write_all(header.data(), header.size(), {});
  } catch (...) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
    throw;
  }
  while (current_ < tensors_.size() && tensors_[current_].size_bytes() == 0) ++current_;
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (finished_) return;
  if (fd_ >= 0) ::close(fd_);
  ::unlink(tmp_.c_str());
}

void SafetensorsStreamWriter::write_all(const std::byte* data, std::size_t bytes,
                                        const std::string& tensor) {
  for (std::size_t done = 0; done < bytes;) {
    const int injected = fault_ ? fault_(write_calls_) : 0;
    ++write_calls_;
    const ssize_t w = injected != 0 ? -1 : ::write(fd_, data + done, bytes - done);
    const int err = injected != 0 ? injected : errno;
    ZERO_CHECK_AS(IoError, w > 0, "safetensors {}: write of {} failed: {}", tmp_,
                  tensor.empty() ? std::string("the header") : "tensor " + tensor,
                  w < 0 ? std::strerror(err) : "no progress");
    done += static_cast<std::size_t>(w);
    file_bytes_ += static_cast<std::uint64_t>(w);
  }
  // Start the disk on each whole kWritebackBytes block as soon as it is in the page cache, so the
  // device writes while the rest is being copied and finish()'s fsync waits only for the tail.
  // A hint: a failure here changes nothing (fsync reports any write error).
  while (file_bytes_ - written_back_ >= kWritebackBytes) {
    ::sync_file_range(fd_, static_cast<off_t>(written_back_), static_cast<off_t>(kWritebackBytes),
                      SYNC_FILE_RANGE_WRITE);
    written_back_ += kWritebackBytes;
  }
}

void SafetensorsStreamWriter::append(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const std::byte*>(data);
  while (bytes > 0) {
    ZERO_CHECK_AS(IoError, current_ < tensors_.size(),
                  "safetensors {}: {} bytes more than the declared tensors hold", path_, bytes);
    const std::uint64_t room = tensors_[current_].size_bytes() - written_in_current_;
    const std::uint64_t to_boundary = kWriteBytes - file_bytes_ % kWriteBytes;
    const std::size_t n =
        static_cast<std::size_t>(std::min<std::uint64_t>({room, bytes, to_boundary}));
    // Checksum first: it brings the bytes into cache for write()'s copy.
    running_[current_].update(p, n);
    write_all(p, n, tensors_[current_].name);
    p += n;
    bytes -= n;
    written_in_current_ += n;
    while (current_ < tensors_.size() && written_in_current_ == tensors_[current_].size_bytes()) {
      ++current_;
      written_in_current_ = 0;
    }
  }
}

void SafetensorsStreamWriter::finish() {
  ZERO_CHECK_AS(IoError, current_ == tensors_.size(),
                "safetensors {}: finished before tensor {} was written in full", path_,
                current_ < tensors_.size() ? tensors_[current_].name : std::string());
  for (std::size_t t = 0; t < tensors_.size(); ++t) sums_[t] = running_[t].digest();
  ZERO_CHECK_AS(IoError, ::fsync(fd_) == 0, "safetensors {}: fsync failed: {}", tmp_,
                std::strerror(errno));
  ZERO_CHECK_AS(IoError, ::close(fd_) == 0, "safetensors {}: close failed: {}", tmp_,
                std::strerror(errno));
  fd_ = -1;
  ZERO_CHECK_AS(IoError, ::rename(tmp_.c_str(), path_.c_str()) == 0,
                "safetensors {}: cannot rename {} over it: {}", path_, tmp_, std::strerror(errno));
  finished_ = true;
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  fsync_directory(dir.empty() ? "." : dir);
}

}  // namespace zero::io
