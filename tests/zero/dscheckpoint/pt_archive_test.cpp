#include "zero/dscheckpoint/pt_archive.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/zero/dscheckpoint/pt_writer.h"
#include "tests/zero/dscheckpoint/test_util.h"
#include "zero/base/error.h"
#include "zero/dscheckpoint/pt_file.h"

namespace ds = zero::dscheckpoint;
namespace t = zero::dscheckpoint::testing;
namespace fs = std::filesystem;

namespace {

using zero::dscheckpoint::testing::error_of;
using zero::dscheckpoint::testing::TempDir;

using zero::dscheckpoint::testing::kFixtures;
const std::string kOptim0 =
    kFixtures + "/zero1_world2_fp32/step5/zero_pp_rank_0_mp_rank_00_optim_states.pt";

std::vector<std::byte> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

}  // namespace

TEST_CASE("a DeepSpeed optimizer-states file opens as a PyTorch zip archive") {
  const ds::PtArchive a = ds::PtArchive::open(kOptim0);
  CHECK(a.archive_name() == "zero_pp_rank_0_mp_rank_00_optim_states");
  CHECK(a.version() == "3");
  CHECK(a.entries().size() == 6);
  REQUIRE(a.has_storage("3"));
  CHECK(a.storage_bytes("3") == 2754 * 4);
  CHECK_FALSE(a.has_storage("9"));

  // A ranged read equals the same bytes of a whole read.
  std::vector<float> whole(2754), part(100);
  a.read_storage("3", 0, whole.data(), whole.size() * 4);
  a.read_storage("3", 1000 * 4, part.data(), part.size() * 4);
  CHECK(std::equal(part.begin(), part.end(), whole.begin() + 1000));
  CHECK(std::any_of(whole.begin(), whole.end(), [](float v) { return v != 0.0f; }));
  CHECK_THROWS_WITH(a.read_storage("3", 2754 * 4 - 4, part.data(), 8),
                    Catch::Contains("outside its 11016 bytes"));

  // The same image from memory.
  const ds::PtArchive m = ds::PtArchive::from_bytes(slurp(kOptim0), "rank0");
  std::vector<float> again(2754);
  m.read_storage("3", 0, again.data(), again.size() * 4);
  CHECK(again == whole);
}

TEST_CASE("a truncated zip is refused, naming the file") {
  TempDir tmp;
  const std::vector<std::byte> bytes = slurp(kOptim0);
  for (std::size_t keep :
       {std::size_t{0}, std::size_t{4}, std::size_t{100}, bytes.size() / 2, bytes.size() - 10}) {
    const fs::path cut = tmp.path() / ("cut_" + std::to_string(keep) + ".pt");
    std::ofstream(cut, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(keep));
    const std::string msg = error_of([&] { (void)ds::PtFile::open(cut.string()); });
    INFO(keep << ": " << msg);
    CHECK(msg.find(cut.string()) != std::string::npos);
    CHECK(msg.find("cannot open as a PyTorch zip checkpoint") != std::string::npos);
    if (keep >= 4) CHECK(msg.find("truncated") != std::string::npos);
  }
  CHECK(error_of([&] {
          (void)ds::PtFile::from_bytes({bytes.begin(), bytes.begin() + 5000}, "half.pt");
        }).find("half.pt") != std::string::npos);
  CHECK(error_of([&] {
          (void)ds::PtArchive::open((tmp.path() / "absent.pt").string());
        }).find("absent.pt") != std::string::npos);
}

TEST_CASE("a tensor whose storage is shorter than its shape needs is refused with file and key") {
  TempDir tmp;
  const fs::path path = tmp.path() / "short.pt";
  // Storage '0' declared as 10 floats; the tensor wants 12 of them.
  t::write_pt(path.string(), "short",
              t::Pickler::dumps(t::dict(
                  {{t::str("module"), t::odict({{t::str("w"), t::tensor("0", 10, 0, {3, 4})}})}})),
              {{"0", std::vector<float>(10, 1.0f)}});
  const ds::PtFile f = ds::PtFile::open(path.string());
  const std::string msg = error_of([&] { (void)f.read_f32(f.root().get("module").get("w")); });
  INFO(msg);
  CHECK(msg.find(path.string() + ": module.w:") != std::string::npos);
  CHECK(msg.find("a float32 tensor of shape [3, 4]") != std::string::npos);
  CHECK(msg.find("needs 12 elements of storage '0', which holds 10") != std::string::npos);

  // The pickle declares 10 floats, the entry holds 8 bytes.
  const fs::path path2 = tmp.path() / "short2.pt";
  t::write_pt(path2.string(), "short2",
              t::Pickler::dumps(t::dict({{t::str("w"), t::tensor("0", 10, 0, {10})}})),
              {{"0", std::vector<float>(2, 1.0f)}});
  const ds::PtFile g = ds::PtFile::open(path2.string());
  const std::string msg2 = error_of([&] { (void)g.read_f32(g.root().get("w")); });
  INFO(msg2);
  CHECK(msg2.find(": w: storage '0' is declared as 10 float32 elements (40 bytes), but entry "
                  "'short2/data/0' holds 8 bytes") != std::string::npos);

  // A storage the archive lacks.
  const fs::path path3 = tmp.path() / "missing.pt";
  t::write_pt(path3.string(), "missing",
              t::Pickler::dumps(t::dict({{t::str("w"), t::tensor("7", 4, 0, {4})}})), {});
  const ds::PtFile h = ds::PtFile::open(path3.string());
  CHECK_THROWS_WITH(
      h.read_f32(h.root().get("w")),
      Catch::Contains("refers to storage '7', but the archive has no entry 'missing/data/7'"));
}

TEST_CASE("tensor reads convert half, bfloat16 and strided views") {
  TempDir tmp;
  const fs::path path = tmp.path() / "dtypes.pt";
  // float16 1.5, -2, 65504; bfloat16 1.5, -2; a transposed float32 view.
  const std::string half("\x00\x3e\x00\xc0\xff\x7b", 6);
  const std::string bf16("\xc0\x3f\x00\xc0", 4);
  t::Py transposed = t::tensor("2", 6, 0, {3, 2});
  transposed.stride = {1, 3};
  t::write_pt(
      path.string(), "dtypes",
      t::Pickler::dumps(t::dict({{t::str("h"), t::tensor("0", 3, 0, {3}, "HalfStorage")},
                                 {t::str("b"), t::tensor("1", 2, 0, {2}, "BFloat16Storage")},
                                 {t::str("t"), transposed}})),
      {{"2", {0, 1, 2, 3, 4, 5}}}, {{"0", half}, {"1", bf16}});
  const ds::PtFile f = ds::PtFile::open(path.string());
  CHECK(f.read_f32(f.root().get("h")) == std::vector<float>{1.5f, -2.0f, 65504.0f});
  CHECK(f.read_f32(f.root().get("b")) == std::vector<float>{1.5f, -2.0f});
  CHECK(f.read_f32(f.root().get("t")) == std::vector<float>{0, 3, 1, 4, 2, 5});
  std::vector<float> tail(2);
  f.read_f32(f.root().get("t"), 3, tail);
  CHECK(tail == std::vector<float>{4, 2});
}
