#include "tools/zero_train/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "zero/base/format.h"

namespace zero::train {

namespace {

using nlohmann::json;

std::size_t round_bytes(double bytes) {
  return static_cast<std::size_t>(std::llround(bytes));
}

double tier_sum(const TierBytes& t) {
  return t.device + t.host + t.nvme;
}

// "0:07", "12:34", "1:02:03".
std::string clock_text(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, std::round(seconds)));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

// Three significant digits down to microseconds: "412 ms", "12.3 ms", "0.214 ms".
std::string ms_text(double seconds) {
  const double ms = seconds * 1e3;
  if (ms >= 99.95) return fmt::format("{:.0f} ms", ms);
  if (ms >= 9.995) return fmt::format("{:.1f} ms", ms);
  if (ms >= 0.9995) return fmt::format("{:.2f} ms", ms);
  return fmt::format("{:.3f} ms", ms);
}

std::string grad_norm_text(double g) {
  return std::isnan(g) ? "-" : fmt::format("{:.4g}", g);
}

// One row of the memory table: a ledger tag and, when the ZeRO paper has one, its formula.
struct MemoryRow {
  MemoryTag tag;
  const char* label;
  const TierBytes* formula;  // null: no formula for this category
  bool always;               // shown even when no rank holds any
  bool peak = false;         // transient (gathered units, staging): show the high-water mark
};

std::size_t tag_current(const MemorySnapshot& s, MemoryTag tag) {
  std::size_t bytes = 0;
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k)
    bytes += s.at(static_cast<MemoryKind>(k), tag).current_bytes;
  return bytes;
}

std::size_t tag_peak(const MemorySnapshot& s, MemoryTag tag) {
  std::size_t bytes = 0;
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k)
    bytes += s.at(static_cast<MemoryKind>(k), tag).peak_bytes;
  return bytes;
}

std::size_t total_current(const MemorySnapshot& s) {
  std::size_t bytes = 0;
  for (const MemoryUsage& u : s.by_kind) bytes += u.current_bytes;
  return bytes;
}

std::size_t total_peak(const MemorySnapshot& s) {
  std::size_t bytes = 0;
  for (const MemoryUsage& u : s.by_kind) bytes += u.peak_bytes;
  return bytes;
}

}  // namespace

json step_json(const StepRecord& step) {
  json j = {{"step", step.step},
            {"loss", step.loss},
            {"lr", step.lr},
            {"grad_norm", nullptr},
            {"loss_scale", step.loss_scale},
            {"skipped", step.skipped},
            {"step_time_s", step.step_time_s},
            {"model_time_s", step.model_time_s}};
  if (!std::isnan(step.grad_norm)) j["grad_norm"] = step.grad_norm;
  return j;
}

json checkpoint_json(const CheckpointRecord& c) {
  json j = {{"checkpoint", c.saved ? "saved" : "loaded"},
            {"dir", c.dir},
            {"tag", c.tag},
            {"step", c.step},
            {"seconds", c.seconds}};
  if (!c.saved && c.saved_world_size > 0) {
    j["saved_world_size"] = c.saved_world_size;
    j["saved_stage"] = c.saved_stage;
  }
  if (!c.saved && c.saved_global_batch > 0) j["saved_global_batch"] = c.saved_global_batch;
  return j;
}

