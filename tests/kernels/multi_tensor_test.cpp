// The CUDA launch plan (host code) covers every chunk once and respects the launch limits.
#include "kernels/multi_tensor.h"

#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <vector>

#include "zero/base/error.h"

namespace zk = zero::kernels;

TEST_CASE("multi-tensor plans cover every chunk exactly once within the per-launch limits") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const zk::MultiTensorLimits limits{1 + rng() % 100, 1 + static_cast<int>(rng() % 5),
                                       1 + static_cast<int>(rng() % 17)};
    std::vector<std::size_t> numels(rng() % 12);
    for (auto& n : numels) n = rng() % 4 == 0 ? 0 : rng() % 2000;
    INFO("trial " << trial << " chunk " << limits.chunk_elems << " tensors " << limits.max_tensors
                  << " blocks " << limits.max_blocks);
    const auto plan = zk::plan_multi_tensor_launches(numels, limits);
    std::map<std::pair<std::size_t, int>, int> seen;
    std::size_t last_tensor = 0;
    int last_chunk = -1;
    for (const auto& launch : plan) {
      REQUIRE(!launch.blocks.empty());
      REQUIRE(static_cast<int>(launch.blocks.size()) <= limits.max_blocks);
      REQUIRE(static_cast<int>(launch.tensors.size()) <= limits.max_tensors);
      for (const auto& block : launch.blocks) {
        const std::size_t tensor = launch.tensors.at(static_cast<std::size_t>(block.slot));
        REQUIRE(block.chunk * limits.chunk_elems < numels[tensor]);
        // Tensor order, then chunk order.
        REQUIRE((tensor > last_tensor || (tensor == last_tensor && block.chunk > last_chunk)));
        last_tensor = tensor;
        last_chunk = block.chunk;
        ++seen[{tensor, block.chunk}];
      }
    }
    std::size_t chunks = 0;
    for (auto n : numels) chunks += (n + limits.chunk_elems - 1) / limits.chunk_elems;
    REQUIRE(seen.size() == chunks);
    for (const auto& [key, count] : seen) REQUIRE(count == 1);
  }
}

TEST_CASE("a tensor split across launches appears in each, and bad limits are rejected") {
  const std::vector<std::size_t> numels = {10, 25, 3};
  const auto plan = zk::plan_multi_tensor_launches(numels, {4, 2, 3});
  // Chunks: t0: 3, t1: 7, t2: 1 → 11 blocks in launches of at most 3 blocks.
  REQUIRE(plan.size() == 4);
  REQUIRE(plan[0].tensors == std::vector<std::size_t>{0});
  REQUIRE(plan[1].tensors == std::vector<std::size_t>{1});
  REQUIRE(plan[3].tensors == std::vector<std::size_t>{1, 2});
  REQUIRE(zk::plan_multi_tensor_launches(std::vector<std::size_t>{}, {}).empty());
  REQUIRE_THROWS_WITH(zk::plan_multi_tensor_launches(numels, {0, 1, 1}),
                      Catch::Contains("chunk_elems"));
  REQUIRE_THROWS_WITH(zk::plan_multi_tensor_launches(numels, {4, 0, 1}),
                      Catch::Contains("max_tensors"));
}
