// zero-bench offload: the optimizer step of offloaded state, per tier, next to a limit measured in
// the same run.
//
// The step is what PartitionOptimizer::step does at stages 1–3 with offload_optimizer: AdamW over
// an offload::SubgroupStore holding the fp32 master weights, exp_avg and exp_avg_sq (12 bytes per
// element), reading fp32 gradients from host memory; update_all() visits every sub-group and the
// visit runs kernels::optimizer_step_cpu on it (no model copy is written). Two tiers:
//   host  ratio 1, offload_kind PinnedHost, no NVMe: every sub-group in host memory.
//         limit "traffic_probe": the same step with the kernel replaced by
//         kernels::traffic_probe_cpu (the kernel's loads and stores, 28 bytes per element, same
//         tiles and OpenMP split, no arithmetic): update_all() of a second store with the same
//         options, one probe call per sub-group. So the limit has the step's memory layout (a
//         buffer per tensor and sub-group) and its calls (each an OpenMP fork and join, which on
//         a machine busy with other work can cost a scheduler tick when a thread was descheduled);
//         the ratio is what the kernel's arithmetic adds to the step's memory traffic. For
//         reference, plain_limit_params_per_s is the probe as one call over three contiguous
//         arrays.
//   nvme  every sub-group on NVMe under --nvme-path, pipeline_read and pipeline_write on,
//         --buffer-count buffers, aio block size and queue depth from the flags.
//         limit "odirect_read_write": the step's I/O without the compute — through the same
//         AsyncIo (make_async_io, same options) on a file of a SwapDir in the same folder, each
//         sub-group's record (the store's size: each tensor's bytes rounded up to the direct-I/O
//         alignment) read from one slot and written to the other, in sub-group order, with
//         --buffer-count records in flight. "direct" says whether the files were opened with
//         O_DIRECT (a filesystem that refuses it, such as tmpfs before Linux 6.6, is used through
//         the page cache: the figures are then memory speeds, not the disk's).
// Each store is first stepped once from its initial values and validated: windows at the start,
// middle and end, read back through the store (from the disk for NVMe), must equal, bit for bit,
// the single-thread scalar kernel run on private copies. NVMe gets a second untimed step (and the
// limit an untimed pass) so both slots of every record exist on disk before timing.
//
// Then --repeats rounds, each timing one step of every figure (interleaved, so that a machine
// shared with other work disturbs them alike); each figure is the best (shortest) of its rounds.
//   params_per_s  elements / step seconds;  limit_params_per_s  elements / limit seconds;
//   ratio         params_per_s / limit_params_per_s (nvme: I/O-only time / step time).
//   gb_per_s      host: the kernel's memory traffic (kernels::optimizer_bytes_per_elem) per
//                 second; nvme: bytes read + written per second.
//   io_hidden_fraction (nvme)  how much of the shorter of compute and I/O the step hid under the
//                 other:  (compute_s + io_s − step_s) / min(compute_s, io_s), clamped to [0, 1],
//                 where compute_s is the host tier's step over the same elements in the same round
//                 (the same kernel on the same sub-groups with no I/O) and io_s the limit. 1 when
//                 the step takes max(compute_s, io_s), 0 when it takes their sum.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "benchmarks/bench_flags.h"
#include "benchmarks/commands.h"
#include "cli/flags.h"
#include "kernels/isa.h"
#include "kernels/optimizer.h"
#include "kernels/traffic_probe.h"
#include "offload/async_io.h"
#include "offload/subgroup_store.h"
#include "offload/swap_dir.h"
#include "zero/base/error.h"
#include "zero/base/timer.h"
#include "zero/device/device.h"

namespace zero::bench {
namespace {

using Clock = std::chrono::steady_clock;
using offload::SubgroupStore;

constexpr std::string_view kUsage =
    "usage: zero-bench offload [--json] [--nvme-path DIR] [--elems N] [--sub-group N] "
    "[--buffer-count N] [--block-size BYTES] [--queue-depth N] [--repeats N] [--help]";

constexpr std::string_view kHelp = R"(
The optimizer step (AdamW; fp32 master, exp_avg, exp_avg_sq in an offload::SubgroupStore; fp32
gradients) per offload tier, next to a limit measured in the same run:
  host  every sub-group in pinned host memory; limit: the same step with the kernel replaced by
        the optimizer's traffic probe (same loads and stores, no arithmetic), on a second store
        of the same shape; ratio = params_per_s / probe params_per_s.
  nvme  every sub-group in a swap file under --nvme-path (default: the current folder),
        pipeline_read and pipeline_write on; limit: the same records read and written through
        the same AsyncIo (O_DIRECT when the filesystem allows it, see "direct") with no compute;
        ratio = I/O-only time / step time.
io_hidden_fraction = (compute_s + io_s - step_s) / min(compute_s, io_s), clamped to [0, 1]:
compute_s is the host tier's step (no I/O), io_s the I/O-only limit; 1 = fully overlapped.
Every figure is the best of --repeats interleaved rounds.

