#include "zero/comm/device_inproc_comm.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/compute.h"
#include "zero/base/error.h"
#include "zero/comm/comm_thread.h"
#include "zero/comm/inproc_comm.h"
#include "zero/comm/reduce_math.h"

namespace zero {
namespace {

// One rank's call as it posts it to its peers: the collective and its buffer addresses, as 64-bit
// words that an fp64 all-gather copies bit for bit (as Communicator::exchange_addresses does).
constexpr std::size_t kPostWords = 8;
using Post = std::array<std::uint64_t, kPostWords>;

Post encode(const CollectiveArgs& a) {
  return {static_cast<std::uint64_t>(a.kind),       a.elems,
          static_cast<std::uint64_t>(a.dtype),      static_cast<std::uint64_t>(a.op),
          static_cast<std::uint64_t>(a.root),       a.in_place ? 1u : 0u,
          reinterpret_cast<std::uintptr_t>(a.send), reinterpret_cast<std::uintptr_t>(a.recv)};
}

CollectiveArgs decode(const std::uint64_t* w) {
  CollectiveArgs a;
  a.kind = static_cast<Collective>(w[0]);
  a.elems = w[1];
  a.dtype = static_cast<DType>(w[2]);
  a.op = static_cast<ReduceOp>(w[3]);
  a.root = static_cast<int>(w[4]);
  a.in_place = w[5] != 0;
  a.send = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(w[6]));
  a.recv = reinterpret_cast<void*>(static_cast<std::uintptr_t>(w[7]));
  return a;
}

bool reduces(const CollectiveArgs& a) {
  return a.kind == Collective::ReduceScatter || a.kind == Collective::AllReduce;
}

// InProcComm's rule: the same collective, size and dtype; the same op for a reduction and the
// same root for a broadcast.
bool same_call(const CollectiveArgs& x, const CollectiveArgs& y) {
  if (x.kind != y.kind || x.elems != y.elems || x.dtype != y.dtype) return false;
  if (reduces(x) && x.op != y.op) return false;
  if (x.kind == Collective::Broadcast && x.root != y.root) return false;
  return true;
}

const std::byte* bytes_at(const void* p, std::size_t offset) {
  return static_cast<const std::byte*>(p) + offset;
}
std::byte* bytes_at(void* p, std::size_t offset) {
  return static_cast<std::byte*>(p) + offset;
}

class DeviceInProcComm final : public Communicator {
 public:
  // `group`: this rank's InProcComm of `world` (or of a split of it), which carries the
  // rendezvous.
  DeviceInProcComm(std::shared_ptr<InProcWorld> world, std::unique_ptr<Communicator> group,
                   Device& device, const CommOptions& options)
      : Communicator(options),
        world_(std::move(world)),
        group_(std::move(group)),
        device_(device),
        table_(device.compute()) {
    // The communication thread runs one kernel at a time, as InProcComm's reductions do.
    exec_.threads = 1;
  }

  // As InProcComm: what is still queued must fail fast on every rank rather than wait for peers
  // that may never come; thread_, the last member, then runs it and joins.
  ~DeviceInProcComm() override {
    const std::size_t outstanding = thread_.outstanding();
    if (outstanding > 0) {
      world_->abort(
          fmt::format("DeviceInProcComm rank {} of {} destroyed its communicator with {} "
                      "collectives outstanding",
                      rank_, size_, outstanding));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "device-inproc"; }

 protected:
  Work start_impl(const CollectiveArgs& args) override {
    ZERO_CHECK_AS(CommError, !(reduces(args) && args.dtype == DType::F64),
                  "DeviceInProcComm rank {} of {}: {}: fp64 is not reduced on device memory (the "
                  "compute kernels cover fp32, bf16 and fp16)",
                  rank_, size_, describe(args, size_));
    const auto limit = timeout();
    return thread_.submit([this, args, limit] { run_collective(args, limit); });
  }

  std::unique_ptr<Communicator> split_impl(int color, int key) override {
    std::unique_ptr<Communicator> result;
    const auto limit = timeout();
    thread_
        .submit([&] {
          group_->set_timeout(limit);
          std::unique_ptr<Communicator> part = group_->split(color, key);
          if (part) {
            result = std::make_unique<DeviceInProcComm>(world_, std::move(part), device_,
                                                        CommOptions{limit});
          }
        })
        .wait();
    return result;
  }

 private:
  using Clock = std::chrono::steady_clock;

  struct Op {
    std::string what;  // describe() of the op, for messages
    Clock::time_point deadline;
  };

  std::string who() const { return fmt::format("DeviceInProcComm rank {} of {}", rank_, size_); }

  // A collective of the rendezvous group, with what is left of the op's time; its failure named
  // as the op's.
  template <typename Start>
  void rendezvous(const Op& op, Start start) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(op.deadline - Clock::now());
    group_->set_timeout(std::max(left, std::chrono::milliseconds(1)));
    try {
      start().wait();
    } catch (const CommError& e) {
      throw CommError(fmt::format("{}: {} failed: {}", who(), op.what, e.what()));
    }
  }

