// Runs under `mpirun -np N` (registered for N = 2 and 4): every process is one rank.
#include "zero/comm/mpi_comm.h"

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <chrono>
#include <string>
#include <vector>

#include "tests/zero/comm/comm_test_util.h"
#include "zero/base/error.h"
#include "zero/comm/communicator.h"

using namespace std::chrono_literals;
using zero::CommError;
using zero::Communicator;
using zero::DType;
using zero::ReduceOp;
namespace zt = zero::test;

namespace {

Communicator& world() {
  static auto comm = zero::MpiComm::world();
  return *comm;
}

}  // namespace

TEST_CASE("MpiComm collectives equal the rank-order reference bit for bit") {
  // Reductions travel as point-to-point parts and are summed here in rank order, as InProcComm
  // sums them, so every world size, dtype and op matches exactly (16-bit sums in fp32, rounded
  // once).
  Communicator& comm = world();
  INFO("rank " << comm.rank() << " of " << comm.size());
  REQUIRE(comm.size() >= 2);
  zt::Tally tally;
  for (const auto& c : zt::all_cases(comm.size(), {0, 1, 7, 1031, 65537})) {
    zt::run_case(comm, c, tally, /*bitwise=*/true, 0);
  }
  INFO(tally.report());
  REQUIRE(tally.failed() == 0);
  REQUIRE(tally.checks() > std::size_t{65537} * 40);  // this rank checked every output element
}

TEST_CASE("MpiComm keeps collectives apart when an all_reduce's second round is posted late") {
  // Two all_reduces and a reduce_scatter in flight at once, waited in reverse order: the first
  // all_reduce posts its gather round only when polled, after the later ops posted theirs.
  Communicator& comm = world();
  const int n = comm.size();
  const std::size_t elems = 4099;
  std::vector<float> a(elems), b(elems), rs(elems * static_cast<std::size_t>(n));
  std::vector<float> rs_out(elems);
  for (std::size_t i = 0; i < elems; ++i) {
    a[i] = static_cast<float>(comm.rank() + 1) * 0.5f + static_cast<float>(i);
    b[i] = -static_cast<float>(comm.rank() + 1) * static_cast<float>(i % 13);
  }
  for (std::size_t i = 0; i < rs.size(); ++i) rs[i] = static_cast<float>(i % 97 + comm.rank());
  auto wa = comm.all_reduce(a.data(), a.data(), elems, DType::F32, ReduceOp::Sum);
  auto wb = comm.all_reduce(b.data(), b.data(), elems, DType::F32, ReduceOp::Sum);
  auto wr = comm.reduce_scatter(rs.data(), rs_out.data(), elems, DType::F32, ReduceOp::Sum);
  wr.wait();
  wb.wait();
  wa.wait();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < elems; ++i) {
    float ea = 0, eb = 0, er = 0;
    for (int q = 0; q < n; ++q) {
      ea += static_cast<float>(q + 1) * 0.5f + static_cast<float>(i);
      eb += -static_cast<float>(q + 1) * static_cast<float>(i % 13);
      const std::size_t at = static_cast<std::size_t>(comm.rank()) * elems + i;
      er += static_cast<float>(at % 97 + static_cast<std::size_t>(q));
    }
    wrong += (a[i] != ea) + (b[i] != eb) + (rs_out[i] != er);
    REQUIRE(ea != 0.0f);  // guards against a vacuous pass
  }
  REQUIRE(wrong == 0);
}

TEST_CASE("MpiComm split groups ranks by color and key") {
  Communicator& comm = world();
  const int r = comm.rank();
  auto sub = comm.split(r % 2, -r);
  REQUIRE(sub);
  const int members = (comm.size() - r % 2 + 1) / 2;
  REQUIRE(sub->size() == members);
  REQUIRE(sub->rank() == members - 1 - r / 2);
  double x = r;
  sub->all_reduce(&x, &x, 1, DType::F64, ReduceOp::Sum).wait();
  double expected = 0;
  for (int q = r % 2; q < comm.size(); q += 2) expected += q;
  REQUIRE(x == expected);
  REQUIRE(comm.split(-1, 0) == nullptr);
}

TEST_CASE("MpiComm agreement check names the rank that differs") {
  Communicator& comm = world();
  zero::check_agreement(comm, "config", "stage 2");
  const std::string value = comm.rank() == 1 ? "layout B" : "layout A";
  try {
    zero::check_agreement(comm, "layout", value);
    FAIL("expected CommError");
  } catch (const CommError& e) {
    INFO(e.what());
    REQUIRE(std::string(e.what()).find("ranks [1] differ from rank 0") != std::string::npos);
  }
}

TEST_CASE("MpiComm collective that peers do not join times out with CommError naming op and size") {
  Communicator& comm = world();
  auto sub = comm.split(0, comm.rank());
  sub->set_timeout(500ms);
  // Rank 0's timed-out receives stay posted until the late ranks' messages arrive, so its buffer
  // must outlive this test: deliberately leaked. A reduce_scatter is one round of messages, so
  // the late ranks can complete it without rank 0 polling again.
  const auto n = static_cast<std::size_t>(comm.size());
  auto& v = *new std::vector<float>(10 * n, 1.0f);
  const std::string expected =
      fmt::format("reduce_scatter in place (sum, fp32) of {} x 10 elements, {} bytes", n, 40 * n);
  if (comm.rank() == 0) {
    try {
      sub->reduce_scatter_in_place(v.data(), 10, DType::F32, ReduceOp::Sum).wait();
      FAIL("expected CommError");
    } catch (const CommError& e) {
      const std::string msg = e.what();
      INFO(msg);
      REQUIRE(msg.find(expected) != std::string::npos);
      REQUIRE(msg.find("did not complete within 500 ms") != std::string::npos);
      REQUIRE(msg.find("MPI does not report which ranks have arrived") != std::string::npos);
    }
    REQUIRE_THROWS_WITH(sub->barrier(), Catch::Contains("unusable after an earlier failure"));
  }
  // The late ranks join now, so nothing is left pending at MPI_Finalize.
  comm.barrier().wait();
  if (comm.rank() != 0) sub->reduce_scatter_in_place(v.data(), 10, DType::F32, ReduceOp::Sum).wait();
  comm.barrier().wait();
}

TEST_CASE("make_communicator builds the MPI world communicator") {
  REQUIRE(zero::communicator_available("mpi"));
  auto comm = zero::make_communicator("mpi");
  REQUIRE(comm->backend_name() == "mpi");
  REQUIRE(comm->size() == world().size());
  REQUIRE(comm->rank() == world().rank());
  comm->barrier().wait();
}