json memory_json(const MemorySnapshot& s) {
  json by_tag = json::object(), by_kind = json::object();
  for (std::size_t t = 0; t < kNumMemoryTags; ++t) {
    const auto tag = static_cast<MemoryTag>(t);
    by_tag[std::string(memory_tag_name(tag))] = {{"current_bytes", tag_current(s, tag)},
                                                 {"peak_bytes", tag_peak(s, tag)}};
  }
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    const auto kind = static_cast<MemoryKind>(k);
    by_kind[std::string(memory_kind_name(kind))] = {{"current_bytes", s.total(kind).current_bytes},
                                                    {"peak_bytes", s.total(kind).peak_bytes}};
  }
  json out = {{"rank", s.rank},
              {"by_tag", by_tag},
              {"by_kind", by_kind},
              {"total_current_bytes", total_current(s)},
              {"total_peak_bytes", total_peak(s)}};
  // Per-tier totals, flat: device_bytes, host_pinned_bytes, host_bytes, nvme_bytes (+ _peak_).
  const std::pair<MemoryKind, const char*> tiers[] = {{MemoryKind::Device, "device"},
                                                      {MemoryKind::PinnedHost, "host_pinned"},
                                                      {MemoryKind::Host, "host"},
                                                      {MemoryKind::Nvme, "nvme"}};
  for (const auto& [kind, name] : tiers) {
    out[fmt::format("{}_bytes", name)] = s.total(kind).current_bytes;
    out[fmt::format("{}_peak_bytes", name)] = s.total(kind).peak_bytes;
  }
  return out;
}

json estimate_json(const EstimateInput& in, const EstimateResult& r) {
  const TierBytes total = r.total();
  return {{"params", in.params},
          {"largest_param", in.largest_param},
          {"world_size", in.world_size},
          {"stage", in.stage},
          {"precision", precision_name(in.precision)},
          {"optimizer", estimate_optimizer_name(in.optimizer)},
          {"offload_optimizer", offload_tier_name(in.offload_optimizer)},
          {"offload_param", offload_tier_name(in.offload_param)},
          {"lp_params_bytes", tier_sum(r.lp_params)},
          {"gradients_bytes", tier_sum(r.gradients)},
          {"fp32_master_bytes", tier_sum(r.fp32_master)},
          {"optimizer_states_bytes", tier_sum(r.optimizer_states)},
          {"working_set_bytes", tier_sum(r.working_set)},
          {"secondary_params_bytes", tier_sum(r.secondary_params)},
          {"device_bytes", total.device},
          {"host_bytes", total.host},
          {"nvme_bytes", total.nvme},
          {"total_bytes", tier_sum(total)}};
}

// Rank 0's engine phases per optimizer step: seconds as ms, counts as counts.
json engine_json(const EngineTimings& t, std::int64_t steps) {
  const double n = static_cast<double>(std::max<std::int64_t>(steps, 1));
  auto ms = [n](double s) { return s * 1e3 / n; };
  auto per = [n](std::int64_t c) { return static_cast<double>(c) / n; };
  return {{"pack_ms", ms(t.pack_s)},
          {"reduce_wait_ms", ms(t.reduce_wait_s)},
          {"unpack_ms", ms(t.unpack_s)},
          {"norm_ms", ms(t.norm_s)},
          {"optimizer_ms", ms(t.optimizer_s)},
          {"all_gather_ms", ms(t.all_gather_s)},
          {"gather_ms", ms(t.gather_s)},
          {"gather_wait_ms", ms(t.gather_wait_s)},
          {"buckets", per(t.buckets)},
          {"units_alone", per(t.units_alone)},
          {"units_fused", per(t.units_fused)},
          {"gathers", per(t.gathers)},
          {"secondary_gathers", per(t.secondary_gathers)},
          {"landed_bytes", per(t.landed_bytes)},
          {"land_ms", ms(t.land_s)},
          {"uploaded_bytes", per(t.uploaded_bytes)},
          {"upload_wait_ms", ms(t.upload_wait_s)}};
}

Reporter::Reporter(ReportStyle style, bool quiet, std::string config_path, std::FILE* out)
    : style_(style), quiet_(quiet), config_path_(std::move(config_path)), out_(out) {}

void Reporter::line(const std::string& text) {
  if (bar_shown_) {
    std::fputs("\r\033[K", out_);
    bar_shown_ = false;
  }
  std::fputs(text.c_str(), out_);
  std::fputc('\n', out_);
  std::fflush(out_);
}

void Reporter::interrupt() {
  if (!bar_shown_) return;
  std::fputc('\n', out_);
  std::fflush(out_);
  bar_shown_ = false;
}

