// Engine::save_checkpoint (format: zero/checkpoint/checkpoint.h); the load is in
// engine_checkpoint_load.cpp.
//
// Save: every rank streams its own partition (master and optimizer states, fp32) into its own
// safetensors file inside <dir>/<tag>.tmp/; rank 0 adds the frozen parameters, the optional
// 16-bit model and the manifest (with every rank's checksums), fsyncs, swaps the directory into
// place and replaces `latest` last. A failure anywhere removes <tag>.tmp.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "kernels/combine.h"
#include "zero/engine/engine_impl.h"

namespace zero::engine_detail {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json hyper_json(const GroupOptimizer& g) {
  const kernels::OptimizerHyper& h = g.hyper;
  return {{"lr", g.base_lr},
          {"beta1", h.beta1},
          {"beta2", h.beta2},
          {"eps", h.eps},
          {"weight_decay", h.weight_decay},
          {"bias_correction", h.bias_correction},
          {"momentum", h.momentum},
          {"dampening", h.dampening},
          {"nesterov", h.nesterov},
          {"lr_decay", h.lr_decay},
          {"initial_accumulator_value", h.initial_accumulator_value}};
}

void write_text_durably(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZERO_CHECK_AS(IoError, fd >= 0, "cannot create {}: {}", tmp.string(), std::strerror(errno));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  ZERO_CHECK_AS(IoError, ok, "cannot write {}: {}", tmp.string(), std::strerror(err));
  ZERO_CHECK_AS(IoError, ::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename {} to {}: {}",
                tmp.string(), path.string(), std::strerror(errno));
  io::fsync_directory(path.parent_path().string());
}

void check_tag(const std::string& tag) {
  ZERO_CHECK_AS(IoError,
                !tag.empty() && tag.find('/') == std::string::npos && tag[0] != '.' &&
                    tag.size() < 200 && tag.find(".tmp") == std::string::npos,
                "checkpoint tag '{}': use a plain name such as global_step100", tag);
}

}  // namespace

std::vector<std::string> checkpoint_state_names(const kernels::OptimizerHyper& h) {
  switch (h.kind) {
    case kernels::OptimizerKind::Adam:
    case kernels::OptimizerKind::AdamW: return {"exp_avg", "exp_avg_sq"};
    case kernels::OptimizerKind::Adagrad: return {"sum"};
    case kernels::OptimizerKind::Lion: return {"exp_avg"};
    case kernels::OptimizerKind::Sgd:
      if (kernels::optimizer_state_count(h) > 0) return {"momentum_buffer"};
      return {};
  }
  return {};
}

void EngineImpl::agree_on_failure(const std::string& local_error) {
  if (world_ == 1) {
    if (!local_error.empty()) throw IoError(local_error);
    return;
  }
  // The lowest failing rank tells everyone its message.
  std::vector<double> failed(static_cast<std::size_t>(world_));
  double mine = local_error.empty() ? 0.0 : 1.0;
  control_.all_gather(&mine, failed.data(), 1, DType::F64).wait();
  int root = -1;
  for (int r = 0; r < world_ && root < 0; ++r) {
    if (failed[static_cast<std::size_t>(r)] != 0.0) root = r;
  }
  if (root < 0) return;
  constexpr std::size_t kMax = 2048;
  std::vector<double> text(kMax, 0.0);
  if (rank_ == root) {
    for (std::size_t i = 0; i < local_error.size() && i < kMax; ++i) {
      text[i] = static_cast<unsigned char>(local_error[i]);
    }
  }
  control_.broadcast(text.data(), kMax, DType::F64, root).wait();
  std::string message;
  for (double c : text) {
    if (c == 0.0) break;
    message.push_back(static_cast<char>(static_cast<unsigned char>(c)));
  }
  throw IoError(rank_ == root ? message : fmt::format("rank {}: {}", root, message));
}

