// PartitionOptimizer alone, without an engine or a communicator: one rank's partition of a
// two-group model, stepped against the optimizer kernel applied by hand to each parameter's
// elements; the fused low-precision write, 16-bit master weights, fp32 master weights kept in the
// model copy, the overflow and norm walk, stage 0's every-domain mode and the checkpoint accessors.
#include "zero/engine/partition_optimizer.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cast.h"
#include "kernels/optimizer.h"
#include "tests/temp_dir.h"
#include "zero/base/error.h"
#include "zero/device/cpu_device.h"

namespace zero::engine_detail {
namespace {

// Domains [first, last) of tensor `t` as fp32, domain after domain, read through the store.
std::vector<float> tensor_f32(PartitionOptimizer& opt, int t, int first, int last) {
  std::vector<float> out;
  for (int d = first; d < last; ++d) {
    opt.read_tensor(t, d, 0, opt.partition_elems(), [&](const std::byte* data, std::size_t n) {
      const std::size_t at = out.size();
      out.resize(at + n);
      kernels::cast_cpu(data, opt.tensor_dtype(t), out.data() + at, DType::F32, n);
    });
  }
  return out;
}
std::vector<float> tensor_f32(PartitionOptimizer& opt, int t) {
  return tensor_f32(opt, t, 0, opt.domains());
}

constexpr int kWorld = 3;

// Two units; group 1 (e.g. biases without decay) interleaves with group 0 inside unit 0.
std::vector<ParamDesc> model_params(DType dtype) {
  return {{"w0", 50, dtype, 0, 0},
          {"b0", 7, dtype, 1, 0},
          {"w1", 33, dtype, 0, 1},
          {"b1", 4, dtype, 1, 1}};
}

float initial_value(std::size_t param, std::size_t j) {
  return 0.01f * static_cast<float>((param * 13 + j * 7) % 23) - 0.1f;
}
float gradient_value(int unit, std::size_t slice_offset) {
  return 0.003f * static_cast<float>((unit * 5 + slice_offset * 3) % 17) - 0.02f;
}

// The engine's side of the seam: gradients in the optimizer's partition (or, in every-domain
// mode, in a test buffer per domain), the model copy as unit-flat buffers.
class TestSlices final : public SliceMap {
 public:
  TestSlices(const FlatLayout& layout, DType model_dtype, bool every_domain)
      : layout_(layout), model_dtype_(model_dtype), every_domain_(every_domain) {
    for (std::size_t u = 0; u < layout.num_units(); ++u) {
      const UnitLayout& ul = layout.unit(static_cast<int>(u));
      model_.emplace_back(ul.padded_elems * dtype_size(model_dtype), std::byte{0});
      domain_grads_.emplace_back(ul.padded_elems, 0.0f);
    }
  }
  void attach(PartitionOptimizer* optimizer) { optimizer_ = optimizer; }
  std::byte* gradient(int domain, int unit, std::size_t slice_offset) override {
    if (!every_domain_) return optimizer_->gradient(unit, slice_offset);
    const std::size_t S = layout_.unit(unit).slice_elems;
    return reinterpret_cast<std::byte*>(domain_grads_[static_cast<std::size_t>(unit)].data() +
                                        static_cast<std::size_t>(domain) * S + slice_offset);
  }
  std::byte* model(int domain, int unit, std::size_t slice_offset) override {
    const int r = optimizer_->domain_rank(domain);
    const std::size_t S = layout_.unit(unit).slice_elems;
    return model_[static_cast<std::size_t>(unit)].data() +
           (static_cast<std::size_t>(r) * S + slice_offset) * dtype_size(model_dtype_);
  }
  std::vector<float> model_f32(int unit) const {
    const auto& m = model_[static_cast<std::size_t>(unit)];
    std::vector<float> out(m.size() / dtype_size(model_dtype_));
    kernels::cast_cpu(m.data(), model_dtype_, out.data(), DType::F32, out.size());
    return out;
  }