  --elems N          elements of the partition (default 64M; K, M, G are binary)
  --sub-group N      sub_group_size in elements (default 8M)
  --buffer-count N   offload_optimizer.buffer_count (default 4)
  --block-size B     aio.block_size in bytes (default 1M)
  --queue-depth N    aio.queue_depth (default 8)
  --repeats N        timed rounds (default 10)
  --json             one JSON object per tier)";

struct OffloadArgs {
  bool json = false;
  bool help = false;
  std::string nvme_path = ".";
  std::size_t elems = std::size_t{64} << 20;
  std::size_t sub_group_elems = std::size_t{8} << 20;
  int buffer_count = 4;
  std::size_t block_size = std::size_t{1} << 20;
  int queue_depth = 8;
  int repeats = 10;
};

OffloadArgs parse_args(std::span<const std::string> args) {
  OffloadArgs r;
  auto small = [&](cli::FlagArg& arg, std::size_t max) {
    const std::size_t v = parse_count(flag_value(arg, kUsage), arg.name(), kUsage);
    ZERO_CHECK(v <= max, "{} {}: at most {}", arg.name(), v, max);
    return static_cast<int>(v);
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    cli::FlagArg arg(args, i);
    const std::string& a = arg.name();
    if (a == "--json") {
      arg.no_value();
      r.json = true;
    } else if (a == "--help" || a == "-h") {
      r.help = true;
    } else if (a == "--nvme-path") {
      r.nvme_path = flag_value(arg, kUsage);
    } else if (a == "--elems") {
      r.elems = parse_count(flag_value(arg, kUsage), a, kUsage);
    } else if (a == "--sub-group") {
      r.sub_group_elems = parse_count(flag_value(arg, kUsage), a, kUsage);
    } else if (a == "--buffer-count") {
      r.buffer_count = small(arg, 1024);
    } else if (a == "--block-size") {
      r.block_size = parse_count(flag_value(arg, kUsage), a, kUsage);
    } else if (a == "--queue-depth") {
      r.queue_depth = small(arg, 4096);
    } else if (a == "--repeats") {
      r.repeats = small(arg, 1000);
    } else {
      ZERO_CHECK(false, "unexpected argument '{}'; {}", args[i], kUsage);
    }
  }
  r.sub_group_elems = std::min(r.sub_group_elems, r.elems);
  return r;
}

std::size_t align_up(std::size_t n, std::size_t a) {
  return (n + a - 1) / a * a;
}

// `bytes` of pinned host memory from `device` whose start is `align`-aligned (direct I/O).
struct AlignedBuffer {
  Buffer memory;
  std::byte* data = nullptr;

  AlignedBuffer(Device& device, std::size_t bytes, std::size_t align, MemoryTag tag)
      : memory(device.allocate(bytes + align, MemoryKind::PinnedHost, tag)) {
    const auto addr = reinterpret_cast<std::uintptr_t>(memory.data());
    data = static_cast<std::byte*>(memory.data()) + (align_up(addr, align) - addr);
  }
};

// A deterministic gradient of either sign and varied magnitude, in [-1e-2, 1e-2).
float gradient_value(std::size_t i) {
  std::uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull;
  z ^= z >> 29;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 32;
  return (static_cast<float>(z >> 40) * (1.0f / 16777216.0f) - 0.5f) * 2e-2f;
}

std::vector<offload::StoreTensor> adamw_tensors() {
  return {{DType::F32, MemoryTag::MasterParams, 0.0f},
          {DType::F32, MemoryTag::OptimizerStates, 0.0f},
          {DType::F32, MemoryTag::OptimizerStates, 0.0f}};
}

// The kernels' arguments for `numel` fp32 elements of master, exp_avg, exp_avg_sq and gradient.
kernels::OptimizerTensors optimizer_tensors(std::byte* master, std::byte* exp_avg,
                                            std::byte* exp_avg_sq, const float* grad,
                                            std::size_t numel) {
  kernels::OptimizerTensors t;
  t.master = reinterpret_cast<float*>(master);
  t.grad = grad;
  t.state0 = exp_avg;
  t.state1 = exp_avg_sq;
  t.numel = numel;
  return t;
}

// The optimizer: AdamW over a store's sub-groups, reading the gradients of the whole range.
class AdamWStep {
 public:
  explicit AdamWStep(const float* grads) : grads_(grads) { hyper_.weight_decay = 0.01; }

