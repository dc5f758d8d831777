// The launch geometry of the CUDA companion kernels, checked on the host.
#include "kernels/cuda_geometry.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <vector>

#include "kernels/cpu_kernels.h"

namespace zd = zero::kernels::detail;

TEST_CASE("element-wise grids cover every element once per pass and cap their block count") {
  REQUIRE(zd::elementwise_blocks(0) == 0);
  REQUIRE(zd::elementwise_blocks(1) == 1);
  REQUIRE(zd::elementwise_blocks(256) == 1);
  REQUIRE(zd::elementwise_blocks(257) == 2);
  REQUIRE(zd::elementwise_blocks(std::size_t{1} << 40) == zd::kCudaElementwiseMaxBlocks);
  for (std::size_t n :
       {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20, std::size_t{3} << 30}) {
    const std::size_t threads = zd::elementwise_blocks(n) * zd::kCudaElementwiseThreads;
    // A grid-stride loop: each thread takes ceil(n / threads) passes, and nobody idles on pass 1
    // unless n is smaller than one block.
    REQUIRE(threads >= std::min<std::size_t>(n, zd::kCudaElementwiseMaxBlocks * 256));
    REQUIRE(threads < n + zd::kCudaElementwiseThreads);
  }
}

TEST_CASE("the staged norm takes one CUDA block per fixed block, its lanes inside one warp") {
  const std::size_t b = zd::kNormBlockElems;
  REQUIRE(zd::norm_geometry(0, b).norm_blocks == 0);
  REQUIRE(zd::norm_geometry(0, b).cuda_blocks == 0);
  REQUIRE(zd::norm_geometry(1, b).norm_blocks == 1);
  REQUIRE(zd::norm_geometry(1, b).cuda_blocks == 1);
  REQUIRE(zd::norm_geometry(b * 32, b).cuda_blocks == 32);
  REQUIRE(zd::norm_geometry(b * 32 + 1, b).norm_blocks == 33);
  REQUIRE(zd::norm_geometry(b * 32 + 1, b).cuda_blocks == 33);
  // Staging: every thread loads the same number of elements, and the lanes are threads [0, 8).
  REQUIRE(b % zd::kCudaNormThreads == 0);
  REQUIRE(b % zd::kCudaNormLanes == 0);
  REQUIRE(zd::kCudaNormThreads >= 32);
  REQUIRE(32 % zd::kCudaNormLanes == 0);
}

TEST_CASE("large arrays take the lanes norm: one thread per lane, whole warps, every lane covered") {
  const std::size_t b = zd::kNormBlockElems;
  const std::size_t min_elems = zd::kCudaNormLanesMinBlocks * b;
  REQUIRE(zd::norm_geometry(min_elems - b, b).kernel == zd::NormKernel::Staged);
  REQUIRE(zd::norm_geometry(min_elems - b + 1, b).kernel == zd::NormKernel::Lanes);
  REQUIRE(zd::norm_geometry(min_elems, b).kernel == zd::NormKernel::Lanes);
  for (std::size_t n : {min_elems, min_elems + 1, min_elems + 4099, std::size_t{64} << 20}) {
    INFO("n=" << n);
    const zd::NormGeometry g = zd::norm_geometry(n, b);
    REQUIRE(g.norm_blocks == (n + b - 1) / b);
    REQUIRE(g.threads == zd::kCudaNormLanesThreads);
    const std::size_t threads = g.cuda_blocks * static_cast<std::size_t>(g.threads);
    REQUIRE(threads >= g.norm_blocks * zd::kCudaNormLanes);              // every lane has a thread
    REQUIRE(threads < g.norm_blocks * zd::kCudaNormLanes + g.threads);   // no idle block
  }
  // A thread's rows come in whole unrolled groups, and a norm block's lanes share a warp.
  REQUIRE((b / zd::kCudaNormLanes) % zd::kCudaNormLanesUnroll == 0);
  REQUIRE(zd::kCudaNormLanesThreads % 32 == 0);
  // Either kernel can be asked for at any size (the GPU test compares both with the CPU).
  REQUIRE(zd::norm_geometry_of(zd::NormKernel::Lanes, 7, b).cuda_blocks == 1);
  REQUIRE(zd::norm_geometry_of(zd::NormKernel::Staged, min_elems, b).cuda_blocks ==
          zd::kCudaNormLanesMinBlocks);
}

TEST_CASE("the norm's table launches cover every staged array's blocks once, in order") {
  const std::size_t b = zd::kNormBlockElems;
  const std::size_t lanes = zd::kCudaNormLanesMinBlocks * b;  // takes the lanes kernel
  // 150 arrays: empties, one-element ones, odd sizes, two for the lanes kernel.
  std::vector<std::size_t> numels;
  for (std::size_t k = 0; k < 150; ++k) {
    numels.push_back(k % 37 == 5 ? 0 : k % 41 == 3 ? lanes + k : k % 3 == 0 ? 1 : k * 977 + 13);
  }
  const auto tables = zd::plan_norm_tables(numels, b);
  std::vector<std::size_t> seen;
  for (const auto& t : tables) {
    REQUIRE(!t.empty());
    REQUIRE(t.size() <= static_cast<std::size_t>(zd::kCudaNormTableArrays));
    seen.insert(seen.end(), t.begin(), t.end());
  }
  REQUIRE(tables.size() >= 3);  // 150 arrays need more than two tables
  REQUIRE(std::is_sorted(seen.begin(), seen.end()));
  REQUIRE(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
  std::size_t staged = 0;
  for (std::size_t a = 0; a < numels.size(); ++a) {
    const bool in = std::binary_search(seen.begin(), seen.end(), a);
    const bool wanted =
        numels[a] > 0 && zd::norm_geometry(numels[a], b).kernel == zd::NormKernel::Staged;
    INFO("array " << a << " of " << numels[a] << " elements");
    REQUIRE(in == wanted);
    staged += wanted;
  }
  REQUIRE(staged == seen.size());
  REQUIRE(staged < numels.size());  // some arrays are empty or take the lanes kernel

  // Each grid block of a table finds the entry whose blocks it lies in.
  for (const auto& t : tables) {
    std::vector<long long> first{0};
    for (std::size_t a : t) first.push_back(first.back() + zd::norm_geometry(numels[a], b).norm_blocks);
    const int count = static_cast<int>(t.size());
    for (long long g = 0; g < first.back(); ++g) {
      const int s = zd::norm_table_slot(first.data(), count, g);
      REQUIRE(s >= 0);
      REQUIRE(s < count);
      REQUIRE(first[s] <= g);
      REQUIRE(g < first[s + 1]);
    }
  }
  std::vector<long long> one{0, 5};
  REQUIRE(zd::norm_table_slot(one.data(), 1, 0) == 0);
  REQUIRE(zd::norm_table_slot(one.data(), 1, 4) == 0);
}
