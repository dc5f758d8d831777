// zero_io reads what it writes, reads the golden files, rejects malformed headers with an
// IoError instead of reading out of bounds, streams pieces to a checksum, and fails a write as
// its fault function says.
#include "zero/io/safetensors.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "zero/base/error.h"
#include "zero/base/stream_copy.h"

using zero::DType;
using zero::io::SafetensorsReader;
using zero::io::SafetensorsWriter;

namespace {

std::vector<std::byte> file_image(const std::string& header_json, std::size_t data_bytes) {
  std::vector<std::byte> out(8 + header_json.size() + data_bytes, std::byte{0});
  const std::uint64_t n = header_json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, header_json.data(), header_json.size());
  return out;
}

void rejects(const std::string& header, std::size_t data_bytes, const std::string& why) {
  INFO(header);
  REQUIRE_THROWS_WITH(SafetensorsReader::from_bytes(file_image(header, data_bytes)),
                      Catch::Contains(why));
  REQUIRE_THROWS_AS(SafetensorsReader::from_bytes(file_image(header, data_bytes)), zero::IoError);
}

}  // namespace

TEST_CASE("a written file reads back with the same tensors, dtypes, shapes and metadata") {
  SafetensorsWriter w;
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  const std::vector<std::uint16_t> b = {0x3f80, 0xbf80, 0x7fc0};
  const std::vector<double> c = {0.1, 0.2};
  w.set_metadata("optimizer", "adamw");
  w.add_f32("a", {2, 3}, a);
  w.add("b", DType::BF16, {3}, b.data(), 6);
  w.add("c", DType::F64, {2, 1}, c.data(), 16);
  w.add("empty", DType::F16, {0}, nullptr, 0);
  const zero::test::TempDir dir("zero_safetensors_test");
  const std::string path = dir / "a.st";
  w.write(path);
  const auto r = SafetensorsReader::open(path);
  REQUIRE(r.metadata().at("optimizer") == "adamw");
  REQUIRE(r.tensors().size() == 4);
  REQUIRE(r.at("a").shape == std::vector<std::int64_t>{2, 3});
  REQUIRE(r.at("b").dtype == DType::BF16);
  REQUIRE(r.read_f32("a") == a);
  REQUIRE(r.read_f32("b")[0] == 1.0f);
  REQUIRE(r.read_f32("b")[1] == -1.0f);
  REQUIRE(r.read_f32("c") == std::vector<float>{0.1f, 0.2f});
  REQUIRE(r.read_f32("empty").empty());
  REQUIRE(r.find("missing") == nullptr);
  REQUIRE_THROWS_AS(r.at("missing"), zero::IoError);
  std::vector<std::byte> small(4);
  REQUIRE_THROWS_WITH(r.read_raw("a", small.data(), small.size()), Catch::Contains("24 bytes"));
  // The data section starts 8-byte aligned.
  const auto bytes = w.to_bytes();
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  REQUIRE(header_bytes % 8 == 0);
  REQUIRE(bytes.size() == 8 + header_bytes + 24 + 6 + 16);
  REQUIRE(SafetensorsReader::from_bytes(bytes).read_f32("a") == a);
}

TEST_CASE("the optimizer golden files parse with their metadata and shapes") {
  const auto r =
      SafetensorsReader::open(std::string(ZERO_TEST_GOLDEN_DIR) + "/adamw_default.safetensors");
  REQUIRE(r.metadata().at("optimizer") == "adamw");
  REQUIRE(r.metadata().count("hyper") == 1);
  REQUIRE(r.at("grads").shape == std::vector<std::int64_t>{12, 4099});
  REQUIRE(r.read_f32("p0").size() == 4099);
}

TEST_CASE("malformed headers are rejected with an IoError naming the problem") {
  rejects(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, "outside");
  rejects(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "needs 12");
  rejects(R"({"a":{"dtype":"I8","shape":[8],"data_offsets":[0,8]}})", 8, "dtype I8");
  rejects(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "non-negative");
  rejects(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "outside");
  rejects(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "data_offsets");
  rejects(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      12, "overlap");
  rejects(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8,
          "overflowing");
  rejects(R"({"__metadata__":{"k":1}})", 0, "not a string");
  rejects(R"([1,2])", 0, "not a JSON object");
  rejects(R"({"a":)", 0, "not a JSON object");
  // Header length beyond the file.
  auto image = file_image("{}", 0);
  image[0] = std::byte{0xff};
  REQUIRE_THROWS_WITH(SafetensorsReader::from_bytes(image), Catch::Contains("exceeds"));
  REQUIRE_THROWS_AS(SafetensorsReader::from_bytes(std::vector<std::byte>(3)), zero::IoError);
  REQUIRE_THROWS_AS(SafetensorsReader::open("/nonexistent/file.safetensors"), zero::IoError);
  SafetensorsWriter w;
  const float x = 1.0f;
  REQUIRE_THROWS_AS(w.add("x", DType::F32, {2}, &x, 4), zero::IoError);
  w.add("x", DType::F32, {1}, &x, 4);
  REQUIRE_THROWS_WITH(w.add("x", DType::F32, {1}, &x, 4), Catch::Contains("twice"));
}

