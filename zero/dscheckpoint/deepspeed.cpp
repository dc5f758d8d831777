#include "zero/dscheckpoint/deepspeed.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "zero/base/error.h"
#include "zero/base/shape.h"
#include "zero/base/strings.h"
#include "zero/dscheckpoint/deepspeed_impl.h"
#include "zero/io/safetensors.h"

namespace zero::dscheckpoint {

namespace fs = std::filesystem;

namespace {

// Archives kept open between reads; a parameter read visits every rank's file in turn.
constexpr std::size_t kMaxOpenArchives = 64;

// What kind of tag folder `dir` is, from its file names alone (a BF16_Optimizer folder shows as
// Zero until its optimizer states are read); nothing when it is none.
std::optional<DsKind> tag_folder_kind(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  if (fs::is_regular_file(dir / "zero" / "optimizer_state.pt", ec)) return DsKind::Universal;
  bool model_states = false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with("optim_states.pt")) return DsKind::Zero;
    if (name.starts_with("mp_rank_") && name.ends_with("_model_states.pt")) model_states = true;
  }
  if (model_states) return DsKind::Zero0;
  return std::nullopt;
}

std::string read_latest(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  return trim(ss.str());
}

}  // namespace

std::int64_t shape_numel(const std::vector<std::int64_t>& shape, const std::string& what) {
  const std::optional<std::uint64_t> n = checked_numel(shape);
  if (!n || *n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    throw IoError(fmt::format("{}: shape [{}] is not valid", what, fmt::join(shape, ", ")));
  }
  return static_cast<std::int64_t>(*n);
}

std::int64_t DsParam::numel() const {
  return shape_numel(shape, name);
}

bool is_deepspeed_checkpoint(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  for (const char* latest : {"latest", "latest_universal"}) {
    if (fs::is_regular_file(root / latest, ec)) {
      const std::string tag = read_latest(root / latest);
      if (!tag.empty() && tag_folder_kind(root / tag)) return true;
    }
  }
  return tag_folder_kind(root).has_value();
}

// --- the implementation -------------------------------------------------------------------------

const PtArchive& DeepSpeedCheckpoint::Impl::archive(std::size_t file) const {
  auto it = open_archives.find(file);
  if (it != open_archives.end()) return it->second;
  if (open_archives.size() >= kMaxOpenArchives) {
    open_archives.erase(open_order.front());
    open_order.pop_front();
  }
  open_order.push_back(file);
  return open_archives.emplace(file, PtArchive::open(files[file])).first->second;
}

std::size_t DeepSpeedCheckpoint::Impl::add_file(const fs::path& p) {
  files.push_back(p.string());
  return files.size() - 1;
}

DeepSpeedCheckpoint::Impl::TensorLoc DeepSpeedCheckpoint::Impl::locate(std::size_t file,
                                                                       const PtFile& pt,
                                                                       const PickleView& v) const {
  TensorLoc t;
  t.file = file;
  t.ref = pt.tensor(v);
  t.where = where_of(v);
  t.numel = static_cast<std::uint64_t>(t.ref.numel());
  return t;
}

std::size_t DeepSpeedCheckpoint::Impl::add_source(Source s) {
  sources.push_back(std::move(s));
  return sources.size() - 1;
}

void DeepSpeedCheckpoint::Impl::read_pieces(const std::vector<Piece>& pieces,
                                            const std::unordered_map<std::size_t, std::size_t>* map,
                                            std::span<float> out) const {
  std::uint64_t at = 0;
  for (const Piece& p : pieces) {
    const std::size_t id = map != nullptr ? map->at(p.source) : p.source;
    const Source& s = sources[id];
    ZERO_ASSERT(p.offset + p.count <= s.numel && at + p.count <= out.size());
    std::uint64_t offset = p.offset;
    std::uint64_t left = p.count;
    for (const TensorLoc& t : s.parts) {
      if (left == 0) break;
      if (offset >= t.numel) {
        offset -= t.numel;
        continue;
      }
      const std::uint64_t n = std::min(left, t.numel - offset);
      read_tensor_f32(archive(t.file), t.ref, offset, out.subspan(at, n), t.where);
      at += n;
      left -= n;
      offset = 0;
    }
  }
  ZERO_ASSERT(at == out.size());
}

DeepSpeedCheckpoint::DeepSpeedCheckpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeepSpeedCheckpoint::DeepSpeedCheckpoint(DeepSpeedCheckpoint&&) noexcept = default;
DeepSpeedCheckpoint& DeepSpeedCheckpoint::operator=(DeepSpeedCheckpoint&&) noexcept = default;
DeepSpeedCheckpoint::~DeepSpeedCheckpoint() = default;

