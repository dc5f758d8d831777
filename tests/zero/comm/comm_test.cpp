#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/zero/comm/comm_test_util.h"
#include "zero/base/error.h"
#include "zero/base/half.h"
#include "zero/comm/communicator.h"
#include "zero/comm/inproc_comm.h"
#include "zero/comm/testing/faulty_communicator.h"

using namespace std::chrono_literals;
using zero::Collective;
using zero::CommError;
using zero::CommOptions;
using zero::Communicator;
using zero::DType;
using zero::ReduceOp;
using zero::run_ranks;
namespace zt = zero::test;

namespace {
const std::vector<int> kWorldSizes = {1, 2, 3, 4, 8};
constexpr auto kShortTimeout = 300ms;
}  // namespace

// ---- correctness of every collective
// --------------------------------------------------------------

TEST_CASE("every collective matches a rank-order reference bit for bit at world sizes 1-8") {
  const std::vector<std::size_t> sizes = {0, 1, 7, 1031, 65537};
  for (int world : kWorldSizes) {
    const auto cases = zt::all_cases(world, sizes);
    INFO("world " << world << ", " << cases.size() << " cases, sizes 0, 1, 7, 1031, 65537");
    zt::Tally tally;
    run_ranks(world, [&](Communicator& comm) {
      for (const auto& c : cases) zt::run_case(comm, c, tally, /*bitwise=*/true, 0);
    });
    INFO(tally.report());
    REQUIRE(tally.failed() == 0);
    // Guard against a vacuous pass: every rank checked every output element of every case.
    REQUIRE(tally.checks() > static_cast<std::size_t>(world) * 65537 * 40);
  }
}

TEST_CASE("bf16 and fp16 sums are taken in fp32 and rounded once") {
  // 1 + 3 × 2^-9 in bf16: each addend alone rounds away, the fp32 sum does not.
  const float tiny = std::ldexp(1.0f, -9);
  std::vector<std::vector<std::uint16_t>> results(4);
  run_ranks(4, [&](Communicator& comm) {
    const float v = comm.rank() == 0 ? 1.0f : tiny;
    std::uint16_t x = zero::half::float_to_bf16(v);
    comm.all_reduce(&x, &x, 1, DType::BF16, ReduceOp::Sum).wait();
    results[static_cast<std::size_t>(comm.rank())] = {x};
  });
  // Rounded per step: 1 + 2^-9 → 1 each time. Rounded once: 1 + 3·2^-9 → 1 + 2^-7 (0x3f81).
  REQUIRE(zero::half::float_to_bf16(1.0f + tiny) == 0x3f80);
  for (const auto& r : results) REQUIRE(r[0] == 0x3f81);
}

TEST_CASE("max propagates NaN from any rank") {
  std::vector<float> result(3);
  run_ranks(3, [&](Communicator& comm) {
    std::vector<float> v = {1.0f, 2.0f, 3.0f};
    if (comm.rank() == 1) v[1] = std::numeric_limits<float>::quiet_NaN();
    if (comm.rank() == 2) v[2] = 7.0f;
    comm.all_reduce(v.data(), v.data(), 3, DType::F32, ReduceOp::Max).wait();
    if (comm.rank() == 0) result = v;
  });
  REQUIRE(result[0] == 1.0f);
  REQUIRE(std::isnan(result[1]));
  REQUIRE(result[2] == 7.0f);
}

// ---- determinism
// ------------------------------------------------------------------------------------

