// The launch geometry of the CUDA companion kernels, checked on the host.
#include "kernels/cuda_geometry.h"

#include <algorithm>
#include <catch2/catch.hpp>

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

TEST_CASE("the norm takes one CUDA block per fixed block, its lanes inside one warp") {
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
