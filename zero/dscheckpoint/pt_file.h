// A PyTorch .pt file: its zip archive (pt_archive.h) and its parsed pickle (pickle.h), with
// tensor reads that check every tensor against its storage before touching the data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zero/dscheckpoint/pickle.h"
#include "zero/dscheckpoint/pt_archive.h"

namespace zero::dscheckpoint {

// Checks that tensor `t` can be read from `archive`: its storage entry exists, holds the
// elements the pickle declares, and the view (offset, shape, stride) stays inside them.
// `where` ("<file>: <key path>") starts the message of the IoError thrown otherwise.
void check_tensor(const PtArchive& archive, const TensorRef& t, std::string_view where);

// Elements [first, first + out.size()) of tensor `t` in row-major order, converted to float
// (exact for float32/float16/bfloat16; float64 and integers rounded). Reads only the bytes of
// the storage those elements occupy. Checks `t` first (check_tensor).
void read_tensor_f32(const PtArchive& archive, const TensorRef& t, std::uint64_t first,
                     std::span<float> out, std::string_view where);

// Not thread-safe (the archive is not).
class PtFile {
 public:
  // Opens the archive and parses data.pkl; tensor data stays on disk until read.
  static PtFile open(const std::string& path);
  static PtFile from_bytes(std::vector<std::byte> bytes, std::string label = "<memory>");

  const std::string& path() const { return archive_.path(); }
  const PtArchive& archive() const { return archive_; }
  PickleView root() const { return pickle_.root(); }

  // The tensor at `v`, checked against its storage (check_tensor); throws naming the file and
  // key path when `v` is not a tensor or does not fit.
  const TensorRef& tensor(const PickleView& v) const;
  std::vector<float> read_f32(const PickleView& v) const;
  void read_f32(const PickleView& v, std::uint64_t first, std::span<float> out) const;

 private:
  PtFile(PtArchive archive, Pickle pickle)
      : archive_(std::move(archive)), pickle_(std::move(pickle)) {}
  PtArchive archive_;
  Pickle pickle_;
};

// "<file>: <key path>" of a view, for check_tensor / read_tensor_f32 messages.
std::string where_of(const PickleView& v);

}  // namespace zero::dscheckpoint
