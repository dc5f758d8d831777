// PyTorch's zip checkpoint container (.pt files written by torch.save since PyTorch 1.6): a zip
// archive whose entries all sit under one top-level folder (the "archive name", e.g.
// "mp_rank_00_model_states/"):
//   <name>/data.pkl      the pickle (see pickle.h)
//   <name>/data/<key>    one entry per tensor storage, raw little-endian elements
//   <name>/version       the serialization format version ("3")
//   <name>/byteorder     "little" or "big" (PyTorch >= 2.1; absent means little)
// PyTorch stores every entry uncompressed and 64-byte aligned, so a storage can be read in
// pieces without reading the rest of the file. The zip structure is parsed by libzip.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace zero::dscheckpoint {

// Thread safety: none; one archive per thread. Errors throw zero::IoError naming the file (the
// path, or the label given to from_bytes) and the entry.
class PtArchive {
 public:
  struct Entry {
    std::uint64_t index = 0;       // libzip's entry index
    std::uint64_t size_bytes = 0;  // uncompressed
    bool stored = true;            // false: compressed (readable, but only front to back)
  };

  // Opens `path`, reads the zip central directory and checks it against the local headers.
  // Nothing else is read until asked for.
  static PtArchive open(const std::string& path);
  // An archive image held in memory (tests, fuzzing). `label` names it in errors.
  static PtArchive from_bytes(std::vector<std::byte> bytes, std::string label = "<memory>");

  PtArchive(PtArchive&&) noexcept;
  PtArchive& operator=(PtArchive&&) noexcept;
  ~PtArchive();

  const std::string& path() const { return path_; }
  // The top-level folder holding data.pkl, without the trailing slash.
  const std::string& archive_name() const { return archive_name_; }
  // "<archive_name>/version" contents, trimmed; empty when absent.
  const std::string& version() const { return version_; }

  // Entries by their full name.
  const std::map<std::string, Entry>& entries() const { return entries_; }

  // The whole data.pkl, checked against its CRC-32.
  std::vector<std::byte> read_pickle() const;

  // Storage `key` ("0", "1", ...: the third field of the pickle's persistent id).
  bool has_storage(const std::string& key) const;
  // Throws naming the file and the entry when the storage is absent.
  std::uint64_t storage_bytes(const std::string& key) const;
  // Copies `bytes` bytes of storage `key` starting at `byte_offset` into dst. Throws when the
  // range lies outside the storage or the file is shorter than its directory says.
  void read_storage(const std::string& key, std::uint64_t byte_offset, void* dst,
                    std::size_t bytes) const;

 private:
  PtArchive() = default;
  void index_entries();
  const Entry& storage_entry(const std::string& key) const;
  void read_entry(const std::string& name, const Entry& e, std::uint64_t byte_offset, void* dst,
                  std::size_t bytes, bool check_crc) const;

  struct Zip;
  std::unique_ptr<Zip> zip_;
  std::string path_;
  std::string archive_name_;
  std::string version_;
  std::uint64_t archive_bytes_ = 0;
  std::map<std::string, Entry> entries_;
};

// True when the first bytes of `path` are a zip local-file header ("PK\3\4"); PyTorch's legacy
// (pre-1.6) format starts with a pickled magic number instead.
bool looks_like_zip(const std::string& path);

}  // namespace zero::dscheckpoint