DeepSpeedCheckpoint DeepSpeedCheckpoint::open(const std::string& dir, const std::string& tag) {
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  const fs::path root(dir);
  std::error_code ec;
  ZERO_CHECK_AS(IoError, fs::is_directory(root, ec), "{}: not a directory", dir);
  fs::path tag_path;
  if (!tag.empty()) {
    tag_path = root / tag;
    ZERO_CHECK_AS(IoError, fs::is_directory(tag_path, ec), "{}: no tag folder '{}'", dir, tag);
  } else if (fs::is_regular_file(root / "latest", ec) ||
             fs::is_regular_file(root / "latest_universal", ec)) {
    // DeepSpeed loads the tag `latest` names unless told to load the universal one; so here.
    const char* file = fs::is_regular_file(root / "latest", ec) ? "latest" : "latest_universal";
    const std::string latest = read_latest(root / file);
    tag_path = root / latest;
    ZERO_CHECK_AS(IoError, !latest.empty() && fs::is_directory(tag_path, ec),
                  "{}: '{}' names tag '{}', but there is no such folder", dir, file, latest);
  } else if (tag_folder_kind(root)) {
    tag_path = root;
  } else {
    throw IoError(fmt::format(
        "{}: not a DeepSpeed checkpoint: expected a 'latest' (or 'latest_universal') file naming "
        "the tag folder, or a tag folder itself (*_optim_states.pt, mp_rank_00_model_states.pt "
        "or zero/optimizer_state.pt in it)",
        dir));
  }
  impl->tag_dir = tag_path.string();
  const std::optional<DsKind> kind = tag_folder_kind(tag_path);
  if (!kind) {
    throw IoError(fmt::format(
        "{}: holds no DeepSpeed checkpoint files (*_optim_states.pt, mp_rank_00_model_states.pt "
        "or zero/optimizer_state.pt)",
        tag_path.string()));
  }
  impl->kind = *kind;
  switch (*kind) {
    case DsKind::Universal: impl->open_universal(tag_path); break;
    case DsKind::Zero0: impl->open_zero0(tag_path); break;
    case DsKind::Zero:
    case DsKind::Bf16Optimizer: impl->open_partitioned(tag_path); break;
  }
  return DeepSpeedCheckpoint(std::move(impl));
}

const std::string& DeepSpeedCheckpoint::tag_dir() const {
  return impl_->tag_dir;
}
DsKind DeepSpeedCheckpoint::kind() const {
  return impl_->kind;
}
std::string DeepSpeedCheckpoint::kind_name() const {
  switch (impl_->kind) {
    case DsKind::Zero: return fmt::format("ZeRO stage {}", impl_->stage);
    case DsKind::Bf16Optimizer: return "BF16_Optimizer (stage 1)";
    case DsKind::Zero0:
      return impl_->zero0_masters.empty()
                 ? fmt::format("ZeRO stage 0 ({})", impl_->dtype)
                 : fmt::format("ZeRO stage 0 ({}, fp32 master copies in {})", impl_->dtype,
                               impl_->zero0_masters);
    case DsKind::Universal: return fmt::format("universal (from ZeRO stage {})", impl_->stage);
  }
  return "?";
}
int DeepSpeedCheckpoint::stage() const {
  return impl_->stage;
}
int DeepSpeedCheckpoint::world_size() const {
  return impl_->world;
}
std::string DeepSpeedCheckpoint::dtype() const {
  return impl_->dtype;
}
const std::vector<DsParam>& DeepSpeedCheckpoint::params() const {
  return impl_->params;
}

std::optional<std::size_t> DeepSpeedCheckpoint::find(const std::string& name) const {
  auto it = impl_->by_name.find(name);
  if (it == impl_->by_name.end()) return std::nullopt;
  return it->second;
}

void DeepSpeedCheckpoint::read_fp32(std::size_t param, std::span<float> out) const {
  ZERO_CHECK_AS(IoError, param < impl_->params.size(), "{}: parameter index {} of {}",
                impl_->tag_dir, param, impl_->params.size());
  const DsParam& p = impl_->params[param];
  ZERO_CHECK(static_cast<std::int64_t>(out.size()) == p.numel(),
             "read_fp32('{}'): buffer of {} floats for {} elements", p.name, out.size(), p.numel());
  impl_->read_pieces(impl_->recipes[param].pieces, nullptr, out);
}

