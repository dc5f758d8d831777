// Damage a file on purpose, for tests that check corruption is found and named.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "zero/io/safetensors.h"

namespace zero::test {

// Flips one bit of the middle byte of tensor `tensor` in the safetensors file `file`.
inline void flip_byte(const std::string& file, const std::string& tensor) {
  const auto reader = io::SafetensorsReader::open(file);
  const io::TensorInfo& t = reader.at(tensor);
  const std::uint64_t header =
      std::filesystem::file_size(file) - reader.tensors().back().data_end;
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  const auto pos = static_cast<std::streamoff>(header + t.data_begin + t.size_bytes() / 2);
  f.seekg(pos);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(pos);
  f.write(&c, 1);
  REQUIRE(f.good());
}

}  // namespace zero::test
