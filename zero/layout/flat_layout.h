// The flat layout (DESIGN.md §3): where every parameter element lives in its unit's flat buffer,
// and which rank owns it.
//
// Each unit's parameters are concatenated in registration order into one flat buffer, each
// parameter's offset rounded up to `param_alignment_elems`; the unit is then padded to a multiple
// of `world_size × unit_alignment_elems` elements, so every rank r owns the same-size contiguous
// slice [r·S, (r+1)·S) of every unit. A rank's *partition* is its slices of all units, one after
// another in unit order (the shape of its fp32 master and optimizer-state buffers).
//
// Pure values: nothing here allocates tensors or talks to other ranks. All sizes are elements
// (size_t), never bytes. Thread safety: a built FlatLayout is immutable; share it freely.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zero/base/dtype.h"

namespace zero {

// One registered parameter, as the layout needs it.
struct ParamDesc {
  std::string name;
  std::size_t numel = 0;
  DType dtype = DType::F32;  // of the model (low-precision) copy
  int group = 0;             // param group (lr / weight-decay overrides)
  int unit = 0;              // what stage 3 gathers together; in [0, number of units)
};

struct LayoutOptions {
  int world_size = 1;
  // Every parameter starts at a multiple of this, inside its unit. 1 = packed.
  std::size_t param_alignment_elems = 1;
  // Every unit is padded to a multiple of world_size × this, so slices are multiples of it.
  std::size_t unit_alignment_elems = 1;
  // Units are numbered below this (0: the number of parameters placed). A caller whose units
  // also hold parameters the layout does not place (the engine's frozen ones) passes its count.
  std::size_t max_units = 0;

  // DeepSpeed stage 1/2 (SPEC_DEEPSPEED.md §3.1): a unit is a whole param group, packed, padded
  // to 2·W elements (nccl_start_alignment_factor 2 × W), so the partition P = |F|/W is even.
  static LayoutOptions deepspeed_stage12(int world_size) { return {world_size, 1, 2}; }
  // DeepSpeed stage 3 (SPEC_DEEPSPEED.md §4.1): a unit per parameter, padded to W elements,
  // so partition_numel = ceil(numel / W).
  static LayoutOptions deepspeed_stage3(int world_size) { return {world_size, 1, 1}; }
};

// Where one parameter sits in its unit's flat buffer.
struct ParamPlacement {
  int unit = 0;
  std::size_t offset = 0;  // first element, inside the unit's flat buffer
  std::size_t numel = 0;
};

struct UnitLayout {
  std::vector<std::size_t> params;   // indices into the registration order, ascending
  std::size_t data_elems = 0;        // end of the last parameter (alignment gaps included)
  std::size_t padded_elems = 0;      // data_elems rounded up to world_size × unit_alignment
  std::size_t slice_elems = 0;       // S = padded_elems / world_size
  std::size_t partition_offset = 0;  // where this unit's slice starts in every rank's partition
};

// A run of one parameter's elements inside one rank's slice of a unit.
struct SliceSegment {
  std::size_t param = 0;
  std::size_t param_begin = 0;   // first element of the run, inside the parameter
  std::size_t slice_offset = 0;  // where the run starts inside the rank's slice
  std::size_t numel = 0;
};

// The owner of one parameter element.
struct ElementOwner {
  int rank = 0;
  std::size_t slice_offset = 0;      // inside the rank's slice of the parameter's unit
  std::size_t partition_offset = 0;  // inside the rank's whole partition
};

// What sits at one position of a rank's slice: a parameter element, or nothing (alignment gap
// or padding) when `param` is empty.
struct SlicePosition {
  std::optional<std::size_t> param;
  std::size_t element = 0;
};

class FlatLayout {
 public:
  // Builds the layout of `params` (in registration order). Throws zero::Error naming the
  // offending parameter or option when: world_size < 1, an alignment is 0, a unit id is negative,
  // or sizes overflow size_t. Units are numbered 0..max(unit); a unit with no parameters has size
  // 0 (slice 0). An empty parameter list gives zero units.
  static FlatLayout build(std::span<const ParamDesc> params, const LayoutOptions& options);

  int world_size() const { return options_.world_size; }
  const LayoutOptions& options() const { return options_; }

  std::size_t num_params() const { return params_.size(); }
  const ParamDesc& param(std::size_t index) const;
  const ParamPlacement& placement(std::size_t param) const;

  std::size_t num_units() const { return units_.size(); }
  const UnitLayout& unit(int unit) const;

  // Elements every rank owns over all units (the same on every rank).
  std::size_t partition_elems() const { return partition_elems_; }
  // Σ padded_elems over units = world_size × partition_elems().
  std::size_t total_padded_elems() const;
  // Σ numel over parameters.
  std::size_t total_param_elems() const { return total_param_elems_; }

  // First element of `rank`'s slice inside `unit`'s flat buffer: rank × S.
  std::size_t slice_begin(int unit, int rank) const;

  // The parameter runs inside `rank`'s slice of `unit`, in ascending slice_offset order. Gaps
  // between runs are alignment or padding. Cost: O(log P + runs).
  std::vector<SliceSegment> segments(int unit, int rank) const;
  // segments() of every unit, with slice_offset made relative to the rank's whole partition.
  std::vector<SliceSegment> partition_segments(int rank) const;

  // Owner of element `element` of parameter `param`. REQUIRES: element < numel.
  ElementOwner owner(std::size_t param, std::size_t element) const;
  // The ranks owning any element of `param`, ascending (empty for a 0-element parameter).
  std::vector<int> owners(std::size_t param) const;
  // Inverse of owner(): what is at `slice_offset` of `rank`'s slice of `unit`.
  // REQUIRES: slice_offset < unit(unit).slice_elems.
  SlicePosition locate(int unit, int rank, std::size_t slice_offset) const;

 private:
  FlatLayout() = default;
  void check_unit_rank(int unit, int rank, const char* what) const;

  LayoutOptions options_;
  std::vector<ParamDesc> params_;
  std::vector<ParamPlacement> placements_;
  std::vector<UnitLayout> units_;
  std::size_t partition_elems_ = 0;
  std::size_t total_param_elems_ = 0;
};

}  // namespace zero