  // One update_all() of `store` as step number `step`; returns its wall seconds. `kernel_s_out`
  // (if given) gets the part of them spent in the kernel.
  double run(SubgroupStore& store, std::int64_t step, double* kernel_s_out = nullptr) const {
    double kernel_s = 0;
    const auto start = Clock::now();
    store.update_all([&](const SubgroupStore::View& v) {
      const auto k0 = Clock::now();
      optimizer_step(v.tensors[0], v.tensors[1], v.tensors[2], v.begin, v.end - v.begin, step,
                     exec_);
      kernel_s += seconds_since(k0);
    });
    const double s = seconds_since(start);
    if (kernel_s_out != nullptr) *kernel_s_out = kernel_s;
    return s;
  }

  // The step on elements [begin, begin + numel) of the range, whose master and states are the
  // arrays given (the gradients are those of the whole range).
  void optimizer_step(std::byte* master, std::byte* exp_avg, std::byte* exp_avg_sq,
                      std::size_t begin, std::size_t numel, std::int64_t step,
                      const kernels::CpuExec& exec) const {
    kernels::optimizer_step_cpu(
        hyper_, {kLr, step, 1.0},
        optimizer_tensors(master, exp_avg, exp_avg_sq, grads_ + begin, numel), exec);
  }

  int state_count() const { return kernels::optimizer_state_count(hyper_); }

 private:
  static constexpr double kLr = 1e-3;
  const float* grads_;
  kernels::OptimizerHyper hyper_;
  kernels::CpuExec exec_;
};

// After the first step of `store` (from its initial values): windows at the start, middle and end
// of the range, read back through the store, equal the scalar single-thread kernel on copies.
void validate_first_step(SubgroupStore& store, const AdamWStep& adamw, std::string_view tier) {
  const std::size_t total = store.total_elems();
  const std::size_t w = std::min<std::size_t>(total, 4099);
  const std::size_t starts[] = {0, (total - w) / 2, total - w};
  std::size_t changed = 0;
  for (const std::size_t b : starts) {
    std::vector<std::vector<float>> want(3, std::vector<float>(w, 0.0f)), got = want;
    adamw.optimizer_step(
        reinterpret_cast<std::byte*>(want[0].data()), reinterpret_cast<std::byte*>(want[1].data()),
        reinterpret_cast<std::byte*>(want[2].data()), b, w, 1, {1, kernels::Isa::Scalar});
    store.read(b, b + w, [&](const SubgroupStore::View& v) {
      const std::size_t lo = std::max(b, v.begin), hi = std::min(b + w, v.end);
      for (std::size_t k = 0; k < got.size(); ++k) {
        std::memcpy(got[k].data() + (lo - b), v.tensors[k] + (lo - v.begin) * sizeof(float),
                    (hi - lo) * sizeof(float));
      }
    });
    for (std::size_t k = 0; k < got.size(); ++k) {
      ZERO_CHECK(std::memcmp(got[k].data(), want[k].data(), w * sizeof(float)) == 0,
                 "offload bench ({}): tensor {} of elements [{}, {}) differs from the scalar "
                 "kernel after the first step",
                 tier, k, b, b + w);
    }
    changed += static_cast<std::size_t>(
        std::count_if(got[0].begin(), got[0].end(), [](float x) { return x != 0.0f; }));
  }
  // Guards against a vacuous pass (a step that did nothing to either side).
  ZERO_CHECK(changed > w, "offload bench ({}): the first step left the master weights at 0", tier);
}

// The nvme tier's limit: the step's records read from one slot and written to the other through
// an AsyncIo, with no compute in between.
class IoOnly {
 public:
  // `records` records of `tensors` tensors of `tensor_bytes` each, laid out as the store lays
  // them out (each tensor rounded up to the direct-I/O alignment, two slots per record).
  IoOnly(Device& device, const OffloadArgs& a, const offload::AioOptions& aio, std::size_t records,
         std::size_t tensors, std::size_t tensor_bytes)
      : dir_(a.nvme_path, "--nvme-path"),
        fd_(dir_.open("limit.swp")),
        file_((dir_.path() / "limit.swp").string()),
        io_(offload::make_async_io(aio)),
        records_(records),
        record_bytes_(tensors * align_up(tensor_bytes, alignment())),
        written_(device, record_bytes_, alignment(), MemoryTag::Staging) {
    for (int b = 0; b < a.buffer_count; ++b) {
      reads_.emplace_back(device, record_bytes_, alignment(), MemoryTag::Staging);
    }
    for (std::size_t i = 0; i < record_bytes_; ++i) {
      written_.data[i] = static_cast<std::byte>(i * 131 + 7);
    }
    // Slot 0 of every record, then an untimed pass (writing slot 1) that checks what it read.
    std::vector<offload::IoRequest> fill;
    for (std::size_t r = 0; r < records_; ++r) fill.push_back(request(offload::IoOp::Write, r, 0));
    io_->wait(io_->submit(std::move(fill)));
    pass();
    for (std::size_t b = 0; b < std::min(records_, reads_.size()); ++b) {
      ZERO_CHECK(std::memcmp(reads_[b].data, written_.data, record_bytes_) == 0,
                 "offload bench: a record read back from {} differs from what was written", file_);
    }
  }

