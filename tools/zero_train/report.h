// How zero-train shows a run on rank 0: plain lines, a self-rewriting progress bar on a terminal,
// or JSON lines; then the per-rank memory ledger next to the ZeRO paper's estimate.
#pragma once

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tools/zero_train/train.h"

namespace zero::train {

enum class ReportStyle {
  Lines,     // one line per optimizer step (stdout is not a terminal)
  Terminal,  // a progress bar with ETA, plus a line every steps_per_print steps and the last
  Json,      // one JSON object per step, then a summary object
};

class Reporter final : public TrainObserver {
 public:
  // quiet: nothing per step; only the summary (a line, or the JSON summary object).
  Reporter(ReportStyle style, bool quiet, std::string config_path, std::FILE* out = stdout);

  void on_start(const RunInfo& info) override;
  void on_step(const StepRecord& step) override;
  void on_checkpoint(const CheckpointRecord& checkpoint) override;
  void on_finish(const RunSummary& summary) override;
  // Ends a progress bar left on the terminal, so an error message starts on a line of its own.
  void interrupt();

 private:
  void line(const std::string& text);  // a full line, clearing the bar first on a terminal
  void draw_bar(const StepRecord& step);
  void memory_table(const RunSummary& summary);

  ReportStyle style_;
  bool quiet_;
  std::string config_path_;
  std::FILE* out_;
  RunInfo info_;
  bool bar_shown_ = false;
  std::chrono::steady_clock::time_point last_bar_{};
  double step_seconds_total_ = 0;
};

// The objects --json prints (per step, and inside the summary).
nlohmann::json step_json(const StepRecord& step);
nlohmann::json checkpoint_json(const CheckpointRecord& checkpoint);
nlohmann::json memory_json(const MemorySnapshot& snapshot);
nlohmann::json estimate_json(const EstimateInput& in, const EstimateResult& r);

}  // namespace zero::train