TEST_CASE(
    "sums are bitwise identical on every rank, across runs, and between all_reduce and "
    "reduce_scatter") {
  constexpr int kWorld = 4;
  constexpr std::size_t kChunk = 4099;
  constexpr std::size_t kElems = kWorld * kChunk;
  auto run_once = [&] {
    std::vector<std::vector<float>> reduced(kWorld), scattered(kWorld);
    run_ranks(kWorld, [&](Communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      std::vector<float> in(kElems);
      // Magnitudes spread over many binades so the summation order changes the bits.
      for (std::size_t i = 0; i < kElems; ++i) {
        in[i] = static_cast<float>(zt::input_value(77, comm.rank(), i) *
                                   std::ldexp(1.0, static_cast<int>(i % 40) - 20));
      }
      std::vector<float> all(kElems), mine(kChunk);
      auto a = comm.all_reduce(in.data(), all.data(), kElems, DType::F32, ReduceOp::Sum);
      auto b = comm.reduce_scatter(in.data(), mine.data(), kChunk, DType::F32, ReduceOp::Sum);
      a.wait();
      b.wait();
      reduced[r] = all;
      scattered[r] = mine;
    });
    return std::make_pair(reduced, scattered);
  };
  const auto [reduced, scattered] = run_once();
  const auto [reduced2, scattered2] = run_once();
  for (int r = 0; r < kWorld; ++r) {
    REQUIRE(std::memcmp(reduced[r].data(), reduced[0].data(), kElems * 4) == 0);
    REQUIRE(std::memcmp(reduced2[r].data(), reduced[0].data(), kElems * 4) == 0);
    REQUIRE(std::memcmp(scattered[r].data(), reduced[0].data() + r * kChunk, kChunk * 4) == 0);
    REQUIRE(std::memcmp(scattered2[r].data(), scattered[r].data(), kChunk * 4) == 0);
  }
  // Guard: summing the same inputs in reverse rank order gives different bits somewhere, so the
  // comparison above would have noticed an order that depends on timing.
  std::size_t differ = 0;
  for (std::size_t i = 0; i < kElems; ++i) {
    float fwd = 0, rev = 0;
    for (int q = 0; q < kWorld; ++q) {
      fwd += static_cast<float>(zt::input_value(77, q, i) *
                                std::ldexp(1.0, static_cast<int>(i % 40) - 20));
      rev += static_cast<float>(zt::input_value(77, kWorld - 1 - q, i) *
                                std::ldexp(1.0, static_cast<int>(i % 40) - 20));
    }
    differ += fwd != rev;
    REQUIRE(fwd == reduced[0][i]);
  }
  REQUIRE(differ > 100);
}

// ---- asynchrony
// ----------------------------------------------------------------------------------

TEST_CASE("a collective completes on the communication thread while the caller keeps computing") {
  std::atomic<bool> rank1_issued{false};
  std::atomic<long> polls_before_done{0};
  bool pending_before_peer = false;
  run_ranks(2, [&](Communicator& comm) {
    std::vector<float> v(1 << 16, static_cast<float>(comm.rank() + 1));
    if (comm.rank() == 0) {
      auto work = comm.all_reduce(v.data(), v.data(), v.size(), DType::F32, ReduceOp::Sum);
      pending_before_peer = !work.test();  // the peer has not even issued yet
      // Compute (poll without blocking) until the op finishes in the background.
      long polls = 0;
      while (!work.test()) {
        ++polls;
        std::this_thread::yield();
      }
      polls_before_done = polls;
      if (!rank1_issued.load()) throw std::runtime_error("completed before the peer issued");
      work.wait();
    } else {
      std::this_thread::sleep_for(50ms);
      rank1_issued = true;
      comm.all_reduce(v.data(), v.data(), v.size(), DType::F32, ReduceOp::Sum).wait();
    }
    if (v[0] != 3.0f || v.back() != 3.0f) throw std::runtime_error("wrong sum");
  });
  REQUIRE(pending_before_peer);
  REQUIRE(polls_before_done.load() > 0);
}

TEST_CASE("collectives issued back to back run in issue order and can be waited in any order") {
  zt::Tally tally;
  run_ranks(3, [&](Communicator& comm) {
    const float me = static_cast<float>(comm.rank());
    std::vector<float> a(1000, me), b(3000), c(1000, me + 10);
    std::vector<zero::Work> works;
    works.push_back(comm.all_reduce(a.data(), a.data(), a.size(), DType::F32, ReduceOp::Sum));
    works.push_back(comm.all_gather(c.data(), b.data(), c.size(), DType::F32));
    works.push_back(comm.broadcast(c.data(), c.size(), DType::F32, 2));
    works.push_back(comm.barrier());
    for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
    tally.check(a[999] == 3.0f, "all_reduce");
    tally.check(b[0] == 10.0f && b[1000] == 11.0f && b[2999] == 12.0f,
                "all_gather before broadcast");
    tally.check(c[0] == 12.0f, "broadcast");
  });
  INFO(tally.report());
  REQUIRE(tally.failed() == 0);
  REQUIRE(tally.checks() == 9);
}

