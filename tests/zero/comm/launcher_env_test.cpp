// read_launcher_env and make_env_communicator: what each launcher's variables give, and errors
// that say which variables are missing or wrong.
#include "zero/comm/launcher_env.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/zero/comm/forked_ranks.h"
#include "zero/base/error.h"
#include "zero/comm/communicator.h"
#include "zero/comm/shm_comm.h"

using zero::Launcher;
using zero::LauncherEnv;
namespace zt = zero::test;

namespace {

using Vars = std::map<std::string, std::string>;

LauncherEnv read(const Vars& vars) {
  return zero::read_launcher_env([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const Vars& vars) {
  try {
    read(vars);
  } catch (const zero::Error& e) {
    return e.what();
  }
  return "no error";
}

const std::vector<const char*> kAllVariables = {"RANK",
                                                "WORLD_SIZE",
                                                "LOCAL_RANK",
                                                "LOCAL_WORLD_SIZE",
                                                "MASTER_ADDR",
                                                "MASTER_PORT",
                                                "TORCHELASTIC_RUN_ID",
                                                "OMPI_COMM_WORLD_RANK",
                                                "OMPI_COMM_WORLD_SIZE",
                                                "OMPI_COMM_WORLD_LOCAL_RANK",
                                                "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                "PMI_RANK",
                                                "PMI_SIZE",
                                                "MPI_LOCALRANKID",
                                                "MPI_LOCALNRANKS",
                                                "OMPI_MCA_ess_base_jobid",
                                                "PMIX_RANK"};

// Sets `vars` in the process environment (every other launcher variable unset) for its
// lifetime, and restores what was there.
class ScopedEnv {
 public:
  explicit ScopedEnv(const Vars& vars) {
    for (const char* name : kAllVariables) {
      if (const char* v = ::getenv(name)) saved_[name] = v;
      ::unsetenv(name);
    }
    for (const auto& [name, value] : vars) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const char* name : kAllVariables) ::unsetenv(name);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  Vars saved_;
};

// `vars` with one variable set to `value`.
Vars with(Vars vars, const std::string& name, const std::string& value) {
  vars.insert_or_assign(name, value);
  return vars;
}

const Vars kTorchrun = {{"RANK", "1"},
                        {"WORLD_SIZE", "4"},
                        {"LOCAL_RANK", "1"},
                        {"LOCAL_WORLD_SIZE", "4"},
                        {"MASTER_ADDR", "127.0.0.1"},
                        {"MASTER_PORT", "29500"},
                        {"TORCHELASTIC_RUN_ID", "job-7"}};

}  // namespace

TEST_CASE("read_launcher_env reads torchrun, mpirun and PMI variables") {
  const LauncherEnv none = read({});
  REQUIRE(none.launcher == Launcher::None);
  REQUIRE(none.world_size == 1);
  REQUIRE(none.single_host());

  const LauncherEnv t = read(kTorchrun);
  REQUIRE(t.launcher == Launcher::Torchrun);
  REQUIRE(t.rank == 1);
  REQUIRE(t.world_size == 4);
  REQUIRE(t.local_rank == 1);
  REQUIRE(t.local_world_size == 4);
  REQUIRE(t.master_addr == "127.0.0.1");
  REQUIRE(t.master_port == 29500);
  REQUIRE(t.run_id == "job-7");
  REQUIRE(t.single_host());

  REQUIRE_FALSE(read(with(kTorchrun, "LOCAL_WORLD_SIZE", "2")).single_host());
  const Vars no_local = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "1234"}};
  REQUIRE(read(no_local).single_host());  // MASTER_ADDR names this host
  REQUIRE_FALSE(read(with(no_local, "MASTER_ADDR", "10.1.2.3")).single_host());