ckpt::Manifest EngineImpl::describe(const std::string& tag) const {
  ckpt::Manifest m;
  m.tag = tag;
  m.world_size = world_;
  m.stage = stage_;
  m.model_dtype = model_dtype_;
  m.partition_elems = partition_elems();
  for (std::size_t u = 0; u < layout_units_; ++u) {
    const UnitLayout& ul = layout_->unit(static_cast<int>(u));
    m.units.push_back({ul.padded_elems, ul.slice_elems, ul.partition_offset});
  }
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    ckpt::ParamEntry e{s.name,      s.shape, s.dtype,          s.group,     s.unit,
                       s.trainable, 0,       params_[i].numel, s.tied_names};
    if (params_[i].layout_index) e.offset = layout_->placement(*params_[i].layout_index).offset;
    m.params.push_back(std::move(e));
  }
  m.state_names = checkpoint_state_names(groups_[0].hyper);
  json groups = json::array();
  for (const GroupOptimizer& g : groups_) groups.push_back(hyper_json(g));
  m.optimizer = {{"kind", std::string(kernels::optimizer_name(groups_[0].hyper.kind))},
                 {"groups", groups}};
  const LossScalerState& ls = scaler_->state();
  m.engine_state = {{"global_steps", global_steps_},
                    {"skipped_steps", skipped_steps_},
                    {"applied_steps", applied_steps_},
                    {"last_batch_iteration", last_batch_iteration_},
                    {"loss_scaler",
                     {{"scale", ls.scale},
                      {"iteration", ls.iteration},
                      {"last_overflow_iteration", ls.last_overflow_iteration},
                      {"hysteresis_left", ls.hysteresis_left}}}};
  m.config = cfg_.to_json();
  return m;
}

void EngineImpl::save_group(const std::string& dir, const std::string& tag,
                            const nlohmann::json& client_state, std::optional<bool> model_16bit) {
  check_tag(tag);
  bool mid_window = micro_in_window_ != 0;
  for (const ParamState& p : params_) mid_window = mid_window || p.ready || p.slot_out;
  ZERO_CHECK(
      !mid_window,
      "save_checkpoint: call it at an accumulation boundary (after the step() that ended the "
      "window), not with gradients of a micro-step pending");
  const fs::path tmp_dir = fs::path(dir) / (tag + ".tmp");
  const bool with_model =
      model_16bit.value_or(cfg_.zero_optimization.gather_16bit_weights_on_model_save);
  std::string error;
  if (rank_ == 0) {
    try {
      fs::create_directories(dir);
      fs::remove_all(tmp_dir);
      fs::create_directories(tmp_dir);
    } catch (const std::exception& e) {
      error = fmt::format("save_checkpoint: cannot prepare {}: {}", tmp_dir.string(), e.what());
    }
  }
  agree_on_failure(error);
  try {
    save_into(dir, tag, client_state, with_model);
  } catch (...) {
    // Every rank has left its writes (each step ends in an agreement): nothing of a failed save
    // stays behind. After the swap <tag>.tmp holds the previous checkpoint, removed anyway.
    if (rank_ == 0) {
      std::error_code ignored;
      fs::remove_all(tmp_dir, ignored);
    }
    throw;
  }
}