void Reporter::on_start(const RunInfo& info) {
  info_ = info;
  if (quiet_ || style_ == ReportStyle::Json) return;
  line(fmt::format(
      "zero-train: {} ({} parameters in {} tensors) on {} {} rank{}, {} kernel thread{} each",
      info.model, info.params, info.tensors, info.world_size,
      info.backend == "inproc" ? "in-process" : info.backend, info.world_size == 1 ? "" : "s",
      info.threads, info.threads == 1 ? "" : "s"));
  const std::int64_t configured = info.micro_batch * info.accumulation * info.world_size;
  line(fmt::format(
      "  {}: ZeRO stage {}, {}, {}{}; micro batch {} x accumulation {} x {} rank{} = "
      "{} samples per step{}; {} steps{}, seed {}",
      config_path_, info.stage, info.dtype, info.optimizer,
      info.scheduler.empty() ? "" : ", " + info.scheduler, info.micro_batch, info.accumulation,
      info.world_size, info.world_size == 1 ? "" : "s", configured,
      info.global_batch == configured
          ? ""
          : fmt::format(" (the checkpoint's {} kept)", info.global_batch),
      info.steps,
      info.start_step > 0 ? fmt::format(" (resuming after step {})", info.start_step) : "",
      info.seed));
}

void Reporter::on_checkpoint(const CheckpointRecord& c) {
  if (quiet_) return;
  if (style_ == ReportStyle::Json) {
    line(checkpoint_json(c).dump());
    return;
  }
  const std::string path = c.dir + "/" + c.tag;
  if (c.saved) {
    line(fmt::format("saved checkpoint {} (step {}, {:.2f} s)", path, c.step, c.seconds));
    return;
  }
  std::string origin;
  if (c.saved_world_size > 0) {
    origin = fmt::format(", saved at ZeRO stage {} on {} rank{}", c.saved_stage, c.saved_world_size,
                         c.saved_world_size == 1 ? "" : "s");
  }
  line(fmt::format("loaded checkpoint {} (step {}{}; {:.2f} s)", path, c.step, origin, c.seconds));
  if (c.saved_global_batch > 0 && c.saved_global_batch != c.global_batch) {
    // The data of step t is a function of (seed, t): the resumed run keeps the saved global batch
    // and splits it over its own ranks, so it sees what the saved run would have seen.
    line(fmt::format(
        "note: continuing with the saved run's {} samples per step (this config alone would give "
        "{}), split over this run's ranks with weighted losses",
        c.saved_global_batch, c.global_batch));
  }
}

void Reporter::draw_bar(const StepRecord& step) {
  constexpr int kWidth = 30;
  const double fraction =
      info_.steps > 0 ? static_cast<double>(step.step) / static_cast<double>(info_.steps) : 1.0;
  const int filled = std::clamp(static_cast<int>(fraction * kWidth), 0, kWidth);
  const double per_step = step_seconds_total_ / static_cast<double>(std::max<std::int64_t>(
                                                    step.step - info_.start_step, 1));
  const double eta =
      per_step * static_cast<double>(std::max<std::int64_t>(info_.steps - step.step, 0));
  std::string bar(static_cast<std::size_t>(filled), '=');
  if (filled < kWidth) bar += '>';
  bar.resize(kWidth, ' ');
  fmt::print(out_, "\r\033[K[{}] {}/{}  loss {:.6g}  {}/step  ETA {}", bar, step.step, info_.steps,
             step.loss, ms_text(per_step), clock_text(eta));
  std::fflush(out_);
  bar_shown_ = true;
}