  std::size_t alignment() const { return std::max<std::size_t>(dir_.alignment(), 4096); }
  bool direct() const { return dir_.direct(); }
  // Bytes a pass reads plus writes.
  std::size_t pass_bytes() const { return 2 * records_ * record_bytes_; }

  // One pass: for every record, read the slot written last and write the other; returns seconds.
  double pass() {
    const int from = from_slot_;
    from_slot_ = 1 - from_slot_;
    const std::size_t window = reads_.size();
    std::vector<offload::AsyncIo::Ticket> tickets;
    const auto start = Clock::now();
    for (std::size_t r = 0; r < records_; ++r) {
      if (r >= window) io_->wait(tickets[r - window]);  // its read buffer is free again
      offload::IoRequest read = request(offload::IoOp::Read, r, from);
      read.data = reads_[r % window].data;
      tickets.push_back(io_->submit({read, request(offload::IoOp::Write, r, 1 - from)}));
    }
    for (std::size_t r = records_ > window ? records_ - window : 0; r < records_; ++r) {
      io_->wait(tickets[r]);
    }
    return seconds_since(start);
  }

 private:
  offload::IoRequest request(offload::IoOp op, std::size_t record, int slot) const {
    const std::uint64_t offset = (2 * record + static_cast<std::size_t>(slot)) * record_bytes_;
    return {op, fd_, written_.data, record_bytes_, offset, file_};
  }

  offload::SwapDir dir_;
  int fd_;
  std::string file_;
  std::unique_ptr<offload::AsyncIo> io_;
  std::size_t records_;
  std::size_t record_bytes_;
  AlignedBuffer written_;
  std::vector<AlignedBuffer> reads_;
  int from_slot_ = 0;  // slot 0 is written by the constructor
};

// The host tier's limits: kernels::traffic_probe_cpu, the kernel's loads and stores (same tiles
// and OpenMP split) without its arithmetic.
class TrafficProbe {
 public:
  TrafficProbe(Device& device, const offload::StoreOptions& options, const float* grads,
               int state_count)
      : store_(device, adamw_tensors(), options), grads_(grads), state_count_(state_count) {
    const std::size_t bytes = options.total_elems * sizeof(float);
    for (int k = 0; k < 3; ++k) {
      plain_.push_back(device.allocate(bytes, MemoryKind::PinnedHost, MemoryTag::Other));
      std::memset(plain_.back().data(), 0, bytes);
    }
  }

  // The step with the kernel replaced by the probe: update_all() of a store laid out like the
  // step's (one buffer per tensor and sub-group), one probe call per sub-group. Returns seconds.
  double run_store() {
    const auto start = Clock::now();
    store_.update_all([&](const SubgroupStore::View& v) {
      kernels::traffic_probe_cpu(optimizer_tensors(v.tensors[0], v.tensors[1], v.tensors[2],
                                                   grads_ + v.begin, v.end - v.begin),
                                 state_count_);
    });
    return seconds_since(start);
  }