 private:
  const FlatLayout& layout_;
  const DType model_dtype_;
  const bool every_domain_;
  PartitionOptimizer* optimizer_ = nullptr;
  std::vector<std::vector<std::byte>> model_;
  std::vector<std::vector<float>> domain_grads_;
};

struct Setup {
  DType model_dtype = DType::F32;
  DType master_dtype = DType::F32;
  bool every_domain = false;
  int rank = 1;
  std::string nvme_path;  // non-empty: master and states in small sub-groups, some on NVMe
  bool master_in_model = false;
};

// Sub-groups of 8 elements, the first half of them in swap files under `path`.
offload::StoreOptions nvme_store(const std::string& path) {
  offload::StoreOptions so;
  so.sub_group_elems = 8;
  so.ratio = 0.5;
  offload::NvmeTier t;
  t.paths = {path};
  t.key = "nvme_path";
  t.buffer_count = 3;
  t.pipeline_read = t.pipeline_write = true;
  t.aio.block_size = 4096;
  so.nvme = t;
  return so;
}

kernels::OptimizerHyper adamw(double weight_decay) {
  kernels::OptimizerHyper h;
  h.kind = kernels::OptimizerKind::AdamW;
  h.weight_decay = weight_decay;
  return h;
}

// Steps the partition twice and compares every owned element against the kernel run on that
// element alone with its group's hyper-parameters (a whole-parameter reference, no partition).
void check_against_reference(const Setup& s) {
  const FlatLayout layout = FlatLayout::build(model_params(s.model_dtype), {kWorld, 1, 4});
  CpuDevice device(s.rank);
  TestSlices slices(layout, s.model_dtype, s.every_domain);
  PartitionOptions o;
  o.rank = s.rank;
  o.every_domain = s.every_domain;
  o.own_gradients = !s.every_domain;
  o.master_dtype = s.master_dtype;
  o.model_dtype = s.model_dtype;
  o.optimizer = adamw(0.01);
  o.exec.threads = 1;
  o.master_in_model = s.master_in_model;
  if (!s.nvme_path.empty()) o.store = nvme_store(s.nvme_path);
  PartitionOptimizer opt(device, device.compute(), layout, o, slices);
  slices.attach(&opt);
  if (!s.nvme_path.empty()) REQUIRE(opt.store().nvme_count() > 1);
  REQUIRE(opt.domains() == (s.every_domain ? kWorld : 1));
  REQUIRE(opt.state_count() == 2);
  // Master weights in the model copy take no memory of their own; else a partition's worth per
  // domain (in memory without NVMe).
  const std::size_t master_bytes =
      device.ledger().usage(MemoryKind::Device, MemoryTag::MasterParams).current_bytes;
  if (s.nvme_path.empty()) {
    REQUIRE(master_bytes == (s.master_in_model ? 0
                                               : opt.domains() * opt.partition_elems() *
                                                     dtype_size(s.master_dtype)));
  }

  for (std::size_t u = 0; u < layout.num_units(); ++u) {
    const UnitLayout& ul = layout.unit(static_cast<int>(u));
    std::vector<float> flat(ul.padded_elems, 0.0f);
    for (std::size_t p : ul.params) {
      const ParamPlacement& pl = layout.placement(p);
      for (std::size_t j = 0; j < pl.numel; ++j) flat[pl.offset + j] = initial_value(p, j);
    }
    opt.set_master(static_cast<int>(u), flat);
  }
  // Gradients of every domain's slices (gaps and padding stay zero, as the reducer leaves them).
  for (int d = 0; d < opt.domains(); ++d) {
    for (std::size_t u = 0; u < layout.num_units(); ++u) {
      const int unit = static_cast<int>(u);
      for (const SliceSegment& seg : layout.segments(unit, opt.domain_rank(d))) {
        auto* g = reinterpret_cast<float*>(slices.gradient(d, unit, seg.slice_offset));
        for (std::size_t j = 0; j < seg.numel; ++j)
          g[j] = gradient_value(unit, seg.slice_offset + j);
      }
    }
  }
  const std::vector<kernels::OptimizerHyper> hypers{adamw(0.01), adamw(0.0)};
  for (std::int64_t step = 1; step <= 2; ++step) {
    const std::vector<kernels::StepScalars> scalars{{1e-2, step, 0.5}, {3e-2, step, 0.5}};
    opt.step(hypers, scalars);
  }

  // Reference: the same two steps on each owned element alone.
  std::size_t checked = 0, moved = 0;
  const float tolerance = s.master_dtype == DType::F32 ? 0.0f : 1e-2f;
  for (int d = 0; d < opt.domains(); ++d) {
    const int r = opt.domain_rank(d);
    const std::vector<float> master = tensor_f32(opt, 0, d, d + 1);
    for (std::size_t u = 0; u < layout.num_units(); ++u) {
      const int unit = static_cast<int>(u);
      const UnitLayout& ul = layout.unit(unit);
      const std::vector<float> model = slices.model_f32(unit);
      for (const SliceSegment& seg : layout.segments(unit, r)) {
        const int group = layout.param(seg.param).group;
        for (std::size_t j = 0; j < seg.numel; ++j) {
          float w = initial_value(seg.param, seg.param_begin + j);
          const float initial = w;
          float g = gradient_value(unit, seg.slice_offset + j), m = 0, v = 0;
          for (std::int64_t step = 1; step <= 2; ++step) {
            kernels::OptimizerTensors t;
            t.master = &w;
            t.grad = &g;
            t.state0 = &m;
            t.state1 = &v;
            t.numel = 1;
            kernels::optimizer_step_cpu(hypers[static_cast<std::size_t>(group)],
                                        {group == 0 ? 1e-2 : 3e-2, step, 0.5}, t,
                                        {1, kernels::Isa::Scalar});
          }
          const float got = master[ul.partition_offset + seg.slice_offset + j];
          INFO("domain " << d << " unit " << unit << " param " << seg.param << " element " << j);
          REQUIRE(std::fabs(got - w) <= tolerance * std::fabs(w) + (tolerance > 0 ? 1e-3f : 0.0f));
          // The model copy is the master rounded once to the model dtype.
          const float in_model =
              model[static_cast<std::size_t>(r) * ul.slice_elems + seg.slice_offset + j];
          float rounded = got;
          if (s.model_dtype != DType::F32) {
            std::uint16_t h;
            kernels::cast_cpu(&got, DType::F32, &h, s.model_dtype, 1);
            kernels::cast_cpu(&h, s.model_dtype, &rounded, DType::F32, 1);
          }
          REQUIRE(std::memcmp(&in_model, &rounded, sizeof(float)) == 0);
          ++checked;
          moved += got != initial;
        }
      }
    }
  }
  // Stage 0 steps all 94 elements; one rank owns its share of them.
  if (s.every_domain) {
    REQUIRE(checked == 94);
  } else {
    REQUIRE(checked > 0);
  }
  REQUIRE(moved == checked);
}

TEST_CASE(
    "the partition steps each param group's elements exactly as the kernel steps them alone") {
  SECTION("fp32 model, rank 0") {
    check_against_reference({DType::F32, DType::F32, false, 0, ""});
  }
  SECTION("fp32 model, last rank") {
    check_against_reference({DType::F32, DType::F32, false, kWorld - 1, ""});
  }
  SECTION("bf16 model: the fused low-precision write") {
    check_against_reference({DType::BF16, DType::F32, false, 1, ""});
  }
  SECTION("fp16 model") {
    check_against_reference({DType::F16, DType::F32, false, 1, ""});
  }
  SECTION("stage 0: every rank's partition") {
    check_against_reference({DType::F32, DType::F32, true, 1, ""});
  }
}

TEST_CASE("fp32 master weights kept in the model copy step exactly as the kernel steps them") {
  for (int rank : {0, kWorld - 1}) {
    INFO("rank " << rank);
    check_against_reference({DType::F32, DType::F32, false, rank, "", true});
  }
  SECTION("stage 0: every rank's partition") {
    check_against_reference({DType::F32, DType::F32, true, 1, "", true});
  }
}

TEST_CASE("master weights in the model copy are refused for a 16-bit model or master") {
  const FlatLayout layout = FlatLayout::build(model_params(DType::BF16), {kWorld, 1, 4});
  CpuDevice device(0);
  TestSlices slices(layout, DType::BF16, false);
  PartitionOptions o;
  o.model_dtype = DType::BF16;
  o.master_in_model = true;
  o.optimizer = adamw(0.0);
  CHECK_THROWS_WITH(PartitionOptimizer(device, device.compute(), layout, o, slices),
                    Catch::Contains("fp32 master and model") && Catch::Contains("bf16"));
}

TEST_CASE("16-bit master weights are stepped in fp32 and stored rounded") {
  check_against_reference({DType::BF16, DType::BF16, false, 2, ""});
}

TEST_CASE("the norm walks only the rank's own gradients and is the overflow check") {
  const FlatLayout layout = FlatLayout::build(model_params(DType::F32), {kWorld, 1, 4});
  CpuDevice device(0);
  TestSlices slices(layout, DType::F32, false);
  PartitionOptions o;
  o.rank = 0;
  o.optimizer = adamw(0.0);
  PartitionOptimizer opt(device, device.compute(), layout, o, slices);
  slices.attach(&opt);
  REQUIRE(opt.squared_norm() == 0.0);
  double want = 0;
  for (std::size_t u = 0; u < layout.num_units(); ++u) {
    const UnitLayout& ul = layout.unit(static_cast<int>(u));
    auto* g = reinterpret_cast<float*>(opt.gradient(static_cast<int>(u), 0));
    for (std::size_t j = 0; j < ul.slice_elems; ++j) {
      g[j] = gradient_value(static_cast<int>(u), j);
      want += static_cast<double>(g[j]) * g[j];
    }
  }
  REQUIRE(want > 0);
  REQUIRE(opt.squared_norm() == Approx(want).epsilon(1e-12));
  // The engine's overflow vote is !isfinite(norm): every gradient at the largest finite value
  // still gives a finite sum, one ±inf or NaN does not.
  auto* last = reinterpret_cast<float*>(opt.gradient(1, 0)) + layout.unit(1).slice_elems - 1;
  for (std::size_t u = 0; u < layout.num_units(); ++u) {
    auto* g = reinterpret_cast<float*>(opt.gradient(static_cast<int>(u), 0));
    std::fill(g, g + layout.unit(static_cast<int>(u)).slice_elems,
              std::numeric_limits<float>::max());
  }
  REQUIRE(std::isfinite(opt.squared_norm()));
  *last = std::numeric_limits<float>::infinity();
  REQUIRE(std::isinf(opt.squared_norm()));
  *last = -std::numeric_limits<float>::infinity();
  REQUIRE(std::isinf(opt.squared_norm()));
  *last = std::numeric_limits<float>::quiet_NaN();
  REQUIRE(std::isnan(opt.squared_norm()));
}

// A replacement of tensor t holding `values` (every domain, fp32), rounded to the tensor's dtype.
PartitionOptimizer::Replacement filled(PartitionOptimizer& opt, int t,
                                       const std::vector<float>& values) {
  PartitionOptimizer::Replacement r = opt.replacement(t);
  const std::size_t p = opt.partition_elems();
  for (int d = 0; d < opt.domains(); ++d) {
    const float* domain = values.data() + static_cast<std::size_t>(d) * p;
    // In two calls, so a stretch may start inside a sub-group.
    for (const auto& [offset, count] : {std::pair{std::size_t{0}, p / 3}, {p / 3, p - p / 3}}) {
      opt.write_replacement(
          r, d, offset, count, [&](std::byte* data, std::size_t first, std::size_t n) {
            kernels::cast_cpu(domain + offset + first, DType::F32, data, opt.tensor_dtype(t), n);
          });
    }
  }
  return r;
}

TEST_CASE(
    "checkpoint accessors read back what a replacement held once adopted, and nothing before; "
    "states start at their initial value") {
  test::TempDir nvme("zero_po_nvme");
  for (const auto& [on_nvme, in_model] : {std::pair{false, false}, {true, false}, {false, true}}) {
    INFO("sub-groups on NVMe: " << on_nvme << ", master weights in the model copy: " << in_model);
    const FlatLayout layout = FlatLayout::build(model_params(DType::F32), {kWorld, 1, 4});
    CpuDevice device(0);
    TestSlices slices(layout, DType::F32, true);
    PartitionOptions o;
    o.rank = 0;
    o.every_domain = true;
    o.own_gradients = false;
    o.state_dtype = DType::BF16;
    o.optimizer.kind = kernels::OptimizerKind::Adagrad;
    o.optimizer.initial_accumulator_value = 0.25;
    o.master_in_model = in_model;
    if (on_nvme) o.store = nvme_store(nvme.str());
    PartitionOptimizer opt(device, device.compute(), layout, o, slices);
    slices.attach(&opt);
    if (on_nvme) REQUIRE(opt.store().nvme_count() > 1);
    REQUIRE(opt.tensors() == 2);
    REQUIRE(opt.tensor_dtype(1) == DType::BF16);
    const std::size_t n = static_cast<std::size_t>(opt.domains()) * opt.partition_elems();
    std::vector<float> state = tensor_f32(opt, 1);
    REQUIRE(state.size() == n);
    for (float v : state) REQUIRE(v == 0.25f);
    const std::vector<float> master = tensor_f32(opt, 0);
    std::vector<float> values(n);
    for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 97) * 0.5f;
    REQUIRE(values != master);
    {
      // Dropped: nothing changes.
      PartitionOptimizer::Replacement r0 = filled(opt, 0, values);
      PartitionOptimizer::Replacement r1 = filled(opt, 1, values);
    }
    REQUIRE(tensor_f32(opt, 0) == master);
    REQUIRE(tensor_f32(opt, 1) == state);
    {
      std::vector<PartitionOptimizer::Replacement> both;
      both.push_back(filled(opt, 0, values));
      both.push_back(filled(opt, 1, values));
      opt.adopt(std::move(both));
    }
    REQUIRE(tensor_f32(opt, 0) == values);
    REQUIRE(tensor_f32(opt, 1) == values);  // multiples of 0.5 below 48 are exact in bf16
    // Domain d's tensor starts d partitions in.
    const std::vector<float> two = tensor_f32(opt, 0, 2, 3);
    REQUIRE(std::equal(two.begin(), two.end(),
                       values.begin() + static_cast<std::ptrdiff_t>(2 * opt.partition_elems())));
    // Master weights in the model copy: adopt() wrote them there, every domain's slices.
    if (!in_model) continue;
    std::size_t compared = 0;
    for (std::size_t u = 0; u < layout.num_units(); ++u) {
      const UnitLayout& ul = layout.unit(static_cast<int>(u));
      const std::vector<float> model = slices.model_f32(static_cast<int>(u));
      for (int d = 0; d < opt.domains(); ++d) {
        for (std::size_t j = 0; j < ul.slice_elems; ++j, ++compared) {
          REQUIRE(model[static_cast<std::size_t>(d) * ul.slice_elems + j] ==
                  values[static_cast<std::size_t>(d) * opt.partition_elems() +
                         ul.partition_offset + j]);
        }
      }
    }
    REQUIRE(compared > 0);
  }
}

TEST_CASE("master and states on NVMe in small sub-groups step exactly like in memory") {
  test::TempDir nvme("zero_po_nvme");
  for (bool every : {false, true}) {
    for (DType model : {DType::F32, DType::BF16}) {
      Setup s;
      s.model_dtype = model;
      s.every_domain = every;
      s.nvme_path = nvme.str();
      check_against_reference(s);
    }
  }
}

TEST_CASE("a step whose NVMe I/O fails at any call changes neither state nor model copy") {
  test::TempDir nvme("zero_po_nvme");
  const FlatLayout layout = FlatLayout::build(model_params(DType::BF16), {kWorld, 1, 4});
  CpuDevice device(1);
  TestSlices slices(layout, DType::BF16, false);
  PartitionOptions o;
  o.rank = 1;
  o.model_dtype = DType::BF16;
  o.optimizer = adamw(0.01);
  o.exec.threads = 1;
  o.store = nvme_store(nvme.str());
  PartitionOptimizer opt(device, device.compute(), layout, o, slices);
  slices.attach(&opt);
  for (std::size_t u = 0; u < layout.num_units(); ++u) {
    const int unit = static_cast<int>(u);
    std::vector<float> flat(layout.unit(unit).padded_elems, 0.1f);
    opt.set_master(unit, flat);
    for (const SliceSegment& seg : layout.segments(unit, 1)) {
      auto* g = reinterpret_cast<float*>(slices.gradient(0, unit, seg.slice_offset));
      for (std::size_t j = 0; j < seg.numel; ++j) g[j] = gradient_value(unit, seg.slice_offset + j);
    }
  }
  opt.store().flush();
  const std::vector<kernels::OptimizerHyper> hypers{adamw(0.01), adamw(0.0)};
  const std::vector<kernels::StepScalars> scalars{{1e-2, 1, 1.0}, {3e-2, 1, 1.0}};
  auto snapshot = [&] {
    std::vector<std::vector<float>> out{tensor_f32(opt, 0), tensor_f32(opt, 1), tensor_f32(opt, 2)};
    for (std::size_t u = 0; u < layout.num_units(); ++u)
      out.push_back(slices.model_f32(static_cast<int>(u)));
    return out;
  };
  opt.step(hypers, scalars);
  const auto before = snapshot();
  offload::AsyncIo& io = *opt.store().io();
  const std::uint64_t start = io.calls();
  opt.step(hypers, scalars);
  const std::uint64_t per_step = io.calls() - start;
  REQUIRE(per_step >= 4);
  const auto after_one = snapshot();
  REQUIRE(after_one[0] != before[0]);  // a step moves the master
  // Back to `before` is not possible, so the faults are judged against `after_one`.
  for (std::uint64_t k = 0; k < per_step; ++k) {
    INFO("fault at I/O call " << k << " of " << per_step);
    const std::uint64_t at = io.calls() + k;
    io.set_fault([at](std::uint64_t call, const offload::IoRequest&) {
      return call == at ? offload::Fault{offload::Fault::Kind::Error, EIO} : offload::Fault{};
    });
    CHECK_THROWS_AS(opt.step(hypers, scalars), IoError);
    io.set_fault(nullptr);
    REQUIRE(snapshot() == after_one);
  }
  opt.step(hypers, scalars);  // and the next step goes through
  CHECK(snapshot()[0] != after_one[0]);
}

}  // namespace
}  // namespace zero::engine_detail
