// ShmComm: ranks as forked processes must give exactly InProcComm's bits, on both transports,
// and fail fast and clean up when a rank goes missing or dies.
#include "zero/comm/hierarchical_comm.h"
#include "zero/comm/node_topology.h"
#include "zero/comm/shm_comm.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/zero/comm/comm_test_util.h"
#include "tests/zero/comm/forked_ranks.h"
#include "zero/base/error.h"
#include "zero/comm/communicator.h"
#include "zero/comm/inproc_comm.h"
#include "zero/comm/shm_group.h"
#include "zero/device/shared_host_arena.h"

using namespace std::chrono_literals;
using zero::Collective;
using zero::CommError;
using zero::CommOptions;
using zero::Communicator;
using zero::DType;
using zero::ReduceOp;
using zero::ShmTransport;
using zero::ShmTuning;
namespace zt = zero::test;

namespace {

// Small pieces and windows, so that even the test's sizes take many pieces and rounds.
ShmTuning small_steps(ShmTransport transport) {
  ShmTuning t;
  t.transport = transport;
  t.piece_bytes = 4096;
  t.window_bytes = 8192;
  return t;
}

using zt::output_elems;

// Runs one case on `comm` and copies this rank's output bytes to `out`.
void run_case_into(Communicator& comm, const zt::Case& c, char* out, const zt::Place& place = {}) {
  const zt::Bytes result = zt::perform_case(comm, c, place);
  std::memcpy(out, result.data(), result.size_bytes());
}

// A buffer in this process's shared host arena (enabled by make_shm_communicator).
std::shared_ptr<std::byte> in_arena(std::size_t bytes) {
  zero::SharedHostArena* arena = zero::SharedHostArena::get();
  if (arena == nullptr) throw std::runtime_error("no shared host arena after make_shm_communicator");
  const std::size_t size = std::max<std::size_t>(bytes, 1);
  void* p = arena->allocate(size);
  if (p == nullptr) throw std::runtime_error("the shared host arena is full");
  return {static_cast<std::byte*>(p), [arena, size](std::byte* q) { arena->free(q, size); }};
}

// Where each case's output lives in one rank's part of a flat buffer.
struct OutputPlan {
  std::vector<zt::Case> cases;
  std::vector<std::size_t> offsets;
  std::size_t bytes_per_rank = 0;

