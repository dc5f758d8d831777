// HierarchicalComm: two-level collectives on simulated nodes of in-process ranks against a
// reference that sums node by node, the byte counts by level, the topology's sources and errors,
// and failures that end every rank instead of hanging.
#include "zero/comm/hierarchical_comm.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/quantize.h"
#include "tests/zero/comm/comm_test_util.h"
#include "zero/base/error.h"
#include "zero/comm/communicator.h"
#include "zero/comm/inproc_comm.h"
#include "zero/comm/node_topology.h"

using namespace std::chrono_literals;
using zero::Collective;
using zero::CommError;
using zero::CommOptions;
using zero::Communicator;
using zero::DType;
using zero::HierarchicalComm;
using zero::NodeTopology;
using zero::ReduceOp;
using zero::run_ranks;
namespace zt = zero::test;

namespace {

NodeTopology topology(int world, int per_node) {
  return zero::resolve_node_topology(world, per_node, [](const char*) { return nullptr; });
}

// The two-level order: the ranks of each node in local order, then the nodes in order; in fp32
// for fp32 and 16-bit types (rounded once by the caller's set()), fp64 for fp64.
zt::ReferenceReduce node_by_node(int per_node) {
  return [per_node](const std::vector<zt::Bytes>& inputs, std::size_t i, DType t, ReduceOp op) {
    const int world = static_cast<int>(inputs.size());
    auto combine = [op](auto acc, auto x) {
      return op == ReduceOp::Max ? std::max(acc, x) : acc + x;
    };
    if (t == DType::F64) {
      double total = 0;
      for (int node = 0; node * per_node < world; ++node) {
        double acc = inputs[static_cast<std::size_t>(node * per_node)].get(i);
        for (int l = 1; l < per_node; ++l) acc = combine(acc, inputs[node * per_node + l].get(i));
        total = node == 0 ? acc : combine(total, acc);
      }
      return op == ReduceOp::Avg ? total / world : total;
    }
    float total = 0;
    for (int node = 0; node * per_node < world; ++node) {
      auto acc = static_cast<float>(inputs[static_cast<std::size_t>(node * per_node)].get(i));
      for (int l = 1; l < per_node; ++l)
        acc = combine(acc, static_cast<float>(inputs[node * per_node + l].get(i)));
      total = node == 0 ? acc : combine(total, acc);
    }
    return static_cast<double>(op == ReduceOp::Avg ? total / static_cast<float>(world) : total);
  };
}

}  // namespace

TEST_CASE(
    "two-level collectives on 4 and 6 ranks as 2 and 3 nodes match a node-by-node "
    "reference bit for bit") {
  const std::vector<std::size_t> sizes = {0, 1, 7, 1031};
  for (const auto& [world, per_node] :
       {std::pair{4, 2}, std::pair{6, 2}, std::pair{6, 3}, std::pair{8, 4}}) {
    const auto cases = zt::all_cases(world, sizes);
    INFO("world " << world << " as " << world / per_node << " nodes of " << per_node);
    zt::Tally tally;
    std::vector<std::string> names(static_cast<std::size_t>(world));
    run_ranks(world, [&](Communicator& comm) {
      auto nodes = HierarchicalComm::create(comm, topology(world, per_node));
      names[static_cast<std::size_t>(comm.rank())] = nodes->backend_name();
      for (const auto& c : cases)
        zt::run_case(*nodes, c, tally, /*bitwise=*/true, 0, node_by_node(per_node));
      // The group still works after every case, and keeps issue order with back-to-back ops.
      float a = 1, b = 2;
      auto w1 = nodes->all_reduce(&a, &a, 1, DType::F32, ReduceOp::Sum);
      auto w2 = nodes->all_reduce(&b, &b, 1, DType::F32, ReduceOp::Sum);
      w2.wait();
      w1.wait();
      tally.check(a == static_cast<float>(world) && b == 2.0f * static_cast<float>(world),
                  "back-to-back all_reduce");
    });
    INFO(tally.report());
    REQUIRE(tally.failed() == 0);
    // Guard against a vacuous pass: every rank checked every element of every case.
    REQUIRE(tally.checks() > static_cast<std::size_t>(world) * 1031 * 40);
    REQUIRE(names[0].find("hierarchical(inproc/inproc") == 0);
  }
}

