#include "zero/dscheckpoint/pt_archive.h"

#include <zip.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "zero/base/error.h"
#include "zero/base/strings.h"

namespace zero::dscheckpoint {

namespace {

// PyTorch pickles are a few MB even for large models (one entry per tensor); a bound keeps a
// forged size field from turning into an allocation.
constexpr std::uint64_t kMaxPickleBytes = 256ull << 20;
constexpr std::size_t kReadChunkBytes = 1 << 20;

std::string zip_error_text(int code) {
  zip_error_t e;
  zip_error_init_with_code(&e, code);
  std::string text = zip_error_strerror(&e);
  zip_error_fini(&e);
  return text;
}

}  // namespace

struct PtArchive::Zip {
  zip_t* archive = nullptr;
  std::vector<std::byte> memory;  // from_bytes(): the image libzip reads from

  ~Zip() {
    if (archive != nullptr) zip_discard(archive);
  }
};

// A zip_file_t that closes itself.
namespace {
struct ZipFile {
  zip_file_t* f = nullptr;
  ~ZipFile() {
    if (f != nullptr) zip_fclose(f);
  }
};
}  // namespace

PtArchive::PtArchive(PtArchive&&) noexcept = default;
PtArchive& PtArchive::operator=(PtArchive&&) noexcept = default;
PtArchive::~PtArchive() = default;

bool looks_like_zip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::array<char, 4> magic{};
  in.read(magic.data(), magic.size());
  return in.gcount() == 4 && std::memcmp(magic.data(), "PK\x03\x04", 4) == 0;
}

PtArchive PtArchive::open(const std::string& path) {
  PtArchive a;
  a.path_ = path;
  a.zip_ = std::make_unique<Zip>();
  int code = 0;
  a.zip_->archive = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code);
  if (a.zip_->archive == nullptr) {
    std::string hint;
    if (code == ZIP_ER_NOZIP || code == ZIP_ER_INCONS) {
      hint = looks_like_zip(path)
                 ? " (it starts like a zip archive but its central directory is missing or "
                   "damaged: the file is truncated or corrupt)"
                 : " (not a zip archive: PyTorch's legacy pre-1.6 format is not supported)";
    }
    throw IoError(fmt::format("{}: cannot open as a PyTorch zip checkpoint: {}{}", path,
                              zip_error_text(code), hint));
  }
  std::error_code ec;
  a.archive_bytes_ = std::filesystem::file_size(path, ec);
  ZERO_CHECK_AS(IoError, !ec, "{}: cannot stat: {}", path, ec.message());
  a.index_entries();
  return a;
}

PtArchive PtArchive::from_bytes(std::vector<std::byte> bytes, std::string label) {
  PtArchive a;
  a.path_ = std::move(label);
  a.zip_ = std::make_unique<Zip>();
  a.zip_->memory = std::move(bytes);
  zip_error_t err;
  zip_error_init(&err);
  // libzip reads the image in place; it outlives the source because Zip owns both.
  zip_source_t* src =
      zip_source_buffer_create(a.zip_->memory.data(), a.zip_->memory.size(), 0, &err);
  if (src == nullptr) {
    const std::string text = zip_error_strerror(&err);
    zip_error_fini(&err);
    throw IoError(fmt::format("{}: cannot read the zip image: {}", a.path_, text));
  }
  a.zip_->archive = zip_open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &err);
  if (a.zip_->archive == nullptr) {
    const std::string text = zip_error_strerror(&err);
    zip_error_fini(&err);
    zip_source_free(src);
    throw IoError(fmt::format(
        "{}: cannot open as a PyTorch zip checkpoint: {} (truncated, corrupt or not a zip)",
        a.path_, text));
  }
  zip_error_fini(&err);
  a.archive_bytes_ = a.zip_->memory.size();
  a.index_entries();
  return a;
}