TEST_CASE(
    "the stream writer writes tensor by tensor, keeps checksums, and leaves no file when "
    "unfinished") {
  const zero::test::TempDir dir("zero_st_stream");
  const std::string path = dir / "a.safetensors";
  std::vector<float> a(1000), b(7);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * static_cast<float>(i);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = -1.0f - static_cast<float>(i);
  {
    zero::io::SafetensorsStreamWriter w(path,
                                        {{"a", zero::DType::F32, {10, 100}},
                                         {"empty", zero::DType::BF16, {0}},
                                         {"b", zero::DType::F32, {7}}},
                                        {{"k", "v"}});
    w.append(a.data(), 1200);  // in pieces that do not follow tensor boundaries
    w.append(reinterpret_cast<const char*>(a.data()) + 1200, 2800);
    w.append(b.data(), 28);
    REQUIRE_THROWS_AS(w.append(b.data(), 4), zero::IoError);
    w.finish();
    REQUIRE(w.checksums().size() == 3);
    CHECK(w.checksums()[0] == zero::io::checksum(a.data(), 4000));
    CHECK(w.checksums()[0] != w.checksums()[2]);
  }
  const auto r = zero::io::SafetensorsReader::open(path);
  CHECK(r.read_f32("a") == a);
  CHECK(r.read_f32("b") == b);
  CHECK(r.metadata().at("k") == "v");
  float mid[3];
  r.read_range("a", 4 * 500, mid, sizeof(mid));
  CHECK(mid[0] == a[500]);
  CHECK(mid[2] == a[502]);
  CHECK_THROWS_AS(r.read_range("a", 3990, mid, sizeof(mid)), zero::IoError);
  {
    // Unfinished: the old file stays, no temporary is left behind.
    zero::io::SafetensorsStreamWriter w(path, {{"a", zero::DType::F32, {2}}});
    w.append(b.data(), 4);
  }
  CHECK(zero::io::SafetensorsReader::open(path).read_f32("b") == b);
  CHECK(!std::filesystem::exists(path + ".tmp"));
}

TEST_CASE(
    "a checksummed ranged read returns the same bytes, feeds each to the checksum once and hands "
    "each to the piece function once, in order, mapped or read, streamed or not") {
  const zero::test::TempDir dir("zero_st_pieces");
  const std::string path = dir / "big.safetensors";
  // 9 MiB + a few bytes: ranges above and below kMapMinBytes and kStreamingMinBytes, pieces and
  // stretches that do not divide them.
  std::vector<float> v((std::size_t{9} << 18) + 5);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.25f - 7.0f;
  const std::size_t bytes = v.size() * sizeof(float);
  REQUIRE(bytes > zero::kStreamingMinBytes);
  {
    zero::io::SafetensorsStreamWriter w(path,
                                        {{"v", DType::F32, {static_cast<std::int64_t>(v.size())}}});
    w.append(v.data(), bytes);
    w.finish();
  }
  const auto r = SafetensorsReader::open(path);
  const auto* src = reinterpret_cast<const std::byte*>(v.data());
  for (const auto& [offset, count] :
       std::vector<std::pair<std::size_t, std::size_t>>{{0, bytes},
                                                        {3, bytes - 3},
                                                        {4 * 1001, zero::io::kMapMinBytes + 17},
                                                        {12, 5000},
                                                        {bytes - 1, 1}}) {
    INFO("bytes [" << offset << ", " << offset + count << ")");
    // One byte in: the destination is not aligned either.
    std::vector<std::byte> out(count + 1, std::byte{0x5a});
    std::vector<std::byte> seen;
    zero::io::Checksum sum;
    r.read_range("v", offset, out.data() + 1, count, sum, [&](const std::byte* p, std::size_t n) {
      REQUIRE(n <= zero::io::kPieceBytes);
      seen.insert(seen.end(), p, p + n);
    });
    CHECK(out[0] == std::byte{0x5a});
    CHECK(std::memcmp(out.data() + 1, src + offset, count) == 0);
    REQUIRE(seen.size() == count);
    CHECK(std::memcmp(seen.data(), src + offset, count) == 0);
    CHECK(sum.digest() == zero::io::checksum(src + offset, count));
  }
}