TEST_CASE("a waited collective gives the same bits, in issue order behind ops still in flight") {
  // all_reduce_now with nothing in flight runs on the calling thread; behind an all-reduce in
  // flight it goes through the communication thread after it, so it sums that one's result.
  zt::Tally tally;
  run_ranks(3, [&](Communicator& comm) {
    const float me = static_cast<float>(comm.rank() + 1);
    std::vector<float> a(1 << 14, me), b(4, me);
    comm.all_reduce_now(b.data(), b.data(), b.size(), DType::F32, ReduceOp::Sum);
    tally.check(b[0] == 6.0f && b[3] == 6.0f, "alone");
    zero::Work first = comm.all_reduce(a.data(), a.data(), a.size(), DType::F32, ReduceOp::Sum);
    comm.all_reduce_now(a.data(), a.data(), a.size(), DType::F32, ReduceOp::Sum);
    tally.check(a[0] == 18.0f && a.back() == 18.0f, "behind one in flight");
    first.wait();
    std::vector<double> g(3, 0.0);
    g[static_cast<std::size_t>(comm.rank())] = me;
    comm.all_gather_in_place_now(g.data(), 1, DType::F64);
    tally.check(g[0] == 1.0 && g[1] == 2.0 && g[2] == 3.0, "all_gather_in_place_now");
    comm.barrier_now();
  });
  INFO(tally.report());
  REQUIRE(tally.failed() == 0);
  REQUIRE(tally.checks() == 9);
  // A waited collective a peer never calls fails at the call, naming it.
  std::vector<std::string> messages(2);
  try {
    run_ranks(2, [&](Communicator& comm) {
      comm.set_timeout(std::chrono::milliseconds(200));
      if (comm.rank() == 1) return;
      try {
        comm.barrier_now();
      } catch (const CommError& e) {
        messages[0] = e.what();
        throw;
      }
    });
  } catch (const std::exception&) {
  }
  CHECK_THAT(messages[0], Catch::Contains("barrier"));
}

TEST_CASE("a host collective cannot be left to a stream: order_stream says so and does nothing") {
  zero::Work done;
  REQUIRE(done.order_stream(nullptr));  // complete already
  zt::Tally tally;
  run_ranks(2, [&](Communicator& comm) {
    std::vector<float> a(1000, static_cast<float>(comm.rank() + 1));
    zero::Work work = comm.all_reduce(a.data(), a.data(), a.size(), DType::F32, ReduceOp::Sum);
    tally.check(!work.order_stream(nullptr), "order_stream of a host collective");
    work.wait();
    tally.check(a[999] == 3.0f, "all_reduce");
  });
  INFO(tally.report());
  REQUIRE(tally.failed() == 0);
  REQUIRE(tally.checks() == 4);
}

// ---- split
// -----------------------------------------------------------------------------------------

TEST_CASE("split groups ranks by color, orders them by key, and leaves color -1 out") {
  std::vector<int> new_rank(8, -2), new_size(8, -2);
  std::vector<float> sums(8, -1);
  run_ranks(8, [&](Communicator& comm) {
    const int r = comm.rank();
    const int color = r == 7 ? -1 : r % 2;
    auto sub = comm.split(color, -r);  // reverse order inside each color
    if (!sub) {
      new_rank[static_cast<std::size_t>(r)] = -1;
      comm.barrier().wait();
      return;
    }
    new_rank[static_cast<std::size_t>(r)] = sub->rank();
    new_size[static_cast<std::size_t>(r)] = sub->size();
    float x = static_cast<float>(r);
    sub->all_reduce(&x, &x, 1, DType::F32, ReduceOp::Sum).wait();
    sums[static_cast<std::size_t>(r)] = x;
    // The parent still works after the split.
    comm.barrier().wait();
  });
  // Evens 0,2,4,6 → keys 0,-2,-4,-6 → new ranks 3,2,1,0. Odds 1,3,5 → new ranks 2,1,0.
  REQUIRE(new_rank == std::vector<int>{3, 2, 2, 1, 1, 0, 0, -1});
  REQUIRE(new_size == std::vector<int>{4, 3, 4, 3, 4, 3, 4, -2});
  REQUIRE(sums == std::vector<float>{12, 9, 12, 9, 12, 9, 12, -1});
}

// ---- failures: timeouts, mismatches, aborts, faults
// ----------------------------------------------

TEST_CASE("a collective a rank never calls times out with CommError naming op, size and ranks") {
  CommOptions opts;
  opts.timeout = kShortTimeout;
  const auto start = std::chrono::steady_clock::now();
  try {
    run_ranks(
        3,
        [&](Communicator& comm) {
          if (comm.rank() == 1) return;  // never calls
          std::vector<float> v(1000, 1.0f);
          comm.all_reduce(v.data(), v.data(), v.size(), DType::F32, ReduceOp::Sum).wait();
        },
        opts);
    FAIL("expected a CommError");
  } catch (const CommError& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.find("all_reduce") != std::string::npos);
    REQUIRE(msg.find("1000 elements") != std::string::npos);
    REQUIRE(msg.find("4000 bytes") != std::string::npos);
    REQUIRE(msg.find("timed out after 300 ms") != std::string::npos);
    REQUIRE(msg.find("arrived ranks [0, 2]") != std::string::npos);
    REQUIRE(msg.find("missing ranks [1 (last reached collective #0)]") != std::string::npos);
  }
  REQUIRE(std::chrono::steady_clock::now() - start < 10s);
}

