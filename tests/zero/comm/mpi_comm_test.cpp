// Runs under `mpirun -np N` (registered for N = 2 and 4): every process is one rank.
#include "zero/comm/mpi_comm.h"

#include <catch2/catch.hpp>
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

// MPI sums in its own order, so results match the rank-order reference within rounding: a few
// fp32 ulps, then at most one ulp of the 16-bit type after the single rounding.
double tolerance(DType t) {
  switch (t) {
    case DType::F32: return 1e-5;
    case DType::F64: return 1e-12;
    case DType::BF16: return 1.0 / 64;
    case DType::F16: return 1.0 / 512;
  }
  return 0;
}

Communicator& world() {
  static auto comm = zero::MpiComm::world();
  return *comm;
}

}  // namespace

TEST_CASE("MpiComm collectives match the rank-order reference within rounding") {
  Communicator& comm = world();
  INFO("rank " << comm.rank() << " of " << comm.size());
  REQUIRE(comm.size() >= 2);
  zt::Tally tally;
  for (const auto& c : zt::all_cases(comm.size(), {0, 1, 7, 1031, 65537})) {
    zt::run_case(comm, c, tally, /*bitwise=*/false, tolerance(c.dtype));
  }
  INFO(tally.report());
  REQUIRE(tally.failed() == 0);
  REQUIRE(tally.checks() > std::size_t{65537} * 40);  // this rank checked every output element
}

TEST_CASE("MpiComm fp32 sums of 2 ranks equal InProcComm's bit for bit") {
  Communicator& comm = world();
  if (comm.size() != 2) return;  // with more ranks MPI's order may differ
  zt::Tally tally;
  for (const auto& c : zt::all_cases(2, {1031})) {
    if (c.dtype == DType::F32 && c.op != ReduceOp::Avg) zt::run_case(comm, c, tally, true, 0);
  }
  INFO(tally.report());
  REQUIRE(tally.failed() == 0);
  REQUIRE(tally.checks() > 1031 * 4);
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
  // Rank 0's timed-out request stays posted until MPI completes it in the background, so its
  // buffer must outlive this test: deliberately leaked.
  auto& v = *new std::vector<float>(10, 1.0f);
  if (comm.rank() == 0) {
    try {
      sub->all_reduce(v.data(), v.data(), v.size(), DType::F32, ReduceOp::Sum).wait();
      FAIL("expected CommError");
    } catch (const CommError& e) {
      const std::string msg = e.what();
      INFO(msg);
      REQUIRE(msg.find("all_reduce (sum, fp32) of 10 elements, 40 bytes") != std::string::npos);
      REQUIRE(msg.find("did not complete within 500 ms") != std::string::npos);
      REQUIRE(msg.find("MPI does not report which ranks have arrived") != std::string::npos);
    }
    REQUIRE_THROWS_WITH(sub->barrier(), Catch::Contains("unusable after an earlier failure"));
  }
  // The late ranks join now, so nothing is left pending at MPI_Finalize.
  comm.barrier().wait();
  if (comm.rank() != 0)
    sub->all_reduce(v.data(), v.data(), v.size(), DType::F32, ReduceOp::Sum).wait();
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
