// CallbackComm: each rank's callbacks delegate to an InProcComm of a second world, so every
// collective must give the bits InProcComm gives when called directly.
#include "zero/comm/callback_comm.h"

#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/zero/comm/comm_test_util.h"
#include "zero/base/error.h"
#include "zero/comm/communicator.h"
#include "zero/comm/inproc_comm.h"

using namespace std::chrono_literals;
using zero::Collective;
using zero::CommError;
using zero::CommOptions;
using zero::Communicator;
using zero::DType;
using zero::InProcWorld;
using zero::ReduceOp;
namespace zt = zero::test;

namespace {

// A callback's answer when `recv` overlaps `send` (CallbackComm promises it never does, except
// in all_reduce) and when the delegated collective threw.
constexpr int kAliased = 99;
constexpr int kThrew = 98;
// Peers waiting on a rank that failed give up after this long.
constexpr auto kInnerTimeout = 60s;

// The C header's codes, written out independently of CallbackComm's own mapping.
std::optional<DType> dtype_of(int code) {
  switch (code) {
    case 0: return DType::F32;
    case 1: return DType::F16;
    case 2: return DType::BF16;
    case 3: return DType::F64;
  }
  return std::nullopt;
}
std::optional<ReduceOp> op_of(int code) {
  switch (code) {
    case 0: return ReduceOp::Sum;
    case 1: return ReduceOp::Avg;
    case 2: return ReduceOp::Max;
  }
  return std::nullopt;
}

// One rank's `user`: the InProcComm the callbacks delegate to, what to fail, and what was called.
struct Delegate {
  Communicator* inner = nullptr;
  int fail_code[5] = {0, 0, 0, 0, 0};  // indexed by Collective; 0 = succeed
  std::mutex mu;
  std::vector<std::string> events;  // callback names in call order, then "destroy"
  std::vector<std::thread::id> threads;
  int destroy_calls = 0;

  int enter(Collective kind) {
    std::lock_guard lock(mu);
    events.emplace_back(zero::collective_name(kind));
    threads.push_back(std::this_thread::get_id());
    return fail_code[static_cast<int>(kind)];
  }
};

bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (...) {
    return kThrew;
  }
}

Delegate& delegate(void* user) {
  return *static_cast<Delegate*>(user);
}

int cb_reduce_scatter(void* user, const void* send, void* recv, std::size_t recv_elems, int dtype,
                      int op) {
  auto& d = delegate(user);
  if (const int rc = d.enter(Collective::ReduceScatter)) return rc;
  const std::size_t esz = zero::dtype_size(*dtype_of(dtype));
  const std::size_t send_bytes = static_cast<std::size_t>(d.inner->size()) * recv_elems * esz;
  if (overlap(send, send_bytes, recv, recv_elems * esz)) return kAliased;
  return guarded([&] {
    d.inner->reduce_scatter(send, recv, recv_elems, *dtype_of(dtype), *op_of(op)).wait();
  });
}

int cb_all_gather(void* user, const void* send, void* recv, std::size_t send_elems, int dtype) {
  auto& d = delegate(user);
  if (const int rc = d.enter(Collective::AllGather)) return rc;
  const std::size_t esz = zero::dtype_size(*dtype_of(dtype));
  const std::size_t recv_bytes = static_cast<std::size_t>(d.inner->size()) * send_elems * esz;
  if (overlap(send, send_elems * esz, recv, recv_bytes)) return kAliased;
  return guarded([&] { d.inner->all_gather(send, recv, send_elems, *dtype_of(dtype)).wait(); });
}

int cb_all_reduce(void* user, const void* send, void* recv, std::size_t elems, int dtype, int op) {
  auto& d = delegate(user);
  if (const int rc = d.enter(Collective::AllReduce)) return rc;
  return guarded(
      [&] { d.inner->all_reduce(send, recv, elems, *dtype_of(dtype), *op_of(op)).wait(); });
}

