#include "zero/checkpoint/source.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "kernels/cast.h"
#include "kernels/combine.h"
#include "zero/base/error.h"
#include "zero/base/shape.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/dscheckpoint/deepspeed.h"

namespace zero::ckpt {
namespace {

using nlohmann::json;

// zero's own format: every range is read from exactly the rank files' byte ranges holding it.
class ZeroSource final : public CheckpointSource {
 public:
  ZeroSource(const std::string& dir, const std::string& tag)
      : r_(CheckpointReader::open(dir, tag)) {
    for (const ParamEntry& e : r_.manifest().params) {
      params_.push_back({.name = e.name,
                         .shape = e.shape,
                         .numel = e.numel,
                         .trainable = e.trainable,
                         .frozen_dtype = e.dtype,
                         .aliases = e.aliases});
    }
  }

  Format format() const override { return Format::Zero; }
  std::string path() const override { return r_.path(); }
  std::string kind() const override {
    return fmt::format("zero (ZeRO stage {})", r_.manifest().stage);
  }
  int stage() const override { return r_.manifest().stage; }
  int world_size() const override { return r_.manifest().world_size; }
  std::string model_dtype() const override {
    return std::string(dtype_name(r_.manifest().model_dtype));
  }
  const std::vector<SourceParam>& params() const override { return params_; }

  std::string check_states(const std::vector<std::string>& names,
                           const std::string& kind) const override {
    const Manifest& m = r_.manifest();
    if (m.state_names == names && m.optimizer.value("kind", std::string()) == kind) return {};
    return fmt::format("the checkpoint's optimizer is {} (states {}), this run's is {} (states {})",
                       m.optimizer.value("kind", std::string("?")), fmt::join(m.state_names, ", "),
                       kind, fmt::join(names, ", "));
  }

  std::vector<ChecksummedFile> checksummed_files() const override {
    std::vector<ChecksummedFile> out;
    for (const RankFile& f : r_.manifest().files) {
      ChecksummedFile c{f.file, f.tensors.size(), 0};
      for (const auto& [name, sum] : f.tensors) c.bytes += sum.bytes;
      out.push_back(std::move(c));
    }
    return out;
  }
  void verify_file(std::size_t i) const override { r_.verify_rank_file(static_cast<int>(i)); }

  void read_values(std::size_t p, const std::string& what, std::uint64_t begin, std::uint64_t count,
                   float* out, const ValuesFn& also) const override {
    r_.read_param(p, what, begin, count, out, also);
  }
  std::vector<float> read_frozen(std::size_t p) const override {
    check_index(p);
    const ParamEntry& e = r_.manifest().params[p];
    std::vector<float> v(e.numel);
    if (e.trainable) {
      r_.read_param(p, "master", 0, v.size(), v.data());
    } else {
      const std::vector<std::byte> raw = r_.read_frozen(p);
      kernels::combine_cpu(v.data(), DType::F32, raw.data(), e.dtype, v.size(), 1.0f, false);
    }
    return v;
  }
  std::vector<std::byte> read_frozen_raw(std::size_t p) const override { return r_.read_frozen(p); }

  SourceCounters counters() const override {
    const json& es = r_.manifest().engine_state;
    const json& s = es.at("loss_scaler");
    SourceCounters c{es.at("global_steps").get<std::int64_t>(),
                     es.at("skipped_steps").get<std::int64_t>(),
                     es.at("applied_steps").get<std::int64_t>(),
                     es.at("last_batch_iteration").get<std::int64_t>(),
                     LossScalerState{s.at("scale").get<double>(),
                                     s.at("iteration").get<std::int64_t>(),
                                     s.at("last_overflow_iteration").get<std::int64_t>(),
                                     s.at("hysteresis_left").get<std::int64_t>()},
                     {}};
    const json& opt = r_.manifest().optimizer;
    if (opt.is_object() && opt.contains("groups") && opt["groups"].is_array()) {
      for (const json& g : opt["groups"]) {
        if (!g.is_object() || !g.contains("lr") || !g["lr"].is_number()) {
          c.group_lrs.clear();
          break;
        }
        c.group_lrs.push_back(g["lr"].get<double>());
      }
    }
    return c;
  }
  json client_state() const override { return r_.manifest().client_state; }

 private:
  void check_index(std::size_t p) const {
    ZERO_CHECK_AS(IoError, p < params_.size(), "checkpoint {}: no parameter {} (it has {})",
                  r_.path(), p, params_.size());
  }

  CheckpointReader r_;
  std::vector<SourceParam> params_;
};

// DeepSpeed's own checkpoint (zero/dscheckpoint): each parameter is reconstructed whole, so the
// last one read is kept for the ranges that follow.
class DeepSpeedSource final : public CheckpointSource {
 public:
  DeepSpeedSource(const std::string& dir, const std::string& tag)
      : d_(dscheckpoint::DeepSpeedCheckpoint::open(dir, tag)) {
    for (const dscheckpoint::DsParam& p : d_.params()) {
      params_.push_back({.name = p.name,
                         .shape = p.shape,
                         .numel = numel_of(p.shape),
                         .trainable = p.trainable,
                         .buffer = p.buffer,
                         .frozen_dtype = p.saved_dtype,
                         .tied_to = p.tied_to});
    }
  }

