// The sub-group store: every tier holds the same values; an NVMe update that fails at any I/O
// call leaves every committed value as it was, and the next update succeeds; no swap file
// outlives the store.
#include "offload/subgroup_store.h"

#include <catch2/catch.hpp>
#include <cerrno>
#include <filesystem>
#include <vector>

#include "tests/temp_dir.h"
#include "zero/base/error.h"
#include "zero/device/cpu_device.h"

namespace zero::offload {
namespace {

constexpr std::size_t kTotal = 10'000;

std::vector<StoreTensor> tensors() {
  return {{DType::F32, MemoryTag::MasterParams, 0.0f},
          {DType::F32, MemoryTag::OptimizerStates, 0.5f},
          {DType::BF16, MemoryTag::OptimizerStates, 0.25f}};
}

StoreOptions nvme_options(const std::string& path, double ratio, int buffers, bool pipelined) {
  StoreOptions o;
  o.total_elems = kTotal;
  o.sub_group_elems = 1'500;  // 7 sub-groups, the last one short
  o.ratio = ratio;
  NvmeTier t;
  t.paths = {path};
  t.key = "nvme_path";
  t.buffer_count = buffers;
  t.pipeline_read = t.pipeline_write = pipelined;
  t.aio.block_size = 4096;
  t.aio.queue_depth = 3;
  o.nvme = t;
  return o;
}

// Every tensor as floats, read through the store.
std::vector<std::vector<float>> contents(SubgroupStore& s) {
  std::vector<std::vector<float>> out(s.tensors().size(), std::vector<float>(kTotal));
  s.read(0, kTotal, [&](const SubgroupStore::View& v) {
    for (std::size_t k = 0; k < out.size(); ++k) {
      for (std::size_t i = v.begin; i < v.end; ++i) {
        const std::byte* p = v.tensors[k] + (i - v.begin) * dtype_size(s.tensors()[k].dtype);
        float x;
        if (s.tensors()[k].dtype == DType::F32) {
          std::memcpy(&x, p, 4);
        } else {
          std::uint16_t h;
          std::memcpy(&h, p, 2);
          const std::uint32_t bits = std::uint32_t{h} << 16;
          std::memcpy(&x, &bits, 4);
        }
        out[k][i] = x;
      }
    }
  });
  return out;
}

// master[i] = i; every update adds 1 to master and to the fp32 state.
void set_master(SubgroupStore& s) {
  s.modify(0, kTotal, [](const SubgroupStore::View& v) {
    auto* m = reinterpret_cast<float*>(v.tensors[0]);
    for (std::size_t i = v.begin; i < v.end; ++i) m[i - v.begin] = static_cast<float>(i);
  });
  s.flush();
}
void add_one(const SubgroupStore::View& v) {
  auto* m = reinterpret_cast<float*>(v.tensors[0]);
  auto* s1 = reinterpret_cast<float*>(v.tensors[1]);
  for (std::size_t i = 0; i < v.end - v.begin; ++i) {
    m[i] += 1.0f;
    s1[i] += 1.0f;
  }
}

TEST_CASE(
    "a replacement with no room for a second copy stages in host memory and copies on adopt") {
  StoreOptions o;
  o.total_elems = kTotal;
  o.sub_group_elems = 1'500;
  std::size_t resident = 0;
  {
    CpuDevice unlimited(0);
    SubgroupStore s(unlimited, tensors(), o);
    resident = unlimited.ledger().total(MemoryKind::Device).current_bytes;
  }
  REQUIRE(resident > 0);
  // Room for two sub-groups' master weights beside the store: the others must stage.
  DeviceOptions d;
  d.device_budget_bytes = resident + 2 * 1'500 * sizeof(float);
  CpuDevice device(0, d);
  SubgroupStore s(device, tensors(), o);
  {
    SubgroupStore::Replacement r = s.replacement(0);
    r.for_range(0, kTotal, [](std::byte* dst, std::size_t first, std::size_t n) {
      auto* f = reinterpret_cast<float*>(dst);
      for (std::size_t i = 0; i < n; ++i) f[i] = 3.0f + static_cast<float>(first + i);
    });
    CHECK(device.ledger().total(MemoryKind::Host).current_bytes > 0);  // some did stage
    std::vector<SubgroupStore::Replacement> all;
    all.push_back(std::move(r));
    s.adopt(std::move(all));
  }
  // The new values are in the store's own memory, which kept its kind and size; no staging
  // memory is left.
  const auto c = contents(s);
  for (std::size_t i = 0; i < kTotal; ++i) REQUIRE(c[0][i] == 3.0f + static_cast<float>(i));
  CHECK(device.ledger().total(MemoryKind::Device).current_bytes == resident);
  CHECK(device.ledger().total(MemoryKind::Host).current_bytes == 0);
}

TEST_CASE("every tier, ratio and pipeline holds the same values") {
  test::TempDir tmp("zero_store");
  CpuDevice device(0);
  StoreOptions host;
  host.total_elems = kTotal;
  host.sub_group_elems = 1'500;
  host.offload_kind = MemoryKind::PinnedHost;
  host.ratio = 0.4;
  SubgroupStore reference(device, tensors(), host);
  set_master(reference);
  for (int u = 0; u < 3; ++u) reference.update_all(add_one);
  const auto expected = contents(reference);
  REQUIRE(expected[0][kTotal - 1] == static_cast<float>(kTotal - 1 + 3));
  REQUIRE(expected[2][7] == 0.25f);
  for (double ratio : {1.0, 0.4, 0.0}) {
    for (int buffers : {1, 2, 4}) {
      for (bool pipelined : {false, true}) {
        INFO("ratio " << ratio << " buffers " << buffers << " pipelined " << pipelined);
        SubgroupStore s(device, tensors(), nvme_options(tmp.str(), ratio, buffers, pipelined));
        CHECK(s.nvme_count() == static_cast<int>(std::llround(ratio * 7)));
        if (ratio > 0) {
          CHECK(device.ledger().total(MemoryKind::Nvme).current_bytes > 0);
        }
        set_master(s);
        for (int u = 0; u < 3; ++u) s.update_all(add_one);
        REQUIRE(contents(s) == expected);
      }
    }
  }
  // Striped over two folders: each gets a swap file.
  {
    test::TempDir second("zero_store_b");
    StoreOptions o = nvme_options(tmp.str(), 1.0, 2, true);
    o.nvme->paths.push_back(second.str());
    SubgroupStore s(device, tensors(), o);
    set_master(s);
    for (int u = 0; u < 3; ++u) s.update_all(add_one);
    REQUIRE(contents(s) == expected);
    for (const std::string& p : o.nvme->paths) {
      std::size_t files = 0;
      for (const auto& e : std::filesystem::recursive_directory_iterator(p))
        files += e.is_regular_file() && std::filesystem::file_size(e.path()) > 0;
      CHECK(files == 1);
    }
  }
  CHECK(device.ledger().total(MemoryKind::Nvme).current_bytes == 0);
  CHECK(std::filesystem::is_empty(tmp.path()));  // every swap folder removed
}

TEST_CASE("an update failing at any I/O call changes nothing, and the next one succeeds") {
  test::TempDir tmp("zero_store");
  CpuDevice device(0);
  for (bool pipelined : {false, true}) {
    for (Fault::Kind kind : {Fault::Kind::Error, Fault::Kind::Short}) {
      // Count the I/O calls of one update.
      SubgroupStore probe(device, tensors(), nvme_options(tmp.str(), 0.6, 3, pipelined));
      set_master(probe);
      probe.update_all(add_one);
      const std::uint64_t before = probe.io()->calls();
      probe.update_all(add_one);
      const std::uint64_t per_update = probe.io()->calls() - before;
      REQUIRE(per_update > 10);
      for (std::uint64_t k = 0; k < per_update; ++k) {
        INFO("pipelined " << pipelined << " fault at call " << k);
        SubgroupStore s(device, tensors(), nvme_options(tmp.str(), 0.6, 3, pipelined));
        set_master(s);
        s.update_all(add_one);
        const auto committed = contents(s);
        const std::uint64_t at = s.io()->calls() + k;
        s.io()->set_fault([&](std::uint64_t call, const IoRequest&) {
          return call == at ? Fault{kind, EIO} : Fault{};
        });
        bool agreed_failure = false;
        CHECK_THROWS_AS(s.update_all(add_one,
                                     [&](bool ok) {
                                       agreed_failure = !ok;
                                       return ok;
                                     }),
                        IoError);
        s.io()->set_fault(nullptr);
        CHECK(agreed_failure);
        REQUIRE(contents(s) == committed);
        s.update_all(add_one);
        const auto after = contents(s);
        REQUIRE(after[0][0] == committed[0][0] + 1.0f);
        REQUIRE(after[0][kTotal - 1] == committed[0][kTotal - 1] + 1.0f);
      }
    }
  }
  // Another rank's failure undoes this rank's step too.
  SubgroupStore s(device, tensors(), nvme_options(tmp.str(), 1.0, 2, true));
  set_master(s);
  const auto committed = contents(s);
  CHECK_THROWS_WITH(s.update_all(add_one, [](bool) { return false; }),
                    Catch::Contains("another rank"));
  REQUIRE(contents(s) == committed);
}

TEST_CASE("a cache of several records reads each once, writes back what it evicts, and keeps "
          "the values") {
  test::TempDir dir("zero_store_cache");
  CpuDevice device(0);
  for (int records : {1, 3, 7, 100}) {
    INFO(records << " cached records");
    StoreOptions o = nvme_options(dir.str(), 1.0, 2, true);
    o.cache_records = records;
    SubgroupStore s(device, tensors(), o);
    REQUIRE(s.cache_records() == std::min(records, 7));
    set_master(s);  // writes all 7 records (a never-written record is not read)
    const std::uint64_t written = s.io()->calls();
    REQUIRE(written > 0);
    // Two passes over sub-groups 0-2. What set_master wrote last stays cached: with 7 records
    // everything does, and neither pass reads; with 3 the second pass reads nothing.
    s.read(0, 4'500, [](const SubgroupStore::View&) {});
    const std::uint64_t first_pass = s.io()->calls() - written;
    CHECK((first_pass == 0) == (records >= 7));
    s.read(0, 4'500, [](const SubgroupStore::View&) {});
    const std::uint64_t second_pass = s.io()->calls() - written - first_pass;
    CHECK(second_pass == (records >= 3 ? 0 : first_pass));
    // Changed values survive eviction and a flush, whatever the cache holds.
    s.modify(0, kTotal, add_one);
    s.flush();
    const auto c = contents(s);
    for (std::size_t i = 0; i < kTotal; ++i) {
      REQUIRE(c[0][i] == static_cast<float>(i) + 1.0f);
      REQUIRE(c[1][i] == 1.5f);
    }
  }
  CHECK(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace zero::offload