  // An exact copy on the table's stream (combine with scale 1 copies bytes), complete on return.
  // Every dtype's byte count is even and its buffers 2-byte aligned, so bytes move as 16-bit
  // elements.
  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    table_.combine(dst, DType::BF16, src, DType::BF16, bytes / 2, 1.0f, false, exec_);
  }

  // The reduction of reduce_math.h's reduce_elements, through the table.
  void reduce(void* dst, const std::vector<const void*>& srcs, std::size_t elems,
              const CollectiveArgs& a) {
    if (elems == 0) return;
    table_.reduce(dst, srcs.data(), static_cast<int>(srcs.size()), elems, a.dtype,
                  a.op == ReduceOp::Max ? kernels::ReduceKind::Max : kernels::ReduceKind::Sum,
                  a.op == ReduceOp::Avg ? static_cast<float>(size_) : 0.0f, exec_);
  }

  // Every rank's call, after checking that they agree (every rank checks the same posts, so all
  // fail alike, and the world is aborted as InProcComm's group is).
  std::vector<CollectiveArgs> post(const Op& op, const CollectiveArgs& a) {
    const auto n = static_cast<std::size_t>(size_);
    std::vector<std::uint64_t> words(kPostWords * n);
    const Post mine = encode(a);
    std::copy(mine.begin(), mine.end(),
              words.begin() + kPostWords * static_cast<std::size_t>(rank_));
    rendezvous(op,
               [&] { return group_->all_gather_in_place(words.data(), kPostWords, DType::F64); });
    std::vector<CollectiveArgs> calls;
    for (std::size_t q = 0; q < n; ++q) calls.push_back(decode(&words[kPostWords * q]));
    const bool agree = std::all_of(calls.begin(), calls.end(),
                                   [&](const CollectiveArgs& c) { return same_call(c, a); });
    if (!agree) {
      std::vector<std::string> described;
      for (std::size_t q = 0; q < n; ++q)
        described.push_back(fmt::format("rank {}: {}", q, describe(calls[q], size_)));
      const std::string message = fmt::format(
          "DeviceInProcComm: ranks issued different collectives: {}", fmt::join(described, "; "));
      world_->abort(message);
      throw CommError(message);
    }
    return calls;
  }

  void run_collective(const CollectiveArgs& a, std::chrono::milliseconds limit) {
    const Op op{describe(a, size_), Clock::now() + limit};
    const std::vector<CollectiveArgs> peer = post(op, a);
    const auto barrier = [this] { return group_->barrier(); };
    try {
      device_.bind_thread();
      compute_part(a, peer, op, barrier);
    } catch (const CommError&) {
      throw;  // a rendezvous failed: the group already knows
    } catch (const std::exception& e) {
      const std::string message =
          fmt::format("{}: {} failed on its device: {}", who(), op.what, e.what());
      world_->abort(message);
      throw CommError(message);
    }
    // Nobody leaves (and reuses its buffers) while a peer still reads or writes them.
    rendezvous(op, barrier);
  }

