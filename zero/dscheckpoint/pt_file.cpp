#include "zero/dscheckpoint/pt_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "zero/base/error.h"
#include "zero/base/half.h"

namespace zero::dscheckpoint {

static_assert(std::endian::native == std::endian::little,
              "storages are little-endian and read in place");

namespace {

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

float element_to_float(ScalarType t, const std::byte* p) {
  switch (t) {
    case ScalarType::F32: return load<float>(p);
    case ScalarType::F64: return static_cast<float>(load<double>(p));
    case ScalarType::F16: return half::f16_to_float(load<std::uint16_t>(p));
    case ScalarType::BF16: return half::bf16_to_float(load<std::uint16_t>(p));
    case ScalarType::I64: return static_cast<float>(load<std::int64_t>(p));
    case ScalarType::I32: return static_cast<float>(load<std::int32_t>(p));
    case ScalarType::I16: return static_cast<float>(load<std::int16_t>(p));
    case ScalarType::I8: return static_cast<float>(load<std::int8_t>(p));
    case ScalarType::U8: return static_cast<float>(load<std::uint8_t>(p));
    case ScalarType::Bool: return load<std::uint8_t>(p) != 0 ? 1.0f : 0.0f;
  }
  return 0.0f;
}

std::string describe_view(const TensorRef& t) {
  return fmt::format("a {} tensor of shape [{}] (offset {}, stride [{}])", scalar_name(t.dtype),
                     fmt::join(t.shape, ", "), t.offset, fmt::join(t.stride, ", "));
}

// Storage index of logical element `i` of a strided view.
std::int64_t storage_index(const TensorRef& t, std::int64_t i) {
  std::int64_t index = t.offset;
  for (std::size_t d = t.shape.size(); d-- > 0;) {
    index += (i % t.shape[d]) * t.stride[d];
    i /= t.shape[d];
  }
  return index;
}

}  // namespace

std::string where_of(const PickleView& v) {
  return fmt::format("{}: {}", v.file(), v.path().empty() ? "(root)" : v.path());
}

void check_tensor(const PtArchive& archive, const TensorRef& t, std::string_view where) {
  std::int64_t span = 0;
  try {
    span = t.span_elems();
  } catch (const IoError&) {
    throw IoError(fmt::format("{}: {} is not a valid view", where, describe_view(t)));
  }
  if (t.numel() > span) {
    throw IoError(
        fmt::format("{}: {} overlaps itself (an expanded view); such tensors are not "
                    "supported",
                    where, describe_view(t)));
  }
  const std::string entry = archive.archive_name() + "/data/" + t.storage_key;
  if (!archive.has_storage(t.storage_key)) {
    throw IoError(fmt::format("{}: {} refers to storage '{}', but the archive has no entry '{}'",
                              where, describe_view(t), t.storage_key, entry));
  }
  const std::uint64_t es = scalar_size(t.dtype);
  const std::uint64_t entry_bytes = archive.storage_bytes(t.storage_key);
  const std::uint64_t declared = static_cast<std::uint64_t>(t.storage_numel);
  if (entry_bytes / es < declared) {
    throw IoError(fmt::format(
        "{}: storage '{}' is declared as {} {} elements ({} bytes), but entry '{}' holds {} bytes",
        where, t.storage_key, declared, scalar_name(t.dtype), declared * es, entry, entry_bytes));
  }
  if (static_cast<std::uint64_t>(span) > declared) {
    throw IoError(fmt::format("{}: {} needs {} elements of storage '{}', which holds {}", where,
                              describe_view(t), span, t.storage_key, declared));
  }
}

void read_tensor_f32(const PtArchive& archive, const TensorRef& t, std::uint64_t first,
                     std::span<float> out, std::string_view where) {
  check_tensor(archive, t, where);
  const auto numel = static_cast<std::uint64_t>(t.numel());
  if (first > numel || out.size() > numel - first) {
    throw IoError(fmt::format("{}: elements [{}, {}) requested from {} of {} elements", where,
                              first, first + out.size(), describe_view(t), numel));
  }
  if (out.empty()) return;
  const std::size_t es = scalar_size(t.dtype);
  if (t.is_contiguous()) {
    const std::uint64_t begin = (static_cast<std::uint64_t>(t.offset) + first) * es;
    if (t.dtype == ScalarType::F32) {
      archive.read_storage(t.storage_key, begin, out.data(), out.size() * es);
      return;
    }
    std::vector<std::byte> raw(out.size() * es);
    archive.read_storage(t.storage_key, begin, raw.data(), raw.size());
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = element_to_float(t.dtype, raw.data() + i * es);
    return;
  }
  // Strided: read the part of the storage the requested elements cover, then gather.
  std::int64_t lo = std::numeric_limits<std::int64_t>::max();
  std::int64_t hi = -1;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int64_t s = storage_index(t, static_cast<std::int64_t>(first + i));
    lo = std::min(lo, s);
    hi = std::max(hi, s);
  }
  std::vector<std::byte> raw(static_cast<std::size_t>(hi - lo + 1) * es);
  archive.read_storage(t.storage_key, static_cast<std::uint64_t>(lo) * es, raw.data(), raw.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int64_t s = storage_index(t, static_cast<std::int64_t>(first + i));
    out[i] = element_to_float(t.dtype, raw.data() + static_cast<std::size_t>(s - lo) * es);
  }
}

PtFile PtFile::open(const std::string& path) {
  PtArchive archive = PtArchive::open(path);
  const std::vector<std::byte> bytes = archive.read_pickle();
  Pickle pickle = Pickle::parse(bytes, path);
  return PtFile(std::move(archive), std::move(pickle));
}

PtFile PtFile::from_bytes(std::vector<std::byte> bytes, std::string label) {
  PtArchive archive = PtArchive::from_bytes(std::move(bytes), label);
  const std::vector<std::byte> pickle_bytes = archive.read_pickle();
  Pickle pickle = Pickle::parse(pickle_bytes, std::move(label));
  return PtFile(std::move(archive), std::move(pickle));
}

const TensorRef& PtFile::tensor(const PickleView& v) const {
  const TensorRef& t = v.as_tensor();
  check_tensor(archive_, t, where_of(v));
  return t;
}

std::vector<float> PtFile::read_f32(const PickleView& v) const {
  const TensorRef& t = tensor(v);
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  read_tensor_f32(archive_, t, 0, out, where_of(v));
  return out;
}

void PtFile::read_f32(const PickleView& v, std::uint64_t first, std::span<float> out) const {
  read_tensor_f32(archive_, v.as_tensor(), first, out, where_of(v));
}

}  // namespace zero::dscheckpoint
