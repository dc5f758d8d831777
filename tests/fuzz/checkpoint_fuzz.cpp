// libFuzzer target for zero's own checkpoint format: arbitrary bytes as a safetensors file (the
// header parser checks every offset and size against the data) and as a manifest (every offset,
// size and name checked against the layout). Both may only return or throw zero::IoError; a
// parsed file's tensors are then read in full, which must stay inside the bytes.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "zero/base/error.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(data),
                               reinterpret_cast<const std::byte*>(data) + size);
  try {
    const auto reader = zero::io::SafetensorsReader::from_bytes(bytes, "fuzz");
    for (const zero::io::TensorInfo& t : reader.tensors()) {
      std::vector<std::byte> out(t.size_bytes());
      reader.read_raw(t.name, out.data(), out.size());
      if (!out.empty())
        reader.read_range(t.name, out.size() / 2, out.data(), out.size() - out.size() / 2);
    }
  } catch (const zero::IoError&) {
  }
  const nlohmann::json j =
      nlohmann::json::parse(std::string_view(reinterpret_cast<const char*>(data), size), nullptr,
                            /*allow_exceptions=*/false);
  if (!j.is_discarded()) {
    try {
      const zero::ckpt::Manifest m = zero::ckpt::Manifest::from_json(j, "fuzz");
      (void)m.to_json().dump();
    } catch (const zero::IoError&) {
    }
  }
  return 0;
}