void PtArchive::index_entries() {
  const zip_int64_t n = zip_get_num_entries(zip_->archive, 0);
  ZERO_CHECK_AS(IoError, n >= 0, "{}: cannot count the zip entries", path_);
  std::vector<std::string> pickles;
  for (zip_int64_t i = 0; i < n; ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(zip_->archive, static_cast<zip_uint64_t>(i), 0, &st) != 0) {
      throw IoError(
          fmt::format("{}: zip entry {}: cannot stat: {}", path_, i, zip_strerror(zip_->archive)));
    }
    const bool complete = (st.valid & ZIP_STAT_NAME) && (st.valid & ZIP_STAT_SIZE) &&
                          (st.valid & ZIP_STAT_COMP_METHOD);
    ZERO_CHECK_AS(IoError, complete && st.name != nullptr,
                  "{}: zip entry {}: the directory lacks its name, size or method", path_, i);
    std::string name = st.name;
    ZERO_CHECK_AS(
        IoError, !(st.valid & ZIP_STAT_ENCRYPTION_METHOD) || st.encryption_method == ZIP_EM_NONE,
        "{}: zip entry '{}' is encrypted; PyTorch never writes encrypted entries", path_, name);
    Entry e;
    e.index = static_cast<std::uint64_t>(i);
    e.size_bytes = st.size;
    e.stored = st.comp_method == ZIP_CM_STORE;
    ZERO_CHECK_AS(IoError, !e.stored || e.size_bytes <= archive_bytes_,
                  "{}: zip entry '{}' declares {} bytes, more than the whole archive ({} bytes)",
                  path_, name, e.size_bytes, archive_bytes_);
    if (name.size() > 9 && name.ends_with("/data.pkl") && name.find('/') == name.size() - 9) {
      pickles.push_back(name.substr(0, name.size() - 9));
    }
    const bool inserted = entries_.emplace(name, e).second;
    ZERO_CHECK_AS(IoError, inserted, "{}: zip entry '{}' appears twice", path_, name);
  }
  ZERO_CHECK_AS(IoError, pickles.size() == 1,
                "{}: expected exactly one '<archive>/data.pkl' entry (a PyTorch zip checkpoint), "
                "found {} among {} entries",
                path_, pickles.size(), entries_.size());
  archive_name_ = pickles.front();

  if (auto it = entries_.find(archive_name_ + "/version"); it != entries_.end()) {
    ZERO_CHECK_AS(IoError, it->second.size_bytes <= 64,
                  "{}: entry '{}' holds {} bytes, expected a short version number", path_,
                  it->first, it->second.size_bytes);
    std::string text(it->second.size_bytes, '\0');
    read_entry(it->first, it->second, 0, text.data(), text.size(), true);
    version_ = trim(text);
  }
  // Also accepted under ".data/" (PyTorch 2.x writes both spellings of some records).
  for (const char* rec : {"/byteorder", "/.data/byteorder"}) {
    auto it = entries_.find(archive_name_ + rec);
    if (it == entries_.end()) continue;
    ZERO_CHECK_AS(IoError, it->second.size_bytes <= 16,
                  "{}: entry '{}' holds {} bytes, expected \"little\" or \"big\"", path_, it->first,
                  it->second.size_bytes);
    std::string text(it->second.size_bytes, '\0');
    read_entry(it->first, it->second, 0, text.data(), text.size(), true);
    text = trim(text);
    ZERO_CHECK_AS(IoError, text == "little",
                  "{}: entry '{}' says the storages are \"{}\"-endian; only little-endian "
                  "checkpoints are supported",
                  path_, it->first, text);
  }
}

