#include "zero/layout/flat_layout.h"

#include <algorithm>
#include <limits>

#include "zero/base/error.h"

namespace zero {

namespace {

constexpr std::size_t kMaxSize = std::numeric_limits<std::size_t>::max();

std::size_t checked_add(std::size_t a, std::size_t b, const char* what) {
  ZERO_CHECK(a <= kMaxSize - b, "flat layout: {} overflows size_t ({} + {})", what, a, b);
  return a + b;
}

std::size_t round_up(std::size_t x, std::size_t multiple, const char* what) {
  const std::size_t rem = x % multiple;
  return rem == 0 ? x : checked_add(x, multiple - rem, what);
}

// Position of the first parameter of `unit` whose last element is at or after `pos` (i.e. whose
// end is > pos). Ends are non-decreasing along a unit, so this is a binary search.
std::vector<std::size_t>::const_iterator first_ending_after(
    const UnitLayout& unit, const std::vector<ParamPlacement>& placements, std::size_t pos) {
  return std::partition_point(unit.params.begin(), unit.params.end(), [&](std::size_t p) {
    return placements[p].offset + placements[p].numel <= pos;
  });
}

}  // namespace

FlatLayout FlatLayout::build(std::span<const ParamDesc> params, const LayoutOptions& options) {
  ZERO_CHECK(options.world_size >= 1, "flat layout: world_size must be at least 1, got {}",
             options.world_size);
  ZERO_CHECK(options.param_alignment_elems >= 1,
             "flat layout: param_alignment_elems must be at least 1, got 0");
  ZERO_CHECK(options.unit_alignment_elems >= 1,
             "flat layout: unit_alignment_elems must be at least 1, got 0");
  const auto world = static_cast<std::size_t>(options.world_size);
  ZERO_CHECK(options.unit_alignment_elems <= kMaxSize / world,
             "flat layout: world_size {} x unit_alignment_elems {} overflows size_t", world,
             options.unit_alignment_elems);
  const std::size_t unit_multiple = world * options.unit_alignment_elems;

  FlatLayout layout;
  layout.options_ = options;
  layout.params_.assign(params.begin(), params.end());
  layout.placements_.resize(params.size());

  int num_units = 0;
  const std::size_t max_units = options.max_units > 0 ? options.max_units : params.size();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    ZERO_CHECK(p.unit >= 0 && static_cast<std::size_t>(p.unit) < max_units,
               "flat layout: parameter {} (\"{}\") has unit {}; units must be numbered from 0 "
               "and there cannot be more units than parameters ({})",
               i, p.name, p.unit, max_units);
    num_units = std::max(num_units, p.unit + 1);
  }
  layout.units_.resize(static_cast<std::size_t>(num_units));

  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    auto& unit = layout.units_[static_cast<std::size_t>(p.unit)];
    const std::size_t offset =
        round_up(unit.data_elems, options.param_alignment_elems, "a parameter offset");
    layout.placements_[i] = {p.unit, offset, p.numel};
    unit.params.push_back(i);
    unit.data_elems = checked_add(offset, p.numel, "a unit's size");
    layout.total_param_elems_ = checked_add(layout.total_param_elems_, p.numel, "the model size");
  }

  std::size_t partition = 0;
  for (auto& unit : layout.units_) {
    unit.padded_elems = round_up(unit.data_elems, unit_multiple, "a padded unit size");
    unit.slice_elems = unit.padded_elems / world;
    unit.partition_offset = partition;
    partition = checked_add(partition, unit.slice_elems, "a rank's partition size");
  }
  layout.partition_elems_ = partition;
  return layout;
}

const ParamDesc& FlatLayout::param(std::size_t index) const {
  ZERO_CHECK(index < params_.size(), "flat layout: parameter index {} out of range ({} params)",
             index, params_.size());
  return params_[index];
}

const ParamPlacement& FlatLayout::placement(std::size_t param) const {
  ZERO_CHECK(param < params_.size(), "flat layout: parameter index {} out of range ({} params)",
             param, params_.size());
  return placements_[param];
}