int cb_broadcast(void* user, void* buffer, std::size_t elems, int dtype, int root) {
  auto& d = delegate(user);
  if (const int rc = d.enter(Collective::Broadcast)) return rc;
  return guarded([&] { d.inner->broadcast(buffer, elems, *dtype_of(dtype), root).wait(); });
}

int cb_barrier(void* user) {
  auto& d = delegate(user);
  if (const int rc = d.enter(Collective::Barrier)) return rc;
  return guarded([&] { d.inner->barrier().wait(); });
}

void cb_destroy(void* user) {
  auto& d = delegate(user);
  std::lock_guard lock(d.mu);
  ++d.destroy_calls;
  d.events.emplace_back("destroy");
}

zero::CommCallbacks table(Delegate& d) {
  zero::CommCallbacks cb;
  cb.user = &d;
  cb.rank = d.inner->rank();
  cb.size = d.inner->size();
  cb.reduce_scatter = cb_reduce_scatter;
  cb.all_gather = cb_all_gather;
  cb.all_reduce = cb_all_reduce;
  cb.broadcast = cb_broadcast;
  cb.barrier = cb_barrier;
  cb.destroy = cb_destroy;
  return cb;
}

// Runs one case and returns what the contract specifies of the output (for an in-place
// reduce_scatter only the rank's own chunk; the other chunks are unspecified).
zt::Bytes perform(Communicator& comm, const zt::Case& c) {
  zt::Bytes out = zt::perform_case(comm, c);
  if (c.kind != Collective::ReduceScatter || !c.in_place) return out;
  const std::size_t n = c.elems;
  zt::Bytes chunk(c.dtype, n);
  if (n > 0) {
    const std::size_t bytes = n * zero::dtype_size(c.dtype);
    std::memcpy(
        chunk.data(),
        static_cast<const char*>(out.data()) + static_cast<std::size_t>(comm.rank()) * bytes,
        bytes);
  }
  return chunk;
}

// Runs fn(rank, delegate, callback communicator) on `world` threads; each rank's callbacks
// delegate to rank r of a fresh InProcWorld. Returns each rank's delegate for inspection (the
// callback communicators are destroyed by then).
std::vector<std::unique_ptr<Delegate>> run_callback_ranks(
    int world, const std::function<void(int, Delegate&, Communicator&)>& fn) {
  InProcWorld inner(world, CommOptions{kInnerTimeout});
  std::vector<std::unique_ptr<Delegate>> delegates;
  for (int r = 0; r < world; ++r) delegates.push_back(std::make_unique<Delegate>());
  zero::run_ranks(world, [&](Communicator& direct) {
    const int r = direct.rank();
    auto inner_comm = inner.comm(r);
    Delegate& d = *delegates[static_cast<std::size_t>(r)];
    d.inner = inner_comm.get();
    try {
      auto comm = zero::make_callback_communicator(table(d));
      fn(r, d, *comm);
    } catch (...) {
      inner.abort("a rank failed");
      throw;
    }
  });
  return delegates;
}

}  // namespace

