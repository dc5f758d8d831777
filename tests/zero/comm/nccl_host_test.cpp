// The host side of NcclComm without NCCL: the completion poll its Works run (with fake probes)
// and the unique-id bootstrap (over InProcComm ranks).
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "zero/base/error.h"
#include "zero/comm/completion_poll.h"
#include "zero/comm/inproc_comm.h"
#include "zero/comm/nccl_bootstrap.h"

using namespace std::chrono_literals;
using zero::CommError;
using zero::PollStatus;
using zero::PollTarget;

namespace {
const PollTarget kTarget{"NcclComm rank 1 of 4", "all_reduce (sum, fp32) of 1000 elements", 200ms};
}

TEST_CASE("the poll returns once the probe reports completion, without calling on_failure") {
  int polls = 0;
  int aborts = 0;
  zero::poll_until_complete(
      [&] {
        return PollStatus{++polls == 5, {}};
      },
      kTarget, [&] { ++aborts; });
  REQUIRE(polls == 5);
  REQUIRE(aborts == 0);
}

TEST_CASE("an error reported while polling aborts once and names who, the op and the error") {
  int polls = 0;
  int aborts = 0;
  auto probe = [&] {
    ++polls;
    return polls < 3 ? PollStatus{} : PollStatus{false, "unhandled system error: peer closed"};
  };
  REQUIRE_THROWS_AS(zero::poll_until_complete(probe, kTarget, [&] { ++aborts; }), CommError);
  REQUIRE(aborts == 1);
  polls = 0;
  REQUIRE_THROWS_WITH(zero::poll_until_complete(probe, kTarget),
                      Catch::Contains("NcclComm rank 1 of 4") &&
                          Catch::Contains("all_reduce (sum, fp32) of 1000 elements failed") &&
                          Catch::Contains("peer closed"));
}

TEST_CASE("an op that never completes times out after the communicator's timeout") {
  std::atomic<int> aborts{0};
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(
      zero::poll_until_complete([] { return PollStatus{}; }, kTarget, [&] { ++aborts; }),
      Catch::Contains("all_reduce") && Catch::Contains("did not complete within 200 ms"));
  const auto waited = std::chrono::steady_clock::now() - start;
  REQUIRE(waited >= 200ms);
  REQUIRE(waited < 5s);
  REQUIRE(aborts == 1);
}

TEST_CASE("a probe that throws fails the op with its message, and test() polls once") {
  auto throwing = []() -> PollStatus {
    throw std::runtime_error("cudaEventQuery: illegal address");
  };
  REQUIRE_THROWS_WITH(zero::poll_once(throwing, kTarget), Catch::Contains("illegal address"));
  REQUIRE_FALSE(zero::poll_once([] { return PollStatus{}; }, kTarget));
  REQUIRE(zero::poll_once([] { return PollStatus{true, {}}; }, kTarget));
}

TEST_CASE("every rank gets the root's unique id over the host communicator") {
  for (int world : {1, 2, 3, 5}) {
    for (int root : {0, world - 1}) {
      INFO("world " << world << ", root " << root);
      std::atomic<int> made{0};
      zero::run_ranks(world, [&](zero::Communicator& host) {
        const zero::NcclIdBytes id = zero::share_unique_id(host, root, [&] {
          ++made;
          zero::NcclIdBytes bytes;
          for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 7 + 1);
          return bytes;
        });
        for (std::size_t i = 0; i < id.size(); ++i) REQUIRE(id[i] == std::byte(i * 7 + 1));
      });
      REQUIRE(made == 1);
    }
  }
}

TEST_CASE("a root that cannot make the id fails every rank with a CommError, not a hang") {
  std::atomic<int> comm_errors{0};
  std::atomic<int> root_errors{0};
  zero::CommOptions options;
  options.timeout = 2s;
  zero::InProcWorld world(3, options);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      auto host = world.comm(r);
      try {
        zero::share_unique_id(*host, 0, []() -> zero::NcclIdBytes {
          throw CommError("ncclGetUniqueId failed: unhandled system error");
        });
      } catch (const CommError& e) {
        const std::string what = e.what();
        if (what.find("unhandled system error") != std::string::npos) ++root_errors;
        if (what.find("root rank 0 could not create the unique id") != std::string::npos) {
          ++comm_errors;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(root_errors == 1);
  REQUIRE(comm_errors == 2);
}
