// The figures of `zero-bench step`: one per stage (and prefetch setting) from the ranks' results,
// printed as a table or as one JSON line each.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "benchmarks/step_bench.h"
#include "zero/estimate/estimate.h"

namespace zero::bench::step_bench {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Four significant digits: enough for timings that vary by more than that from run to run.
double sig4(double x) {
  if (x == 0 || !std::isfinite(x)) return x;
  const double scale = std::pow(10.0, 3 - std::floor(std::log10(std::fabs(x))));
  return std::round(x * scale) / scale;
}

}  // namespace

Figure summarize(int stage, const std::vector<RankResult>& ranks, const Workload& w,
                 const StepArgs& args, const config::DsConfig& cfg) {
  const RankResult& r0 = ranks[0];
  Figure f;
  f.stage = stage;
  f.counted_steps = static_cast<int>(r0.step_s.size());
  f.step_s = median(r0.step_s);
  double sum = 0;
  for (double s : r0.step_s) sum += s;
  f.step_mean_s = sum / f.counted_steps;
  const double n = f.counted_steps;
  const EngineTimings& t = r0.timings;
  EngineTimings& p = f.per_step;
  p.pack_s = t.pack_s / n;
  p.reduce_wait_s = t.reduce_wait_s / n;
  p.unpack_s = t.unpack_s / n;
  p.norm_s = t.norm_s / n;
  p.optimizer_s = t.optimizer_s / n;
  p.all_gather_s = t.all_gather_s / n;
  p.gather_s = t.gather_s / n;
  p.gather_wait_s = t.gather_wait_s / n;
  p.buckets = t.buckets;
  p.gathers = t.gathers;
  p.prefetches = t.prefetches;
  p.pushed_bytes = t.pushed_bytes;
  f.model_s = r0.model_s / n;
  for (const RankResult& r : ranks) {
    f.intra_node_bytes += r.intra_node_bytes / static_cast<double>(ranks.size());
    f.inter_node_bytes += r.inter_node_bytes / static_cast<double>(ranks.size());
  }
  f.other_s = f.step_mean_s - f.model_s - (p.pack_s + p.reduce_wait_s + p.unpack_s + p.norm_s +
                               p.optimizer_s + p.all_gather_s + p.gather_s);
  f.optimizer_elems = r0.optimizer_elems;
  f.optimizer_bytes_per_elem = r0.optimizer_bytes_per_elem;
  // Stages 1/2 (and stage 3's persistent units): the phase also writes what it pushed into the
  // peers' copies.
  f.optimizer_gbps = (static_cast<double>(r0.optimizer_elems * r0.optimizer_bytes_per_elem) +
                      static_cast<double>(t.pushed_bytes) / n) /
                     p.optimizer_s / 1e9;
  f.memcpy_gbps = 2.0 * static_cast<double>(r0.memcpy_bytes) / r0.memcpy_s / 1e9;
  f.probe_gbps =
      static_cast<double>(r0.optimizer_elems * r0.probe_bytes_per_elem) / r0.probe_s / 1e9;
  f.limit_bytes =
      phase_bytes(stage, args.world_size, cfg, r0.optimizer_elems, r0.optimizer_bytes_per_elem,
                  static_cast<double>(t.gathered_elems) / n, !w.mlp, args.device == "cpu",
                  static_cast<double>(t.pushed_bytes) / n);
  f.step_limit_s = f.limit_bytes.total() / (f.memcpy_gbps * 1e9);
  f.step_limit_ratio = f.step_limit_s / f.step_s;
  for (const RankResult& r : ranks) {
    std::size_t total = 0;
    for (const MemoryUsage& u : r.memory.by_kind) total += u.peak_bytes;
    f.peak_bytes = std::max(f.peak_bytes, total);
    for (std::size_t tag = 0; tag < kNumMemoryTags; ++tag) {
      f.peak_by_tag[tag] =
          std::max(f.peak_by_tag[tag], tag_bytes(r.memory, static_cast<MemoryTag>(tag), true));
    }
    f.skipped_steps = std::max(f.skipped_steps, r.skipped_steps);
    f.warmup_steps = std::max(f.warmup_steps, r.warmup_steps);
  }
  if (t.landings > 0 && r0.pinned_d2h_s > 0) {
    Figure::Offload o;
    o.landed_bytes = static_cast<double>(t.landed_bytes) / n;
    o.land_s = t.land_s / n;
    o.land_gbps = o.land_s > 0 ? o.landed_bytes / o.land_s / 1e9 : 0;
    o.pinned_d2h_gbps = static_cast<double>(r0.pinned_d2h_bytes) / r0.pinned_d2h_s / 1e9;
    o.uploaded_bytes = static_cast<double>(t.uploaded_bytes) / n;
    o.upload_wait_s = t.upload_wait_s / n;
    if (r0.pinned_h2d_s > 0) {
      o.pinned_h2d_gbps = static_cast<double>(r0.pinned_h2d_bytes) / r0.pinned_h2d_s / 1e9;
      o.upload_limit_s = o.uploaded_bytes / (o.pinned_h2d_gbps * 1e9);
    }
    f.offload = o;
  }
  EstimateInput in;
  in.params = w.params;
  in.largest_param = w.largest_param;
  in.world_size = static_cast<std::uint64_t>(args.world_size);
  in.stage = stage;
  in.precision = cfg.model_dtype == DType::BF16  ? Precision::Bf16
                 : cfg.model_dtype == DType::F16 ? Precision::Fp16
                                                 : Precision::Fp32;
  in.optimizer = EstimateOptimizer::Adam;
  const TierBytes formula = estimate_model_states(in).total();
  f.formula_bytes = formula.device + formula.host + formula.nvme;
  return f;
}