TEST_CASE("after a timeout the group fails later collectives at once instead of hanging") {
  zero::InProcWorld world(2, CommOptions{kShortTimeout});
  auto c0 = world.comm(0);
  auto c1 = world.comm(1);
  float x = 1;
  REQUIRE_THROWS_AS(c0->all_reduce(&x, &x, 1, DType::F32, ReduceOp::Sum).wait(), CommError);
  c1->set_timeout(60s);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(c1->barrier().wait(), Catch::Contains("timed out"));
  REQUIRE(std::chrono::steady_clock::now() - start < 5s);
}

TEST_CASE("ranks calling different collectives fail with CommError naming both calls") {
  CommOptions opts;
  opts.timeout = 10s;
  try {
    run_ranks(
        2,
        [&](Communicator& comm) {
          std::vector<float> v(16, 1.0f);
          if (comm.rank() == 0) {
            comm.all_reduce(v.data(), v.data(), 16, DType::F32, ReduceOp::Sum).wait();
          } else {
            comm.broadcast(v.data(), 8, DType::F32, 0).wait();
          }
        },
        opts);
    FAIL("expected a CommError");
  } catch (const CommError& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.find("rank 0: all_reduce (sum, fp32) of 16 elements") != std::string::npos);
    REQUIRE(msg.find("rank 1: broadcast (fp32, root 0) of 8 elements") != std::string::npos);
  }
}

TEST_CASE("an exception on one rank aborts the others promptly and run_ranks rethrows it") {
  CommOptions opts;
  opts.timeout = 60s;
  const auto start = std::chrono::steady_clock::now();
  std::atomic<int> comm_errors{0};
  REQUIRE_THROWS_WITH(
      run_ranks(
          4,
          [&](Communicator& comm) {
            if (comm.rank() == 2) throw std::runtime_error("rank 2 model exploded");
            float x = 1;
            try {
              comm.all_reduce(&x, &x, 1, DType::F32, ReduceOp::Sum).wait();
            } catch (const CommError& e) {
              if (std::string(e.what()).find("rank 2 failed: rank 2 model exploded") !=
                  std::string::npos) {
                ++comm_errors;
              }
              throw;
            }
          },
          opts),
      "rank 2 model exploded");
  REQUIRE(comm_errors.load() == 3);
  REQUIRE(std::chrono::steady_clock::now() - start < 10s);
}