void Reporter::on_step(const StepRecord& step) {
  step_seconds_total_ += step.step_time_s;
  if (quiet_) return;
  if (style_ == ReportStyle::Json) {
    line(step_json(step).dump());
    return;
  }
  const int digits = static_cast<int>(std::to_string(info_.steps).size());
  const std::string text = fmt::format(
      "step {:>{}}/{}  loss {:.6g}  lr {:.3e}  grad_norm {}  loss_scale {:g}  {}{}", step.step,
      digits, info_.steps, step.loss, step.lr, grad_norm_text(step.grad_norm), step.loss_scale,
      ms_text(step.step_time_s), step.skipped ? "  skipped (gradient overflow)" : "");
  if (style_ == ReportStyle::Lines) {
    line(text);
    return;
  }
  const std::int64_t every = std::max<std::int64_t>(info_.steps_per_print, 1);
  if (step.step % every == 0 || step.step >= info_.steps) line(text);
  // Redrawing at every step of a fast run would flood the terminal: about ten frames a second.
  const auto now = std::chrono::steady_clock::now();
  if (step.step < info_.steps &&
      (!bar_shown_ || now - last_bar_ >= std::chrono::milliseconds(100))) {
    draw_bar(step);
    last_bar_ = now;
  }
}

void Reporter::on_finish(const RunSummary& summary) {
  if (style_ == ReportStyle::Json) {
    json memory = json::array();
    for (const MemorySnapshot& s : summary.memory) memory.push_back(memory_json(s));
    json out = {{"summary", true},
                {"steps", summary.steps},
                {"first_loss", summary.first_loss},
                {"final_loss", summary.final_loss},
                {"skipped_steps", summary.skipped_steps},
                {"samples_per_s", summary.samples_per_s},
                {"train_seconds", summary.train_seconds},
                {"world_size", info_.world_size},
                {"nodes", info_.nodes},
                {"ranks_per_node", info_.ranks_per_node},
                {"intra_node_bytes", nullptr},
                {"inter_node_bytes", nullptr},
                {"stage", info_.stage},
                {"memory", memory},
                {"estimate", nullptr},
                {"dump_params", nullptr},
                {"checkpoint", nullptr},
                {"engine_per_step", engine_json(summary.timings, summary.steps - info_.start_step)},
                {"notes", summary.notes}};
    if (summary.traffic) {
      out["intra_node_bytes"] = summary.traffic->intra_bytes;
      out["inter_node_bytes"] = summary.traffic->inter_bytes;
    }
    if (summary.estimate)
      out["estimate"] = estimate_json(*summary.estimate_input, *summary.estimate);
    if (!summary.dump_path.empty()) out["dump_params"] = summary.dump_path;
    if (!summary.checkpoint_path.empty()) out["checkpoint"] = summary.checkpoint_path;
    line(out.dump());
    return;
  }
  for (const std::string& n : summary.notes) line("note: " + n);
  line(fmt::format(
      "done: {} steps in {:.2f} s ({:.0f} samples/s); loss {:.6g} -> {:.6g}; {} skipped",
      summary.steps, summary.train_seconds, summary.samples_per_s, summary.first_loss,
      summary.final_loss, summary.skipped_steps));
  if (info_.world_size > 1 && summary.traffic) {
    line(fmt::format("bytes sent per rank and step: {} inside nodes, {} across {} node{}",
                     summary.traffic->intra_bytes, summary.traffic->inter_bytes, info_.nodes,
                     info_.nodes == 1 ? "" : "s"));
  }
  if (!summary.dump_path.empty()) {
    line(fmt::format("wrote {} fp32 master tensors to {}", info_.tensors, summary.dump_path));
  }
  // Without --quiet the save was reported as it happened.
  if (quiet_ && !summary.checkpoint_path.empty()) {
    line(fmt::format("saved checkpoint {}", summary.checkpoint_path));
  }
  if (!quiet_) memory_table(summary);
}

