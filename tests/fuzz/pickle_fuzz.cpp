// libFuzzer target: arbitrary bytes as a torch.save pickle. Parsing must return or throw
// zero::IoError; any other exception, crash, hang, leak or sanitizer report is a finding.
// Nothing in the parser can execute code; this checks it also cannot over-read or blow up.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>

#include "zero/base/error.h"
#include "zero/dscheckpoint/pickle.h"

namespace ds = zero::dscheckpoint;

namespace {

// Touches every accessor on a bounded walk (shared and cyclic structures are cut off by the
// budget), as DeepSpeedCheckpoint does on real files.
void walk(const ds::PickleView& v, int depth, int& budget) {
  if (depth > 16 || --budget < 0) return;
  try {
    switch (v.kind()) {
      case ds::PickleValue::Kind::Dict:
      case ds::PickleValue::Kind::Object:
        (void)v.find("optimizer_state_dict");
        (void)v.find(std::int64_t{0});
        for (const auto& [k, e] : v.entries()) {
          (void)k.key_text();
          walk(e, depth + 1, budget);
        }
        if (v.is(ds::PickleValue::Kind::Object)) {
          (void)v.type_name();
          for (std::size_t i = 0; i < v.size(); ++i) walk(v.element(i), depth + 1, budget);
        }
        break;
      case ds::PickleValue::Kind::List:
      case ds::PickleValue::Kind::Tuple:
      case ds::PickleValue::Kind::Set:
        for (const auto& e : v.elements()) walk(e, depth + 1, budget);
        (void)v.as_shape();
        break;
      case ds::PickleValue::Kind::Tensor: {
        const ds::TensorRef& t = v.as_tensor();
        (void)t.numel();
        (void)t.span_elems();
        (void)t.is_contiguous();
        break;
      }
      default: (void)v.as_number(); break;
    }
  } catch (const zero::IoError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const ds::Pickle p = ds::Pickle::parse(std::as_bytes(std::span(data, size)), "fuzz.pkl");
    int budget = 4096;
    walk(p.root(), 0, budget);
    try {
      (void)p.root().to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    } catch (const zero::IoError&) {
    }
  } catch (const zero::IoError&) {
  }
  return 0;
}
