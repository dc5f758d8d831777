// Nearest-name suggestions for misspelt keys and values.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace zero::config {

// Optimal-string-alignment distance (insertions, deletions, substitutions, adjacent swaps).
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word` when it is close enough to be a likely typo: distance at most
// max(2, |word|/4), or `word` differs from the candidate only in case or in a "stage3_" prefix.
// Ties go to the longer common prefix, then to the length nearer the word's, then to the earlier
// candidate.
std::optional<std::string> nearest(std::string_view word,
                                   std::span<const std::string_view> candidates);

// "; did you mean X?" or "" — ready to append to a message.
std::string did_you_mean(std::string_view word, std::span<const std::string_view> candidates);

}  // namespace zero::config