const UnitLayout& FlatLayout::unit(int unit) const {
  ZERO_CHECK(unit >= 0 && static_cast<std::size_t>(unit) < units_.size(),
             "flat layout: unit {} out of range ({} units)", unit, units_.size());
  return units_[static_cast<std::size_t>(unit)];
}

std::size_t FlatLayout::total_padded_elems() const {
  return partition_elems_ * static_cast<std::size_t>(options_.world_size);
}

void FlatLayout::check_unit_rank(int unit, int rank, const char* what) const {
  ZERO_CHECK(unit >= 0 && static_cast<std::size_t>(unit) < units_.size(),
             "flat layout {}: unit {} out of range ({} units)", what, unit, units_.size());
  ZERO_CHECK(rank >= 0 && rank < options_.world_size,
             "flat layout {}: rank {} out of range (world size {})", what, rank,
             options_.world_size);
}

std::size_t FlatLayout::slice_begin(int unit, int rank) const {
  check_unit_rank(unit, rank, "slice_begin");
  return static_cast<std::size_t>(rank) * units_[static_cast<std::size_t>(unit)].slice_elems;
}

std::vector<SliceSegment> FlatLayout::segments(int unit, int rank) const {
  check_unit_rank(unit, rank, "segments");
  const auto& u = units_[static_cast<std::size_t>(unit)];
  const std::size_t begin = static_cast<std::size_t>(rank) * u.slice_elems;
  const std::size_t end = begin + u.slice_elems;
  std::vector<SliceSegment> out;
  for (auto it = first_ending_after(u, placements_, begin); it != u.params.end(); ++it) {
    const auto& pl = placements_[*it];
    if (pl.offset >= end) break;
    if (pl.numel == 0) continue;
    const std::size_t run_begin = std::max(pl.offset, begin);
    const std::size_t run_end = std::min(pl.offset + pl.numel, end);
    out.push_back({*it, run_begin - pl.offset, run_begin - begin, run_end - run_begin});
  }
  return out;
}

std::vector<SliceSegment> FlatLayout::partition_segments(int rank) const {
  std::vector<SliceSegment> out;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    for (auto seg : segments(static_cast<int>(u), rank)) {
      seg.slice_offset += units_[u].partition_offset;
      out.push_back(seg);
    }
  }
  return out;
}

ElementOwner FlatLayout::owner(std::size_t param, std::size_t element) const {
  const auto& pl = placement(param);
  ZERO_CHECK(element < pl.numel,
             "flat layout owner: element {} out of range for \"{}\" ({} elements)", element,
             params_[param].name, pl.numel);
  const auto& u = units_[static_cast<std::size_t>(pl.unit)];
  const std::size_t pos = pl.offset + element;
  const std::size_t slice_offset = pos % u.slice_elems;
  return {static_cast<int>(pos / u.slice_elems), slice_offset, u.partition_offset + slice_offset};
}

std::vector<int> FlatLayout::owners(std::size_t param) const {
  const auto& pl = placement(param);
  if (pl.numel == 0) return {};
  const auto& u = units_[static_cast<std::size_t>(pl.unit)];
  const auto first = static_cast<int>(pl.offset / u.slice_elems);
  const auto last = static_cast<int>((pl.offset + pl.numel - 1) / u.slice_elems);
  std::vector<int> out;
  for (int r = first; r <= last; ++r) out.push_back(r);
  return out;
}

SlicePosition FlatLayout::locate(int unit, int rank, std::size_t slice_offset) const {
  check_unit_rank(unit, rank, "locate");
  const auto& u = units_[static_cast<std::size_t>(unit)];
  ZERO_CHECK(slice_offset < u.slice_elems,
             "flat layout locate: offset {} out of range for unit {} (slice of {} elements)",
             slice_offset, unit, u.slice_elems);
  const std::size_t pos = static_cast<std::size_t>(rank) * u.slice_elems + slice_offset;
  const auto it = first_ending_after(u, placements_, pos);
  if (it == u.params.end() || placements_[*it].offset > pos) return {};
  return {*it, pos - placements_[*it].offset};
}

}  // namespace zero