  Format format() const override { return Format::DeepSpeed; }
  std::string path() const override { return d_.tag_dir(); }
  std::string kind() const override { return "DeepSpeed " + d_.kind_name(); }
  int stage() const override { return d_.stage(); }
  int world_size() const override { return d_.world_size(); }
  std::string model_dtype() const override { return d_.dtype(); }
  const std::vector<SourceParam>& params() const override { return params_; }

  std::string check_states(const std::vector<std::string>& names,
                           const std::string& kind) const override {
    for (const std::string& n : names) {
      if (std::find(d_.state_names().begin(), d_.state_names().end(), n) ==
          d_.state_names().end()) {
        return fmt::format(
            "the DeepSpeed checkpoint holds optimizer states {}, this run's {} needs {}",
            fmt::join(d_.state_names(), ", "), kind, fmt::join(names, ", "));
      }
    }
    return {};
  }

  std::vector<ChecksummedFile> checksummed_files() const override { return {}; }
  void verify_file(std::size_t i) const override {
    throw IoError(
        fmt::format("{}: a DeepSpeed checkpoint has no checksummed file {}", d_.tag_dir(), i));
  }

  void read_values(std::size_t p, const std::string& what, std::uint64_t begin, std::uint64_t count,
                   float* out, const ValuesFn& also) const override {
    if (cached_param_ != p || cached_what_ != what) {
      cached_ = what == "master" ? d_.read_fp32(p) : d_.read_state(p, what);
      cached_param_ = p;
      cached_what_ = what;
    }
    ZERO_CHECK_AS(IoError, begin <= cached_.size() && count <= cached_.size() - begin,
                  "{}: elements [{}, {}) are outside '{}' ({} elements)", d_.tag_dir(), begin,
                  begin + count, params_[p].name, cached_.size());
    std::copy_n(cached_.begin() + static_cast<std::ptrdiff_t>(begin), count, out);
    if (also) also(reinterpret_cast<const std::byte*>(out), 0, count);
  }
  std::vector<float> read_frozen(std::size_t p) const override { return d_.read_fp32(p); }
  // The saved values were widened exactly on read, so narrowing them back is exact too.
  std::vector<std::byte> read_frozen_raw(std::size_t p) const override {
    const std::vector<float> v = d_.read_fp32(p);
    const DType dtype = params_[p].frozen_dtype;
    std::vector<std::byte> out(v.size() * dtype_size(dtype));
    kernels::cast_cpu(v.data(), DType::F32, out.data(), dtype, v.size());
    return out;
  }

  SourceCounters counters() const override {
    SourceCounters c;
    c.global_steps = d_.global_steps();
    c.skipped_steps = d_.skipped_steps();
    c.applied_steps = d_.step();
    // DeepSpeed's schedulers count applied steps from -1 (lr_schedules.py last_batch_iteration).
    const json sched = d_.lr_scheduler();
    c.last_batch_iteration = sched.is_object() && sched.contains("last_batch_iteration") &&
                                     sched["last_batch_iteration"].is_number_integer()
                                 ? sched["last_batch_iteration"].get<std::int64_t>()
                                 : c.applied_steps - 1;
    const json sc = d_.scaler_state();
    if (d_.dynamic_loss_scale() && sc.is_object() && sc.contains("cur_scale")) {
      c.scaler = LossScalerState{sc.value("cur_scale", 1.0), sc.value("cur_iter", std::int64_t{0}),
                                 sc.value("last_overflow_iter", std::int64_t{-1}),
                                 sc.value("cur_hysteresis", std::int64_t{1})};
    }
    return c;
  }
  json client_state() const override { return json::object(); }

 private:
  dscheckpoint::DeepSpeedCheckpoint d_;
  std::vector<SourceParam> params_;
  mutable std::size_t cached_param_ = SIZE_MAX;
  mutable std::string cached_what_;
  mutable std::vector<float> cached_;
};

}  // namespace

std::string_view format_name(Format format) {
  switch (format) {
    case Format::Zero: return "zero";
    case Format::DeepSpeed: return "DeepSpeed";
  }
  return "?";
}

Format detect_format(const std::string& dir) {
  return dscheckpoint::is_deepspeed_checkpoint(dir) ? Format::DeepSpeed : Format::Zero;
}

std::unique_ptr<CheckpointSource> CheckpointSource::open(const std::string& dir,
                                                         const std::string& tag) {
  if (detect_format(dir) == Format::DeepSpeed) return std::make_unique<DeepSpeedSource>(dir, tag);
  return std::make_unique<ZeroSource>(dir, tag);
}

void CheckpointSource::verify(int rank, int world) const {
  ZERO_CHECK(rank >= 0 && world > 0 && rank < world, "verify: rank {} of {} ranks", rank, world);
  const std::size_t files = checksummed_files().size();
  for (std::size_t i = static_cast<std::size_t>(rank); i < files;
       i += static_cast<std::size_t>(world)) {
    verify_file(i);
  }
}

}  // namespace zero::ckpt
