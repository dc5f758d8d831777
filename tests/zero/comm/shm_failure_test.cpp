// ShmComm when ranks go missing, die, disagree or leave stale segments behind: prompt CommErrors
// that name the rank and its pid, and nothing left in /dev/shm. Also split and issue order
// across processes.
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/zero/comm/forked_ranks.h"
#include "zero/base/error.h"
#include "zero/comm/communicator.h"
#include "zero/comm/shm_comm.h"

using namespace std::chrono_literals;
using zero::CommError;
using zero::CommOptions;
using zero::Communicator;
using zero::DType;
using zero::ReduceOp;
namespace zt = zero::test;

namespace {

constexpr auto kShortTimeout = 500ms;
// A dead peer must be noticed well before any timeout the tests set.
constexpr auto kPromptly = 2s;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool file_exists(const std::string& name) {
  return std::filesystem::exists("/dev/shm/" + name);
}

// Polls `ready` until it holds, for at most `limit`.
template <typename Pred>
bool eventually(Pred ready, std::chrono::milliseconds limit = 20000ms) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

}  // namespace

TEST_CASE("a rank that never calls a collective times out naming it, its pid and who arrived") {
  const std::string name = zt::unique_shm_name("late");
  zt::SharedRegion shared(64);
  auto& others_done = *reinterpret_cast<std::atomic<int>*>(shared.data());
  zt::ForkedRanks ranks(3, [&](int r) {
    auto comm = zero::make_shm_communicator(name, r, 3, CommOptions{kShortTimeout});
    if (r == 1) {  // alive, but never calls; leaves once the others have failed
      if (!eventually([&] { return others_done.load() == 2; })) throw std::runtime_error("stuck");
      return;
    }
    std::vector<float> v(1000, 1.0f);
    try {
      comm->all_reduce(v.data(), v.data(), v.size(), DType::F32, ReduceOp::Sum).wait();
    } catch (const CommError&) {
      // The group is aborted: a later collective fails at once, whatever its timeout.
      comm->set_timeout(60s);
      const auto start = std::chrono::steady_clock::now();
      try {
        comm->barrier().wait();
      } catch (const CommError& again) {
        if (std::chrono::steady_clock::now() - start > 1s) throw std::runtime_error("slow");
        ++others_done;
        throw;
      }
    }
    ++others_done;
    throw std::runtime_error("the collective did not fail");
  });
  const auto outcomes = ranks.wait();
  REQUIRE(outcomes[1].exit_code == 0);
  for (int r : {0, 2}) {
    const std::string& msg = outcomes[static_cast<std::size_t>(r)].error;
    INFO("rank " << r << ": " << msg);
    REQUIRE(outcomes[static_cast<std::size_t>(r)].exit_code == 1);
    REQUIRE(contains(msg, "all_reduce (sum, fp32) of 1000 elements, 4000 bytes"));
    REQUIRE(contains(msg, "timed out after 500 ms"));
    REQUIRE(contains(msg, "arrived ranks [0, 2]"));
    REQUIRE(contains(
        msg, fmt::format("missing ranks [1 (pid {}, last reached collective #0)]", ranks.pid(1))));
  }
  REQUIRE(zt::shm_files_with_prefix(name).empty());
}

TEST_CASE("a rank killed mid-run fails the others within 2 s naming its rank and pid") {
  const std::string name = zt::unique_shm_name("killed");
  zt::SharedRegion shared(64);
  auto* iterations = reinterpret_cast<std::atomic<int>*>(shared.data());
  zt::ForkedRanks ranks(3, [&](int r) {
    auto comm = zero::make_shm_communicator(name, r, 3, CommOptions{60s});
    std::vector<float> v(1 << 16, 1.0f);
    for (int i = 0; i < 1000000; ++i) {
      comm->all_reduce(v.data(), v.data(), v.size(), DType::F32, ReduceOp::Max).wait();
      iterations[r] = i + 1;
    }
    throw std::runtime_error("never failed");
  });
  REQUIRE(eventually([&] { return iterations[2].load() >= 20; }));
  const auto killed_at = std::chrono::steady_clock::now();
  ::kill(ranks.pid(2), SIGKILL);
  const auto outcomes = ranks.wait();
  REQUIRE(outcomes[2].signal == SIGKILL);
  for (int r : {0, 1}) {
    const auto& o = outcomes[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << o.error);
    REQUIRE(o.exit_code == 1);
    REQUIRE(contains(o.error, fmt::format("rank 2 (pid {}) exited", ranks.pid(2))));
    REQUIRE(contains(o.error, "all_reduce (max, fp32)"));
    REQUIRE(o.end - killed_at < kPromptly);
  }
  REQUIRE(zt::shm_files_with_prefix(name).empty());
}