  OutputPlan(int world, const std::vector<std::size_t>& sizes)
      : cases(zt::all_cases(world, sizes)) {
    for (const auto& c : cases) {
      offsets.push_back(bytes_per_rank);
      bytes_per_rank += (output_elems(c, world) * dtype_size(c.dtype) + 7) / 8 * 8;
    }
  }
};

// With `per_node` > 0, `comm` as a HierarchicalComm of nodes of that many ranks; else itself.
template <typename Fn>
void maybe_in_nodes(Communicator& comm, int per_node, Fn&& fn) {
  if (per_node == 0) {
    fn(comm);
    return;
  }
  const auto nodes = zero::HierarchicalComm::create(
      comm, zero::resolve_node_topology(comm.size(), per_node, [](const char*) { return nullptr; }));
  fn(*nodes);
}

// Every case on InProcComm threads (in nodes of `per_node`, when given): rank r's outputs at
// [r·bytes_per_rank, ...).
std::vector<char> inproc_outputs(int world, const OutputPlan& plan, int per_node = 0) {
  std::vector<char> out(static_cast<std::size_t>(world) * plan.bytes_per_rank);
  zero::run_ranks(world, [&](Communicator& base) {
    maybe_in_nodes(base, per_node, [&](Communicator& comm) {
      char* mine = out.data() + static_cast<std::size_t>(comm.rank()) * plan.bytes_per_rank;
      for (std::size_t i = 0; i < plan.cases.size(); ++i)
        run_case_into(comm, plan.cases[i], mine + plan.offsets[i]);
    });
  });
  return out;
}

// Forks `world` ShmComm ranks running every case; returns their outputs laid out as above.
// With `arena`, every collective runs on buffers in the ranks' shared host arenas, and each
// rank checks that it read its peers' bytes in place only (never through the kernel).
std::vector<char> shm_outputs(int world, const OutputPlan& plan, const ShmTuning& tuning,
                              std::vector<zt::RankOutcome>& outcomes, bool arena = false,
                              int per_node = 0) {
  zt::SharedRegion region(static_cast<std::size_t>(world) * plan.bytes_per_rank);
  const std::string name = zt::unique_shm_name("bitwise");
  zt::ForkedRanks ranks(world, [&](int r) {
    auto comm = zero::make_shm_communicator(name, r, world, CommOptions{30s}, tuning);
    const ShmTransport expected = tuning.transport;
    if (zero::shm_transport(*comm) != expected) throw std::runtime_error("wrong transport");
    char* mine = region.data() + static_cast<std::size_t>(r) * plan.bytes_per_rank;
    maybe_in_nodes(*comm, per_node, [&](Communicator& c) {
      for (std::size_t i = 0; i < plan.cases.size(); ++i)
        run_case_into(c, plan.cases[i], mine + plan.offsets[i], arena ? in_arena : zt::Place{});
    });
    if (arena && world > 1) {
      const zero::ShmReadStats stats = zero::shm_read_stats(*comm).value();
      if (stats.direct_bytes == 0 || stats.kernel_bytes != 0) {
        throw std::runtime_error(fmt::format("read {} bytes in place, {} through the kernel",
                                             stats.direct_bytes, stats.kernel_bytes));
      }
    }
  });
  outcomes = ranks.wait();
  REQUIRE(zt::shm_files_with_prefix(name).empty());
  return std::vector<char>(region.data(), region.data() + region.size());
}

std::string failures(const std::vector<zt::RankOutcome>& outcomes) {
  std::string out;
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    const auto& o = outcomes[r];
    if (o.exit_code != 0) {
      out += fmt::format("\n  rank {}: exit {} signal {}: {}", r, o.exit_code, o.signal, o.error);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("ShmComm gives InProcComm's bits for every collective, dtype and op at world sizes 1-4") {
  const std::vector<std::size_t> sizes = {0, 1, 7, 1031, 20011};
  for (int world : {1, 2, 3, 4}) {
    const OutputPlan plan(world, sizes);
    const std::vector<char> expected = inproc_outputs(world, plan);
    // Guard against a vacuous pass: every case with elements has an output that is not zero.
    std::size_t nonzero = 0, with_elems = 0;
    for (std::size_t i = 0; i < plan.cases.size(); ++i) {
      if (plan.cases[i].elems == 0) continue;
      ++with_elems;
      const char* p = expected.data() + plan.offsets[i];
      const std::size_t len = output_elems(plan.cases[i], world) * dtype_size(plan.cases[i].dtype);
      nonzero += std::any_of(p, p + len, [](char b) { return b != 0; });
    }
    REQUIRE(with_elems > 200);
    REQUIRE(nonzero == with_elems);

    for (ShmTransport transport : {ShmTransport::CrossMemoryAttach, ShmTransport::Segment}) {
      INFO("world " << world << ", transport " << zero::shm_transport_name(transport) << ", "
                    << plan.cases.size() << " cases of sizes 0, 1, 7, 1031, 20011");
      std::vector<zt::RankOutcome> outcomes;
      const std::vector<char> got = shm_outputs(world, plan, small_steps(transport), outcomes);
      INFO("rank failures:" << failures(outcomes));
      for (const auto& o : outcomes) REQUIRE(o.exit_code == 0);
      std::vector<std::string> differ;
      for (int r = 0; r < world; ++r) {
        for (std::size_t i = 0; i < plan.cases.size(); ++i) {
          const std::size_t at =
              static_cast<std::size_t>(r) * plan.bytes_per_rank + plan.offsets[i];
          const std::size_t len =
              output_elems(plan.cases[i], world) * dtype_size(plan.cases[i].dtype);
          if (std::memcmp(got.data() + at, expected.data() + at, len) != 0 && differ.size() < 10)
            differ.push_back(fmt::format("rank {}: {}", r, plan.cases[i].name(world)));
        }
      }
      INFO("cases that differ: " << fmt::format("{}", fmt::join(differ, "; ")));
      REQUIRE(differ.empty());
    }
  }
}

TEST_CASE("ShmComm reads buffers in its peers' shared host arenas in place, with InProcComm's bits") {
  const std::vector<std::size_t> sizes = {1, 1031, (std::size_t{1} << 18) + 3};  // 1 MiB + 12 B of fp32: two pieces
  for (int world : {2, 3}) {
    const OutputPlan plan(world, sizes);
    const std::vector<char> expected = inproc_outputs(world, plan);
    REQUIRE(std::any_of(expected.begin(), expected.end(), [](char b) { return b != 0; }));
    INFO("world " << world << ", " << plan.cases.size() << " cases, buffers in the arena");
    std::vector<zt::RankOutcome> outcomes;
    ShmTuning tuning;
    tuning.transport = ShmTransport::CrossMemoryAttach;
    const std::vector<char> got = shm_outputs(world, plan, tuning, outcomes, /*arena=*/true);
    INFO("rank failures:" << failures(outcomes));
    for (const auto& o : outcomes) REQUIRE(o.exit_code == 0);
    REQUIRE(std::memcmp(got.data(), expected.data(), expected.size()) == 0);
  }
}

TEST_CASE("A peer's arena is mapped staggered from this rank's, so equal offsets do not alias") {
  // Two views of one memfd stand in for this rank's arena and a peer's: the view's distance from
  // `own`, modulo the stagger period, must be index × kStagger, and it must show the fd's bytes.
  namespace cd = zero::comm_detail;
  const int fd = ::memfd_create("zero-stagger-test", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  constexpr std::size_t kBytes = std::size_t{4} << 20;
  REQUIRE(::ftruncate(fd, kBytes) == 0);
  void* own = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(own != MAP_FAILED);
  std::memset(own, 0x5a, kBytes);
  static_cast<unsigned char*>(own)[kBytes - 1] = 0xa5;
  const auto own_base = reinterpret_cast<std::uint64_t>(own);
  for (std::uint64_t index : {1, 2, 7}) {
    INFO("index " << index);
    void* view = cd::map_staggered(fd, kBytes, own_base, index);
    REQUIRE(view != MAP_FAILED);
    const auto at = reinterpret_cast<std::uint64_t>(view);
    CHECK((at - own_base) % cd::kStaggerPeriod == index * cd::kStagger % cd::kStaggerPeriod);
    CHECK(std::memcmp(view, own, kBytes) == 0);
    CHECK(static_cast<const unsigned char*>(view)[kBytes - 1] == 0xa5);
    ::munmap(view, kBytes);
  }
  ::munmap(own, kBytes);
  ::close(fd);
}

TEST_CASE("ShmComm with default tuning matches InProcComm on buffers of several MB") {
  // Default pieces (256 KiB per peer) and windows (1 MiB): sizes that take several of each.
  const std::vector<std::size_t> sizes = {(std::size_t{3} << 20) + 5};
  for (int world : {2, 3}) {
    OutputPlan plan(world, sizes);
    // Only fp32 and bf16 sums and out-of-place calls (all_to_all included): the others share
    // their code paths.
    std::vector<zt::Case> picked;
    for (const auto& c : plan.cases) {
      const bool wanted = (c.dtype == DType::F32 || c.dtype == DType::BF16) && !c.in_place &&
                          c.op == ReduceOp::Sum && c.kind != Collective::Broadcast;
      if (wanted) picked.push_back(c);
    }
    REQUIRE(picked.size() == 8);  // reduce_scatter, all_reduce, all_gather, all_to_all × 2 dtypes
    plan = OutputPlan(world, {});
    for (const auto& c : picked) {
      plan.offsets.push_back(plan.bytes_per_rank);
      plan.bytes_per_rank += (output_elems(c, world) * dtype_size(c.dtype) + 7) / 8 * 8;
      plan.cases.push_back(c);
    }
    const std::vector<char> expected = inproc_outputs(world, plan);
    for (ShmTransport transport : {ShmTransport::CrossMemoryAttach, ShmTransport::Segment}) {
      INFO("world " << world << ", transport " << zero::shm_transport_name(transport));
      ShmTuning tuning;
      tuning.transport = transport;
      std::vector<zt::RankOutcome> outcomes;
      const std::vector<char> got = shm_outputs(world, plan, tuning, outcomes);
      INFO("rank failures:" << failures(outcomes));
      for (const auto& o : outcomes) REQUIRE(o.exit_code == 0);
      REQUIRE(std::memcmp(got.data(), expected.data(), expected.size()) == 0);
    }
  }
}

TEST_CASE("ShmComm picks cross-memory attach when it works, and the segment when told to") {
  for (const char* env : {"", "segment"}) {
    INFO("ZERO_SHM_TRANSPORT=" << env);
    const std::string name = zt::unique_shm_name("auto");
    zt::ForkedRanks ranks(2, [&](int r) {
      ::setenv("ZERO_SHM_TRANSPORT", env, 1);
      auto comm = zero::make_shm_communicator(name, r, 2, CommOptions{20s});
      // This machine allows cross-memory attach between sibling processes (as the
      // "InProcComm's bits" test relies on), so Auto must choose it unless told otherwise.
      const ShmTransport expected =
          *env == '\0' ? ShmTransport::CrossMemoryAttach : ShmTransport::Segment;
      if (zero::shm_transport(*comm) != expected) throw std::runtime_error("wrong transport");
      std::vector<float> v(100000, static_cast<float>(r + 1));
      comm->all_reduce(v.data(), v.data(), v.size(), DType::F32, ReduceOp::Sum).wait();
      if (v.front() != 3.0f || v.back() != 3.0f) throw std::runtime_error("wrong sum");
    });
    for (const auto& o : ranks.wait()) {
      INFO(o.error);
      REQUIRE(o.exit_code == 0);
    }
  }
}

TEST_CASE("two-level collectives over ShmComm processes, 4 and 6 ranks as 2 and 3 nodes, are "
          "bitwise those over InProcComm threads") {
  for (const auto& [world, per_node] : {std::pair{4, 2}, std::pair{6, 2}}) {
    INFO("world " << world << " as " << world / per_node << " nodes");
    const OutputPlan plan(world, {1, 7, 1031});
    const std::vector<char> expected = inproc_outputs(world, plan, per_node);
    std::vector<zt::RankOutcome> outcomes;
    ShmTuning tuning;
    tuning.transport = ShmTransport::CrossMemoryAttach;
    const std::vector<char> got =
        shm_outputs(world, plan, tuning, outcomes, /*arena=*/false, per_node);
    INFO("rank failures:" << failures(outcomes));
    for (const auto& o : outcomes) REQUIRE(o.exit_code == 0);
    REQUIRE(std::memcmp(got.data(), expected.data(), expected.size()) == 0);
    // Not a vacuous pass: the outputs were written (no case leaves every byte zero).
    REQUIRE(std::any_of(got.begin(), got.end(), [](char c) { return c != 0; }));
  }
}
