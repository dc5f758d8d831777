// libFuzzer target: arbitrary bytes as a PyTorch zip checkpoint (.pt). Opening the archive
// (libzip), reading data.pkl, parsing it and reading every tensor it references must return or
// throw zero::IoError; any other exception, crash, hang, leak or sanitizer report is a finding.
// libzip itself is the system library (not instrumented); the bytes it hands back are checked
// by our code and by ASan on our side.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "zero/dscheckpoint/pt_file.h"
#include "zero/error.h"

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  if (size > 0) std::memcpy(bytes.data(), data, size);
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