  const LauncherEnv o = read({{"OMPI_COMM_WORLD_RANK", "2"},
                              {"OMPI_COMM_WORLD_SIZE", "3"},
                              {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  REQUIRE(o.launcher == Launcher::OpenMpi);
  REQUIRE(o.rank == 2);
  REQUIRE(o.world_size == 3);
  REQUIRE(o.single_host());

  const LauncherEnv p = read({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}});
  REQUIRE(p.launcher == Launcher::Pmi);
  REQUIRE(p.world_size == 2);
  REQUIRE_FALSE(p.single_host());  // no local size: cannot know
}

TEST_CASE("read_launcher_env names exactly the variables missing from a partial set") {
  REQUIRE(error_of({{"RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"}}) ==
          "RANK=1, MASTER_ADDR=10.0.0.1 are set but WORLD_SIZE, MASTER_PORT are not: launch with "
          "torchrun (which sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and "
          "MASTER_PORT), or unset RANK");
  REQUIRE(error_of({{"RANK", "1"}}) ==
          "RANK=1 is set but WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not: launch with torchrun "
          "(which sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and "
          "MASTER_PORT), or unset RANK");
  const std::string local_only = error_of({{"LOCAL_RANK", "0"}, {"WORLD_SIZE", "2"}});
  REQUIRE_THAT(local_only, Catch::StartsWith("WORLD_SIZE=2, LOCAL_RANK=0 are set but RANK, "
                                             "MASTER_ADDR, MASTER_PORT are not"));
  REQUIRE_THAT(local_only, Catch::EndsWith("or unset WORLD_SIZE, LOCAL_RANK"));
  REQUIRE_THAT(error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
               Catch::StartsWith("OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_SIZE=2 are set but "
                                 "OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE are not"));
  REQUIRE_THAT(error_of({{"PMI_SIZE", "2"}}),
               Catch::StartsWith("PMI_SIZE=2 is set but PMI_RANK is not"));
  // MASTER_ADDR/MASTER_PORT alone do not make a launch.
  REQUIRE(read({{"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}}).launcher == Launcher::None);
}

TEST_CASE("read_launcher_env reports every value that does not parse or is out of range") {
  const Vars bad =
      with(with(with(kTorchrun, "RANK", "4"), "LOCAL_RANK", "one"), "MASTER_PORT", "70000");
  const std::string msg = error_of(bad);
  INFO(msg);
  REQUIRE_THAT(msg, Catch::StartsWith("launcher environment (torchrun): "));
  REQUIRE_THAT(msg, Catch::Contains("RANK=4 is out of range for WORLD_SIZE=4"));
  REQUIRE_THAT(msg, Catch::Contains("LOCAL_RANK=one is not an integer"));
  REQUIRE_THAT(msg, Catch::Contains("MASTER_PORT=70000 is out of range (1 to 65535)"));

  REQUIRE_THAT(
      error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}),
      Catch::Contains("WORLD_SIZE=0 is out of range (at least 1)"));
  REQUIRE_THAT(
      error_of({{"RANK", "0"}, {"WORLD_SIZE", "2x"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}),
      Catch::Contains("WORLD_SIZE=2x is not an integer"));
  REQUIRE_THAT(error_of(with(kTorchrun, "LOCAL_WORLD_SIZE", "5")),
               Catch::Contains("LOCAL_WORLD_SIZE=5 is out of range (1 to WORLD_SIZE=4)"));
}

TEST_CASE("read_launcher_env reads the process environment") {
  {
    ScopedEnv env({{"RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"}});
    REQUIRE_THROWS_WITH(zero::read_launcher_env(),
                        Catch::StartsWith("RANK=1, MASTER_ADDR=10.0.0.1 are set but WORLD_SIZE, "
                                          "MASTER_PORT are not"));
  }
  {
    ScopedEnv env(kTorchrun);
    REQUIRE(zero::read_launcher_env().rank == 1);
  }
  ScopedEnv env({});
  REQUIRE(zero::read_launcher_env().launcher == Launcher::None);
}

TEST_CASE("make_env_communicator without a launcher gives one in-process rank") {
  ScopedEnv env({});
  auto comm = zero::make_env_communicator();
  REQUIRE(comm->size() == 1);
  REQUIRE(comm->rank() == 0);
  REQUIRE(comm->backend_name() == "inproc");
  float x = 2;
  comm->all_reduce(&x, &x, 1, zero::DType::F32, zero::ReduceOp::Sum).wait();
  REQUIRE(x == 2);
  REQUIRE(zero::make_communicator("shm")->size() == 1);
  REQUIRE(zero::make_communicator("env")->size() == 1);
  REQUIRE(zero::communicator_available("shm"));
  REQUIRE(zero::communicator_available("env"));
}

TEST_CASE("make_env_communicator refuses torchrun across hosts before any communication") {
  ScopedEnv env(with(kTorchrun, "LOCAL_WORLD_SIZE", "2"));
  REQUIRE_THROWS_WITH(zero::make_env_communicator(),
                      Catch::Contains("torchrun started 4 ranks on several hosts") &&
                          Catch::Contains("no communicator between hosts"));
}

TEST_CASE("make_env_communicator under torchrun-like variables gives a working ShmComm world") {
  constexpr int kWorld = 3;
  const std::string port = std::to_string(20000 + ::getpid() % 20000);
  zt::SharedRegion shared(kWorld * sizeof(float));
  auto* sums = reinterpret_cast<float*>(shared.data());
  zt::ForkedRanks ranks(kWorld, [&](int r) {
    // Each worker's own environment, as torchrun gives it; they share this test as parent.
    ScopedEnv env({{"RANK", std::to_string(r)},
                   {"WORLD_SIZE", std::to_string(kWorld)},
                   {"LOCAL_RANK", std::to_string(r)},
                   {"LOCAL_WORLD_SIZE", std::to_string(kWorld)},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", port}});
    auto comm = zero::make_communicator("env", zero::CommOptions{std::chrono::seconds(20)});
    if (comm->backend_name() != "shm" || comm->rank() != r || comm->size() != kWorld) {
      throw std::runtime_error("not the expected ShmComm rank");
    }
    float x = static_cast<float>(r + 1);
    comm->all_reduce(&x, &x, 1, zero::DType::F32, zero::ReduceOp::Sum).wait();
    sums[r] = x;
  });
  for (const auto& o : ranks.wait()) {
    INFO(o.error);
    REQUIRE(o.exit_code == 0);
  }
  REQUIRE(std::vector<float>(sums, sums + kWorld) == std::vector<float>{6, 6, 6});
  // The workers' segment is named after their parent, this process.
  for (const auto& f : zt::shm_files_with_prefix("zero-torchrun-")) {
    REQUIRE(f.find(fmt::format("-{}-", ::getpid())) == std::string::npos);
  }
}
