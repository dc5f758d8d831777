#include "zero/engine/partition_optimizer.h"

#include <algorithm>

#include "zero/base/error.h"

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
  const std::size_t total = static_cast<std::size_t>(domains()) * partition_elems_;
  master_ = alloc(total, options_.master_dtype, MemoryTag::MasterParams);
  if (options_.own_gradients) {
    gradients_ = alloc(partition_elems_, options_.grad_dtype, MemoryTag::Gradients);
    compute_.fill_zero(gradients_.data(), options_.grad_dtype, partition_elems_, options_.exec);
  }
  const int nstates = kernels::optimizer_state_count(options_.optimizer);
  for (int k = 0; k < nstates; ++k) {
    states_.push_back(alloc(total, options_.state_dtype, MemoryTag::OptimizerStates));
    const std::vector<float> init(total,
                                  kernels::optimizer_state_initial_value(options_.optimizer, k));
    compute_.combine(states_.back().data(), options_.state_dtype, init.data(), DType::F32, total,
                     1.0f, false, options_.exec);
  }
  build_runs();
}

Buffer PartitionOptimizer::alloc(std::size_t elems, DType dtype, MemoryTag tag) {
  return device_.allocate(elems * dtype_size(dtype), options_.kind, tag);
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
      Run run{d, static_cast<int>(u), 0, 0, segs.empty() ? 0 : layout_.param(segs[0].param).group};
      for (const SliceSegment& s : segs) {
        const int g = layout_.param(s.param).group;
        if (g != run.group) {
          run.end = s.slice_offset;
          if (run.end > run.begin) runs_.push_back(run);
          run.begin = s.slice_offset;
          run.group = g;
        }
      }
      run.end = S;
      runs_.push_back(run);
    }
  }
}

void PartitionOptimizer::set_master(int unit, std::span<const float> unit_flat) {
  const UnitLayout& ul = layout_.unit(unit);
  ZERO_ASSERT(unit_flat.size() == ul.padded_elems);
  const std::size_t S = ul.slice_elems;
  for (int d = 0; d < domains(); ++d) {
    const std::size_t src = static_cast<std::size_t>(domain_rank(d)) * S;
    compute_.combine(element_at(master_, options_.master_dtype, partition_offset(d, unit)),
                     options_.master_dtype, unit_flat.data() + src, DType::F32, S, 1.0f, false,
                     options_.exec);
  }
}

std::byte* PartitionOptimizer::gradient(int unit, std::size_t slice_offset) const {
  ZERO_ASSERT(options_.own_gradients);
  return element_at(gradients_, options_.grad_dtype,
                    layout_.unit(unit).partition_offset + slice_offset);
}

bool PartitionOptimizer::has_overflow() const {
  for (std::size_t u = 0; u < layout_.num_units(); ++u) {
    const std::size_t S = layout_.unit(static_cast<int>(u)).slice_elems;
    if (S > 0 && compute_.unscale_and_check(slices_.gradient(own_domain(), static_cast<int>(u), 0),
                                            options_.grad_dtype, S, 1.0f, options_.exec)) {
      return true;
    }
  }
  return false;
}

double PartitionOptimizer::squared_norm() const {
  double sum = 0.0;
  for (std::size_t u = 0; u < layout_.num_units(); ++u) {
    const std::size_t S = layout_.unit(static_cast<int>(u)).slice_elems;
    if (S > 0) {
      sum += compute_.squared_l2_norm(slices_.gradient(own_domain(), static_cast<int>(u), 0),
                                      options_.grad_dtype, S, options_.exec);
    }
  }
  return sum;
}

void PartitionOptimizer::step(std::span<const kernels::OptimizerHyper> hypers,
                              std::span<const kernels::StepScalars> scalars) {
  for (const Run& run : runs_) {
    const auto g = static_cast<std::size_t>(run.group);
    ZERO_ASSERT(g < hypers.size() && g < scalars.size());
    step_run(run, hypers[g], scalars[g]);
  }
}

