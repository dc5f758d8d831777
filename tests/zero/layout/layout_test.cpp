#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstddef>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "zero/base/error.h"
#include "zero/layout/flat_layout.h"

using zero::DType;
using zero::FlatLayout;
using zero::LayoutOptions;
using zero::ParamDesc;

namespace {

constexpr std::uint32_t kSeed = 20240611;

std::vector<ParamDesc> make_params(const std::vector<std::size_t>& numels,
                                   const std::vector<int>& units) {
  std::vector<ParamDesc> out;
  for (std::size_t i = 0; i < numels.size(); ++i) {
    out.push_back({fmt::format("p{}", i), numels[i], i % 3 == 2 ? DType::BF16 : DType::F32,
                   static_cast<int>(i % 2), units[i]});
  }
  return out;
}

// The size lists every exhaustive test walks: empty, zeros, ones, primes, mixed, large-ish.
std::vector<std::vector<std::size_t>> awkward_size_lists() {
  std::vector<std::vector<std::size_t>> lists = {
      {},
      {0},
      {1},
      {0, 0, 0},
      {1, 0, 1},
      {2, 3, 5, 7, 11, 13},
      {5, 7, 3},
      {97},
      {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
      {0, 257, 0, 1, 1021},
      {4096, 17, 4096},
  };
  std::mt19937 rng(kSeed);
  std::uniform_int_distribution<std::size_t> count(1, 12);
  std::uniform_int_distribution<std::size_t> size(0, 300);
  for (int i = 0; i < 6; ++i) {
    std::vector<std::size_t> v(count(rng));
    for (auto& s : v) s = size(rng);
    lists.push_back(v);
  }
  return lists;
}

// Unit assignments for n params: all in one unit, one per param, and a random grouping.
std::vector<std::vector<int>> unit_assignments(std::size_t n, std::mt19937& rng) {
  std::vector<std::vector<int>> out;
  out.emplace_back(n, 0);
  std::vector<int> each(n);
  for (std::size_t i = 0; i < n; ++i) each[i] = static_cast<int>(i);
  out.push_back(each);
  if (n > 1) {
    std::uniform_int_distribution<int> pick(0, static_cast<int>(n / 2));
    std::vector<int> random(n);
    for (auto& u : random) u = pick(rng);
    out.push_back(random);
  }
  return out;
}

struct Coverage {
  std::size_t elements_checked = 0;
  std::size_t straddling_params = 0;  // owned by more than one rank
  std::size_t padded_positions = 0;
};

// Every invariant of the flat layout, checked element by element.
void check_layout_exhaustively(const FlatLayout& layout, const std::vector<ParamDesc>& params,
                               Coverage& cov) {
  const int world = layout.world_size();
  const auto& opt = layout.options();
  const std::size_t unit_multiple = static_cast<std::size_t>(world) * opt.unit_alignment_elems;

  std::size_t partition = 0;
  for (std::size_t u = 0; u < layout.num_units(); ++u) {
    const auto& unit = layout.unit(static_cast<int>(u));
    // Padded, aligned, balanced.
    REQUIRE(unit.padded_elems % unit_multiple == 0);
    REQUIRE(unit.padded_elems >= unit.data_elems);
    REQUIRE(unit.padded_elems - unit.data_elems < unit_multiple);
    REQUIRE(unit.slice_elems * static_cast<std::size_t>(world) == unit.padded_elems);
    REQUIRE(unit.slice_elems % opt.unit_alignment_elems == 0);
    REQUIRE(unit.partition_offset == partition);
    partition += unit.slice_elems;

    // Parameters in registration order, aligned, not overlapping, inside data_elems.
    std::size_t prev_end = 0;
    std::size_t prev_index = 0;
    for (std::size_t k = 0; k < unit.params.size(); ++k) {
      const std::size_t p = unit.params[k];
      const auto& pl = layout.placement(p);
      REQUIRE(params[p].unit == static_cast<int>(u));
      REQUIRE(pl.unit == static_cast<int>(u));
      if (k > 0) REQUIRE(p > prev_index);
      REQUIRE(pl.offset % opt.param_alignment_elems == 0);
      REQUIRE(pl.offset >= prev_end);
      REQUIRE(pl.offset - prev_end < opt.param_alignment_elems);
      REQUIRE(pl.numel == params[p].numel);
      prev_end = pl.offset + pl.numel;
      prev_index = p;
    }
    REQUIRE(unit.data_elems == prev_end);

    // Slices: disjoint and covering by construction of [r·S, (r+1)·S); check what is in them.
    for (int r = 0; r < world; ++r) {
      REQUIRE(layout.slice_begin(static_cast<int>(u), r) ==
              static_cast<std::size_t>(r) * unit.slice_elems);
      const auto segs = layout.segments(static_cast<int>(u), r);
      std::vector<bool> in_segment(unit.slice_elems, false);
      std::size_t prev_seg_end = 0;
      for (const auto& s : segs) {
        REQUIRE(s.numel > 0);
        REQUIRE(s.slice_offset >= prev_seg_end);
        REQUIRE(s.slice_offset + s.numel <= unit.slice_elems);
        REQUIRE(s.param_begin + s.numel <= params[s.param].numel);
        prev_seg_end = s.slice_offset + s.numel;
        for (std::size_t i = 0; i < s.numel; ++i) {
          in_segment[s.slice_offset + i] = true;
          const auto pos = layout.locate(static_cast<int>(u), r, s.slice_offset + i);
          REQUIRE(pos.param == s.param);
          REQUIRE(pos.element == s.param_begin + i);
        }
      }
      for (std::size_t off = 0; off < unit.slice_elems; ++off) {
        if (in_segment[off]) continue;
        REQUIRE_FALSE(layout.locate(static_cast<int>(u), r, off).param.has_value());
        ++cov.padded_positions;
      }
    }
  }
  REQUIRE(layout.partition_elems() == partition);
  REQUIRE(layout.total_padded_elems() == partition * static_cast<std::size_t>(world));

  // Every parameter element owned by exactly one rank, and the maps are inverse.
  std::vector<std::vector<std::vector<bool>>> owned(layout.num_units());
  for (std::size_t u = 0; u < layout.num_units(); ++u) {
    owned[u].assign(static_cast<std::size_t>(world),
                    std::vector<bool>(layout.unit(static_cast<int>(u)).slice_elems, false));
  }
  std::size_t total = 0;
  for (std::size_t p = 0; p < params.size(); ++p) {
    const auto& pl = layout.placement(p);
    total += pl.numel;
    std::set<int> ranks;
    for (std::size_t e = 0; e < pl.numel; ++e) {
      const auto o = layout.owner(p, e);
      REQUIRE(o.rank >= 0);
      REQUIRE(o.rank < world);
      ranks.insert(o.rank);
      auto&& slot = owned[static_cast<std::size_t>(pl.unit)][static_cast<std::size_t>(o.rank)]
                         [o.slice_offset];
      REQUIRE_FALSE(slot);
      slot = true;
      REQUIRE(o.partition_offset == layout.unit(pl.unit).partition_offset + o.slice_offset);
      const auto back = layout.locate(pl.unit, o.rank, o.slice_offset);
      REQUIRE(back.param == p);
      REQUIRE(back.element == e);
      ++cov.elements_checked;
    }
    const auto owners = layout.owners(p);
    REQUIRE(std::vector<int>(ranks.begin(), ranks.end()) == owners);
    if (owners.size() > 1) ++cov.straddling_params;
  }
  REQUIRE(layout.total_param_elems() == total);

  // partition_segments is segments() shifted by each unit's partition offset.
  for (int r = 0; r < world; ++r) {
    std::size_t covered = 0;
    for (const auto& s : layout.partition_segments(r)) {
      REQUIRE(s.slice_offset + s.numel <= layout.partition_elems());
      covered += s.numel;
    }
    std::size_t expected = 0;
    for (std::size_t u = 0; u < layout.num_units(); ++u) {
      for (const auto& s : layout.segments(static_cast<int>(u), r)) expected += s.numel;
    }
    REQUIRE(covered == expected);
  }
}

}  // namespace

TEST_CASE("DeepSpeed's stage 1/2 worked example: W=4, params 5,7,3 give partitions of 4") {
  const auto params = make_params({5, 7, 3}, {0, 0, 0});
  const auto layout = FlatLayout::build(params, LayoutOptions::deepspeed_stage12(4));
  REQUIRE(layout.unit(0).data_elems == 15);
  REQUIRE(layout.unit(0).padded_elems == 16);
  REQUIRE(layout.unit(0).slice_elems == 4);
  using Seg = std::vector<std::tuple<std::size_t, std::size_t, std::size_t, std::size_t>>;
  auto segs = [&](int r) {
    Seg out;
    for (const auto& s : layout.segments(0, r)) {
      out.emplace_back(s.param, s.param_begin, s.slice_offset, s.numel);
    }
    return out;
  };
  REQUIRE(segs(0) == Seg{{0, 0, 0, 4}});
  REQUIRE(segs(1) == Seg{{0, 4, 0, 1}, {1, 0, 1, 3}});  // first_offset 4 on p0
  REQUIRE(segs(2) == Seg{{1, 3, 0, 4}});                // first_offset 3 on p1
  REQUIRE(segs(3) == Seg{{2, 0, 0, 3}});                // one element of padding
  REQUIRE_FALSE(layout.locate(0, 3, 3).param.has_value());
}

TEST_CASE("DeepSpeed's stage 3 partitioning: numel 10 on 4 ranks gives partitions of 3") {
  const auto params = make_params({10, 1}, {0, 1});
  const auto layout = FlatLayout::build(params, LayoutOptions::deepspeed_stage3(4));
  REQUIRE(layout.unit(0).slice_elems == 3);
  REQUIRE(layout.unit(1).slice_elems == 1);
  REQUIRE(layout.owner(0, 9).rank == 3);
  REQUIRE(layout.owner(0, 9).slice_offset == 0);
  REQUIRE(layout.partition_elems() == 4);
  REQUIRE(layout.owner(1, 0).partition_offset == 3);
}

TEST_CASE("parameter offsets are rounded up to the parameter alignment") {
  const auto params = make_params({3, 5, 0, 1}, {0, 0, 0, 0});
  const auto layout = FlatLayout::build(params, {2, 4, 4});
  REQUIRE(layout.placement(0).offset == 0);
  REQUIRE(layout.placement(1).offset == 4);
  REQUIRE(layout.placement(2).offset == 12);
  REQUIRE(layout.placement(3).offset == 12);
  REQUIRE(layout.unit(0).data_elems == 13);
  REQUIRE(layout.unit(0).padded_elems == 16);
  REQUIRE(layout.owners(2).empty());
}

TEST_CASE("flat layout invariants hold for world sizes 1-16 and awkward sizes") {
  std::mt19937 rng(kSeed);
  const std::vector<std::pair<std::size_t, std::size_t>> alignments = {
      {1, 1}, {1, 2}, {3, 1}, {16, 16}, {4, 5}};
  Coverage cov;
  std::size_t layouts = 0;
  for (const auto& sizes : awkward_size_lists()) {
    for (const auto& units : unit_assignments(sizes.size(), rng)) {
      const auto params = make_params(sizes, units);
      for (int world = 1; world <= 16; ++world) {
        for (const auto& [pa, ua] : alignments) {
          INFO("world " << world << ", param alignment " << pa << ", unit alignment " << ua << ", "
                        << sizes.size() << " params");
          const auto layout = FlatLayout::build(params, {world, pa, ua});
          check_layout_exhaustively(layout, params, cov);
          ++layouts;
        }
      }
    }
  }
  // Guard against a vacuous pass: elements, straddling parameters and padding were all seen.
  INFO("layouts " << layouts << ", elements " << cov.elements_checked << ", straddling "
                  << cov.straddling_params << ", padding " << cov.padded_positions);
  REQUIRE(layouts > 2000);
  REQUIRE(cov.elements_checked > 1'000'000);
  REQUIRE(cov.straddling_params > 1000);
  REQUIRE(cov.padded_positions > 1000);
}

TEST_CASE("a parameter of 2^31+11 elements is split exactly across 1-16 ranks in size_t") {
  const std::size_t huge = (std::size_t{1} << 31) + 11;
  const auto params = make_params({7, huge, 1}, {0, 0, 0});
  for (int world = 1; world <= 16; ++world) {
    for (auto opts : {LayoutOptions{world, 1, 1}, LayoutOptions::deepspeed_stage12(world),
                      LayoutOptions{world, 64, 64}}) {
      INFO("world " << world << ", param alignment " << opts.param_alignment_elems);
      const auto layout = FlatLayout::build(params, opts);
      const auto& unit = layout.unit(0);
      REQUIRE(unit.slice_elems * static_cast<std::size_t>(world) == unit.padded_elems);
      REQUIRE(unit.padded_elems >= 7 + huge + 1);
      REQUIRE(unit.padded_elems > std::size_t{1} << 31);  // beyond any 32-bit index
      std::size_t next_element = 0;
      std::size_t covered = 0;
      for (int r = 0; r < world; ++r) {
        for (const auto& s : layout.segments(0, r)) {
          if (s.param != 1) continue;
          REQUIRE(s.param_begin == next_element);  // runs continue where the last rank stopped
          next_element += s.numel;
          covered += s.numel;
          // Both ends of each run round-trip through owner/locate.
          for (std::size_t e : {s.param_begin, s.param_begin + s.numel - 1}) {
            const auto o = layout.owner(1, e);
            REQUIRE(o.rank == r);
            const auto back = layout.locate(0, o.rank, o.slice_offset);
            REQUIRE(back.param == std::size_t{1});
            REQUIRE(back.element == e);
          }
        }
      }
      REQUIRE(covered == huge);
      REQUIRE(layout.owner(2, 0).rank ==
              static_cast<int>(layout.placement(2).offset / unit.slice_elems));
      REQUIRE(layout.total_param_elems() == huge + 8);
    }
  }
}

TEST_CASE("invalid layout options and unit ids are rejected with the offending value") {
  const auto params = make_params({4, 4}, {0, 1});
  REQUIRE_THROWS_WITH(FlatLayout::build(params, {0, 1, 1}), Catch::Contains("world_size"));
  REQUIRE_THROWS_WITH(FlatLayout::build(params, {2, 0, 1}), Catch::Contains("param_alignment"));
  REQUIRE_THROWS_WITH(FlatLayout::build(params, {2, 1, 0}), Catch::Contains("unit_alignment"));
  auto bad = make_params({4, 4}, {0, -1});
  REQUIRE_THROWS_WITH(FlatLayout::build(bad, {2, 1, 1}), Catch::Contains("\"p1\""));
  const auto layout = FlatLayout::build(params, {2, 1, 1});
  REQUIRE_THROWS_AS(layout.segments(0, 2), zero::Error);
  REQUIRE_THROWS_AS(layout.owner(0, 4), zero::Error);
  REQUIRE_THROWS_AS(layout.locate(0, 0, 2), zero::Error);
  const std::vector<ParamDesc> none;
  REQUIRE(FlatLayout::build(none, {3, 1, 1}).num_units() == 0);
}