  // This rank's part of the collective, from its peers' posted buffers.
  template <typename Barrier>
  void compute_part(const CollectiveArgs& a, const std::vector<CollectiveArgs>& peer, const Op& op,
                    Barrier barrier) {
    const int n = size_;
    const std::size_t esz = dtype_size(a.dtype);
    const auto me = static_cast<std::size_t>(rank_);
    std::vector<const void*> srcs(static_cast<std::size_t>(n));
    switch (a.kind) {
      case Collective::ReduceScatter: {
        const std::size_t offset = me * a.elems * esz;
        for (int q = 0; q < n; ++q)
          srcs[static_cast<std::size_t>(q)] =
              bytes_at(peer[static_cast<std::size_t>(q)].send, offset);
        reduce(a.in_place ? bytes_at(a.recv, offset) : a.recv, srcs, a.elems, a);
        return;
      }
      case Collective::AllGather: {
        const std::size_t bytes = a.elems * esz;
        for (int q = 0; q < n; ++q) {
          if (a.in_place && q == rank_) continue;
          const CollectiveArgs& p = peer[static_cast<std::size_t>(q)];
          const std::size_t offset = static_cast<std::size_t>(q) * bytes;
          copy(bytes_at(a.recv, offset), p.in_place ? bytes_at(p.recv, offset) : p.send, bytes);
        }
        return;
      }
      case Collective::AllToAll: {
        const std::size_t bytes = a.elems * esz;
        for (int q = 0; q < n; ++q) {
          copy(bytes_at(a.recv, static_cast<std::size_t>(q) * bytes),
               bytes_at(peer[static_cast<std::size_t>(q)].send, me * bytes), bytes);
        }
        return;
      }
      case Collective::AllReduce: {
        // Each rank reduces its chunk (every rank's input in rank order) into its output, then
        // copies the other chunks from their owners' outputs.
        const auto [begin, end] = comm_detail::chunk_bounds(a.elems, n, rank_);
        for (int q = 0; q < n; ++q)
          srcs[static_cast<std::size_t>(q)] =
              bytes_at(peer[static_cast<std::size_t>(q)].send, begin * esz);
        reduce(bytes_at(a.recv, begin * esz), srcs, end - begin, a);
        rendezvous(op, barrier);
        for (int q = 0; q < n; ++q) {
          if (q == rank_) continue;
          const auto [qb, qe] = comm_detail::chunk_bounds(a.elems, n, q);
          copy(bytes_at(a.recv, qb * esz),
               bytes_at(peer[static_cast<std::size_t>(q)].recv, qb * esz), (qe - qb) * esz);
        }
        return;
      }
      case Collective::Broadcast:
        if (rank_ != a.root)
          copy(a.recv, peer[static_cast<std::size_t>(a.root)].recv, a.elems * esz);
        return;
      case Collective::Barrier: return;
    }
  }

  const std::shared_ptr<InProcWorld> world_;
  const std::unique_ptr<Communicator> group_;
  const int rank_ = group_->rank();
  const int size_ = group_->size();
  Device& device_;
  const kernels::ComputeKernels& table_;
  kernels::CpuExec exec_;           // threads 1; cuda_stream null: the legacy default stream
  comm_detail::CommThread thread_;  // last: joined before the members its ops use go away
};

}  // namespace

DeviceInProcWorld::DeviceInProcWorld(int size, const CommOptions& options)
    : world_(std::make_shared<InProcWorld>(size, options)), options_(options) {}

DeviceInProcWorld::~DeviceInProcWorld() = default;

int DeviceInProcWorld::size() const {
  return world_->size();
}

std::unique_ptr<Communicator> DeviceInProcWorld::comm(int rank, Device& device) {
  return std::make_unique<DeviceInProcComm>(world_, world_->comm(rank), device, options_);
}

void DeviceInProcWorld::abort(const std::string& reason) {
  world_->abort(reason);
}

std::unique_ptr<Communicator> DeviceInProcWorld::join(Communicator& host, Device& device,
                                                      const CommOptions& options) {
  ZERO_CHECK_AS(CommError, host.shares_address_space(),
                "DeviceInProcWorld::join: the {} backend's ranks are not threads of one process; "
                "in-process device ranks need ones that are (InProcComm)",
                host.backend_name());
  // Rank 0 makes the world; every rank copies its handle, which rank 0 keeps alive until the
  // barrier says all have.
  std::shared_ptr<InProcWorld> made;
  if (host.rank() == 0) made = std::make_shared<InProcWorld>(host.size(), options);
  void* const mine = &made;
  const std::vector<void*> all = host.exchange_addresses(std::span(&mine, 1));
  std::shared_ptr<InProcWorld> world = *static_cast<const std::shared_ptr<InProcWorld>*>(all[0]);
  host.barrier().wait();
  std::unique_ptr<Communicator> group = world->comm(host.rank());
  return std::make_unique<DeviceInProcComm>(std::move(world), std::move(group), device, options);
}

}  // namespace zero