void PartitionOptimizer::step_run(const Run& run, const kernels::OptimizerHyper& hyper,
                                  const kernels::StepScalars& scalars) {
  const DType master_dtype = options_.master_dtype;
  const DType model_dtype = options_.model_dtype;
  const std::size_t off = partition_offset(run.domain, run.unit) + run.begin;
  const std::size_t n = run.end - run.begin;
  std::byte* model_out = slices_.model(run.domain, run.unit, run.begin);
  const std::byte* grad = slices_.gradient(run.domain, run.unit, run.begin);
  kernels::OptimizerTensors t;
  t.grad_dtype = options_.grad_dtype;
  t.state_dtype = options_.state_dtype;
  // A 16-bit model copy is written by the kernel, rounded once from the updated master.
  if (model_dtype != DType::F32) t.param_out_dtype = model_dtype;
  const std::size_t tile =
      master_dtype == DType::F32 ? std::max<std::size_t>(n, 1) : kMasterTileElems;
  for (std::size_t b = 0; b < n; b += tile) {
    const std::size_t m = std::min(tile, n - b);
    std::byte* master = element_at(master_, master_dtype, off + b);
    if (master_dtype == DType::F32) {
      t.master = reinterpret_cast<float*>(master);
    } else {
      master_tile_.resize(m);
      compute_.combine(master_tile_.data(), DType::F32, master, master_dtype, m, 1.0f, false,
                       options_.exec);
      t.master = master_tile_.data();
    }
    t.grad = grad + b * dtype_size(options_.grad_dtype);
    if (!states_.empty()) t.state0 = element_at(states_[0], options_.state_dtype, off + b);
    if (states_.size() > 1) t.state1 = element_at(states_[1], options_.state_dtype, off + b);
    if (model_dtype != DType::F32) t.param_out = model_out + b * dtype_size(model_dtype);
    t.numel = m;
    compute_.optimizer_step(hyper, scalars, t, options_.exec);
    if (model_dtype == DType::F32) {
      // An fp32 model copy is the master itself, copied (on the device, by its kernels).
      compute_.combine(model_out + b * sizeof(float), DType::F32, t.master, DType::F32, m, 1.0f,
                       false, options_.exec);
    }
    if (master_dtype != DType::F32) {
      // The master keeps what the model copy got: the update rounded once to bf16.
      compute_.combine(master, master_dtype, t.master, DType::F32, m, 1.0f, false, options_.exec);
    }
  }
}

void PartitionOptimizer::write_model() {
  for (const Run& run : runs_) {
    const std::size_t off = partition_offset(run.domain, run.unit) + run.begin;
    compute_.combine(slices_.model(run.domain, run.unit, run.begin), options_.model_dtype,
                     element_at(master_, options_.master_dtype, off), options_.master_dtype,
                     run.end - run.begin, 1.0f, false, options_.exec);
  }
}

DType PartitionOptimizer::tensor_dtype(int tensor) const {
  return tensor == 0 ? options_.master_dtype : options_.state_dtype;
}

const std::byte* PartitionOptimizer::tensor_data(int tensor, int domain) const {
  ZERO_ASSERT(tensor >= 0 && tensor < tensors() && domain >= 0 && domain < domains());
  const Buffer& b = tensor == 0 ? master_ : states_[static_cast<std::size_t>(tensor - 1)];
  return element_at(b, tensor_dtype(tensor), static_cast<std::size_t>(domain) * partition_elems_);
}

void PartitionOptimizer::assign(int tensor, std::span<const float> values) {
  ZERO_ASSERT(tensor >= 0 && tensor < tensors());
  ZERO_ASSERT(values.size() == static_cast<std::size_t>(domains()) * partition_elems_);
  const Buffer& b = tensor == 0 ? master_ : states_[static_cast<std::size_t>(tensor - 1)];
  compute_.combine(b.data(), tensor_dtype(tensor), values.data(), DType::F32, values.size(), 1.0f,
                   false, options_.exec);
}

}  // namespace zero::engine_detail