  // The probe as one call over contiguous arrays of the whole range. Returns seconds.
  double run_plain() const {
    auto at = [&](int k) { return static_cast<std::byte*>(plain_[k].data()); };
    const auto start = Clock::now();
    kernels::traffic_probe_cpu(optimizer_tensors(at(0), at(1), at(2), grads_, store_.total_elems()),
                               state_count_);
    return seconds_since(start);
  }

  // Bytes one run moves.
  double bytes() const {
    return static_cast<double>(
        store_.total_elems() *
        kernels::optimizer_bytes_per_elem(kernels::OptimizerTensors{}, state_count_));
  }

 private:
  SubgroupStore store_;
  const float* grads_;
  int state_count_;
  std::vector<Buffer> plain_;  // master, exp_avg, exp_avg_sq
};

struct Figure {
  std::string tier;
  double step_s = 0;
  std::string limit;
  double limit_s = 0;
  double gb_per_step = 0;  // host: memory traffic; nvme: bytes read + written
  // host only: the probe as one call over contiguous arrays.
  std::optional<double> plain_limit_s;
  // nvme only.
  std::optional<double> compute_s, kernel_in_step_s, io_hidden_fraction;
  std::optional<std::string> io_backend;
  std::optional<bool> direct;
};

double best(std::span<const double> seconds) {
  return *std::min_element(seconds.begin(), seconds.end());
}

// A tier's figure from the seconds of its rounds: the best of each.
Figure best_of(std::string tier, std::span<const double> step_s, std::string limit,
               std::span<const double> limit_s, double gb_per_step) {
  Figure f;
  f.tier = std::move(tier);
  f.step_s = best(step_s);
  f.limit = std::move(limit);
  f.limit_s = best(limit_s);
  f.gb_per_step = gb_per_step;
  return f;
}

void print_figure(const OffloadArgs& a, const Figure& f) {
  const auto n = static_cast<double>(a.elems);
  const double pps = n / f.step_s, limit_pps = n / f.limit_s;
  const double ratio = pps / limit_pps;
  if (a.json) {
    nlohmann::ordered_json j{{"bench", "offload"},
                             {"tier", f.tier},
                             {"elems", a.elems},
                             {"sub_group_elems", a.sub_group_elems},
                             {"repeats", a.repeats},
                             {"statistic", "best"},
                             {"step_s", f.step_s},
                             {"params_per_s", pps},
                             {"gb_per_s", f.gb_per_step / f.step_s},
                             {"limit", f.limit},
                             {"limit_s", f.limit_s},
                             {"limit_params_per_s", limit_pps},
                             {"limit_gb_per_s", f.gb_per_step / f.limit_s},
                             {"ratio", ratio}};
    auto opt = [&](const char* key, const auto& v) {
      if (v) {
        j[key] = *v;
      } else {
        j[key] = nullptr;
      }
    };
    opt("plain_limit_params_per_s",
        f.plain_limit_s ? std::optional<double>(n / *f.plain_limit_s) : std::nullopt);
    opt("compute_s", f.compute_s);
    opt("kernel_in_step_s", f.kernel_in_step_s);
    opt("io_hidden_fraction", f.io_hidden_fraction);
    opt("io_backend", f.io_backend);
    opt("direct", f.direct);
    if (f.tier == "nvme") {
      j["nvme_path"] = a.nvme_path;
      j["buffer_count"] = a.buffer_count;
      j["block_size"] = a.block_size;
      j["queue_depth"] = a.queue_depth;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%-5s %8.3f s %10.1f %9.2f   %-19s %8.3f s %10.1f %7.3f", f.tier.c_str(), f.step_s,
                pps / 1e6, f.gb_per_step / f.step_s, f.limit.c_str(), f.limit_s, limit_pps / 1e6,
                ratio);
    if (f.plain_limit_s) {
      std::printf("   (probe on plain arrays: %.1f Mparams/s)", n / *f.plain_limit_s / 1e6);
    }
    if (f.io_hidden_fraction) {
      std::printf("   io_hidden %.2f (compute %.3f s, kernel in step %.3f s) %s %s",
                  *f.io_hidden_fraction, *f.compute_s, *f.kernel_in_step_s, f.io_backend->c_str(),
                  *f.direct ? "O_DIRECT" : "buffered (no O_DIRECT)");
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

}  // namespace

int run_offload(std::span<const std::string> argv) {
  const OffloadArgs a = parse_args(argv);
  if (a.help) {
    std::printf("%.*s\n%.*s\n", static_cast<int>(kUsage.size()), kUsage.data(),
                static_cast<int>(kHelp.size()), kHelp.data());
    return 0;
  }
  auto device = make_device("cpu", 0);
  const std::size_t n = a.elems;
  Buffer grad_memory = device->allocate(n * sizeof(float), MemoryKind::Host, MemoryTag::Gradients);
  auto* grads = static_cast<float*>(grad_memory.data());
  for (std::size_t i = 0; i < n; ++i) grads[i] = gradient_value(i);
  const AdamWStep adamw(grads);
  std::int64_t step = 1;

  offload::StoreOptions host_options;
  host_options.total_elems = n;
  host_options.sub_group_elems = a.sub_group_elems;
  host_options.resident_kind = MemoryKind::Host;
  host_options.offload_kind = MemoryKind::PinnedHost;
  host_options.ratio = 1.0;
  SubgroupStore host(*device, adamw_tensors(), host_options);
  adamw.run(host, step++);
  validate_first_step(host, adamw, "host");
  if (!a.json) {
    std::printf(
        "zero-bench offload: %zu elements (AdamW: fp32 master, exp_avg, exp_avg_sq, grads) in "
        "%d sub-groups of %zu, best of %d rounds\n",
        n, host.count(), a.sub_group_elems, a.repeats);
    std::printf("%-5s %10s %10s %9s   %-19s %10s %10s %7s\n", "tier", "step", "Mparams/s", "GB/s",
                "limit", "limit", "Mparams/s", "ratio");
  }

  // Host tier: the step next to the traffic probe. The probe's memory lives to the end of the
  // run: on this machine (a VM), handing 1.5 GiB back to the kernel mid-run made the NVMe tier's
  // step take twice as long afterwards, and its compute too, while the I/O alone did not change.
  TrafficProbe probe(*device, host_options, grads, adamw.state_count());
  {
    probe.run_store();
    probe.run_plain();
    std::vector<double> step_s, probe_s, plain_s;
    for (int r = 0; r < a.repeats; ++r) {
      step_s.push_back(adamw.run(host, step++));
      probe_s.push_back(probe.run_store());
      plain_s.push_back(probe.run_plain());
    }
    Figure f = best_of("host", step_s, "traffic_probe", probe_s, probe.bytes() / 1e9);
    f.plain_limit_s = best(plain_s);
    print_figure(a, f);
  }

  // NVMe tier: the pipelined step next to its I/O alone and its compute alone (the host store).
  offload::StoreOptions nvme_options = host_options;
  offload::NvmeTier tier;
  tier.paths = {a.nvme_path};
  tier.key = "--nvme-path";
  tier.aio.block_size = a.block_size;
  tier.aio.queue_depth = a.queue_depth;
  tier.buffer_count = a.buffer_count;
  tier.pipeline_read = true;
  tier.pipeline_write = true;
  nvme_options.nvme = tier;
  SubgroupStore nvme(*device, adamw_tensors(), nvme_options);
  ZERO_CHECK(nvme.nvme_count() == nvme.count(), "offload bench: {} of {} sub-groups on NVMe",
             nvme.nvme_count(), nvme.count());
  std::int64_t nvme_step = 1;
  adamw.run(nvme, nvme_step++);
  validate_first_step(nvme, adamw, "nvme");
  adamw.run(nvme, nvme_step++);  // both slots of every record now exist on disk
  IoOnly io_only(*device, a, tier.aio, static_cast<std::size_t>(nvme.count()),
                 adamw_tensors().size(), a.sub_group_elems * sizeof(float));
  std::vector<double> step_s, kernel_s, compute_s, io_s;
  for (int r = 0; r < a.repeats; ++r) {
    double k = 0;
    step_s.push_back(adamw.run(nvme, nvme_step++, &k));
    kernel_s.push_back(k);
    compute_s.push_back(adamw.run(host, step++));
    io_s.push_back(io_only.pass());
  }
  Figure f = best_of("nvme", step_s, "odirect_read_write", io_s,
                     static_cast<double>(io_only.pass_bytes()) / 1e9);
  f.compute_s = best(compute_s);
  f.kernel_in_step_s = best(kernel_s);
  f.io_backend = std::string(nvme.io_name());
  f.direct = io_only.direct();
  const double shorter = std::min(*f.compute_s, f.limit_s);
  f.io_hidden_fraction = std::clamp((*f.compute_s + f.limit_s - f.step_s) / shorter, 0.0, 1.0);
  print_figure(a, f);
  return 0;
}

}  // namespace zero::bench
