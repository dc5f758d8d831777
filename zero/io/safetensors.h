// safetensors files (https://github.com/huggingface/safetensors, "format"): an 8-byte
// little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__":
// {string: string}}, then the tensor bytes. Used for golden data, replay output and checkpoints.
//
// Reading parses and checks the whole header up front (every offset and size against the file,
// no overlaps, element counts against byte sizes) and reads tensor bytes on demand, so a large
// checkpoint is never loaded whole. Only F32, F16, BF16 and F64 tensors are accepted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zero/base/dtype.h"

namespace zero::io {

class Checksum;

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t data_begin = 0;  // byte offsets inside the data section
  std::uint64_t data_end = 0;

  std::uint64_t numel() const;
  std::uint64_t size_bytes() const { return data_end - data_begin; }
};

// The piece size of streamed reads: small enough to stay in a core's L2 cache between the copy
// and the piece function, large enough that calls cost nothing next to the bytes.
inline constexpr std::size_t kPieceBytes = std::size_t{512} << 10;
// The stream writer's write() calls cover the file in aligned kWriteBytes blocks (the first block
// holds the header too), so the page cache can hold the file in 2 MiB folios, which a later
// mapped read walks with few faults. Measured with zero-bench checkpoint (2 ranks x 201 MB,
// ext4), aligned blocks of 1 MiB: loads 31-41 ms (smaller folios); of 2 MiB: loads 33-36 ms and
// saves 215-226 ms (best of 3, 5 runs); of 8 MiB: loads 33-38 ms, but saves of 207-487 ms (a
// write() of 8 MiB now and then stalls for hundreds of ms). A block also stays in cache between
// the checksum and write()'s copy.
inline constexpr std::size_t kWriteBytes = std::size_t{2} << 20;
// The stream writer asks the kernel to start writing each aligned block of this size to disk as
// soon as it is complete, overlapping the device with the rest of the copy into the page cache.
inline constexpr std::size_t kWritebackBytes = std::size_t{8} << 20;
// Checksummed ranged reads from this size on go through a mapping of the file.
inline constexpr std::size_t kMapMinBytes = std::size_t{1} << 20;

// Not thread-safe; one reader per thread. Errors throw zero::IoError naming the file.
class SafetensorsReader {
 public:
  // Opens and validates `path`. The file is reopened for each read, so the reader holds no
  // descriptor between calls; the first large read with a piece function maps the whole file
  // read-only, and the mapping lasts as long as the reader (and its copies).
  static SafetensorsReader open(const std::string& path);
  // Parses a whole file image held in memory (tests, fuzzing).
  static SafetensorsReader from_bytes(std::vector<std::byte> bytes, std::string label = "<memory>");

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // In file order (ascending offsets).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Null when absent.
  const TensorInfo* find(const std::string& name) const;
  // Throws when absent.
  const TensorInfo& at(const std::string& name) const;

  // Copies the tensor's raw bytes (little-endian) to dst. REQUIRES: dst_bytes == size_bytes().
  void read_raw(const std::string& name, void* dst, std::size_t dst_bytes) const;
  // Copies `bytes` raw bytes of tensor `name` starting `byte_offset` into the tensor, so a large
  // tensor can be read in pieces. Throws IoError when the range is outside the tensor.
  void read_range(const std::string& name, std::uint64_t byte_offset, void* dst,
                  std::size_t bytes) const;
  // The same, feeding `sum` every byte on the way and then calling on_piece(piece, piece_bytes),
  // if given, on each piece of at most kPieceBytes right after it was copied into dst, while it is
  // in cache (the pieces follow each other in order and cover the range). The checksum is taken
  // while copying (copy_streaming_seen), so it costs no second trip through memory.
  // A range of kMapMinBytes or more is copied out of the reader's read-only mapping of the whole
  // file (with non-temporal stores from kStreamingMinBytes on), as safetensors' own loader maps
  // its files: one mapping for every range, its pages faulted in as they are first read. A file
  // truncated by another process during that copy raises SIGBUS, as it would there.
  using PieceFn = std::function<void(const std::byte* piece, std::size_t bytes)>;
  void read_range(const std::string& name, std::uint64_t byte_offset, void* dst, std::size_t bytes,
                  Checksum& sum, const PieceFn& on_piece = nullptr) const;
  // The tensor converted to float (exact for F32/F16/BF16; F64 rounded).
  std::vector<float> read_f32(const std::string& name) const;

 private:
  void parse(const std::vector<std::byte>& header_json, std::uint64_t data_bytes);
  // Where bytes [byte_offset, byte_offset + bytes) of tensor `name` start in the file; throws
  // IoError when the range is outside the tensor.
  std::uint64_t file_offset(const std::string& name, std::uint64_t byte_offset,
                            std::size_t bytes) const;
  // Reads file bytes [at_byte, at_byte + bytes) of tensor `name` into out with preads of at most
  // `piece` bytes, calling on_piece (if given) on each piece read.
  void read_file(const std::string& name, std::uint64_t at_byte, std::byte* out, std::size_t bytes,
                 std::size_t piece, const PieceFn& on_piece) const;
  static void copy_pieces(const std::byte* src, std::byte* dst, std::size_t bytes, Checksum& sum,
                          const PieceFn& on_piece);
  // The whole file mapped read-only (made on the first call), or null when it cannot be mapped
  // (the caller reads instead).
  const std::byte* mapping() const;