TEST_CASE(
    "two-level sums differ from the flat world's order, so the reference above is not "
    "the flat one") {
  // Guards the bitwise test: with these inputs the node-by-node and the rank-order sums differ.
  std::vector<zt::Bytes> inputs;
  for (int q = 0; q < 4; ++q) inputs.push_back(zt::make_input(77, DType::F32, q, 4096));
  std::size_t differ = 0;
  for (std::size_t i = 0; i < 4096; ++i) {
    differ += node_by_node(2)(inputs, i, DType::F32, ReduceOp::Sum) !=
              zt::reference_reduce(inputs, i, DType::F32, ReduceOp::Sum);
  }
  REQUIRE(differ > 100);
}

TEST_CASE(
    "one node or one rank per node forwards to the world: the world's bits, counted on "
    "one level") {
  const std::vector<std::size_t> sizes = {1, 1031};
  for (const int per_node : {1, 4}) {
    const auto cases = zt::all_cases(4, sizes);
    zt::Tally tally;
    std::vector<zero::NodeTraffic> traffic(4);
    run_ranks(4, [&](Communicator& comm) {
      auto nodes = HierarchicalComm::create(comm, topology(4, per_node));
      tally.check(
          !nodes->two_level() && nodes->backend_name() == "inproc" && nodes->shares_address_space(),
          "forwarding mode");
      for (const auto& c : cases) zt::run_case(*nodes, c, tally, /*bitwise=*/true, 0);
      traffic[static_cast<std::size_t>(comm.rank())] = nodes->traffic();
    });
    INFO(tally.report());
    REQUIRE(tally.failed() == 0);
    REQUIRE(tally.checks() > 4 * 1031 * 20);
    for (const auto& t : traffic) {
      REQUIRE((per_node == 4 ? t.intra_bytes : t.inter_bytes) > 0);
      REQUIRE((per_node == 4 ? t.inter_bytes : t.intra_bytes) == 0);
    }
  }
}

TEST_CASE("bytes are counted by level as a ring sends them") {
  // 4 ranks as 2 nodes of 2 (L = 2, N = 2); fp32, 12 elements per rank chunk.
  constexpr std::size_t c = 12;
  std::vector<zero::NodeTraffic> rs(4), ag(4), ar(4), bc(4);
  run_ranks(4, [&](Communicator& comm) {
    auto nodes = HierarchicalComm::create(comm, topology(4, 2));
    const auto me = static_cast<std::size_t>(comm.rank());
    std::vector<float> buf(4 * c, 1.0f), out(4 * c);
    nodes->reduce_scatter(buf.data(), out.data(), c, DType::F32, ReduceOp::Sum).wait();
    rs[me] = nodes->traffic();
    nodes->all_gather(buf.data(), out.data(), c, DType::F32).wait();
    ag[me] = nodes->traffic();
    nodes->all_reduce(buf.data(), out.data(), 4 * c, DType::F32, ReduceOp::Sum).wait();
    ar[me] = nodes->traffic();
    nodes->broadcast(buf.data(), 4 * c, DType::F32, 1).wait();
    bc[me] = nodes->traffic();
  });
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    // reduce_scatter: inside the node (L−1)·N·c, across (N−1)·c elements.
    REQUIRE(rs[r].intra_bytes == 1 * 2 * c * 4);
    REQUIRE(rs[r].inter_bytes == 1 * c * 4);
    // all_gather: across (N−1)·c first, then inside (L−1)·N·c.
    REQUIRE(ag[r].intra_bytes - rs[r].intra_bytes == 1 * 2 * c * 4);
    REQUIRE(ag[r].inter_bytes - rs[r].inter_bytes == 1 * c * 4);
    // all_reduce of 4c: a reduce-scatter and an all-gather of 2c-element blocks inside the node,
    // an all-reduce of a 2c block across: 2·(N−1)/N·2c.
    REQUIRE(ar[r].intra_bytes - ag[r].intra_bytes == 2 * (2 * c) * 4);
    REQUIRE(ar[r].inter_bytes - ag[r].inter_bytes == 2 * (2 * c) * 4 / 2);
    // broadcast from rank 1 (local 1 of node 0): rank 1 sends across, then each node's local 1
    // sends inside.
    const std::uint64_t across = r == 1 ? 4 * c * 4 : 0;
    const std::uint64_t inside = r % 2 == 1 ? 4 * c * 4 : 0;
    REQUIRE(bc[r].inter_bytes - ar[r].inter_bytes == across);
    REQUIRE(bc[r].intra_bytes - ar[r].intra_bytes == inside);
  }
}

