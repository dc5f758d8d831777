// Internal: how every CPU kernel splits [0, numel) among OpenMP threads. Tiles of a fixed size,
// static schedule, so each thread walks one contiguous run of memory; the split never changes a
// result (element-wise kernels; norms use fixed blocks).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace zero::kernels::detail {

// Calls fn(tile_begin, tile_end) for every tile, from `threads` OpenMP threads. Runs inline when
// there is a single tile or a single thread.
template <class Fn>
void for_each_tile(std::size_t numel, std::size_t tile_elems, int threads, Fn&& fn) {
  const std::size_t tiles = (numel + tile_elems - 1) / tile_elems;
  if (tiles == 0) return;
  const int team =
      static_cast<int>(std::min<std::size_t>(tiles, static_cast<std::size_t>(threads)));
  if (team <= 1) {
    for (std::size_t tile = 0; tile < tiles; ++tile) {
      fn(tile * tile_elems, std::min(numel, (tile + 1) * tile_elems));
    }
    return;
  }
  const auto count = static_cast<std::int64_t>(tiles);
#pragma omp parallel for schedule(static) num_threads(team)
  for (std::int64_t tile = 0; tile < count; ++tile) {
    const auto first = static_cast<std::size_t>(tile) * tile_elems;
    fn(first, std::min(numel, first + tile_elems));
  }
}

}  // namespace zero::kernels::detail
