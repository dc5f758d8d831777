// zero/base/strings.h, shape.h, format.h and timer.h.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "zero/base/format.h"
#include "zero/base/shape.h"
#include "zero/base/strings.h"
#include "zero/base/timer.h"

TEST_CASE("trim drops leading and trailing whitespace only") {
  CHECK(zero::trim("  global_step5\n") == "global_step5");
  CHECK(zero::trim("\t\r\v\fa b\n") == "a b");
  CHECK(zero::trim(" \n\t ").empty());
  CHECK(zero::trim("").empty());
  CHECK(zero::trim("x") == "x");
}

TEST_CASE("numel_of multiplies the dimensions; checked_numel refuses negative and overflowing") {
  CHECK(zero::numel_of(std::vector<std::int64_t>{2, 3, 4}) == 24);
  CHECK(zero::numel_of(std::vector<std::size_t>{7, 5}) == 35);
  CHECK(zero::numel_of(std::vector<std::int64_t>{}) == 1);
  CHECK(zero::numel_of(std::vector<std::int64_t>{3, 0, 9}) == 0);
  const std::vector<std::int64_t> ok = {1 << 20, 1 << 20};
  CHECK(zero::checked_numel(ok) == std::uint64_t{1} << 40);
  const std::vector<std::int64_t> negative = {4, -1};
  CHECK_FALSE(zero::checked_numel(negative).has_value());
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  const std::vector<std::int64_t> overflow = {big, 3};
  CHECK_FALSE(zero::checked_numel(overflow).has_value());
  const std::vector<std::int64_t> zero_first = {0, big, big};
  CHECK(zero::checked_numel(zero_first) == 0);
}

TEST_CASE("format_bytes picks the largest binary unit below the value") {
  CHECK(zero::format_bytes(0) == "0 B");
  CHECK(zero::format_bytes(1023) == "1023 B");
  CHECK(zero::format_bytes(1536) == "1.5 KiB");
  CHECK(zero::format_bytes(std::uint64_t{12} << 20) == "12.0 MiB");
  CHECK(zero::format_bytes(std::uint64_t{3} << 30) == "3.0 GiB");
  CHECK(zero::format_bytes(std::uint64_t{5} << 40) == "5.0 TiB");
}

TEST_CASE("format_bytes_decimal uses powers of 1000 as DeepSpeed's estimators do") {
  CHECK(zero::format_bytes_decimal(0) == "0");
  CHECK(zero::format_bytes_decimal(512) == "512 B");
  CHECK(zero::format_bytes_decimal(1500) == "1.50 kB");
  CHECK(zero::format_bytes_decimal(31.4e9) == "31.40 GB");
  CHECK(zero::format_bytes_decimal(1.2e12) == "1.20 TB");
}

TEST_CASE("ScopedTimer adds its scope's wall time to the counter") {
  double seconds = 0.5;
  const auto start = std::chrono::steady_clock::now();
  {
    zero::ScopedTimer timer(seconds);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(seconds >= 0.5 + 0.019);
  CHECK(seconds - 0.5 <= zero::seconds_since(start));
}