TEST_CASE("agreement check passes when ranks agree and names the ranks that differ") {
  for (int world : kWorldSizes) {
    run_ranks(world, [](Communicator& comm) { zero::check_agreement(comm, "config", "stage 2"); });
  }
  std::vector<std::string> messages(5);
  run_ranks(5, [&](Communicator& comm) {
    const int r = comm.rank();
    const std::string value = r == 1 ? "p0:[5] p1:[7]" : r == 3 ? "p0:[5]" : "p0:[5] p1:[6]";
    try {
      zero::check_agreement(comm, "layout", value);
    } catch (const CommError& e) {
      messages[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& m : messages) {
    INFO(m);
    REQUIRE(m.find("ranks disagree on layout") != std::string::npos);
    REQUIRE(m.find("ranks [1, 3] differ from rank 0") != std::string::npos);
    REQUIRE(m.find("3 distinct values over 5 ranks") != std::string::npos);
    REQUIRE(m.find("ranks [0, 2, 4] hash") != std::string::npos);
  }
}

TEST_CASE("in-process ranks share an address space and exchange addresses rank-major") {
  for (int world : kWorldSizes) {
    INFO(world << " ranks");
    // Each rank's two arrays; every rank writes a value into each peer's second array through
    // the exchanged addresses, and after a barrier finds the peers' values in its own.
    std::vector<std::vector<int>> first(static_cast<std::size_t>(world), std::vector<int>(1));
    std::vector<std::vector<int>> second(static_cast<std::size_t>(world),
                                         std::vector<int>(static_cast<std::size_t>(world), -1));
    run_ranks(world, [&](Communicator& comm) {
      const auto me = static_cast<std::size_t>(comm.rank());
      REQUIRE(comm.shares_address_space());
      const std::vector<void*> mine = {first[me].data(), second[me].data()};
      const std::vector<void*> all = comm.exchange_addresses(mine);
      REQUIRE(all.size() == 2 * static_cast<std::size_t>(world));
      for (int q = 0; q < world; ++q) {
        const auto k = static_cast<std::size_t>(q);
        CHECK(all[2 * k] == first[k].data());
        CHECK(all[2 * k + 1] == second[k].data());
        static_cast<int*>(all[2 * k + 1])[me] = 100 + comm.rank();
      }
      comm.barrier().wait();
      for (int q = 0; q < world; ++q) CHECK(second[me][static_cast<std::size_t>(q)] == 100 + q);
    });
  }
  // A backend that does not say so (here a wrapper) refuses, naming itself.
  zero::InProcWorld world(1);
  auto inner = world.comm(0);
  zero::FaultyCommunicator wrapped(*inner, 0);
  REQUIRE_FALSE(wrapped.shares_address_space());
  int x = 0;
  const std::vector<void*> one = {&x};
  REQUIRE_THROWS_WITH(wrapped.exchange_addresses(one),
                      Catch::Contains("faulty(inproc)") && Catch::Contains("address space"));
}

TEST_CASE("FaultyCommunicator fails exactly the N-th call, at the call or at wait") {
  zero::InProcWorld world(1);
  auto inner = world.comm(0);
  zero::FaultyCommunicator throws(*inner, 3);
  float x = 2;
  throws.all_reduce(&x, &x, 1, DType::F32, ReduceOp::Sum).wait();
  throws.barrier().wait();
  REQUIRE_THROWS_WITH(throws.broadcast(&x, 1, DType::F32, 0),
                      Catch::Contains("injected failure of call #3 (broadcast"));
  throws.barrier().wait();  // later calls go through
  REQUIRE(throws.calls() == 4);
  REQUIRE(throws.backend_name() == "faulty(inproc)");

  zero::FaultyCommunicator at_wait(*inner, 1, zero::FaultyCommunicator::Mode::FailOnWait);
  auto work = at_wait.all_gather(&x, &x, 1, DType::F32);
  REQUIRE_THROWS_AS(work.test(), CommError);
  REQUIRE_THROWS_WITH(work.wait(), Catch::Contains("injected failure of call #1 (all_gather"));
}

TEST_CASE("a fault injected on one rank fails its peers promptly under run_ranks") {
  CommOptions opts;
  opts.timeout = 60s;
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(run_ranks(
                          2,
                          [&](Communicator& comm) {
                            zero::FaultyCommunicator faulty(comm, comm.rank() == 1 ? 2 : 0);
                            float x = 1;
                            for (int i = 0; i < 3; ++i)
                              faulty.all_reduce(&x, &x, 1, DType::F32, ReduceOp::Sum).wait();
                          },
                          opts),
                      Catch::Contains("injected failure of call #2"));
  REQUIRE(std::chrono::steady_clock::now() - start < 10s);
}

// ---- argument checks
// -------------------------------------------------------------------------------

TEST_CASE("collective arguments are checked before anything is issued") {
  zero::InProcWorld world(2, CommOptions{kShortTimeout});
  auto c = world.comm(0);
  REQUIRE_THROWS_WITH(c->all_reduce(nullptr, nullptr, 4, DType::F32, ReduceOp::Sum),
                      Catch::Contains("null buffer for 4 elements"));
  float x = 0;
  REQUIRE_THROWS_WITH(c->broadcast(&x, 1, DType::F32, 2), Catch::Contains("root 2 out of range"));
  REQUIRE_THROWS_WITH(c->reduce_scatter(&x, &x, std::numeric_limits<std::size_t>::max() / 2,
                                        DType::F32, ReduceOp::Sum),
                      Catch::Contains("overflow"));
  REQUIRE_THROWS_AS(world.comm(0), CommError);  // taken
  REQUIRE_THROWS_AS(world.comm(2), CommError);
  REQUIRE_NOTHROW(c->all_reduce(nullptr, nullptr, 0, DType::F32, ReduceOp::Sum));
}

TEST_CASE("make_communicator explains where in-process ranks come from and what is built") {
  REQUIRE_THROWS_WITH(zero::make_communicator("inproc"), Catch::Contains("run_ranks"));
  REQUIRE_THROWS_WITH(zero::make_communicator("gloo"), Catch::Contains("unknown backend"));
  REQUIRE(zero::communicator_available("inproc"));
  REQUIRE_FALSE(zero::communicator_available("gloo"));
}
