#include "zero/engine/partition_optimizer.h"

#include <algorithm>
#include <cstring>

#include "kernels/norm.h"
#include "zero/base/error.h"
#include "zero/base/stream_copy.h"

namespace zero::engine_detail {
namespace {

// 16-bit master weights are stepped in fp32 tiles of this many elements.
constexpr std::size_t kMasterTileElems = 1 << 16;

}  // namespace

PartitionOptimizer::PartitionOptimizer(Device& device, const kernels::ComputeKernels& compute,
                                       const FlatLayout& layout, const PartitionOptions& options,
                                       SliceMap& slices)
    : device_(device),
      compute_(compute),
      layout_(layout),
      options_(options),
      slices_(slices),
      domains_{options.rank, layout.world_size(), options.every_domain},
      partition_elems_(layout.partition_elems()) {
  ZERO_CHECK(options.rank >= 0 && options.rank < layout.world_size(),
             "PartitionOptimizer: rank {} outside the layout's {} ranks", options.rank,
             layout.world_size());
  std::vector<offload::StoreTensor> tensors;
  if (options_.master_in_model) {
    const offload::StoreOptions& so = options_.store;
    ZERO_CHECK(options_.master_dtype == DType::F32 && options_.model_dtype == DType::F32 &&
                   !so.nvme && (so.offload_kind == options_.kind || so.ratio == 0.0),
               "PartitionOptimizer: master weights kept in the model copy need an fp32 master and "
               "model and no offloaded sub-group (got {} and {}, ratio {})",
               dtype_name(options_.master_dtype), dtype_name(options_.model_dtype), so.ratio);
  } else {
    tensors.push_back({options_.master_dtype, MemoryTag::MasterParams, 0.0f});
  }
  const int nstates = kernels::optimizer_state_count(options_.optimizer);
  for (int k = 0; k < nstates; ++k) {
    tensors.push_back({options_.state_dtype, MemoryTag::OptimizerStates,
                       kernels::optimizer_state_initial_value(options_.optimizer, k)});
  }
  offload::StoreOptions so = options_.store;
  so.total_elems = static_cast<std::size_t>(domains()) * partition_elems_;
  so.resident_kind = options_.kind;
  store_ = std::make_unique<offload::SubgroupStore>(device_, std::move(tensors), so);
  if (options_.own_gradients) {
    gradients_ = device_.allocate(partition_elems_ * dtype_size(options_.grad_dtype),
                                  options_.kind, MemoryTag::Gradients);
    compute_.fill_zero(gradients_.data(), options_.grad_dtype, partition_elems_, options_.exec);
  }
  build_runs();
  norm_.first.assign(layout_.num_units() + 1, 0);
  for (std::size_t u = 0; u < layout_.num_units(); ++u) {
    const std::size_t S = layout_.unit(static_cast<int>(u)).slice_elems;
    norm_.first[u + 1] =
        norm_.first[u] + (S + kernels::kNormBlockElems - 1) / kernels::kNormBlockElems;
  }
}

std::size_t PartitionOptimizer::partition_offset(int domain, int unit) const {
  return static_cast<std::size_t>(domain) * partition_elems_ + layout_.unit(unit).partition_offset;
}

void PartitionOptimizer::build_runs() {
  for (int d = 0; d < domains(); ++d) {
    const int r = domain_rank(d);
    for (std::size_t u = 0; u < layout_.num_units(); ++u) {
      const std::size_t S = layout_.unit(static_cast<int>(u)).slice_elems;
      if (S == 0) continue;
      const std::vector<SliceSegment> segs = layout_.segments(static_cast<int>(u), r);
      const std::size_t base = partition_offset(d, static_cast<int>(u));
      Run run{d, static_cast<int>(u), 0, 0, segs.empty() ? 0 : layout_.param(segs[0].param).group,
              base};
      for (const SliceSegment& s : segs) {
        const int g = layout_.param(s.param).group;
        if (g != run.group) {
          run.end = s.slice_offset;
          if (run.end > run.begin) runs_.push_back(run);
          run.begin = s.slice_offset;
          run.flat = base + s.slice_offset;
          run.group = g;
        }
      }
      run.end = S;
      runs_.push_back(run);
    }
  }
}

void PartitionOptimizer::for_runs(
    std::size_t begin, std::size_t end,
    const std::function<void(const Run&, std::size_t, std::size_t)>& fn) const {
  // Runs are in ascending store order: the first that ends after `begin`.
  auto it = std::partition_point(runs_.begin(), runs_.end(), [&](const Run& r) {
    return r.flat + (r.end - r.begin) <= begin;
  });
  for (; it != runs_.end() && it->flat < end; ++it) {
    const std::size_t lo = std::max(begin, it->flat);
    const std::size_t hi = std::min(end, it->flat + (it->end - it->begin));
    if (hi > lo) fn(*it, it->begin + (lo - it->flat), it->begin + (hi - it->flat));
  }
}

void PartitionOptimizer::for_runs(
    const offload::SubgroupStore::View& view,
    const std::function<void(const Run&, std::size_t, std::size_t)>& fn) const {
  for_runs(view.begin, view.end, fn);
}

std::byte* PartitionOptimizer::master_at(const Run& run, std::size_t first,
                                         const offload::SubgroupStore::View& view) {
  if (options_.master_in_model) return slices_.model(run.domain, run.unit, first);
  return view.tensors[0] +
         (run.flat + (first - run.begin) - view.begin) * dtype_size(options_.master_dtype);
}

void PartitionOptimizer::set_master(int unit, std::span<const float> unit_flat) {
  const UnitLayout& ul = layout_.unit(unit);
  ZERO_ASSERT(unit_flat.size() == ul.padded_elems);
  const std::size_t S = ul.slice_elems;
  const DType dt = options_.master_dtype;
  for (int d = 0; d < domains(); ++d) {
    const std::size_t base = partition_offset(d, unit);
    const float* src = unit_flat.data() + static_cast<std::size_t>(domain_rank(d)) * S;
    if (options_.master_in_model) {
      if (S == 0) continue;
      compute_.combine(slices_.model(d, unit, 0), DType::F32, src, DType::F32, S, 1.0f, false,
                       options_.exec);
      slices_.model_written(d, unit, 0, S);
      continue;
    }
    store_->modify(base, base + S, [&](const offload::SubgroupStore::View& v) {
      const std::size_t lo = std::max(base, v.begin), hi = std::min(base + S, v.end);
      compute_.combine(v.tensors[0] + (lo - v.begin) * dtype_size(dt), dt, src + (lo - base),
                       DType::F32, hi - lo, 1.0f, false, options_.exec);
    });
  }
}

std::byte* PartitionOptimizer::gradient(int unit, std::size_t slice_offset) const {
  ZERO_ASSERT(options_.own_gradients);
  return element_at(gradients_, options_.grad_dtype,
                    layout_.unit(unit).partition_offset + slice_offset);
}

void PartitionOptimizer::step(std::span<const kernels::OptimizerHyper> hypers,
                              std::span<const kernels::StepScalars> scalars,
                              const offload::SubgroupStore::Agree& agree,
                              offload::SubgroupStore* model_store,
                              const std::function<void()>& before_commit, double* own_sumsq) {
  const bool early = early_.open;
  if (early) {
    ZERO_ASSERT(model_store == nullptr && store_->nvme_count() == 0);
    ZERO_ASSERT(norm_.fusing == (own_sumsq != nullptr && compute_.optimizer_step_norm != nullptr));
  } else {
    start_norm(own_sumsq != nullptr);
  }
  struct EndEarly {
    PartitionOptimizer& self;
    ~EndEarly() { self.early_.open = false; }
  } end_early{*this};
  // The model copy of stepped NVMe sub-groups, kept until the store commits (see the header).
  // Pointers are looked up again on restore. A model copy in a swap store needs none: its batch
  // is aborted instead.
  struct Undo {
    int domain, unit;
    std::size_t first;
    std::vector<std::byte> bytes;
  };
  std::vector<Undo> undo;
  ZERO_ASSERT(!options_.master_in_model || model_store == nullptr);
  const std::size_t msize = dtype_size(options_.model_dtype);
  // With the model copy in a swap store, resident sub-groups write theirs before the agreement
  // too: from a step on copies of their state (ModelOnly), their state itself being stepped after
  // the agreement without a model write (StateOnly), so nothing after it can fail on I/O.
  const bool preview = model_store != nullptr && store_->nvme_count() < store_->count();
  auto each_run = [&](const offload::SubgroupStore::View& view, PartMode mode) {
    StepBatch batch;
    StepBatch* batching = compute_.waits_per_call ? &batch : nullptr;
    for_runs(view, [&](const Run& run, std::size_t first, std::size_t last) {
      if (!steps(run) || (early && early_.stepped[static_cast<std::size_t>(run.unit)])) return;
      const auto g = static_cast<std::size_t>(run.group);
      ZERO_ASSERT(g < hypers.size() && g < scalars.size());
      if (batch.group != run.group) flush(batch, hypers, scalars);
      batch.group = run.group;
      step_part(run, first, last, view, hypers[g], scalars[g], mode, batching);
    });
    flush(batch, hypers, scalars);  // the view's memory is valid only inside this callback
  };
  std::function<void()> before_agree;
  if (model_store != nullptr) {
    model_store->begin_batch();
    before_agree = [&] {
      if (preview)
        store_->visit_memory([&](const auto& view) { each_run(view, PartMode::ModelOnly); });
      model_store->flush();
      if (before_commit) before_commit();
    };
  } else if (before_commit) {
    before_agree = before_commit;
  }
  try {
    store_->update_all(
        [&](const offload::SubgroupStore::View& view) {
          if (view.nvme && model_store == nullptr) {
            for_runs(view, [&](const Run& run, std::size_t first, std::size_t last) {
              const std::byte* model = slices_.model(run.domain, run.unit, first);
              undo.push_back({run.domain, run.unit, first,
                              std::vector<std::byte>(model, model + (last - first) * msize)});
            });
          }
          each_run(view, !view.nvme && preview ? PartMode::StateOnly : PartMode::Full);
        },
        agree, before_agree);
    if (model_store != nullptr) model_store->commit_batch();
  } catch (const IoError&) {
    if (model_store != nullptr) {
      model_store->abort_batch();
    } else {
      slices_.model_settled();  // no copy of a stretch in flight while it is restored
      for (const Undo& u : undo) {
        std::memcpy(slices_.model(u.domain, u.unit, u.first), u.bytes.data(), u.bytes.size());
        slices_.model_written(u.domain, u.unit, u.first, u.bytes.size() / msize);
      }
    }
    slices_.model_settled();
    throw;
  } catch (...) {
    if (model_store != nullptr) model_store->abort_batch();
    slices_.model_settled();
    throw;
  }
  slices_.model_settled();
  if (own_sumsq != nullptr) *own_sumsq = norm_.fusing ? finish_norm() : squared_norm();
  norm_.fusing = false;
}

void PartitionOptimizer::start_norm(bool own_sumsq) {
  norm_.fusing = own_sumsq && compute_.optimizer_step_norm != nullptr;
  if (norm_.fusing) {
    norm_.sums.assign(norm_.first.back(), 0.0);
    norm_.summed.assign(norm_.first.back(), 0);
  }
}

void PartitionOptimizer::begin_early(bool own_sumsq) {
  ZERO_ASSERT(!early_.open && store_->nvme_count() == 0);
  early_.open = true;
  early_.stepped.assign(layout_.num_units(), 0);
  start_norm(own_sumsq);
}

void PartitionOptimizer::end_early() {
  early_.open = false;
  norm_.fusing = false;
}

void PartitionOptimizer::step_unit(int unit, std::span<const kernels::OptimizerHyper> hypers,
                                   std::span<const kernels::StepScalars> scalars) {
  ZERO_ASSERT(early_.open && !early_.stepped[static_cast<std::size_t>(unit)]);
  early_.stepped[static_cast<std::size_t>(unit)] = 1;
  // Runs are in store order, domain after domain: each domain's runs of the unit, sub-group by
  // sub-group where a sub-group edge cuts one (memory sub-groups only: nothing to read or write
  // back).
  for (const Run& run : runs_) {
    if (run.unit != unit || !steps(run)) continue;
    const auto g = static_cast<std::size_t>(run.group);
    ZERO_ASSERT(g < hypers.size() && g < scalars.size());
    const std::size_t n = run.end - run.begin;
    store_->modify(run.flat, run.flat + n, [&](const offload::SubgroupStore::View& view) {
      const std::size_t lo = std::max(run.flat, view.begin);
      const std::size_t hi = std::min(run.flat + n, view.end);
      step_part(run, run.begin + (lo - run.flat), run.begin + (hi - run.flat), view, hypers[g],
                scalars[g], PartMode::Full, nullptr);
    });
  }
}

void PartitionOptimizer::step_own_domain_only() {
  ZERO_ASSERT(domains() > 1 && options_.master_in_model && store_->nvme_count() == 0);
  own_domain_only_ = true;
}

void PartitionOptimizer::flush(StepBatch& batch, std::span<const kernels::OptimizerHyper> hypers,
                               std::span<const kernels::StepScalars> scalars) {
  if (!batch.tensors.empty()) {
    const auto g = static_cast<std::size_t>(batch.group);
    compute_.optimizer_step_many(hypers[g], scalars[g], batch.tensors, options_.exec);
  }
  for (const StepBatch::Written& w : batch.written) {
    slices_.model_written(w.domain, w.unit, w.first, w.count);
  }
  batch.tensors.clear();
  batch.written.clear();
}

void PartitionOptimizer::step_part(const Run& run, std::size_t first, std::size_t last,
                                   const offload::SubgroupStore::View& view,
                                   const kernels::OptimizerHyper& hyper,
                                   const kernels::StepScalars& scalars, PartMode mode,
                                   StepBatch* batch) {
  const DType master_dtype = options_.master_dtype;
  const DType model_dtype = options_.model_dtype;
  const std::size_t off = run.flat + (first - run.begin) - view.begin;  // inside the sub-group
  const std::size_t n = last - first;
  const bool write_model = mode != PartMode::StateOnly;
  const bool on_copies = mode == PartMode::ModelOnly;
  // With the master in the model copy, the step writes the model copy as the master.
  const bool in_model = options_.master_in_model;
  ZERO_ASSERT(!in_model || mode == PartMode::Full);
  std::byte* model_out =
      write_model && !in_model ? slices_.model(run.domain, run.unit, first) : nullptr;
  const std::byte* grad = slices_.gradient(run.domain, run.unit, first);
  kernels::OptimizerTensors t;
  t.grad_dtype = options_.grad_dtype;
  t.state_dtype = options_.state_dtype;
  // The model copy is written by the kernel, from the updated master while it is in registers:
  // rounded once to 16 bits, or (fp32) the master's own bits, with no second pass over it.
  if (model_out != nullptr) t.param_out_dtype = model_dtype;
  const bool late = slices_.gradient_late(run.domain, run.unit);
  const bool in_place = master_dtype == DType::F32 && !on_copies;
  std::size_t tile = in_place ? std::max<std::size_t>(n, 1) : kMasterTileElems;
  if (late) tile = std::min(tile, kLateTileElems);
  const std::size_t ssize = dtype_size(options_.state_dtype);
  const std::size_t states = view.tensors.size() - static_cast<std::size_t>(first_state());
  std::byte* const run_master = master_at(run, first, view);
  // An fp32 master stepped in place sums the run's norm blocks on the way (tile by tile when
  // late: the tiles start on blocks).
  const bool batched = batch != nullptr && in_place && !late;
  double* const run_blocks = in_place && !batched ? fused_norm_blocks(run, first, last) : nullptr;
  for (std::size_t b = 0; b < n; b += tile) {
    const std::size_t m = std::min(tile, n - b);
    std::byte* master = run_master + b * dtype_size(master_dtype);
    if (master_dtype == DType::F32 && !on_copies) {
      t.master = reinterpret_cast<float*>(master);
    } else {
      if (master_tile_.empty()) {
        // Where the kernels compute (a GPU's memory unless the partition is on the host).
        master_tile_ =
            device_.allocate(kMasterTileElems * sizeof(float), options_.kind, MemoryTag::Staging);
      }
      t.master = static_cast<float*>(master_tile_.data());
      compute_.combine(t.master, DType::F32, master, master_dtype, m, 1.0f, false, options_.exec);
    }
    // A late tile is summed by the kernel as it steps it, where it can be (the sum never stored:
    // finish_norm() forms what it reads after the step), else formed in memory right before.
    kernels::GradSources sources;
    const bool summed = late && sums_in_step(run.domain, run.unit, first + b, &sources);
    if (late && !summed) slices_.settle_gradient(run.domain, run.unit, first + b, m);
    t.grad = grad + b * dtype_size(options_.grad_dtype);
    std::byte* state[2] = {nullptr, nullptr};
    for (std::size_t k = 0; k < states && k < 2; ++k) {
      state[k] = view.tensors[k + static_cast<std::size_t>(first_state())] + (off + b) * ssize;
      if (on_copies) {
        // The kernel steps copies; the state itself is stepped after the agreement.
        state_tiles_[k].assign(state[k], state[k] + m * ssize);
        state[k] = state_tiles_[k].data();
      }
    }
    t.state0 = state[0];
    t.state1 = state[1];
    if (model_out != nullptr) t.param_out = model_out + b * dtype_size(model_dtype);
    t.numel = m;
    if (batched) {
      batch->tensors.push_back(t);  // one tile: the whole run, stepped in place
      if (write_model) batch->written.push_back({run.domain, run.unit, first, n});
      return;
    }
    double* const tile_blocks =
        run_blocks != nullptr ? run_blocks + b / kernels::kNormBlockElems : nullptr;
    if (summed) {
      compute_.optimizer_step_summed(hyper, scalars, t, sources, tile_blocks, options_.exec);
    } else if (run_blocks != nullptr) {
      compute_.optimizer_step_norm(hyper, scalars, t, tile_blocks, options_.exec);
    } else {
      compute_.optimizer_step(hyper, scalars, t, options_.exec);
    }
    // A late run's model copy is said written tile by tile, while each tile is in cache.
    if (late && write_model) slices_.model_written(run.domain, run.unit, first + b, m);
    if (master_dtype != DType::F32 && !on_copies) {
      // The master keeps what the model copy got: the update rounded once to bf16.
      compute_.combine(master, master_dtype, t.master, DType::F32, m, 1.0f, false, options_.exec);
    }
  }
  if (write_model && !late) slices_.model_written(run.domain, run.unit, first, n);
}

void PartitionOptimizer::write_model() {
  if (options_.master_in_model) return;  // it is the master
  const DType dt = options_.master_dtype;
  store_->read(0, store_->total_elems(), [&](const offload::SubgroupStore::View& view) {
    for_runs(view, [&](const Run& run, std::size_t first, std::size_t last) {
      const std::size_t off = run.flat + (first - run.begin) - view.begin;
      compute_.combine(slices_.model(run.domain, run.unit, first), options_.model_dtype,
                       view.tensors[0] + off * dtype_size(dt), dt, last - first, 1.0f, false,
                       options_.exec);
      slices_.model_written(run.domain, run.unit, first, last - first);
    });
  });
  slices_.model_settled();
}

std::vector<std::byte> PartitionOptimizer::model_from(Replacement& master) {
  ZERO_ASSERT(master.tensor() == 0);
  const std::size_t msize = dtype_size(options_.model_dtype);
  const std::size_t total = static_cast<std::size_t>(domains()) * partition_elems_;
  std::vector<std::byte> model(total * msize);
  auto convert = [&](const std::byte* src, std::size_t first, std::size_t n) {
    compute_.combine(model.data() + first * msize, options_.model_dtype, src, options_.master_dtype,
                     n, 1.0f, false, options_.exec);
  };
  if (master.stored_) {
    master.stored_->read_range(0, total, convert);
  } else {
    convert(static_cast<const std::byte*>(master.master_.data()), 0, total);
  }
  return model;
}

void PartitionOptimizer::write_model_range(int domain, std::size_t offset, std::size_t count,
                                           const std::byte* master, const ModelEcho& echo) {
  ZERO_ASSERT(domain >= 0 && domain < domains() && offset + count <= partition_elems_);
  const DType dt = options_.master_dtype;
  const std::size_t msize = dtype_size(options_.model_dtype);
  offload::SubgroupStore::View range;
  range.begin = static_cast<std::size_t>(domain) * partition_elems_ + offset;
  range.end = range.begin + count;
  for_runs(range, [&](const Run& run, std::size_t first, std::size_t last) {
    const std::byte* src = master + (run.flat + (first - run.begin) - range.begin) * dtype_size(dt);
    std::byte* dst = slices_.model(run.domain, run.unit, first);
    if (options_.model_dtype == dt) {
      // The whole model copy is what is being written, a piece at a time: stream it.
      copy_large(dst, src, (last - first) * msize, partition_elems_ * msize);
      if (echo) echo(run.unit, first, src, last - first);  // the source is the one in cache
    } else {
      compute_.combine(dst, options_.model_dtype, src, dt, last - first, 1.0f, false,
                       options_.exec);
      if (echo) echo(run.unit, first, dst, last - first);
    }
    slices_.model_written(run.domain, run.unit, first, last - first);
  });
  slices_.model_settled();
}

void PartitionOptimizer::write_model(std::span<const std::byte> model) {
  const std::size_t msize = dtype_size(options_.model_dtype);
  ZERO_ASSERT(model.size() == static_cast<std::size_t>(domains()) * partition_elems_ * msize);
  for (int d = 0; d < domains(); ++d) {
    for (std::size_t u = 0; u < layout_.num_units(); ++u) {
      const int unit = static_cast<int>(u);
      const std::size_t n = layout_.unit(unit).slice_elems;
      if (n == 0) continue;
      std::memcpy(slices_.model(d, unit, 0), model.data() + partition_offset(d, unit) * msize,
                  n * msize);
      slices_.model_written(d, unit, 0, n);
    }
  }
  slices_.model_settled();
}

DType PartitionOptimizer::tensor_dtype(int tensor) const {
  return tensor == 0 ? options_.master_dtype : options_.state_dtype;
}

void PartitionOptimizer::read_tensor(int tensor, int domain, std::size_t offset,
                                     std::size_t count, const TensorVisit& visit) {
  ZERO_ASSERT(tensor >= 0 && tensor < tensors() && domain >= 0 && domain < domains());
  ZERO_ASSERT(offset + count <= partition_elems_);
  const std::size_t begin = static_cast<std::size_t>(domain) * partition_elems_ + offset;
  const std::size_t esize = dtype_size(tensor_dtype(tensor));
  if (tensor == 0 && options_.master_in_model) {
    // The model copy's runs, and zeros (the master's value there) where the partition has none.
    static constexpr float kZeros[1024] = {};
    auto zeros = [&](std::size_t n) {
      for (std::size_t b = 0; b < n; b += std::size(kZeros))
        visit(reinterpret_cast<const std::byte*>(kZeros), std::min(std::size(kZeros), n - b));
    };
    std::size_t at = begin;
    for_runs(begin, begin + count, [&](const Run& run, std::size_t first, std::size_t last) {
      const std::size_t flat = run.flat + (first - run.begin);
      zeros(flat - at);
      visit(slices_.model(run.domain, run.unit, first), last - first);
      at = flat + (last - first);
    });
    zeros(begin + count - at);
    return;
  }
  const auto t = static_cast<std::size_t>(tensor - 1 + first_state());
  store_->read(begin, begin + count, [&](const offload::SubgroupStore::View& v) {
    const std::size_t lo = std::max(begin, v.begin), hi = std::min(begin + count, v.end);
    visit(v.tensors[t] + (lo - v.begin) * esize, hi - lo);
  });
}

PartitionOptimizer::Replacement PartitionOptimizer::replacement(int tensor) {
  ZERO_ASSERT(tensor >= 0 && tensor < tensors());
  Replacement r;
  r.tensor_ = tensor;
  r.dtype_ = tensor_dtype(tensor);
  if (tensor == 0 && options_.master_in_model) {
    // New master weights wait beside the model copy until adopt() writes them into it.
    r.master_ = device_.allocate(static_cast<std::size_t>(domains()) * partition_elems_ *
                                     sizeof(float),
                                 options_.kind, MemoryTag::Staging);
  } else {
    r.stored_.emplace(store_->replacement(tensor - 1 + first_state()));
  }
  return r;
}

// `first` is passed on relative to `offset`, so a caller need not know the store's order.
void PartitionOptimizer::write_replacement(Replacement& r, int domain, std::size_t offset,
                                           std::size_t count, const TensorWrite& visit) const {
  ZERO_ASSERT(domain >= 0 && domain < domains());
  ZERO_ASSERT(offset + count <= partition_elems_);
  const std::size_t begin = static_cast<std::size_t>(domain) * partition_elems_ + offset;
  if (!r.stored_) {
    visit(static_cast<std::byte*>(r.master_.data()) + begin * sizeof(float), 0, count);
    return;
  }
  r.stored_->for_range(begin, begin + count, [&](std::byte* data, std::size_t first, std::size_t n) {
    visit(data, first - begin, n);
  });
}

void PartitionOptimizer::adopt(std::vector<Replacement>&& all, const ModelEcho& echo) {
  std::vector<offload::SubgroupStore::Replacement> stored;
  for (Replacement& r : all) {
    if (r.stored_) {
      stored.push_back(std::move(*r.stored_));
      continue;
    }
    // master_in_model: the new master weights become the model copy (the padding has none).
    const auto* master = static_cast<const std::byte*>(r.master_.data());
    const std::size_t total = static_cast<std::size_t>(domains()) * partition_elems_;
    for_runs(0, total, [&](const Run& run, std::size_t first, std::size_t last) {
      const std::byte* src = master + (run.flat + (first - run.begin)) * sizeof(float);
      std::byte* dst = slices_.model(run.domain, run.unit, first);
      if (!echo) {
        device_.copy(dst, src, (last - first) * sizeof(float));
      } else {
        // In pieces, so that the echo reads each one from cache right after the copy read it.
        for (std::size_t b = 0; b < last - first; b += kMasterTileElems) {
          const std::size_t m = std::min(kMasterTileElems, last - first - b);
          copy_large(dst + b * sizeof(float), src + b * sizeof(float), m * sizeof(float),
                     total * sizeof(float));
          echo(run.unit, first + b, src + b * sizeof(float), m);
        }
      }
      slices_.model_written(run.domain, run.unit, first, last - first);
    });
    slices_.model_settled();
  }
  store_->adopt(std::move(stored));
}

}  // namespace zero::engine_detail