  std::string path_;
  std::vector<std::byte> memory_;  // whole image for from_bytes(), else empty
  mutable std::shared_ptr<const std::byte> mapping_;  // mapping()'s, unmapped with the last copy
  mutable bool mapping_tried_ = false;
  std::uint64_t data_offset_ = 0;  // 8 + header length
  std::map<std::string, std::string> metadata_;
  std::vector<TensorInfo> tensors_;
};

// Collects tensors (copies their bytes) and writes one file. Tensors are laid out in the order
// added; the header is padded with spaces to a multiple of 8 bytes so the data is aligned.
class SafetensorsWriter {
 public:
  void set_metadata(const std::string& key, const std::string& value);
  // REQUIRES: bytes == product(shape) × dtype_size(dtype); a name not added before and not
  // "__metadata__".
  void add(const std::string& name, DType dtype, std::vector<std::int64_t> shape, const void* data,
           std::size_t bytes);
  void add_f32(const std::string& name, std::vector<std::int64_t> shape,
               const std::vector<float>& values);

  std::vector<std::byte> to_bytes() const;
  // Writes to `path` + ".tmp", then renames it over `path`, so a reader never sees half a file.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<std::int64_t> shape;
    std::vector<std::byte> bytes;
  };
  std::map<std::string, std::string> metadata_;
  std::vector<Entry> entries_;
};

// The header bytes (8-byte length + JSON padded to 8) of a file holding `tensors` in this order,
// each tensor's data_offsets following from its shape and dtype.
struct TensorDecl {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t size_bytes() const;
};
std::vector<std::byte> safetensors_header(const std::vector<TensorDecl>& tensors,
                                          const std::map<std::string, std::string>& metadata);

// XXH3-64 (xxHash, seed 0) of a byte stream fed in any pieces; the same value as checksum() of
// the whole. Checkpoint tensors carry it (fast enough not to bound save and load speed).
class Checksum {
 public:
  Checksum();
  ~Checksum();
  Checksum(Checksum&& other) noexcept;
  Checksum& operator=(Checksum&& other) noexcept;
  Checksum(const Checksum&) = delete;
  Checksum& operator=(const Checksum&) = delete;
  void update(const void* data, std::size_t bytes);
  std::uint64_t digest() const;

 private:
  void* state_ = nullptr;  // XXH3_state_t
};
std::uint64_t checksum(const void* data, std::size_t bytes);
// "0123456789abcdef": 16 lower-case hex digits (JSON numbers cannot hold 64 bits everywhere).
std::string checksum_hex(std::uint64_t sum);

// Writes a safetensors file tensor by tensor without holding it in memory: the header first
// (every shape is known up front), then each tensor's bytes in order, in as many pieces as the
// caller likes. The file is written to `path` + ".tmp", fsynced and renamed over `path` by
// finish(); destroying an unfinished writer removes the temporary file, so `path` is either the
// old file or the complete new one. A checksum (XXH3-64) of each tensor's bytes is kept,
// computed on each write's bytes (at most kWriteBytes, ending on a kWriteBytes boundary of the
// file) just before it, so write() copies them from cache.
//
// Fault injection (tests): `fault`, when given, is asked before each write() system call of this
// writer with the call's index (0, 1, ...) and returns 0 to let it through or an errno (ENOSPC,
// EIO, ...) that the call then fails with, as the kernel's would.
using WriteFault = std::function<int(std::size_t call)>;
class SafetensorsStreamWriter {
 public:
  SafetensorsStreamWriter(std::string path, std::vector<TensorDecl> tensors,
                          const std::map<std::string, std::string>& metadata = {},
                          WriteFault fault = nullptr);
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;

  // Appends bytes of the current tensor; moves on to the next tensor when one is complete.
  // Throws IoError when more bytes arrive than the tensors declared, or a write fails.
  void append(const void* data, std::size_t bytes);
  // REQUIRES: every declared byte appended. fsyncs the file, renames it into place and fsyncs
  // the directory.
  void finish();

  // XXH3-64 of each tensor's bytes, in declaration order (complete once finish() returned).
  const std::vector<std::uint64_t>& checksums() const { return sums_; }
  const std::string& path() const { return path_; }

 private:
  // Writes all of [data, data + bytes) of `tensor` (empty: the header) or throws IoError.
  void write_all(const std::byte* data, std::size_t bytes, const std::string& tensor);

  std::string path_;
  std::string tmp_;
  WriteFault fault_;
  std::size_t write_calls_ = 0;
  std::vector<TensorDecl> tensors_;
  std::vector<Checksum> running_;
  std::vector<std::uint64_t> sums_;
  int fd_ = -1;
  std::size_t current_ = 0;  // tensor being written
  std::uint64_t written_in_current_ = 0;
  std::uint64_t file_bytes_ = 0;    // written so far, header included
  std::uint64_t written_back_ = 0;  // the bytes before it are on their way to disk
  bool finished_ = false;
};

// fsync of a directory, so a rename or a new entry in it survives a crash. Throws IoError.
void fsync_directory(const std::string& dir);

}  // namespace zero::io