void print_header(const StepArgs& args, const Workload& w, int threads) {
  if (args.json) return;
  std::printf(
      "zero-bench step: %s (%zu params), %d in-process ranks x %d threads on %s, %s, AdamW, "
      "bucket %lld elems, median of %d timed steps after a warm-up; ms per step on rank 0; limits: "
      "memcpy (cpy) and the optimizer's traffic probe (prb) of the optimizer's bytes on every rank "
      "at once\n",
      w.label.c_str(), w.params, args.world_size, threads, args.device.c_str(),
      args.precision.c_str(), static_cast<long long>(args.bucket_elems), args.steps - 1);
  std::printf("%5s %8s %7s %7s %8s %7s %7s %7s %7s %7s %7s %7s %8s %8s %6s %8s %6s %8s %6s %9s\n",
              "stage", "step", "model", "pack", "red.wait", "unpack", "norm", "optim", "allgath",
              "gather", "g.wait", "other", "opt GB/s", "cpy GB/s", "ratio", "prb GB/s", "ratio",
              "limit", "l.ratio", "peak MiB");
}

void print_figure(const StepArgs& args, const Workload& w, int threads, const Figure& f) {
  const EngineTimings& p = f.per_step;
  const double ratio = f.optimizer_gbps / f.memcpy_gbps;
  if (args.json) {
    nlohmann::ordered_json j;
    j["bench"] = "step";
    j["stage"] = f.stage;
    j["world_size"] = args.world_size;
    j["precision"] = args.precision;
    j["device"] = args.device;
    j["model"] = w.label;
    j["params"] = w.params;
    j["threads"] = threads;
    j["bucket_elems"] = args.bucket_elems;
    j["steps"] = f.counted_steps;
    j["intra_node_bytes"] = f.intra_node_bytes;
    j["inter_node_bytes"] = f.inter_node_bytes;
    j["warmup_steps"] = f.warmup_steps;
    j["skipped_steps"] = f.skipped_steps;
    j["step_s"] = sig4(f.step_s);
    j["step_mean_s"] = sig4(f.step_mean_s);
    j["breakdown_s"] = {{"model", sig4(f.model_s)},
                        {"pack", sig4(p.pack_s)},
                        {"reduce_wait", sig4(p.reduce_wait_s)},
                        {"unpack", sig4(p.unpack_s)},
                        {"norm", sig4(p.norm_s)},
                        {"optimizer", sig4(p.optimizer_s)},
                        {"all_gather", sig4(p.all_gather_s)},
                        {"gather", sig4(p.gather_s)},
                        {"gather_wait", sig4(p.gather_wait_s)}};
    j["other_s"] = sig4(f.other_s);
    j["other_fraction"] = sig4(f.other_s / f.step_mean_s);
    const PhaseBytes& lb = f.limit_bytes;
    const double limit_gbps = f.memcpy_gbps * 1e9;
    nlohmann::ordered_json limits_s;
    for (const auto& [name, bytes] : {std::pair{"model", lb.model},
                                      {"pack", lb.pack},
                                      {"reduce", lb.reduce},
                                      {"unpack", lb.unpack},
                                      {"norm", lb.norm},
                                      {"optimizer", lb.optimizer},
                                      {"all_gather", lb.all_gather},
                                      {"gather", lb.gather}}) {
      if (bytes > 0) limits_s[name] = sig4(bytes / limit_gbps);
    }
    j["phase_bytes_per_rank"] = sig4(lb.total());
    j["phase_limits_s"] = limits_s;  // each phase's bytes at the memcpy speed below
    j["step_limit_s"] = sig4(f.step_limit_s);
    j["step_limit_ratio"] = sig4(f.step_limit_ratio);
    j["buckets_per_step"] = static_cast<double>(p.buckets) / f.counted_steps;
    j["gathers_per_step"] = static_cast<double>(p.gathers) / f.counted_steps;
    j["pushed_bytes_per_step"] = static_cast<double>(p.pushed_bytes) / f.counted_steps;
    j["prefetch_enabled"] = f.prefetch_enabled;
    j["prefetch"] = f.prefetch_enabled && p.prefetches > 0;
    if (f.gather_hidden_fraction) j["gather_hidden_fraction"] = sig4(*f.gather_hidden_fraction);
    j["prefetches_per_step"] = static_cast<double>(p.prefetches) / f.counted_steps;
    j["optimizer_elems_per_rank"] = f.optimizer_elems;
    j["optimizer_bytes_per_elem"] = f.optimizer_bytes_per_elem;
    j["optimizer_gb_per_s"] = sig4(f.optimizer_gbps);
    j["limit"] = "memcpy";
    j["limit_gb_per_s"] = sig4(f.memcpy_gbps);
    j["ratio"] = sig4(ratio);
    j["probe_gb_per_s"] = sig4(f.probe_gbps);
    j["probe_ratio"] = sig4(f.optimizer_gbps / f.probe_gbps);
    j["peak_bytes_per_rank"] = f.peak_bytes;
    nlohmann::ordered_json tags = nlohmann::ordered_json::object();
    for (std::size_t tag = 0; tag < kNumMemoryTags; ++tag) {
      if (f.peak_by_tag[tag] != 0) {
        tags[std::string(memory_tag_name(static_cast<MemoryTag>(tag)))] = f.peak_by_tag[tag];
      }
    }
    j["peak_bytes_by_tag"] = tags;
    if (f.offload) {
      const Figure::Offload& o = *f.offload;
      nlohmann::ordered_json off;
      off["landed_bytes_per_step"] = o.landed_bytes;
      off["land_s"] = sig4(o.land_s);
      off["land_gb_per_s"] = sig4(o.land_gbps);
      off["pinned_d2h_gb_per_s"] = sig4(o.pinned_d2h_gbps);
      off["land_ratio"] = sig4(o.land_gbps / o.pinned_d2h_gbps);
      off["uploaded_bytes_per_step"] = o.uploaded_bytes;
      off["upload_wait_s"] = sig4(o.upload_wait_s);
      if (o.pinned_h2d_gbps > 0) {
        off["pinned_h2d_gb_per_s"] = sig4(o.pinned_h2d_gbps);
        off["upload_limit_s"] = sig4(o.upload_limit_s);
      }
      j["offload"] = off;
    }
    j["zero_formula_bytes_per_rank"] = f.formula_bytes;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "%5d %8.2f %7.2f %7.2f %8.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %8.2f %8.2f "
        "%6.3f %8.2f %6.3f %8.2f %6.3f %9.1f\n",
        f.stage, f.step_s * 1e3, f.model_s * 1e3, p.pack_s * 1e3, p.reduce_wait_s * 1e3, p.unpack_s * 1e3,
        p.norm_s * 1e3, p.optimizer_s * 1e3, p.all_gather_s * 1e3,
        p.gather_s * 1e3, p.gather_wait_s * 1e3, f.other_s * 1e3, f.optimizer_gbps, f.memcpy_gbps,
        ratio, f.probe_gbps, f.optimizer_gbps / f.probe_gbps, f.step_limit_s * 1e3,
        f.step_limit_ratio, static_cast<double>(f.peak_bytes) / (1 << 20));
  }
  std::fflush(stdout);
}