TEST_CASE("every collective over callbacks gives InProcComm's bits, world sizes 1-4") {
  const std::vector<std::size_t> sizes = {0, 1, 7, 1031};
  for (int world = 1; world <= 4; ++world) {
    const auto cases = zt::all_cases(world, sizes);
    INFO("world " << world << ", " << cases.size() << " cases, sizes 0, 1, 7, 1031");
    zt::Tally reference;  // the callback comm against the rank-order reference
    zt::Tally same;       // the callback comm against InProcComm called directly
    InProcWorld direct_world(world, CommOptions{kInnerTimeout});
    std::vector<std::unique_ptr<Communicator>> direct(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) direct[static_cast<std::size_t>(r)] = direct_world.comm(r);
    run_callback_ranks(world, [&](int r, Delegate&, Communicator& comm) {
      Communicator& plain = *direct[static_cast<std::size_t>(r)];
      for (const auto& c : cases) {
        zt::run_case(comm, c, reference, /*bitwise=*/true, 0);
        const zt::Bytes via_callbacks = perform(comm, c);
        const zt::Bytes via_inproc = perform(plain, c);
        const bool ok =
            via_callbacks.elems() == via_inproc.elems() &&
            std::memcmp(via_callbacks.data(), via_inproc.data(), via_inproc.size_bytes()) == 0;
        same.check(ok, fmt::format("rank {}: {}", r, c.name(world)));
      }
    });
    INFO(reference.report());
    INFO(same.report());
    REQUIRE(reference.failed() == 0);
    REQUIRE(same.failed() == 0);
    // Guard against a vacuous pass: every output element of every case was checked.
    REQUIRE(reference.checks() > static_cast<std::size_t>(world) * 1031 * 40);
    REQUIRE(same.checks() == static_cast<std::size_t>(world) * cases.size());
  }
}

TEST_CASE("callbacks run one at a time in issue order on one thread that is not the caller's") {
  std::vector<std::thread::id> callers(2);
  const auto delegates = run_callback_ranks(2, [&](int r, Delegate&, Communicator& comm) {
    callers[static_cast<std::size_t>(r)] = std::this_thread::get_id();
    std::vector<float> a(8, 1.0f), b(16, 2.0f), c(8);
    std::vector<zero::Work> works;
    works.push_back(comm.all_reduce(a.data(), a.data(), 8, DType::F32, ReduceOp::Sum));
    works.push_back(comm.barrier());
    works.push_back(comm.reduce_scatter(b.data(), c.data(), 8, DType::F32, ReduceOp::Max));
    works.push_back(comm.broadcast(a.data(), 8, DType::F32, 1));
    works.push_back(comm.all_gather_in_place(b.data(), 8, DType::F32));
    for (auto& w : works) w.wait();
  });
  const std::vector<std::string> expected = {"all_reduce", "barrier",    "reduce_scatter",
                                             "broadcast",  "all_gather", "destroy"};
  for (std::size_t r = 0; r < delegates.size(); ++r) {
    const Delegate& d = *delegates[r];
    REQUIRE(d.events == expected);
    REQUIRE(d.threads.size() == 5);
    for (const auto& t : d.threads) REQUIRE(t == d.threads[0]);
    REQUIRE(d.threads[0] != callers[r]);
  }
}

TEST_CASE("a failing callback fails its collective with CommCallbackError naming op and code") {
  InProcWorld inner(1);
  auto inner_comm = inner.comm(0);
  Delegate d;
  d.inner = inner_comm.get();
  d.fail_code[static_cast<int>(Collective::ReduceScatter)] = 3;
  {
    auto comm = zero::make_callback_communicator(table(d));
    std::vector<float> buf(4, 1.0f);
    zero::Work failed = comm->reduce_scatter_in_place(buf.data(), 4, DType::F32, ReduceOp::Sum);
    REQUIRE_THROWS_AS(failed.wait(), zero::CommCallbackError);
    REQUIRE_THROWS_WITH(failed.wait(), Catch::Contains("the reduce_scatter callback returned 3") &&
                                           Catch::Contains("reduce_scatter in place (sum, fp32)"));
    // Later collectives fail too, without reaching the callbacks; the C ABI tells a callback's
    // failure (ZERO_ERR_CALLBACK) from the communicator's own by the type.
    REQUIRE_THROWS_AS(comm->barrier().wait(), zero::CommCallbackError);
    REQUIRE_THROWS_WITH(
        comm->all_reduce(buf.data(), buf.data(), 4, DType::F32, ReduceOp::Sum).wait(),
        Catch::Contains("not run: an earlier collective failed") && Catch::Contains("returned 3"));
  }
  REQUIRE(d.events == std::vector<std::string>{"reduce_scatter", "destroy"});
}