TEST_CASE("a rank that destroys its communicator fails the peers that wait for it at once") {
  const std::string name = zt::unique_shm_name("closed");
  zt::ForkedRanks ranks(2, [&](int r) {
    auto comm = zero::make_shm_communicator(name, r, 2, CommOptions{60s});
    if (r == 1) {
      comm.reset();
      std::this_thread::sleep_for(3s);  // still running: the closed place must be what counts
      return;
    }
    float x = 1;
    comm->all_reduce(&x, &x, 1, DType::F32, ReduceOp::Sum).wait();
  });
  const auto outcomes = ranks.wait();
  INFO(outcomes[0].error);
  REQUIRE(outcomes[0].exit_code == 1);
  REQUIRE(contains(outcomes[0].error,
                   fmt::format("rank 1 (pid {}) destroyed its communicator", ranks.pid(1))));
  REQUIRE(outcomes[0].seconds < 2.5);
}

TEST_CASE("a rank that never attaches fails the bootstrap naming it, and rank 0 removes the file") {
  const std::string name = zt::unique_shm_name("absent");
  zt::ForkedRanks ranks(3, [&](int r) {
    if (r == 2) return;  // never calls make_shm_communicator
    auto comm = zero::make_shm_communicator(name, r, 3, CommOptions{kShortTimeout});
  });
  const auto outcomes = ranks.wait();
  REQUIRE(outcomes[2].exit_code == 0);
  for (int r : {0, 1}) {
    const std::string& msg = outcomes[static_cast<std::size_t>(r)].error;
    INFO("rank " << r << ": " << msg);
    REQUIRE(contains(msg, "bootstrap of segment /dev/shm/" + name));
    REQUIRE(contains(msg, "timed out after 500 ms"));
    REQUIRE(contains(msg, "arrived ranks [0, 1]; missing ranks [2 (not attached)]"));
  }
  REQUIRE(zt::shm_files_with_prefix(name).empty());
}

TEST_CASE("a rank whose rank 0 never comes times out naming the segment") {
  const std::string name = zt::unique_shm_name("norank0");
  zt::ForkedRanks ranks(
      1, [&](int) { zero::make_shm_communicator(name, 1, 2, CommOptions{kShortTimeout}); });
  const auto outcomes = ranks.wait();
  INFO(outcomes[0].error);
  REQUIRE(
      contains(outcomes[0].error, "segment /dev/shm/" + name + " did not appear within 500 ms"));
}

// The earlier run of a group: its rank 0 made the segment and was killed before rank 1 came,
// as a launcher kills its workers when one of them fails. Leaves /dev/shm/<name> behind.
void leave_stale_segment(const std::string& name) {
  zt::ForkedRanks earlier(1,
                          [&](int) { zero::make_shm_communicator(name, 0, 2, CommOptions{60s}); });
  REQUIRE(eventually([&] { return file_exists(name); }));
  ::kill(earlier.pid(0), SIGKILL);
  REQUIRE(earlier.wait()[0].signal == SIGKILL);
  REQUIRE(file_exists(name));
}

TEST_CASE("a stale segment of the same name from an earlier run is replaced, never attached to") {
  const std::string name = zt::unique_shm_name("stale");
  const std::string other = zt::unique_shm_name("stale-other");
  leave_stale_segment(name);
  leave_stale_segment(other);
  // The new run: rank 1 comes first and finds only the stale segment for a while.
  zt::ForkedRanks ranks(2, [&](int r) {
    if (r == 0) std::this_thread::sleep_for(300ms);
    auto comm = zero::make_shm_communicator(name, r, 2, CommOptions{5s});
    float x = static_cast<float>(r + 1);
    comm->all_reduce(&x, &x, 1, DType::F32, ReduceOp::Sum).wait();
    if (x != 3.0f) throw std::runtime_error("wrong sum");
  });
  const auto outcomes = ranks.wait();
  for (const auto& o : outcomes) {
    INFO(o.error);
    REQUIRE(o.exit_code == 0);
  }
  REQUIRE(zt::shm_files_with_prefix(name).empty());
  // Rank 0 of the new group also removed the other abandoned segment.
  REQUIRE(zt::shm_files_with_prefix(other).empty());
}