TEST_CASE("copy_streaming_seen copies any length at any alignment and shows every byte once") {
  std::vector<unsigned char> src(100000), dst(100100);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 31 + 7);
  for (std::size_t shift : {0, 1, 8, 15, 4090}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{100}, std::size_t{16384}, std::size_t{16447},
                          std::size_t{95000}}) {
      INFO("dst + " << shift << ", " << n << " bytes");
      std::fill(dst.begin(), dst.end(), 0);
      std::vector<unsigned char> seen;
      zero::copy_streaming_seen(dst.data() + shift, src.data() + 1, n,
                                [&](const std::byte* p, std::size_t m) {
                                  REQUIRE(m > 0);
                                  REQUIRE(m <= std::max(n, zero::kSeenStretchBytes));
                                  const auto* b = reinterpret_cast<const unsigned char*>(p);
                                  REQUIRE(b == src.data() + 1 + seen.size());
                                  seen.insert(seen.end(), b, b + m);
                                });
      CHECK(std::memcmp(dst.data() + shift, src.data() + 1, n) == 0);
      CHECK(dst[shift + n] == 0);
      if (shift > 0) CHECK(dst[shift - 1] == 0);
      CHECK(seen.size() == n);
    }
  }
}

TEST_CASE("copy_streaming copies any length at any alignment, fenced or in tiles fenced once") {
  std::vector<unsigned char> src(100000), dst(100100);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 31 + 7);
  for (const bool tiles : {false, true}) {
    for (std::size_t shift : {0, 1, 8, 15}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{100}, std::size_t{16384},
                            std::size_t{16447}, std::size_t{99999}}) {
        INFO((tiles ? "unfenced tiles of 20000 bytes" : "one copy") << ", dst + " << shift << ", "
                                                                    << n << " bytes");
        std::fill(dst.begin(), dst.end(), 0);
        if (tiles) {
          // An optimizer step's push: tile after tile, one fence after the last.
          for (std::size_t b = 0; b < n; b += 20000) {
            zero::copy_streaming_unfenced(dst.data() + shift + b, src.data() + 1 + b,
                                          std::min<std::size_t>(20000, n - b));
          }
          zero::streaming_fence();
        } else {
          zero::copy_streaming(dst.data() + shift, src.data() + 1, n);
        }
        CHECK(std::memcmp(dst.data() + shift, src.data() + 1, n) == 0);
        CHECK(dst[shift + n] == 0);
        if (shift > 0) CHECK(dst[shift - 1] == 0);
      }
    }
  }
}

TEST_CASE("the stream writer's writes end on kWriteBytes boundaries of the file") {
  const zero::test::TempDir dir("zero_st_blocks");
  const std::string path = dir / "a.safetensors";
  constexpr std::size_t K = zero::io::kWriteBytes;
  // Two blocks' worth of data after a header of h bytes: written as K - h, K and h bytes, so the
  // page cache sees whole aligned blocks (unaligned writes of K would be two calls, not three).
  std::vector<float> a(2 * K / sizeof(float));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 4099) - 2000.0f;
  std::size_t calls = 0;
  {
    zero::io::SafetensorsStreamWriter w(
        path, {{"a", DType::F32, {static_cast<std::int64_t>(a.size())}}}, {}, [&](std::size_t) {
          ++calls;
          return 0;
        });
    w.append(a.data(), 2 * K);
    w.finish();
  }
  const std::size_t header = std::filesystem::file_size(path) - 2 * K;
  REQUIRE(header > 0);
  REQUIRE(header < K);
  CHECK(calls == 1 + 3);
  CHECK(SafetensorsReader::open(path).read_f32("a") == a);
}

TEST_CASE("a stream writer whose write fails with ENOSPC throws naming it and leaves no file") {
  const zero::test::TempDir dir("zero_st_fault");
  const std::string path = dir / "a.safetensors";
  std::vector<float> a(5 << 20, 1.0f);  // 20 MiB: several writes after the header
  for (std::size_t failing : {0, 1, 3}) {
    INFO("write call " << failing << " fails");
    std::size_t calls = 0;
    auto fault = [&](std::size_t call) {
      ++calls;
      return call == failing ? ENOSPC : 0;
    };
    try {
      zero::io::SafetensorsStreamWriter w(path, {{"a", DType::F32, {5 << 20}}}, {}, fault);
      w.append(a.data(), a.size() * sizeof(float));
      w.finish();
      FAIL("no error");
    } catch (const zero::IoError& e) {
      CHECK_THAT(e.what(), Catch::Contains(std::strerror(ENOSPC)));
    }
    CHECK(calls == failing + 1);
    CHECK(!std::filesystem::exists(path));
    CHECK(!std::filesystem::exists(path + ".tmp"));
  }
}
