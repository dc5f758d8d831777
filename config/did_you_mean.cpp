#include "config/did_you_mean.h"

#include <algorithm>
#include <cctype>
#include <vector>

namespace zero::config {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string> sorted_parts(std::string_view s) {
  std::vector<std::string> parts;
  std::string current;
  for (char c : lower(s)) {
    if (c == '_') {
      parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  parts.push_back(current);
  std::sort(parts.begin(), parts.end());
  return parts;
}

// "comm_overlap" for "overlap_comm": the same words in another order is a common slip that
// plain edit distance scores as far apart.
bool same_words_reordered(std::string_view a, std::string_view b) {
  return a.find('_') != std::string_view::npos && sorted_parts(a) == sorted_parts(b);
}

}  // namespace

std::size_t edit_distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size();
  const std::size_t m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::optional<std::string> nearest(std::string_view word,
                                   std::span<const std::string_view> candidates) {
  // Long keys from the fuzzer would make the quadratic distance slow for no benefit.
  if (word.empty() || word.size() > 128) return std::nullopt;
  const std::string word_lower = lower(word);
  std::optional<std::string> best;
  std::size_t best_distance = std::max<std::size_t>(2, word.size() / 4) + 1;
  std::size_t best_prefix = 0;
  std::size_t best_length_gap = 0;
  for (std::string_view c : candidates) {
    if (c == word) continue;
    const std::string c_lower = lower(c);
    std::size_t dist = edit_distance(word_lower, c_lower);
    if (same_words_reordered(word, c) || "stage3_" + word_lower == c_lower) dist = 0;
    // Equal distances go to the longer common prefix: "bfp16" means bf16 rather than fp16.
    std::size_t prefix = 0;
    while (prefix < word_lower.size() && prefix < c_lower.size() &&
           word_lower[prefix] == c_lower[prefix])
      ++prefix;
    // Then to the length nearest the word's: "AdamX" is AdamW with one letter wrong rather than
    // Adam with one too many.
    const std::size_t length_gap =
        c.size() > word.size() ? c.size() - word.size() : word.size() - c.size();
    const bool tie = best && dist == best_distance;
    if (dist < best_distance || (tie && prefix > best_prefix) ||
        (tie && prefix == best_prefix && length_gap < best_length_gap)) {
      best_distance = dist;
      best_prefix = prefix;
      best_length_gap = length_gap;
      best = std::string(c);
    }
  }
  return best;
}

std::string did_you_mean(std::string_view word, std::span<const std::string_view> candidates) {
  const auto n = nearest(word, candidates);
  return n ? "; did you mean " + *n + "?" : std::string();
}

}  // namespace zero::config
