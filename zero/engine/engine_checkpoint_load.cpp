// Engine::load_checkpoint (format: zero/checkpoint/checkpoint.h; the save is in
// engine_checkpoint.cpp).
//
// Every rank reads the manifest, reads exactly the byte ranges of its new partition through the
// old layout (any world size, any stage) into new memory (PartitionOptimizer::replacement),
// hashing them on the way (and, in memory, making its model copy from the master weights while
// they are in cache), verifies what its share of the files (file q by rank q mod W) still needs,
// and only once every rank succeeded swaps the new memory in. DeepSpeed's checkpoints come in
// through the same CheckpointSource.
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "kernels/combine.h"
#include "zero/checkpoint/source.h"
#include "zero/engine/engine_impl.h"

namespace zero::engine_detail {

// What a load reads, whatever wrote it: zero's own checkpoints, or DeepSpeed's.
using ckpt::SourceCounters;
using ckpt::SourceParam;

nlohmann::json EngineImpl::load_checkpoint(const std::string& dir, const std::string& tag) {
  check_not_begun_in_backward("load_checkpoint");
  std::string error;
  std::unique_ptr<ckpt::CheckpointSource> source;
  try {
    source = ckpt::CheckpointSource::open(dir, tag);
  } catch (const std::exception& e) {
    error = fmt::format("load_checkpoint: {}", e.what());
  }
  agree_on_failure(error);
  const std::vector<SourceParam>& sp = source->params();

  // What the checkpoint holds must be what this engine trains.
  std::map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < sp.size(); ++i) by_name[sp[i].name] = i;
  std::vector<std::string> problems;
  std::vector<std::size_t> from(specs_.size());
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    auto it = by_name.find(specs_[i].name);
    if (it == by_name.end()) {
      problems.push_back(fmt::format("parameter '{}' is not in the checkpoint", specs_[i].name));
      continue;
    }
    const SourceParam& e = sp[it->second];
    if (e.shape != specs_[i].shape) {
      problems.push_back(
          fmt::format("parameter '{}' has shape [{}] here and [{}] in the checkpoint",
                      specs_[i].name, fmt::join(specs_[i].shape, ", "), fmt::join(e.shape, ", ")));
    }
    if (specs_[i].trainable && !e.trainable) {
      problems.push_back(
          fmt::format("parameter '{}' is trainable here but was frozen in the checkpoint (no "
                      "master weights or optimizer states saved)",
                      specs_[i].name));
    }
    from[i] = it->second;
    by_name.erase(it);
  }
  for (const auto& [name, index] : by_name) {
    if (sp[index].trainable)
      problems.push_back(
          fmt::format("the checkpoint's parameter '{}' is not registered here", name));
  }
  const std::vector<std::string> names = checkpoint_state_names(groups_[0].hyper);
  const std::string kind(kernels::optimizer_name(groups_[0].hyper.kind));
  if (std::string why = source->check_states(names, kind); !why.empty()) problems.push_back(why);
  if (!problems.empty()) {
    error = fmt::format("load_checkpoint {}: {}", source->path(), fmt::join(problems, "; "));
  }
  agree_on_failure(error);

  // Each tensor is read straight into the memory that will hold it (PartitionOptimizer::
  // replacement), its checksum computed on the way; what this rank's share of the files still
  // needs is verified after. Nothing is replaced until every rank read and verified.
  const std::size_t P = partition_elems();
  std::vector<PartitionOptimizer::Replacement> fresh;
  std::vector<std::vector<std::byte>> frozen(specs_.size());
  std::vector<std::byte> model;
  const bool stash_model = param_store_ != nullptr || optimizer_->store().nvme_count() > 0;
  // In memory with fp32 master weights, the master weights make the model copy as they are read,
  // while they are in cache (one pass less over memory than write_model() after the commit).
  // Until the ranks agree the model copy then no longer matches the master weights in place: a
  // failure writes it back from them.
  // (Not where the master weights are the model copy: they must stay until the ranks agree, and
  // adopt() writes the new ones into it.)
  // (Nor where the ranks share one model copy: the peers may read it until they agree.)
  const bool model_on_the_way = host_memory_ && !stash_model && !optimizer_->master_in_model() &&
                                !shared_model_ && optimizer_->tensor_dtype(0) == DType::F32;
  // At stages 1 and 2 every rank's model copy also needs the other ranks' slices. Where the ranks
  // share one address space (in-process ranks) each rank writes its slices into the peers' model
  // copies as well, while they are in cache (push_model_to_peers()): the all-gather's read of every
  // peer slice is saved. A peer's slices are complete once it reaches the agreement below, a
  // collective over the same communicator; nothing else writes them during the load. Elsewhere
  // each unit's model copy is all-gathered as soon as this rank has read its master weights, while
  // the rest is read; every rank starts every unit's gather whether or not its reads failed, so
  // the collectives match. Either way a failure (agreed on at the end) writes the model copy back
  // from the master weights in place and all-gathers it again.
  const bool spread_model = model_on_the_way && gathers_model();
  const bool push_model = spread_model && comm_.shares_address_space() && &control_ == &comm_;
  const bool gather_early = spread_model && !push_model;
  ZERO_ASSERT(!spread_model || num_domains() == 1);
  // Where the master weights are the model copy, nothing is written before the ranks agree. With
  // in-process ranks at stages 1 and 2, adopt() then writes each rank's new master weights into
  // every peer's model copy as well, while they are in cache, in place of the all-gather after it
  // (a barrier orders those writes before anyone's next forward).
  const bool push_on_adopt = optimizer_->master_in_model() && host_memory_ && !stash_model &&
                             !shared_model_ && gathers_model() && num_domains() == 1 &&
                             comm_.shares_address_space() && &control_ == &comm_;
  const PartitionOptimizer::ModelEcho to_peers =
      push_model ? push_model_to_peers() : PartitionOptimizer::ModelEcho();
  SourceCounters counters;
  // Writes fp32 values that produce(out, first, n, also) makes of elements [offset, offset +
  // count) of domain d, converting in tiles where the tensor is held in another dtype. `also`
  // (CheckpointSource::read's) makes the model copy of master weights on the way, or is empty.
  using ValuesFn = ckpt::CheckpointSource::ValuesFn;
  std::vector<float> tile(std::size_t{1} << 16);
  std::vector<std::byte> narrow;  // a tile converted on the host, for a device's memory
  auto put = [&](PartitionOptimizer::Replacement& r, int d, std::size_t offset, std::size_t count,
                 const auto& produce) {
    const bool model_too = model_on_the_way && r.tensor() == 0;
    optimizer_->write_replacement(
        r, d, offset, count, [&](std::byte* data, std::size_t first, std::size_t n) {
          if (r.dtype() == DType::F32 && host_memory_) {
            ValuesFn also;
            if (model_too) {
              also = [&](const std::byte* values, std::size_t i, std::size_t m) {
                optimizer_->write_model_range(d, offset + first + i, m, values, to_peers);
              };
            }
            produce(reinterpret_cast<float*>(data), first, n, also);
            return;
          }
          // In tiles: converted where the tensor is 16-bit, and copied to a device's memory.
          const std::size_t esize = dtype_size(r.dtype());
          for (std::size_t b = 0; b < n; b += tile.size()) {
            const std::size_t m = std::min(tile.size(), n - b);
            produce(tile.data(), first + b, m, ValuesFn());
            std::byte* out = data + b * esize;
            if (host_memory_) {
              combine(out, r.dtype(), tile.data(), DType::F32, m);
            } else if (r.dtype() == DType::F32) {
              device_.copy(out, tile.data(), m * esize);
            } else {
              narrow.resize(m * esize);
              host_combine(narrow.data(), r.dtype(), tile.data(), DType::F32, m);
              device_.copy(out, narrow.data(), m * esize);
            }
          }
        });
  };
  // Padding and alignment gaps hold the optimizer's initial values (master weights: zero).
  auto fill = [&](PartitionOptimizer::Replacement& r, int d, std::size_t offset, std::size_t count,
                  float value) {
    put(r, d, offset, count, [&](float* out, std::size_t, std::size_t n, const ValuesFn& also) {
      std::fill_n(out, n, value);
      if (also) also(reinterpret_cast<const std::byte*>(out), 0, n);
    });
  };
  std::vector<Work> early;
  std::size_t units_started = 0;
  // Starts the gathers of the units whose slices lie in the first `written` partition elements.
  auto gather_through = [&](std::size_t written) {
    for (; units_started < layout_units_; ++units_started) {
      const UnitLayout& ul = layout_->unit(static_cast<int>(units_started));
      if (ul.partition_offset + ul.slice_elems > written) break;
      if (ul.padded_elems > 0) early.push_back(start_model_gather(units_started));
    }
  };
  // Tensor k (0: master, then each state) parameter by parameter, so a source that reconstructs a
  // whole parameter at a time does so once per tensor.
  auto read_tensor = [&](std::size_t k) {
    const std::string& what = k == 0 ? std::string("master") : names[k - 1];
    const float init =
        k == 0 ? 0.0f
               : kernels::optimizer_state_initial_value(groups_[0].hyper, static_cast<int>(k - 1));
    fresh.push_back(optimizer_->replacement(static_cast<int>(k)));
    PartitionOptimizer::Replacement& r = fresh.back();
    for (int d = 0; d < num_domains(); ++d) {
      std::size_t written = 0;
      for (const SliceSegment& seg : layout_->partition_segments(domain_rank(d))) {
        ZERO_ASSERT(seg.slice_offset >= written);
        fill(r, d, written, seg.slice_offset - written, init);
        if (k == 0 && gather_early) gather_through(seg.slice_offset);
        const std::size_t param = from[layout_to_spec_[seg.param]];
        put(r, d, seg.slice_offset, seg.numel,
            [&](float* out, std::size_t first, std::size_t n, const ValuesFn& also) {
              source->read(param, what, seg.param_begin + first, n, out, also);
            });
        written = seg.slice_offset + seg.numel;
      }
      fill(r, d, written, P - written, init);
    }
  };
  auto restore_model = [&] {
    for (Work& w : early) w.wait();
    if (!model_on_the_way) return;
    optimizer_->write_model();
    if (spread_model) all_gather_model();
  };
  try {
    read_tensor(0);
  } catch (const std::exception& e) {
    error = fmt::format("load_checkpoint {}: {}", source->path(), e.what());
  }
  if (gather_early) gather_through(P);
  try {
    if (!error.empty()) throw IoError(error);
    for (std::size_t k = 1; k <= names.size(); ++k) read_tensor(k);
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      if (params_[i].layout_index) continue;
      const std::vector<float> v = source->read_frozen(from[i]);
      frozen[i].resize(params_[i].numel * dtype_size(model_dtype_));
      host_combine(frozen[i].data(), model_dtype_, v.data(), DType::F32, v.size());
    }
    source->verify(rank_, world_);
    counters = source->counters();
    // With NVMe in play, the model copy the new master weights make is found now (reading NVMe
    // sub-groups back), so that nothing after the ranks agree does I/O. With stage 3's slices in
    // a swap store it is written there now as a batch (committed below), and the persistent
    // units' slices read back for the refresh. In memory the model copy was made on the way
    // (fp32 master weights) or write_model() makes it after the commit (nothing to fail).
    if (stash_model) model = optimizer_->model_from(fresh.front());
    if (param_store_) {
      param_store_->begin_batch();
      optimizer_->write_model(model);
      param_store_->flush();
      if (fetcher_) fetcher_->stage_refresh();
    }
  } catch (const std::exception& e) {
    if (error.empty()) error = fmt::format("load_checkpoint {}: {}", source->path(), e.what());
  }
  try {
    agree_on_failure(error);
  } catch (...) {
    restore_model();
    if (param_store_) param_store_->abort_batch();
    if (fetcher_) fetcher_->drop_staged();
    throw;
  }

  // Commit.
  optimizer_->adopt(std::move(fresh), push_on_adopt ? push_model_to_peers()
                                                    : PartitionOptimizer::ModelEcho());
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    if (frozen[i].empty()) continue;
    if (params_[i].quantized) {
      params_[i].quantized->set(frozen[i].data());
    } else {
      device_.copy(params_[i].frozen.data(), frozen[i].data(), frozen[i].size());
    }
  }
  global_steps_ = counters.global_steps;
  skipped_steps_ = counters.skipped_steps;
  applied_steps_ = counters.applied_steps;
  last_batch_iteration_ = counters.last_batch_iteration;
  // The lr each group had for its next step (set_lr's), where the checkpoint has as many groups.
  if (counters.group_lrs.size() == groups_.size()) {
    for (std::size_t g = 0; g < groups_.size(); ++g) groups_[g].base_lr = counters.group_lrs[g];
  }
  // A dynamic scaler continues where it was (DeepSpeed restores it); a static one keeps the
  // config's scale.
  if (scaler_->dynamic() && counters.scaler) scaler_->restore(*counters.scaler);
  micro_in_window_ = 0;
  reducer_->start_window();
  reset_micro_step();
  if (param_store_) {
    param_store_->commit_batch();  // written back above: flips slots, no I/O
  } else if (stash_model) {
    optimizer_->write_model(model);
  } else if (!model_on_the_way) {
    optimizer_->write_model();
  }
  if (gather_early) {
    for (Work& w : early) w.wait();
  } else if (push_on_adopt) {
    comm_.barrier_now();  // every peer's slices are in this rank's model copy
  } else if (!push_model) {
    all_gather_model();
  }
  if (fetcher_) fetcher_->refresh_after_step();
  return source->client_state();
}

}  // namespace zero::engine_detail