TEST_CASE("each callback's failure names that callback") {
  const std::array<Collective, 5> kinds = {Collective::ReduceScatter, Collective::AllGather,
                                           Collective::AllReduce, Collective::Broadcast,
                                           Collective::Barrier};
  for (Collective kind : kinds) {
    INFO(zero::collective_name(kind));
    InProcWorld inner(1);
    auto inner_comm = inner.comm(0);
    Delegate d;
    d.inner = inner_comm.get();
    d.fail_code[static_cast<int>(kind)] = -7;
    auto comm = zero::make_callback_communicator(table(d));
    std::vector<double> send(2, 1.0), recv(2);
    const zero::CollectiveArgs args{kind,       send.data(),   recv.data(), 2,
                                    DType::F64, ReduceOp::Max, 0,           false};
    REQUIRE_THROWS_WITH(
        comm->start(args).wait(),
        Catch::Contains(fmt::format("the {} callback returned -7", zero::collective_name(kind))));
  }
}

TEST_CASE("destroy is called once, after every issued collective has run") {
  InProcWorld inner(1);
  auto inner_comm = inner.comm(0);
  Delegate d;
  d.inner = inner_comm.get();
  {
    auto comm = zero::make_callback_communicator(table(d));
    std::vector<float> buf(1024, 1.0f);
    comm->all_reduce(buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::Sum);
    comm->barrier();  // neither waited for: the destructor runs them first
  }
  REQUIRE(d.destroy_calls == 1);
  REQUIRE(d.events == std::vector<std::string>{"all_reduce", "barrier", "destroy"});

  zero::CommCallbacks no_destroy = table(d);
  no_destroy.destroy = nullptr;
  zero::make_callback_communicator(no_destroy)->barrier().wait();
  REQUIRE(d.destroy_calls == 1);
}

TEST_CASE("a malformed callback table is rejected and its destroy is not called") {
  InProcWorld inner(1);
  auto inner_comm = inner.comm(0);
  Delegate d;
  d.inner = inner_comm.get();
  zero::CommCallbacks cb = table(d);
  cb.all_gather = nullptr;
  cb.barrier = nullptr;
  REQUIRE_THROWS_WITH(zero::make_callback_communicator(cb),
                      Catch::Contains("null callbacks: all_gather, barrier"));
  cb = table(d);
  cb.rank = 1;
  REQUIRE_THROWS_WITH(zero::make_callback_communicator(cb),
                      Catch::Contains("rank 1 out of range for size 1"));
  cb.rank = 0;
  cb.size = 0;
  REQUIRE_THROWS_AS(zero::make_callback_communicator(cb), zero::Error);
  REQUIRE(d.destroy_calls == 0);
}

TEST_CASE("split gives one-rank groups, and refuses groups the callbacks cannot carry") {
  std::atomic<int> singles{0};
  std::atomic<int> nulls{0};
  run_callback_ranks(3, [&](int r, Delegate&, Communicator& comm) {
    // Rank 1 joins no group; ranks 0 and 2 each form their own.
    auto sub = comm.split(r == 1 ? -1 : r, 0);
    if (sub == nullptr) {
      nulls += r == 1;
      return;
    }
    float x = 2.5f;
    sub->all_reduce(&x, &x, 1, DType::F32, ReduceOp::Sum).wait();
    const bool ok =
        sub->size() == 1 && sub->rank() == 0 && sub->timeout() == comm.timeout() && x == 2.5f;
    singles += ok;
  });
  REQUIRE(singles == 2);
  REQUIRE(nulls == 1);

  std::atomic<int> refused{0};
  run_callback_ranks(3, [&](int r, Delegate&, Communicator& comm) {
    try {
      comm.split(r == 2 ? 5 : 0, -r);
    } catch (const zero::Error& e) {
      if (std::string(e.what()).find("color 0: ranks [0, 1]") != std::string::npos) ++refused;
    }
    // The failed split leaves the communicator usable.
    comm.barrier().wait();
  });
  REQUIRE(refused == 3);
}