void EngineImpl::save_into(const std::string& dir, const std::string& tag,
                           const nlohmann::json& client_state, bool with_model) {
  const fs::path final_dir = fs::path(dir) / tag;
  const fs::path tmp_dir = fs::path(dir) / (tag + ".tmp");
  std::string error;

  // This rank's file.
  const std::vector<std::string> names = checkpoint_state_names(groups_[0].hyper);
  const std::size_t P = partition_elems();
  const int own = optimizer_->own_domain();
  ckpt::RankFile mine{rank_, ckpt::rank_file_name(rank_, world_), {}};
  // Frozen parameters kept as int8 shards: their values (dequantized) gathered, on every rank (a
  // collective), and kept by rank 0 for its file.
  std::vector<std::vector<std::byte>> gathered_frozen(specs_.size());
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    if (!params_[i].quantized) continue;
    std::vector<std::byte> value = params_[i].quantized->read();
    if (rank_ == 0) gathered_frozen[i] = std::move(value);
  }
  try {
    std::vector<io::TensorDecl> decls{{"master", DType::F32, {static_cast<std::int64_t>(P)}}};
    for (const std::string& n : names)
      decls.push_back({n, DType::F32, {static_cast<std::int64_t>(P)}});
    std::vector<std::size_t> frozen;
    if (rank_ == 0) {
      for (std::size_t i = 0; i < specs_.size(); ++i) {
        if (params_[i].layout_index) continue;
        frozen.push_back(i);
        decls.push_back({"frozen/" + specs_[i].name, model_dtype_, specs_[i].shape});
      }
    }
    io::SafetensorsStreamWriter w((tmp_dir / mine.file).string(), decls,
                                  {{"format", "zero-checkpoint-rank"}}, checkpoint_write_fault_);
    // Checkpoints hold fp32 (exact for 16-bit master weights or states), converted in tiles;
    // a device's memory comes to the host a tile at a time.
    auto append_f32 = [&](const std::byte* data, DType dtype, std::size_t n) {
      if (dtype == DType::F32 && host_memory_) {
        w.append(data, n * sizeof(float));
        return;
      }
      const std::size_t esize = dtype_size(dtype);
      std::vector<float> tile(std::min<std::size_t>(n, 1 << 20));
      std::vector<std::byte> raw;
      for (std::size_t b = 0; b < n; b += tile.size()) {
        const std::size_t m = std::min(tile.size(), n - b);
        const std::byte* src = data + b * esize;
        if (!host_memory_) {
          raw.resize(m * esize);
          device_.copy(raw.data(), src, m * esize);
          src = raw.data();
        }
        if (dtype == DType::F32) {
          w.append(src, m * sizeof(float));
          continue;
        }
        host_combine(tile.data(), DType::F32, src, dtype, m);
        w.append(tile.data(), m * sizeof(float));
      }
    };
    // Straight from each sub-group's tier: no second copy of the partition.
    for (int t = 0; t < optimizer_->tensors(); ++t) {
      optimizer_->read_tensor(t, own, 0, P, [&](const std::byte* data, std::size_t n) {
        append_f32(data, optimizer_->tensor_dtype(t), n);
      });
    }
    for (std::size_t i : frozen) {
      const Buffer& b = params_[i].frozen;
      if (params_[i].quantized) {
        w.append(gathered_frozen[i].data(), gathered_frozen[i].size());
      } else if (host_memory_) {
        w.append(b.data(), b.size_bytes());
      } else {
        const std::vector<std::byte> bytes = to_host(b.data(), b.size_bytes());
        w.append(bytes.data(), bytes.size());
      }
    }
    w.finish();
    for (std::size_t k = 0; k < decls.size(); ++k) {
      mine.tensors[decls[k].name] = {w.checksums()[k], decls[k].size_bytes()};
    }
  } catch (const std::exception& e) {
    error = fmt::format("save_checkpoint: rank {}: {}", rank_, e.what());
  }
  agree_on_failure(error);

  // Every rank's checksums of master and states, to rank 0, as two exact 32-bit halves each.
  const std::size_t nt = 1 + names.size();
  std::vector<double> sums(2 * nt), all_sums(2 * nt * static_cast<std::size_t>(world_));
  for (std::size_t k = 0; k < nt; ++k) {
    const std::uint64_t v = mine.tensors[k == 0 ? std::string("master") : names[k - 1]].xxh3;
    sums[2 * k] = static_cast<double>(v >> 32);
    sums[2 * k + 1] = static_cast<double>(v & 0xffffffffu);
  }
  if (world_ > 1) {
    control_.all_gather(sums.data(), all_sums.data(), 2 * nt, DType::F64).wait();
  } else {
    all_sums = sums;
  }

  // The whole 16-bit model (collective at stage 3), written by rank 0 as it arrives.
  std::optional<ckpt::RankFile> model_file;
  if (with_model) {
    std::optional<io::SafetensorsStreamWriter> w;
    std::vector<io::TensorDecl> decls;
    for (const ParamSpec& s : specs_) decls.push_back({s.name, model_dtype_, s.shape});
    try {
      if (rank_ == 0)
        w.emplace((tmp_dir / "model_16bit.safetensors").string(), decls,
                  std::map<std::string, std::string>{{"format", "pt"}}, checkpoint_write_fault_);
    } catch (const std::exception& e) {
      error = e.what();
    }
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      const std::vector<std::byte> bytes = gather_model(i);
      if (w && error.empty()) {
        try {
          w->append(bytes.data(), bytes.size());
        } catch (const std::exception& e) {
          error = e.what();
        }
      }
    }
    if (w && error.empty()) {
      try {
        w->finish();
        model_file = ckpt::RankFile{0, "model_16bit.safetensors", {}};
        for (std::size_t k = 0; k < decls.size(); ++k)
          model_file->tensors[decls[k].name] = {w->checksums()[k], decls[k].size_bytes()};
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    if (!error.empty()) error = "save_checkpoint: 16-bit model: " + error;
  }
  agree_on_failure(error);

  // Rank 0: manifest, then the directory into place, then `latest`.
  if (rank_ == 0) {
    try {
      ckpt::Manifest m = describe(tag);
      m.client_state = client_state;
      m.model_16bit = model_file;
      for (int r = 0; r < world_; ++r) {
        ckpt::RankFile f{r, ckpt::rank_file_name(r, world_), {}};
        const std::size_t base = static_cast<std::size_t>(r) * 2 * nt;
        auto sum_of = [&](std::size_t k) {
          return (static_cast<std::uint64_t>(all_sums[base + 2 * k]) << 32) |
                 static_cast<std::uint64_t>(all_sums[base + 2 * k + 1]);
        };
        f.tensors["master"] = {sum_of(0), P * sizeof(float)};
        for (std::size_t k = 0; k < names.size(); ++k)
          f.tensors[names[k]] = {sum_of(k + 1), P * sizeof(float)};
        if (r == 0) {
          for (const auto& [name, sum] : mine.tensors) {
            if (name.rfind("frozen/", 0) == 0) f.tensors[name] = sum;
          }
        }
        m.files.push_back(std::move(f));
      }
      write_text_durably(tmp_dir / "manifest.json", m.to_json().dump(1));  // fsyncs tmp_dir
      if (fs::exists(final_dir)) {
        // Swap atomically, so a crash leaves either the old or the new checkpoint under the tag.
        ZERO_CHECK_AS(IoError,
                      ::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(),
                                  RENAME_EXCHANGE) == 0,
                      "cannot swap {} into place: {}", final_dir.string(), std::strerror(errno));
        io::fsync_directory(dir);
      } else {
        ZERO_CHECK_AS(IoError, ::rename(tmp_dir.c_str(), final_dir.c_str()) == 0,
                      "cannot rename {} to {}: {}", tmp_dir.string(), final_dir.string(),
                      std::strerror(errno));
        io::fsync_directory(dir);
      }
      write_text_durably(fs::path(dir) / "latest", tag + "\n");
    } catch (const std::exception& e) {
      error = fmt::format("save_checkpoint: {}", e.what());
    }
  }
  agree_on_failure(error);

  // The checkpoint is complete. A previous one under the same tag now sits in <tag>.tmp: each
  // rank removes its own file of it at once (dropping a file's cached pages is the cost), then
  // rank 0 the rest. A failure here loses nothing; the next save removes what is left.
  std::error_code ignored;
  fs::remove(tmp_dir / ckpt::rank_file_name(rank_, world_), ignored);
  if (world_ > 1) control_.barrier().wait();
  if (rank_ == 0) fs::remove_all(tmp_dir, ignored);
}

}  // namespace zero::engine_detail
