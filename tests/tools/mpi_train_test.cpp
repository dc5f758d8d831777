// zero-train under mpirun (MpiComm, one process per rank) against the same run on in-process ranks
// (InProcComm): stages 0-3, bf16 and fp32, at 2 and 4 ranks. Both backends reduce in rank order
// with the same kernel (16-bit sums in fp32, rounded once), so the dumps are equal bit for bit.
// Two simulated nodes under mpirun run their node level on shared memory and MPI only between
// nodes, again bitwise the in-process run. Exits 77 (skipped) when the build has no mpirun.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "tests/temp_dir.h"
#include "zero/io/safetensors.h"

namespace {

int sh(const std::string& cmd) {
  const int rc = std::system((cmd + " > /dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// What the command printed (stdout and stderr), or "exit N: ..." when it failed.
std::string sh_output(const std::string& cmd, const std::string& file) {
  const int rc = std::system((cmd + " > '" + file + "' 2>&1").c_str());
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  const int status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return status == 0 ? text.str() : "exit " + std::to_string(status) + ": " + text.str();
}

// The largest |a - b| over every tensor of two dumps; *largest gets the largest |a|.
double max_diff(const std::string& a, const std::string& b, std::size_t* tensors, double* largest) {
  const auto ra = zero::io::SafetensorsReader::open(a);
  const auto rb = zero::io::SafetensorsReader::open(b);
  REQUIRE(ra.tensors().size() == rb.tensors().size());
  double m = 0;
  for (const auto& t : ra.tensors()) {
    const std::vector<float> x = ra.read_f32(t.name), y = rb.read_f32(t.name);
    REQUIRE(x.size() == y.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      m = std::max(m, std::fabs(double{x[i]} - y[i]));
      *largest = std::max(*largest, std::fabs(double{x[i]}));
    }
  }
  *tensors = ra.tensors().size();
  return m;
}

}  // namespace

TEST_CASE("zero-train under mpirun equals in-process ranks bit for bit") {
  const zero::test::TempDir dir("zero_mpi_train");
  const std::string train = ZERO_TRAIN_BIN;
  const std::string common = " --steps 4 --seed 3 --model mlp:16,32,4 --threads 1 --quiet";
  for (const char* config : {"fp32_stage2.json", "bf16_stage2_ga2.json"}) {
    for (int stage : {0, 1, 2, 3}) {
      for (int np : {2, 4}) {
        INFO(config << ", stage " << stage << ", " << np << " ranks");
        // The bundled config with the stage replaced.
        const std::string cfg = dir / "c.json";
        {
          std::ifstream src(std::string(ZERO_TEST_DATA_DIR) + "/train/" + config);
          std::stringstream text;
          text << src.rdbuf();
          const std::string replaced = std::regex_replace(
              text.str(), std::regex("\"stage\": *[0-9]"), "\"stage\": " + std::to_string(stage));
          REQUIRE(replaced.find("\"stage\": " + std::to_string(stage)) != std::string::npos);
          std::ofstream(cfg) << replaced;
        }
        const std::string in = dir / "in.st", mpi = dir / "mpi.st";
        REQUIRE(sh("'" + train + "' --config '" + cfg + "' --world-size " + std::to_string(np) +
                   common + " --dump-params '" + in + "'") == 0);
        REQUIRE(sh(std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 '") +
                   ZERO_MPIEXEC + "' --oversubscribe -np " + std::to_string(np) + " '" + train +
                   "' --comm mpi --config '" + cfg + "'" + common + " --dump-params '" + mpi +
                   "'") == 0);
        std::size_t tensors = 0;
        double largest = 0;
        CHECK(max_diff(in, mpi, &tensors, &largest) == 0.0);
        CHECK(tensors == 4);
        CHECK(largest > 0.0);  // the weights are not all zero
      }
    }
  }
}

TEST_CASE("two nodes under mpirun: the node level on shared memory, bitwise in-process ranks") {
  const zero::test::TempDir dir("zero_mpi_nodes");
  const std::string train = ZERO_TRAIN_BIN;
  const std::string common =
      " --steps 4 --seed 3 --model mlp:16,32,32,4 --threads 1 --ranks-per-node 2 --regather";
  for (const char* config : {"fp32_stage3_regather.json", "fp32_stage3_hpz_regather.json"}) {
    INFO(config);
    const std::string cfg = std::string(ZERO_TEST_DATA_DIR) + "/train/" + config;
    const std::string in = dir / "in.st", mpi = dir / "mpi.st";
    REQUIRE(sh("'" + train + "' --config '" + cfg + "' --world-size 4 --quiet" + common +
               " --dump-params '" + in + "'") == 0);
    // Only TCP between processes: without the shared-memory node level, a node's ranks would
    // talk over TCP too.
    const std::string out = sh_output(
        std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 '") +
            ZERO_MPIEXEC + "' --oversubscribe --mca btl tcp,self -np 4 '" + train +
            "' --comm mpi --config '" + cfg + "'" + common + " --dump-params '" + mpi + "'",
        dir / "mpi.log");
    INFO(out);
    REQUIRE(out.find("exit ") != 0);
    CHECK(out.find("hierarchical(shm/mpi, 2 nodes x 2 ranks)") != std::string::npos);
    std::size_t tensors = 0;
    double largest = 0;
    CHECK(max_diff(in, mpi, &tensors, &largest) == 0.0);
    CHECK(tensors == 6);
    CHECK(largest > 0.0);
  }
}
