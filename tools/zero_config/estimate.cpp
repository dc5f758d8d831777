// zero-config estimate: per-rank model-state bytes by category and memory tier.
#include "zero/estimate/estimate.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/flags.h"
#include "tools/zero_config/commands.h"
#include "zero/base/error.h"
#include "zero/base/format.h"

namespace zero::tools {

namespace {

constexpr const char* kEstimateUsage =
    R"(usage: zero-config estimate --params N --world-size W [options]

Per-rank model-state memory from the ZeRO paper's formulas (§5; K = 12 for mixed-precision Adam):
low-precision parameters, gradients, fp32 master weights and optimizer states, on the device,
the host and NVMe. Activations, buffers and the allocator's slack are not included.

options:
  --params N                total parameters (7.5e9, 175B, 1.3B, 350M, 4096)
  --largest-param N         elements of the largest parameter (stage 3 gathers it whole)
  --world-size W            data-parallel ranks
  --gpus-per-node G         ranks per node, for host memory per node (default 1)
  --stage S                 ZeRO stage 0..3 (default 0)
  --precision P             fp16, bf16 or fp32 (default fp16)
  --optimizer O             adam, adagrad, lion, sgd, sgd-momentum (default adam)
  --offload-optimizer T     none, cpu or nvme (default none)
  --offload-param T         none, cpu or nvme; stage 3 only (default none)
  --config FILE             take stage, precision, optimizer and offload from a ds_config
  --json                    one JSON object instead of the table
)";

// Parses a count such as "7.5e9", "175B", "350M", "12k"; returns nothing unless it is a
// non-negative whole number.
std::optional<std::uint64_t> parse_count(const std::string& text) {
  if (text.empty()) return std::nullopt;
  double scale = 1;
  std::string digits = text;
  switch (digits.back()) {
    case 'k':
    case 'K':
      scale = 1e3;
      digits.pop_back();
      break;
    case 'm':
    case 'M':
      scale = 1e6;
      digits.pop_back();
      break;
    case 'b':
    case 'B':
    case 'g':
    case 'G':
      scale = 1e9;
      digits.pop_back();
      break;
    case 't':
    case 'T':
      scale = 1e12;
      digits.pop_back();
      break;
    default: break;
  }
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(digits, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != digits.size() || !std::isfinite(value) || value < 0) return std::nullopt;
  value *= scale;
  if (value != std::floor(value) || value > 1.8e19) return std::nullopt;
  return static_cast<std::uint64_t>(value);
}

template <typename Enum, std::size_t N>
std::optional<Enum> parse_choice(const std::string& text,
                                 const std::pair<const char*, Enum> (&choices)[N]) {
  for (const auto& [name, value] : choices) {
    if (text == name) return value;
  }
  return std::nullopt;
}

constexpr std::pair<const char*, Precision> kPrecisions[] = {
    {"fp16", Precision::Fp16}, {"bf16", Precision::Bf16}, {"fp32", Precision::Fp32}};
constexpr std::pair<const char*, OffloadTier> kTiers[] = {
    {"none", OffloadTier::None}, {"cpu", OffloadTier::Cpu}, {"nvme", OffloadTier::Nvme}};
constexpr std::pair<const char*, EstimateOptimizer> kOptimizers[] = {
    {"adam", EstimateOptimizer::Adam},       {"adamw", EstimateOptimizer::Adam},
    {"adagrad", EstimateOptimizer::Adagrad}, {"lion", EstimateOptimizer::Lion},
    {"sgd", EstimateOptimizer::Sgd},         {"sgd-momentum", EstimateOptimizer::SgdMomentum}};

std::string human_count(double n) {
  if (n >= 1e9) return fmt::format("{:.3g}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.3g}M", n / 1e6);
  return fmt::format("{:.0f}", n);
}

nlohmann::json tier_json(const TierBytes& t) {
  return {{"device", t.device}, {"host", t.host}, {"nvme", t.nvme}};
}

}  // namespace