TEST_CASE("ShmComm ranks calling different collectives fail naming both calls") {
  const std::string name = zt::unique_shm_name("mismatch");
  zt::ForkedRanks ranks(2, [&](int r) {
    auto comm = zero::make_shm_communicator(name, r, 2, CommOptions{10s});
    std::vector<float> v(16, 1.0f);
    if (r == 0) {
      comm->all_reduce(v.data(), v.data(), 16, DType::F32, ReduceOp::Sum).wait();
    } else {
      comm->broadcast(v.data(), 8, DType::F32, 0).wait();
    }
  });
  for (const auto& o : ranks.wait()) {
    INFO(o.error);
    REQUIRE(o.exit_code == 1);
    REQUIRE(contains(o.error, "rank 0: all_reduce (sum, fp32) of 16 elements"));
    REQUIRE(contains(o.error, "rank 1: broadcast (fp32, root 0) of 8 elements"));
  }
}

TEST_CASE("ShmComm split groups processes by color, orders them by key, leaves color -1 out") {
  const std::string name = zt::unique_shm_name("split");
  const auto before = zt::shm_files_with_prefix("zero-shm-");
  constexpr int kWorld = 5;
  zt::SharedRegion shared(3 * kWorld * sizeof(int));
  int* new_rank = reinterpret_cast<int*>(shared.data());
  int* new_size = new_rank + kWorld;
  int* sums = new_size + kWorld;
  zt::ForkedRanks ranks(kWorld, [&](int r) {
    auto comm = zero::make_shm_communicator(name, r, kWorld, CommOptions{20s});
    const int color = r == 4 ? -1 : r % 2;
    auto sub = comm->split(color, -r);  // reverse order inside each color
    if (sub) {
      new_rank[r] = sub->rank();
      new_size[r] = sub->size();
      float x = static_cast<float>(r);
      sub->all_reduce(&x, &x, 1, DType::F32, ReduceOp::Sum).wait();
      sums[r] = static_cast<int>(x);
    } else {
      new_rank[r] = -1;
    }
    comm->barrier().wait();  // the parent still works after the split
  });
  for (const auto& o : ranks.wait()) {
    INFO(o.error);
    REQUIRE(o.exit_code == 0);
  }
  // Evens 0, 2 → keys 0, -2 → new ranks 1, 0. Odds 1, 3 → keys -1, -3 → new ranks 1, 0.
  REQUIRE(std::vector<int>(new_rank, new_rank + kWorld) == std::vector<int>{1, 1, 0, 0, -1});
  REQUIRE(std::vector<int>(new_size, new_size + 4) == std::vector<int>{2, 2, 2, 2});
  REQUIRE(std::vector<int>(sums, sums + 4) == std::vector<int>{2, 4, 2, 4});
  REQUIRE(zt::shm_files_with_prefix("zero-shm-") == before);  // the splits' segments are gone
}

TEST_CASE("ShmComm runs collectives issued back to back in issue order") {
  const std::string name = zt::unique_shm_name("order");
  zt::ForkedRanks ranks(3, [&](int r) {
    auto comm = zero::make_shm_communicator(name, r, 3, CommOptions{20s});
    const float me = static_cast<float>(r);
    std::vector<float> a(1000, me), b(3000), c(1000, me + 10);
    std::vector<zero::Work> works;
    works.push_back(comm->all_reduce(a.data(), a.data(), a.size(), DType::F32, ReduceOp::Sum));
    works.push_back(comm->all_gather(c.data(), b.data(), c.size(), DType::F32));
    works.push_back(comm->broadcast(c.data(), c.size(), DType::F32, 2));
    works.push_back(comm->barrier());
    for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
    const bool ok =
        a[999] == 3.0f && b[0] == 10.0f && b[1000] == 11.0f && b[2999] == 12.0f && c[0] == 12.0f;
    if (!ok) throw std::runtime_error("out of order");
  });
  for (const auto& o : ranks.wait()) {
    INFO(o.error);
    REQUIRE(o.exit_code == 0);
  }
}

TEST_CASE("make_shm_communicator checks its arguments before touching /dev/shm") {
  REQUIRE_THROWS_WITH(zero::make_shm_communicator("", 0, 1), Catch::Contains("name is empty"));
  REQUIRE_THROWS_WITH(zero::make_shm_communicator("a/b", 0, 1), Catch::Contains("contains '/'"));
  REQUIRE_THROWS_WITH(zero::make_shm_communicator(std::string(201, 'x'), 0, 1),
                      Catch::Contains("more than 200"));
  REQUIRE_THROWS_WITH(zero::make_shm_communicator("ok", 2, 2), Catch::Contains("out of range"));
  REQUIRE_THROWS_AS(zero::make_shm_communicator("ok", 0, 0), CommError);
}