void print_footer(const StepArgs& args, const std::vector<Figure>& figures) {
  if (args.json) return;
  std::printf(
      "\nmodel = the trainer's own work between engine calls (%s and the gradient writes into "
      "the engine's slots). other = mean step minus model and the engine's phases but g.wait "
      "(untimed engine work). g.wait = waiting for stage-3 all-gathers, in gather() or not (after step(), "
      "persistent units are re-gathered outside gather()). limit = the bytes each phase must "
      "move (model (--params), pack, reduce, unpack, norm, optimizer, all-gather or gathers) at the "
      "memcpy speed, summed; l.ratio = limit / step (JSON: phase_limits_s, "
      "step_limit_s, step_limit_ratio). At stages 1/2 the optimizer step writes the rank's slices "
      "into the peers' model copies itself where it can (pushed_bytes): opt GB/s and the "
      "optimizer's limit count those bytes, allgath what is left.\n",
      args.model ? "the MLP's forward and backward" : "the forward stand-in's reads");
  for (const Figure& f : figures) {
    if (f.stage != 3) continue;
    std::printf("stage 3: %.1f unit all-gathers per step, %.1f of them prefetched\n",
                static_cast<double>(f.per_step.gathers) / f.counted_steps,
                static_cast<double>(f.per_step.prefetches) / f.counted_steps);
  }
  std::printf("peak memory per rank by tag (MiB, largest over ranks; ZeRO formula in brackets):\n");
  for (const Figure& f : figures) {
    std::printf("  stage %d: %.1f [%.1f] =", f.stage, static_cast<double>(f.peak_bytes) / (1 << 20),
                f.formula_bytes / (1 << 20));
    for (std::size_t tag = 0; tag < kNumMemoryTags; ++tag) {
      if (f.peak_by_tag[tag] == 0) continue;
      const std::string name(memory_tag_name(static_cast<MemoryTag>(tag)));
      std::printf(" %s %.1f", name.c_str(), static_cast<double>(f.peak_by_tag[tag]) / (1 << 20));
    }
    std::printf("\n");
  }
  for (const Figure& f : figures) {
    if (f.skipped_steps > 0) {
      std::printf("stage %d: %d timed step(s) skipped on overflow (optimizer time includes them)\n",
                  f.stage, f.skipped_steps);
    }
  }
}

}  // namespace zero::bench::step_bench