void Reporter::memory_table(const RunSummary& summary) {
  const std::vector<MemorySnapshot>& ranks = summary.memory;
  if (ranks.empty()) return;
  const EstimateResult* formula = summary.estimate ? &*summary.estimate : nullptr;
  const bool stage3 = info_.stage == 3;
  const std::vector<MemoryRow> rows = {
      {MemoryTag::LowPrecisionParams, "low-precision params",
       formula ? &formula->lp_params : nullptr, true},
      {MemoryTag::Gradients, "gradients", formula ? &formula->gradients : nullptr, true},
      {MemoryTag::MasterParams, "fp32 master weights", formula ? &formula->fp32_master : nullptr,
       true},
      {MemoryTag::OptimizerStates, "optimizer states",
       formula ? &formula->optimizer_states : nullptr, true},
      {MemoryTag::GatherBuffers, "gather buffers (peak)",
       formula && stage3 ? &formula->working_set : nullptr, stage3, true},
      {MemoryTag::SecondaryParams, "hpZ secondary (peak)",
       formula && stage3 ? &formula->secondary_params : nullptr, stage3, true},
      {MemoryTag::Buckets, "reduction buckets", nullptr, false},
      {MemoryTag::Staging, "staging (peak)", nullptr, false, true},
      {MemoryTag::Other, "other", nullptr, false},
  };

  // Up to 8 ranks get a column each; beyond that rank 0 and the smallest and largest figure.
  std::vector<std::string> titles;
  std::vector<std::function<std::size_t(const std::function<std::size_t(const MemorySnapshot&)>&)>>
      columns;
  auto by_rank = [&ranks](std::size_t r) {
    return [&ranks, r](const std::function<std::size_t(const MemorySnapshot&)>& f) {
      return f(ranks[r]);
    };
  };
  if (ranks.size() <= 8) {
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      titles.push_back(fmt::format("rank {}", r));
      columns.push_back(by_rank(r));
    }
  } else {
    titles = {"rank 0", "min", "max"};
    columns.push_back(by_rank(0));
    columns.push_back([&ranks](const std::function<std::size_t(const MemorySnapshot&)>& f) {
      std::size_t v = f(ranks[0]);
      for (const auto& s : ranks) v = std::min(v, f(s));
      return v;
    });
    columns.push_back([&ranks](const std::function<std::size_t(const MemorySnapshot&)>& f) {
      std::size_t v = 0;
      for (const auto& s : ranks) v = std::max(v, f(s));
      return v;
    });
  }

  line("");
  line(
      fmt::format("Memory per rank at the end of training: the engine's ledger, next to the ZeRO "
                  "paper's formula"));
  if (summary.estimate_input) {
    const EstimateInput& in = *summary.estimate_input;
    line(fmt::format(
        "(formula = zero-config estimate --params {} --largest-param {} --world-size {} "
        "--stage {} --precision {} --optimizer {})",
        in.params, in.largest_param, in.world_size, in.stage, precision_name(in.precision),
        estimate_optimizer_name(in.optimizer)));
  } else {
    line("(the config's optimizer has no formula in zero-config estimate)");
  }
  std::string header = fmt::format("{:<22} {:>12}", "category", "formula");
  for (const std::string& t : titles) header += fmt::format(" {:>12}", t);
  line(header);

  auto print_row = [&](const std::string& label, std::optional<double> formula_bytes,
                       const std::function<std::size_t(const MemorySnapshot&)>& measure) {
    std::string text = fmt::format("{:<22} {:>12}", label,
                                   formula_bytes ? format_bytes(round_bytes(*formula_bytes)) : "-");
    for (const auto& column : columns)
      text += fmt::format(" {:>12}", format_bytes(column(measure)));
    line(text);
  };
  double formula_total = 0;
  for (const MemoryRow& row : rows) {
    const auto measure = [tag = row.tag, peak = row.peak](const MemorySnapshot& s) {
      return peak ? tag_peak(s, tag) : tag_current(s, tag);
    };
    bool any = row.always;
    for (const auto& s : ranks) any = any || tag_peak(s, row.tag) > 0;
    if (!any) continue;
    std::optional<double> f;
    if (row.formula) {
      f = tier_sum(*row.formula);
      formula_total += *f;
    }
    print_row(row.label, f, measure);
  }
  print_row("total", formula ? std::optional<double>(formula_total) : std::nullopt, total_current);
  print_row("peak total", std::nullopt, total_peak);
  line(
      "Measured: bytes held at the end of training, all memory kinds; (peak) rows and 'peak total' "
      "are high-water marks over the run. The formula counts model states only.");
}

}  // namespace zero::train