std::vector<float> DeepSpeedCheckpoint::read_fp32(std::size_t param) const {
  ZERO_CHECK_AS(IoError, param < impl_->params.size(), "{}: parameter index {} of {}",
                impl_->tag_dir, param, impl_->params.size());
  std::vector<float> out(static_cast<std::size_t>(impl_->params[param].numel()));
  read_fp32(param, out);
  return out;
}

void DeepSpeedCheckpoint::read_state(std::size_t param, const std::string& name,
                                     std::span<float> out) const {
  ZERO_CHECK_AS(IoError, param < impl_->params.size(), "{}: parameter index {} of {}",
                impl_->tag_dir, param, impl_->params.size());
  const DsParam& p = impl_->params[param];
  ZERO_CHECK_AS(IoError, impl_->recipes[param].has_state, "{}: '{}' {}", impl_->tag_dir, p.name,
                p.buffer       ? "is a buffer and has no optimizer state"
                : !p.trainable ? "is a frozen parameter and has no optimizer state"
                               : "has no optimizer state (the checkpoint was saved without the "
                                 "optimizer's)");
  auto it = impl_->state_sources.find(name);
  ZERO_CHECK_AS(IoError, it != impl_->state_sources.end(),
                "{}: no optimizer state '{}'; the checkpoint holds [{}]", impl_->tag_dir, name,
                fmt::join(impl_->state_names, ", "));
  ZERO_CHECK(static_cast<std::int64_t>(out.size()) == p.numel(),
             "read_state('{}', '{}'): buffer of {} floats for {} elements", p.name, name,
             out.size(), p.numel());
  impl_->read_pieces(impl_->recipes[param].pieces, &it->second, out);
}

std::vector<float> DeepSpeedCheckpoint::read_state(std::size_t param,
                                                   const std::string& name) const {
  ZERO_CHECK_AS(IoError, param < impl_->params.size(), "{}: parameter index {} of {}",
                impl_->tag_dir, param, impl_->params.size());
  std::vector<float> out(static_cast<std::size_t>(impl_->params[param].numel()));
  read_state(param, name, out);
  return out;
}

const std::vector<std::string>& DeepSpeedCheckpoint::state_names() const {
  return impl_->state_names;
}
std::int64_t DeepSpeedCheckpoint::step() const {
  return impl_->step;
}

std::optional<double> DeepSpeedCheckpoint::loss_scale() const {
  const nlohmann::json& s = impl_->scaler;
  if (!s.is_object() || !s.contains("cur_scale") || !s["cur_scale"].is_number())
    return std::nullopt;
  return s["cur_scale"].get<double>();
}

nlohmann::json DeepSpeedCheckpoint::scaler_state() const {
  return impl_->scaler;
}
bool DeepSpeedCheckpoint::dynamic_loss_scale() const {
  return impl_->dynamic_loss_scale;
}
std::optional<double> DeepSpeedCheckpoint::clip_grad() const {
  return impl_->clip_grad;
}
nlohmann::json DeepSpeedCheckpoint::param_groups() const {
  return impl_->param_groups;
}
std::int64_t DeepSpeedCheckpoint::global_steps() const {
  return impl_->global_steps;
}
std::int64_t DeepSpeedCheckpoint::global_samples() const {
  return impl_->global_samples;
}
std::int64_t DeepSpeedCheckpoint::skipped_steps() const {
  return impl_->skipped_steps;
}
nlohmann::json DeepSpeedCheckpoint::lr_scheduler() const {
  return impl_->lr_scheduler;
}
nlohmann::json DeepSpeedCheckpoint::ds_config() const {
  return impl_->ds_config;
}
std::string DeepSpeedCheckpoint::ds_version() const {
  return impl_->ds_version;
}

void write_fp32_safetensors(const DeepSpeedCheckpoint& checkpoint, const std::string& path,
                            const std::map<std::string, std::string>& metadata) {
  std::vector<io::TensorDecl> decls;
  for (const DsParam& p : checkpoint.params()) decls.push_back({p.name, DType::F32, p.shape});
  io::SafetensorsStreamWriter writer(path, decls, metadata);
  std::vector<float> values;
  for (std::size_t i = 0; i < checkpoint.params().size(); ++i) {
    values.resize(static_cast<std::size_t>(checkpoint.params()[i].numel()));
    checkpoint.read_fp32(i, values);
    writer.append(values.data(), values.size() * sizeof(float));
  }
  writer.finish();
}

}  // namespace zero::dscheckpoint