int config_estimate(const Args& args) {
  EstimateInput in;
  bool have_world = false, json = false;
  bool saw_params = false, saw_world = false;
  std::string config_path;
  std::vector<std::string> problems;

  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      std::fputs(kEstimateUsage, stdout);
      return 0;
    }
    if (args[i] == "--json") {
      json = true;
      continue;
    }
    cli::FlagArg arg(args, i);
    const std::string flag = arg.name();
    if (!arg.has_value()) {
      problems.push_back(fmt::format("{} needs a value", flag));
      break;
    }
    const std::string value = arg.value("a value");
    auto count = [&](std::uint64_t& into, const char* what) {
      if (auto c = parse_count(value)) {
        into = *c;
        return true;
      }
      problems.push_back(fmt::format("{} {}: expected a whole number of {} (e.g. 7.5e9, 350M)",
                                     flag, value, what));
      return false;
    };
    if (flag == "--params") {
      saw_params = true;
      count(in.params, "parameters");
    } else if (flag == "--largest-param") {
      count(in.largest_param, "elements");
    } else if (flag == "--world-size") {
      saw_world = true;
      have_world = count(in.world_size, "ranks");
    } else if (flag == "--gpus-per-node") {
      count(in.gpus_per_node, "ranks");
    } else if (flag == "--stage") {
      if (value.size() == 1 && value[0] >= '0' && value[0] <= '3') {
        in.stage = value[0] - '0';
      } else {
        problems.push_back(fmt::format("--stage {}: expected 0, 1, 2 or 3", value));
      }
    } else if (flag == "--precision") {
      if (auto p = parse_choice(value, kPrecisions))
        in.precision = *p;
      else
        problems.push_back(fmt::format("--precision {}: expected fp16, bf16 or fp32", value));
    } else if (flag == "--optimizer") {
      if (auto o = parse_choice(value, kOptimizers))
        in.optimizer = *o;
      else
        problems.push_back(fmt::format(
            "--optimizer {}: expected adam, adamw, adagrad, lion, sgd or sgd-momentum", value));
    } else if (flag == "--offload-optimizer" || flag == "--offload-param") {
      auto t = parse_choice(value, kTiers);
      if (!t)
        problems.push_back(fmt::format("{} {}: expected none, cpu or nvme", flag, value));
      else if (flag == "--offload-optimizer")
        in.offload_optimizer = *t;
      else
        in.offload_param = *t;
    } else if (flag == "--config") {
      config_path = value;
    } else {
      problems.push_back(fmt::format("unknown option {}", flag));
    }
  }
  if (!saw_params) problems.emplace_back("--params is required");
  if (!saw_world) problems.emplace_back("--world-size is required");
  if (have_world && in.world_size == 0) problems.emplace_back("--world-size must be at least 1");
  if (!config_path.empty()) apply_config_to_estimate(config_path, in, problems);
  if (!problems.empty()) {
    for (const auto& p : problems)
      std::fprintf(stderr, "zero-config estimate: error: %s\n", p.c_str());
    std::fputs("\n", stderr);
    std::fputs(kEstimateUsage, stderr);
    return 2;
  }

  const EstimateResult r = estimate_model_states(in);
  const TierBytes total = r.total();
  const double k = 4 + r.optimizer_state_bytes_per_param;

  if (json) {
    nlohmann::json out = {
        {"params", in.params},
        {"largest_param", in.largest_param},
        {"world_size", in.world_size},
        {"gpus_per_node", in.gpus_per_node},
        {"stage", in.stage},
        {"precision", precision_name(in.precision)},
        {"optimizer", estimate_optimizer_name(in.optimizer)},
        {"K", k},
        {"offload_optimizer", offload_tier_name(in.offload_optimizer)},
        {"offload_param", offload_tier_name(in.offload_param)},
        {"device_bytes_per_rank", total.device},
        {"host_bytes_per_rank", total.host},
        {"nvme_bytes_per_rank", total.nvme},
        {"host_bytes_per_node", total.host * static_cast<double>(in.gpus_per_node)},
        {"categories",
         {{"lp_params", tier_json(r.lp_params)},
          {"gradients", tier_json(r.gradients)},
          {"fp32_master", tier_json(r.fp32_master)},
          {"optimizer_states", tier_json(r.optimizer_states)},
          {"working_set", tier_json(r.working_set)}}},
    };
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }

  std::printf("Model states per rank: %s parameters, %llu ranks, ZeRO stage %d, %s, %s (K = %g)\n",
              human_count(static_cast<double>(in.params)).c_str(),
              static_cast<unsigned long long>(in.world_size), in.stage,
              std::string(precision_name(in.precision)).c_str(),
              std::string(estimate_optimizer_name(in.optimizer)).c_str(), k);
  std::printf(
      "offload: optimizer %s, parameters %s%s\n\n",
      std::string(offload_tier_name(in.offload_optimizer)).c_str(),
      std::string(offload_tier_name(in.offload_param)).c_str(),
      in.stage < 3 && in.offload_param != OffloadTier::None ? " (ignored below stage 3)" : "");
  std::printf("%-26s %14s %14s %14s\n", "category", "device", "host", "nvme");
  auto row = [](const char* name, const TierBytes& t) {
    std::printf("%-26s %14s %14s %14s\n", name, format_bytes_decimal(t.device).c_str(),
                format_bytes_decimal(t.host).c_str(), format_bytes_decimal(t.nvme).c_str());
  };
  row("low-precision parameters", r.lp_params);
  row("gradients", r.gradients);
  row("fp32 master weights", r.fp32_master);
  row("optimizer states", r.optimizer_states);
  if (in.stage == 3) row("gathered working set", r.working_set);
  row("total per rank", total);
  if (in.gpus_per_node > 1) {
    std::printf("%-26s %14s %14s\n", "host per node", "",
                format_bytes_decimal(total.host * static_cast<double>(in.gpus_per_node)).c_str());
  }
  std::printf(
      "\nGB = 1e9 bytes. Activations, communication buckets and allocator slack are extra.\n");
  return 0;
}

}  // namespace zero::tools