void PtArchive::read_entry(const std::string& name, const Entry& e, std::uint64_t byte_offset,
                           void* dst, std::size_t bytes, bool check_crc) const {
  ZERO_CHECK_AS(IoError, byte_offset <= e.size_bytes && bytes <= e.size_bytes - byte_offset,
                "{}: entry '{}': read of {} bytes at offset {} is outside its {} bytes", path_,
                name, bytes, byte_offset, e.size_bytes);
  // A stored entry's raw bytes are its contents; opening it raw lets libzip seek, which it
  // refuses on the CRC-checking stream. The pickle is read whole with its CRC checked.
  const bool raw = e.stored && !check_crc;
  ZipFile f;
  f.f = zip_fopen_index(zip_->archive, e.index, raw ? ZIP_FL_COMPRESSED : 0);
  ZERO_CHECK_AS(IoError, f.f != nullptr, "{}: entry '{}': cannot open: {}", path_, name,
                zip_strerror(zip_->archive));
  auto* out = static_cast<unsigned char*>(dst);
  if (byte_offset > 0) {
    if (raw) {
      ZERO_CHECK_AS(
          IoError,
          byte_offset <= static_cast<std::uint64_t>(std::numeric_limits<zip_int64_t>::max()) &&
              zip_fseek(f.f, static_cast<zip_int64_t>(byte_offset), SEEK_SET) == 0,
          "{}: entry '{}': cannot seek to byte {}: {}", path_, name, byte_offset,
          zip_file_strerror(f.f));
    } else {
      std::vector<unsigned char> skip(std::min<std::uint64_t>(byte_offset, kReadChunkBytes));
      std::uint64_t left = byte_offset;
      while (left > 0) {
        const zip_int64_t got =
            zip_fread(f.f, skip.data(), std::min<std::uint64_t>(left, skip.size()));
        ZERO_CHECK_AS(IoError, got > 0, "{}: entry '{}': short read while skipping to byte {}: {}",
                      path_, name, byte_offset, zip_file_strerror(f.f));
        left -= static_cast<std::uint64_t>(got);
      }
    }
  }
  std::size_t done = 0;
  while (done < bytes) {
    const zip_int64_t got = zip_fread(f.f, out + done, std::min(bytes - done, kReadChunkBytes));
    ZERO_CHECK_AS(IoError, got > 0,
                  "{}: entry '{}': the file ends after {} of {} bytes at offset {}: {}", path_,
                  name, done, bytes, byte_offset, got < 0 ? zip_file_strerror(f.f) : "end of data");
    done += static_cast<std::size_t>(got);
  }
  if (check_crc && byte_offset + bytes == e.size_bytes) {
    unsigned char extra;
    const zip_int64_t got = zip_fread(f.f, &extra, 1);
    ZERO_CHECK_AS(
        IoError, got == 0, "{}: entry '{}': {}", path_, name,
        got < 0 ? std::string(zip_file_strerror(f.f)) : "more data than the directory declares");
  }
}

std::vector<std::byte> PtArchive::read_pickle() const {
  const std::string name = archive_name_ + "/data.pkl";
  const Entry& e = entries_.at(name);
  ZERO_CHECK_AS(IoError, e.size_bytes <= kMaxPickleBytes,
                "{}: entry '{}' declares {} bytes; pickles above {} bytes are refused", path_, name,
                e.size_bytes, kMaxPickleBytes);
  ZipFile f;
  f.f = zip_fopen_index(zip_->archive, e.index, 0);
  ZERO_CHECK_AS(IoError, f.f != nullptr, "{}: entry '{}': cannot open: {}", path_, name,
                zip_strerror(zip_->archive));
  // Grown as data arrives rather than sized from the directory, which a damaged file can
  // overstate.
  std::vector<std::byte> bytes;
  std::vector<std::byte> chunk(std::min<std::uint64_t>(e.size_bytes + 1, kReadChunkBytes));
  while (true) {
    const zip_int64_t got = zip_fread(f.f, chunk.data(), chunk.size());
    ZERO_CHECK_AS(IoError, got >= 0, "{}: entry '{}': {}", path_, name, zip_file_strerror(f.f));
    if (got == 0) break;
    ZERO_CHECK_AS(IoError, bytes.size() + static_cast<std::uint64_t>(got) <= e.size_bytes,
                  "{}: entry '{}' holds more than the {} bytes its directory declares", path_, name,
                  e.size_bytes);
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + got);
  }
  ZERO_CHECK_AS(IoError, bytes.size() == e.size_bytes,
                "{}: entry '{}' ends after {} of the {} bytes its directory declares", path_, name,
                bytes.size(), e.size_bytes);
  return bytes;
}

bool PtArchive::has_storage(const std::string& key) const {
  return entries_.count(archive_name_ + "/data/" + key) != 0;
}

const PtArchive::Entry& PtArchive::storage_entry(const std::string& key) const {
  auto it = entries_.find(archive_name_ + "/data/" + key);
  ZERO_CHECK_AS(IoError, it != entries_.end(),
                "{}: the pickle references storage '{}', but the archive has no entry '{}/data/{}'",
                path_, key, archive_name_, key);
  return it->second;
}

std::uint64_t PtArchive::storage_bytes(const std::string& key) const {
  return storage_entry(key).size_bytes;
}

void PtArchive::read_storage(const std::string& key, std::uint64_t byte_offset, void* dst,
                             std::size_t bytes) const {
  if (bytes == 0) return;
  read_entry(archive_name_ + "/data/" + key, storage_entry(key), byte_offset, dst, bytes, false);
}

}  // namespace zero::dscheckpoint
