// libFuzzer target: arbitrary bytes as a PyTorch zip checkpoint (.pt). Opening the archive
// (libzip), reading data.pkl, parsing it and reading every tensor it references must return or
// throw zero::IoError; any other exception, crash, hang, leak or sanitizer report is a finding.
// libzip itself is the system library (not instrumented); the bytes it hands back are checked
// by our code and by ASan on our side.
//
// Two input forms, chosen by the first byte. Odd: the rest is the archive image as is. Even: the
// rest is "<pickle>ZSEP<data>"; a valid archive is built from it (storages "0".."9" all hold
// <data>), so mutations reach the pickle and the tensor reads behind libzip's CRC check.
#include <zip.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "zero/base/error.h"
#include "zero/dscheckpoint/pt_file.h"

namespace ds = zero::dscheckpoint;

namespace {

constexpr std::int64_t kMaxReadElems = 1 << 20;

void read_tensors(const ds::PtFile& f, const ds::PickleView& v, int depth, int& budget) {
  if (depth > 16 || --budget < 0) return;
  try {
    switch (v.kind()) {
      case ds::PickleValue::Kind::Dict:
      case ds::PickleValue::Kind::Object:
        for (const auto& [k, e] : v.entries()) read_tensors(f, e, depth + 1, budget);
        break;
      case ds::PickleValue::Kind::List:
      case ds::PickleValue::Kind::Tuple:
      case ds::PickleValue::Kind::Set:
        for (const auto& e : v.elements()) read_tensors(f, e, depth + 1, budget);
        break;
      case ds::PickleValue::Kind::Tensor: {
        const ds::TensorRef& t = f.tensor(v);
        if (t.numel() <= kMaxReadElems) {
          const std::vector<float> all = f.read_f32(v);
          if (all.size() > 2) {
            std::vector<float> tail(all.size() / 2);
            f.read_f32(v, all.size() - tail.size(), tail);
          }
        }
        break;
      }
      default: break;
    }
  } catch (const zero::IoError&) {
  }
}

// A stored-only zip image of <name>/data.pkl = pickle and <name>/data/0..9 = data, or nothing
// when libzip refuses.
std::vector<std::byte> build_archive(std::string_view pickle, std::string_view data) {
  zip_error_t err;
  zip_error_init(&err);
  zip_source_t* src = zip_source_buffer_create(nullptr, 0, 0, &err);
  zip_error_fini(&err);
  if (src == nullptr) return {};
  zip_source_keep(src);
  zip_error_init(&err);
  zip_t* z = zip_open_from_source(src, ZIP_TRUNCATE, &err);
  zip_error_fini(&err);
  std::vector<std::byte> image;
  if (z != nullptr) {
    auto add = [&](const std::string& name, std::string_view bytes) {
      zip_source_t* s = zip_source_buffer(z, bytes.data(), bytes.size(), 0);
      const zip_int64_t i = s != nullptr ? zip_file_add(z, name.c_str(), s, ZIP_FL_OVERWRITE) : -1;
      if (i < 0) {
        if (s != nullptr) zip_source_free(s);
        return;
      }
      zip_set_file_compression(z, static_cast<zip_uint64_t>(i), ZIP_CM_STORE, 0);
    };
    add("archive/data.pkl", pickle);
    for (char k = '0'; k <= '9'; ++k) add(std::string("archive/data/") + k, data);
    add("archive/version", "3\n");
    if (zip_close(z) != 0) {
      zip_discard(z);
    } else if (zip_source_open(src) == 0) {
      zip_stat_t st;
      if (zip_source_stat(src, &st) == 0 && (st.valid & ZIP_STAT_SIZE)) {
        image.resize(st.size);
        if (zip_source_read(src, image.data(), image.size()) !=
            static_cast<zip_int64_t>(image.size())) {
          image.clear();
        }
      }
      zip_source_close(src);
    }
  }
  zip_source_free(src);
  return image;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::vector<std::byte> bytes;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) != 0) {
    bytes.resize(rest.size());
    if (!rest.empty()) std::memcpy(bytes.data(), rest.data(), rest.size());
  } else {
    const std::size_t sep = rest.find("ZSEP");
    bytes = sep == std::string_view::npos
                ? build_archive(rest, {})
                : build_archive(rest.substr(0, sep), rest.substr(sep + 4));
    if (bytes.empty()) return 0;
  }
  try {
    const ds::PtFile f = ds::PtFile::from_bytes(std::move(bytes), "fuzz.pt");
    int budget = 256;
    read_tensors(f, f.root(), 0, budget);
    // Ranged reads of whatever storages the archive lists, including out-of-range ones.
    for (const auto& [name, entry] : f.archive().entries()) {
      const std::string prefix = f.archive().archive_name() + "/data/";
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string key = name.substr(prefix.size());
      char buf[64];
      try {
        f.archive().read_storage(key, entry.size_bytes / 2, buf, sizeof(buf));
      } catch (const zero::IoError&) {
      }
    }
  } catch (const zero::IoError&) {
  }
  return 0;
}