TEST_CASE(
    "the topology comes from the flag, ZERO_RANKS_PER_NODE or the launcher, and bad "
    "values name the fix") {
  std::map<std::string, std::string> env;
  auto lookup = [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto t = zero::resolve_node_topology(8, std::nullopt, lookup);
  REQUIRE(t.single_node());
  REQUIRE(t.source == "one node");
  env["LOCAL_WORLD_SIZE"] = "2";
  env["LOCAL_RANK"] = "1";
  t = zero::resolve_node_topology(8, std::nullopt, lookup);
  REQUIRE(t.ranks_per_node == 2);
  REQUIRE(t.nodes() == 4);
  REQUIRE(t.source == "LOCAL_WORLD_SIZE");
  REQUIRE(t.launcher_local_rank == 1);
  REQUIRE(t.node_of(5) == 2);
  REQUIRE(t.local_of(5) == 1);
  REQUIRE_FALSE(zero::simulated_nodes_requested(lookup));  // a launcher's world is no simulation
  env["ZERO_RANKS_PER_NODE"] = "";
  REQUIRE_FALSE(zero::simulated_nodes_requested(lookup));
  REQUIRE(zero::resolve_node_topology(8, std::nullopt, lookup).source == "LOCAL_WORLD_SIZE");
  env["ZERO_RANKS_PER_NODE"] = "4";
  REQUIRE(zero::simulated_nodes_requested(lookup));
  t = zero::resolve_node_topology(8, std::nullopt, lookup);
  REQUIRE(t.ranks_per_node == 4);
  REQUIRE(t.source == "ZERO_RANKS_PER_NODE");
  REQUIRE_FALSE(t.launcher_local_rank);
  t = zero::resolve_node_topology(8, 8, lookup);
  REQUIRE(t.single_node());
  REQUIRE(t.source == "--ranks-per-node");
  // A launcher whose local world is the whole world: one node.
  env.erase("ZERO_RANKS_PER_NODE");
  env["LOCAL_WORLD_SIZE"] = "8";
  REQUIRE(zero::resolve_node_topology(8, std::nullopt, lookup).single_node());

  REQUIRE_THROWS_WITH(zero::resolve_node_topology(4, 3, lookup),
                      "--ranks-per-node 3 does not divide the world size 4: nodes hold equal, "
                      "contiguous blocks of ranks; use one of 1, 2, 4");
  env["ZERO_RANKS_PER_NODE"] = "5";
  REQUIRE_THROWS_WITH(zero::resolve_node_topology(6, std::nullopt, lookup),
                      Catch::Contains("ZERO_RANKS_PER_NODE=5 does not divide the world size 6") &&
                          Catch::Contains("1, 2, 3, 6"));
  env["ZERO_RANKS_PER_NODE"] = "two";
  REQUIRE_THROWS_WITH(zero::resolve_node_topology(6, std::nullopt, lookup),
                      Catch::Contains("ZERO_RANKS_PER_NODE=two: not a positive integer"));
  REQUIRE_THROWS_WITH(zero::resolve_node_topology(4, 0, lookup),
                      Catch::Contains("--ranks-per-node 0 does not divide"));
}

TEST_CASE("a launcher that placed ranks round-robin is refused on every rank, naming the rank") {
  std::vector<std::string> errors(4);
  run_ranks(4, [&](Communicator& comm) {
    NodeTopology t = topology(4, 2);
    t.source = "OMPI_COMM_WORLD_LOCAL_SIZE";
    t.launcher_local_rank = comm.rank() / 2;  // --map-by node: ranks 0, 2 on host 0
    try {
      HierarchicalComm::create(comm, t);
    } catch (const CommError& e) {
      errors[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  for (const auto& e : errors) {
    INFO(e);
    REQUIRE(e.find("OMPI_COMM_WORLD_LOCAL_SIZE=2 says rank 1 is not local rank 1 of node 0") !=
            std::string::npos);
    REQUIRE(e.find("--map-by slot") != std::string::npos);
  }
}

TEST_CASE(
    "a rank lost before a two-level collective ends every rank with an error, not a "
    "hang, and later collectives fail at once") {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> errors(4);
  std::vector<std::string> later(4);
  try {
    run_ranks(
        4,
        [&](Communicator& comm) {
          auto nodes = HierarchicalComm::create(comm, topology(4, 2));
          const auto me = static_cast<std::size_t>(comm.rank());
          if (comm.rank() == 3) throw std::runtime_error("rank 3 lost");
          std::vector<float> v(64, 1.0f);
          try {
            nodes->all_reduce(v.data(), v.data(), v.size(), DType::F32, ReduceOp::Sum).wait();
          } catch (const CommError& e) {
            errors[me] = e.what();
          }
          try {
            nodes->barrier().wait();
          } catch (const CommError& e) {
            later[me] = e.what();
          }
        },
        CommOptions{20s});
    FAIL("expected rank 3's error");
  } catch (const std::runtime_error& e) {
    REQUIRE(std::string(e.what()) == "rank 3 lost");
  }
  REQUIRE(std::chrono::steady_clock::now() - start < 15s);  // the abort, not the 20 s timeout
  for (std::size_t r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << errors[r] << " / " << later[r]);
    REQUIRE(errors[r].find("all_reduce (sum, fp32) of 64 elements") != std::string::npos);
    REQUIRE(errors[r].find("2 nodes x 2 ranks") != std::string::npos);
    REQUIRE(later[r].find("an earlier collective failed") != std::string::npos);
  }
}

TEST_CASE(
    "split keeps the topology: node groups count inside, groups across nodes count across "
    "or run in two levels, and the parent's counts include them") {
  struct Seen {
    bool two_level = false;
    int size = 0;
    zero::NodeTraffic before, after;
    float sum = 0;
  };
  // 8 ranks as 4 nodes of 2.
  std::vector<std::map<std::string, Seen>> seen(8);
  run_ranks(8, [&](Communicator& comm) {
    auto nodes = HierarchicalComm::create(comm, topology(8, 2));
    const int r = comm.rank();
    auto& mine = seen[static_cast<std::size_t>(r)];
    auto probe = [&](const std::string& name, int color, int key) {
      auto group = nodes->split(color, key);
      auto* h = dynamic_cast<HierarchicalComm*>(group.get());
      Seen s;
      s.two_level = h != nullptr && h->two_level();
      s.size = group->size();
      s.before = nodes->traffic();
      std::vector<float> v(64, static_cast<float>(r + 1));
      group->all_reduce(v.data(), v.data(), v.size(), DType::F32, ReduceOp::Sum).wait();
      s.after = nodes->traffic();
      s.sum = v[0];
      mine[name] = s;
    };
    probe("node", r / 2, r % 2);                             // {0,1}, {2,3}, ...: inside a node
    probe("across", r % 2, r / 2);                           // {0,2,4,6}: one per node
    probe("two nodes", r / 4, r % 4);                        // {0,1,2,3}: 2 nodes of 2
    probe("interleaved", r / 4, (r % 2) * 2 + (r % 4) / 2);  // 0,2,1,3: not blocks
  });
  for (int r = 0; r < 8; ++r) {
    INFO("rank " << r);
    const auto& m = seen[static_cast<std::size_t>(r)];
    auto delta = [](const Seen& s) {
      return std::pair{s.after.intra_bytes - s.before.intra_bytes,
                       s.after.inter_bytes - s.before.inter_bytes};
    };
    // A sum over the group of (rank + 1): checks the membership too.
    const int node = r / 2;
    REQUIRE(m.at("node").sum == static_cast<float>(2 * node + 1 + 2 * node + 2));
    REQUIRE_FALSE(m.at("node").two_level);
    REQUIRE(delta(m.at("node")) == std::pair<std::uint64_t, std::uint64_t>{2 * 1 * 64 * 4 / 2, 0});
    REQUIRE(m.at("across").sum == static_cast<float>(r % 2 == 0 ? 1 + 3 + 5 + 7 : 2 + 4 + 6 + 8));
    REQUIRE_FALSE(m.at("across").two_level);
    REQUIRE(delta(m.at("across")) ==
            std::pair<std::uint64_t, std::uint64_t>{0, 2 * 3 * 64 * 4 / 4});
    const float half = r < 4 ? 1 + 2 + 3 + 4 : 5 + 6 + 7 + 8;
    REQUIRE(m.at("two nodes").sum == half);
    REQUIRE(m.at("two nodes").two_level);
    REQUIRE(m.at("two nodes").size == 4);
    // Two levels: 32-element blocks inside (reduce-scatter and all-gather), a 32-element
    // all-reduce across 2 nodes.
    REQUIRE(delta(m.at("two nodes")) ==
            std::pair<std::uint64_t, std::uint64_t>{2 * 32 * 4, 32 * 4});
    REQUIRE(m.at("interleaved").sum == half);
    REQUIRE_FALSE(m.at("interleaved").two_level);
    REQUIRE(delta(m.at("interleaved")) ==
            std::pair<std::uint64_t, std::uint64_t>{0, 2 * 3 * 64 * 4 / 4});
  }
}

TEST_CASE(
    "a quantized reduce-scatter (qgZ) is the true mean within its documented bound, at "
    "every size, reproducibly, and sends fewer bytes") {
  for (const auto& [world, per_node] : {std::pair{4, 2}, std::pair{6, 3}, std::pair{6, 2}}) {
    for (int bits : {4, 8}) {
      for (DType dtype : {DType::F32, DType::BF16}) {
        for (std::size_t c :
             {std::size_t{1}, std::size_t{7}, std::size_t{255}, std::size_t{1031}}) {
          INFO("world " << world << " as nodes of " << per_node << ", " << bits << " bits, "
                        << zero::dtype_name(dtype) << ", chunk " << c);
          const auto w = static_cast<std::size_t>(world);
          // Inputs: rank-dependent values of very different magnitudes per block.
          std::vector<zt::Bytes> inputs;
          for (int q = 0; q < world; ++q)
            inputs.push_back(zt::make_input(900 + c, dtype, q, w * c));
          std::vector<std::vector<double>> got(w), again(w);
          std::vector<zero::NodeTraffic> quantized(w), exact(w);
          run_ranks(world, [&](Communicator& comm) {
            auto nodes = HierarchicalComm::create(comm, topology(world, per_node));
            const auto me = static_cast<std::size_t>(comm.rank());
            for (int round = 0; round < 2; ++round) {
              zt::Bytes out(dtype, c);
              const auto before = nodes->traffic();
              nodes->reduce_scatter(inputs[me].data(), out.data(), c, dtype, ReduceOp::Avg, bits)
                  .wait();
              quantized[me] = {nodes->traffic().intra_bytes - before.intra_bytes,
                               nodes->traffic().inter_bytes - before.inter_bytes};
              auto& dst = round == 0 ? got[me] : again[me];
              for (std::size_t i = 0; i < c; ++i) dst.push_back(out.get(i));
            }
            zt::Bytes out(dtype, c);
            const auto before = nodes->traffic();
            nodes->reduce_scatter(inputs[me].data(), out.data(), c, dtype, ReduceOp::Avg).wait();
            exact[me] = {nodes->traffic().intra_bytes - before.intra_bytes,
                         nodes->traffic().inter_bytes - before.inter_bytes};
          });
          const int qmax = bits == 4 ? 7 : 127;
          for (std::size_t r = 0; r < w; ++r) {
            REQUIRE(got[r] == again[r]);  // bitwise the same run to run
            // The bound: each rank's block scale (step 1) plus each node's partial sum's scale
            // (step 3), halved, over W; then the element type's rounding of the mean.
            for (std::size_t i = 0; i < c; ++i) {
              const std::size_t e = r * c + i;  // element of every rank's input
              const std::size_t block = i / zero::kernels::kQuantBlock;
              double sum = 0, bound = 0;
              std::vector<double> node_sums(w / static_cast<std::size_t>(per_node), 0.0);
              for (std::size_t q = 0; q < w; ++q) {
                sum += inputs[q].get(e);
                double amax = 0;
                for (std::size_t j = block * zero::kernels::kQuantBlock;
                     j < std::min(c, (block + 1) * zero::kernels::kQuantBlock); ++j)
                  amax = std::max(amax, std::fabs(inputs[q].get(r * c + j)));
                bound += amax / qmax / 2;
              }
              // Step 3's scale: a node's dequantized partial sum of the block is at most the sum
              // of its ranks' block maxima plus step 1's error, so its half-step is at most
              // step 1's bound times (1 + 1 / (2·qmax)); over all nodes, at most that much again.
              bound *= 1 + (1 + 1.0 / (2 * qmax));
              const double mean = sum / static_cast<double>(w);
              const double tolerance = bound / static_cast<double>(w) * 1.001 +
                                       std::fabs(mean) * (dtype == DType::BF16 ? 8e-3 : 1e-6);
              REQUIRE(std::fabs(got[r][i] - mean) <= tolerance);
            }
            // Fewer bytes across nodes than the exact reduction (payloads of 4 or 8 bits plus one
            // fp32 scale per 256 elements, rounded up to 4 bytes, against 2 or 4 bytes a value).
            if (c >= 255) {
              REQUIRE(quantized[r].inter_bytes > 0);
              REQUIRE(quantized[r].inter_bytes < exact[r].inter_bytes);
            }
          }
        }
      }
    }
  }
}

TEST_CASE(
    "LoCo error feedback: the first call is plain qgZ, later calls cancel the quantization "
    "error, so the mean over calls approaches the exact mean; reproducible, cleared on demand") {
  constexpr int kWorld = 4, kPerNode = 2, kCalls = 32;
  constexpr std::size_t c = 300;  // one full block and a short one
  const auto w = static_cast<std::size_t>(kWorld);
  for (float beta : {0.0f, 0.8f}) {
    INFO("err_beta " << beta);
    std::vector<zt::Bytes> inputs;
    for (int q = 0; q < kWorld; ++q) inputs.push_back(zt::make_input(77, DType::F32, q, w * c));
    // Per rank: the plain qgZ result, and the results of kCalls calls with feedback (twice).
    std::vector<std::vector<float>> plain(w), first_run(w), second_run(w), after_clear(w);
    run_ranks(kWorld, [&](Communicator& comm) {
      auto nodes = HierarchicalComm::create(comm, topology(kWorld, kPerNode));
      const auto me = static_cast<std::size_t>(comm.rank());
      const auto call = [&](zero::QuantizationFeedback* fb, std::vector<float>& into) {
        std::vector<float> out(c);
        nodes->reduce_scatter(inputs[me].data(), out.data(), c, DType::F32, ReduceOp::Avg, 4, fb)
            .wait();
        into.insert(into.end(), out.begin(), out.end());
      };
      call(nullptr, plain[me]);
      for (auto* run : {&first_run[me], &second_run[me]}) {
        zero::QuantizationFeedback fb;
        fb.beta = beta;
        for (int t = 0; t < kCalls; ++t) call(&fb, *run);
        // The state holds W + N errors of one chunk in 8-bit blocks.
        REQUIRE(fb.state.size() == (w + 2) * zero::kernels::quantized_bytes(c, 8));
        fb.clear();
        if (run == &first_run[me]) call(&fb, after_clear[me]);
      }
    });
    double plain_error = 0, mean_error = 0;
    for (std::size_t r = 0; r < w; ++r) {
      REQUIRE(first_run[r] == second_run[r]);  // bitwise the same run to run
      // With no error stored yet (the first call, and the first after clear()), plain qgZ.
      REQUIRE(std::vector<float>(first_run[r].begin(), first_run[r].begin() + c) == plain[r]);
      REQUIRE(after_clear[r] == plain[r]);
      for (std::size_t i = 0; i < c; ++i) {
        double exact = 0, mean = 0;
        for (std::size_t q = 0; q < w; ++q) exact += inputs[q].get(r * c + i);
        exact /= static_cast<double>(w);
        for (int t = 0; t < kCalls; ++t) mean += first_run[r][static_cast<std::size_t>(t) * c + i];
        mean /= kCalls;
        plain_error = std::max(plain_error, std::fabs(plain[r][i] - exact));
        mean_error = std::max(mean_error, std::fabs(mean - exact));
      }
    }
    INFO("largest error: plain qgZ " << plain_error << ", mean of " << kCalls
                                     << " calls with feedback " << mean_error);
    REQUIRE(plain_error > 0);  // the quantization loses something to feed back
    // The errors telescope: the mean's error is (e_0 − e_T) / ((1 − beta) · T), against one
    // call's error without feedback.
    REQUIRE(mean_error < plain_error / 4);
  }
}

TEST_CASE("error feedback is refused without quantization, and with beta outside [0, 1)") {
  run_ranks(2, [&](Communicator& comm) {
    std::vector<float> in(4, 1.0f), out(2);
    zero::QuantizationFeedback fb;
    REQUIRE_THROWS_WITH(
        comm.reduce_scatter(in.data(), out.data(), 2, DType::F32, ReduceOp::Avg, 0, &fb),
        Catch::Contains("error feedback without quantize_bits"));
    fb.beta = 1.0f;
    REQUIRE_THROWS_WITH(
        comm.reduce_scatter(in.data(), out.data(), 2, DType::F32, ReduceOp::Avg, 4, &fb),
        Catch::Contains("beta 1 is outside [0, 1)"));
  });
}
