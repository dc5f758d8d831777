#include "zero/comm/inproc_comm.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "zero/base/error.h"
#include "zero/base/stream_copy.h"
#include "zero/comm/comm_thread.h"
#include "zero/comm/reduce_math.h"

namespace zero {
namespace comm_detail {

struct InProcGroup;

struct InProcWorldState {
  InProcWorldState(int n, const CommOptions& o) : size(n), options(o), taken(n, false) {}

  void abort(const std::string& why);
  std::string reason() {
    std::lock_guard lock(mu);
    return abort_reason;
  }

  const int size;
  const CommOptions options;
  std::atomic<bool> aborted{false};
  std::mutex mu;  // guards everything below
  std::vector<bool> taken;
  std::vector<std::weak_ptr<InProcGroup>> groups;
  std::string abort_reason;
  std::shared_ptr<InProcGroup> world_group;
};

// What one rank posted for the collective it is in. Written by its owner before it arrives at
// the collective's first rendezvous, read by peers after it; not rewritten before the last
// rendezvous of the collective, so peers may read it without a lock in between.
struct Slot {
  CollectiveArgs args;
  bool is_split = false;
  int color = 0;
  int key = 0;
  std::shared_ptr<InProcGroup> split_group;  // set by the lowest rank of each color
};

// One set of ranks that issue collectives together: the world, or one color of a split.
struct InProcGroup {
  InProcGroup(std::shared_ptr<InProcWorldState> w, int n, std::string name)
      : world(std::move(w)), size(n), label(std::move(name)), progress(n, 0), slots(n) {}

  void abort(const std::string& why) {
    {
      std::lock_guard lock(mu);
      if (!aborted) {
        aborted = true;
        reason = why;
      }
    }
    cv.notify_all();
  }

  const std::shared_ptr<InProcWorldState> world;
  const int size;
  const std::string label;
  std::mutex mu;
  std::condition_variable cv;
  // Rendezvous tickets: rank q has reached phase p of its collective #s when
  // progress[q] >= s·kPhases + p. Monotonic, so a late waker never misreads an older round.
  std::vector<std::uint64_t> progress;
  std::vector<Slot> slots;
  bool aborted = false;
  std::string reason;
};

constexpr std::uint64_t kPhases = 4;

void InProcWorldState::abort(const std::string& why) {
  std::vector<std::shared_ptr<InProcGroup>> live;
  {
    std::lock_guard lock(mu);
    if (!aborted.load()) abort_reason = why;
    aborted = true;
    for (auto& g : groups) {
      if (auto p = g.lock()) live.push_back(std::move(p));
    }
  }
  // Taking each group's lock before notifying means no waiter can miss the flag.
  for (auto& g : live) {
    { std::lock_guard lock(g->mu); }
    g->cv.notify_all();
  }
}

namespace {

std::shared_ptr<InProcGroup> new_group(const std::shared_ptr<InProcWorldState>& world, int size,
                                       std::string label) {
  auto g = std::make_shared<InProcGroup>(world, size, std::move(label));
  std::lock_guard lock(world->mu);
  world->groups.push_back(g);
  return g;
}

bool same_call(const Slot& a, const Slot& b) {
  if (a.is_split != b.is_split) return false;
  const auto& x = a.args;
  const auto& y = b.args;
  if (x.kind != y.kind || x.elems != y.elems || x.dtype != y.dtype) return false;
  const bool reduces = x.kind == Collective::ReduceScatter || x.kind == Collective::AllReduce;
  if (reduces && x.op != y.op) return false;
  if (x.kind == Collective::Broadcast && x.root != y.root) return false;
  return true;
}

const char* bytes_at(const void* p, std::size_t offset) {
  return static_cast<const char*>(p) + offset;
}
char* bytes_at(void* p, std::size_t offset) {
  return static_cast<char*>(p) + offset;
}

class InProcComm final : public Communicator {
 public:
  InProcComm(std::shared_ptr<InProcGroup> group, int rank, const CommOptions& options)
      : Communicator(options), group_(std::move(group)), rank_(rank) {}

  // Aborting first makes whatever is still queued fail fast; thread_, the last member, then runs
  // it and joins before the rest of this object goes away.
  ~InProcComm() override {
    const std::size_t outstanding = thread_.outstanding();
    if (outstanding > 0) {
      group_->abort(
          fmt::format("rank {} of {} destroyed its communicator with {} collectives "
                      "outstanding",
                      rank_, group_->label, outstanding));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  std::string backend_name() const override { return "inproc"; }
  // Every op is a rendezvous under the group's mutex: what a rank wrote before it entered one is
  // visible to every rank that left it.
  bool shares_address_space() const override { return true; }

 protected:
  Work start_impl(const CollectiveArgs& args) override {
    const auto limit = timeout();
    return thread_.submit([this, args, limit] { run_collective(args, limit); }, args.waited);
  }

  std::unique_ptr<Communicator> split_impl(int color, int key) override {
    std::unique_ptr<Communicator> result;
    const auto limit = timeout();
    thread_.submit([&] { result = run_split(color, key, limit); }).wait();
    return result;
  }

 private:
  struct Op {
    std::string what;  // describe() of the op, for messages
    std::uint64_t seq;
    std::chrono::steady_clock::time_point deadline;
    std::chrono::milliseconds timeout;
  };

  std::string failure_reason(InProcGroup& g) {
    if (g.aborted) return g.reason;
    return g.world->reason();
  }

  // Marks this rank as having reached `phase` of `op` and waits until every rank of the group
  // has. Throws CommError if the group or world is aborted, or on timeout (and then aborts the
  // group so the others fail promptly too).
  void arrive(const Op& op, std::uint64_t phase) {
    InProcGroup& g = *group_;
    const std::uint64_t ticket = op.seq * kPhases + phase;
    std::unique_lock lock(g.mu);
    auto failed = [&] { return g.aborted || g.world->aborted.load(); };
    auto everyone = [&] {
      return std::all_of(g.progress.begin(), g.progress.end(),
                         [&](std::uint64_t t) { return t >= ticket; });
    };
    // A group that failed before this rank got here is not joined. One that fails after every
    // rank has arrived does not undo this phase: its data exchange is complete.
    if (!failed()) {
      g.progress[static_cast<std::size_t>(rank_)] = ticket;
      g.cv.notify_all();
      g.cv.wait_until(lock, op.deadline, [&] { return failed() || everyone(); });
      if (everyone()) return;
    }
    if (failed()) {
      const std::string reason = failure_reason(g);
      lock.unlock();
      throw CommError(fmt::format("InProcComm rank {} of {}: {} (collective #{}) failed: {}", rank_,
                                  g.label, op.what, op.seq, reason));
    }
    std::vector<int> arrived;
    std::vector<std::string> missing;
    for (int q = 0; q < g.size; ++q) {
      const std::uint64_t t = g.progress[static_cast<std::size_t>(q)];
      if (t >= ticket) {
        arrived.push_back(q);
      } else {
        missing.push_back(fmt::format("{} (last reached collective #{})", q, t / kPhases));
      }
    }
    const std::string message = fmt::format(
        "InProcComm rank {} of {} ({} ranks): {} (collective #{}) timed out after {} ms {}: "
        "arrived ranks [{}]; missing ranks [{}]",
        rank_, g.label, g.size, op.what, op.seq, op.timeout.count(),
        phase == 1 ? "waiting for every rank to arrive" : "waiting for every rank to finish",
        fmt::join(arrived, ", "), fmt::join(missing, ", "));
    if (!g.aborted) {
      g.aborted = true;
      g.reason = message;
    }
    lock.unlock();
    g.cv.notify_all();
    throw CommError(message);
  }

  // After the first rendezvous: every rank must have called the same collective.
  void check_same_call(const Op& op) {
    InProcGroup& g = *group_;
    const Slot& mine = g.slots[static_cast<std::size_t>(rank_)];
    bool all_same = true;
    for (const auto& s : g.slots) all_same = all_same && same_call(s, mine);
    if (all_same) return;
    std::vector<std::string> calls;
    for (int q = 0; q < g.size; ++q) {
      const Slot& s = g.slots[static_cast<std::size_t>(q)];
      calls.push_back(
          fmt::format("rank {}: {}", q, s.is_split ? "split" : describe(s.args, g.size)));
    }
    const std::string message =
        fmt::format("InProcComm {}: ranks issued different collectives as collective #{}: {}",
                    g.label, op.seq, fmt::join(calls, "; "));
    g.abort(message);
    throw CommError(message);
  }

  Op begin_op(std::string what, std::chrono::milliseconds limit) {
    return {std::move(what), ++seq_, std::chrono::steady_clock::now() + limit, limit};
  }

  void run_collective(const CollectiveArgs& a, std::chrono::milliseconds limit) {
    InProcGroup& g = *group_;
    const int n = g.size;
    const Op op = begin_op(describe(a, n), limit);
    {
      std::lock_guard lock(g.mu);
      auto& slot = g.slots[static_cast<std::size_t>(rank_)];
      slot.args = a;
      slot.is_split = false;
    }
    arrive(op, 1);
    check_same_call(op);

    const std::size_t esz = dtype_size(a.dtype);
    const auto me = static_cast<std::size_t>(rank_);
    auto peer = [&](int q) -> const CollectiveArgs& {
      return g.slots[static_cast<std::size_t>(q)].args;
    };
    std::vector<const void*> srcs(static_cast<std::size_t>(n));

    switch (a.kind) {
      case Collective::ReduceScatter: {
        if (a.elems == 0) break;
        const std::size_t offset = me * a.elems * esz;
        for (int q = 0; q < n; ++q)
          srcs[static_cast<std::size_t>(q)] = bytes_at(peer(q).send, offset);
        void* dst = a.in_place ? bytes_at(a.recv, offset) : a.recv;
        comm_detail::reduce_elements(dst, srcs.data(), n, a.elems, a.dtype, a.op, n);
        break;
      }
      case Collective::AllGather: {
        if (a.elems == 0) break;
        const std::size_t bytes = a.elems * esz;
        for (int q = 0; q < n; ++q) {
          if (a.in_place && q == rank_) continue;
          const std::size_t offset = static_cast<std::size_t>(q) * bytes;
          const void* src = a.in_place ? bytes_at(peer(q).recv, offset) : peer(q).send;
          copy_large(bytes_at(a.recv, offset), src, bytes);
        }
        break;
      }
      case Collective::AllReduce: {
        // Each rank reduces its own chunk (reading every rank's input in rank order) into its
        // output, then copies the other chunks from their owners' outputs.
        const auto [begin, end] = chunk_bounds(a.elems, n, rank_);
        if (end > begin) {
          for (int q = 0; q < n; ++q)
            srcs[static_cast<std::size_t>(q)] = bytes_at(peer(q).send, begin * esz);
          comm_detail::reduce_elements(bytes_at(a.recv, begin * esz), srcs.data(), n, end - begin,
                                       a.dtype, a.op, n);
        }
        arrive(op, 2);
        for (int q = 0; q < n; ++q) {
          if (q == rank_) continue;
          const auto [qb, qe] = chunk_bounds(a.elems, n, q);
          if (qe > qb) {
            copy_large(bytes_at(a.recv, qb * esz), bytes_at(peer(q).recv, qb * esz),
                       (qe - qb) * esz);
          }
        }
        arrive(op, 3);
        return;
      }
      case Collective::Broadcast:
        if (rank_ != a.root && a.elems > 0) {
          copy_large(a.recv, peer(a.root).recv, a.elems * esz);
        }
        break;
      case Collective::AllToAll: {
        // Block q of the output is block `me` of rank q's input.
        const std::size_t bytes = a.elems * esz;
        for (int q = 0; q < n && bytes > 0; ++q) {
          copy_large(bytes_at(a.recv, static_cast<std::size_t>(q) * bytes),
                     bytes_at(peer(q).send, me * bytes), bytes);
        }
        break;
      }
      case Collective::Barrier: break;
    }
    arrive(op, 2);  // nobody leaves (and reuses its buffers or slot) while a peer still reads them
  }

  std::unique_ptr<Communicator> run_split(int color, int key, std::chrono::milliseconds limit) {
    InProcGroup& g = *group_;
    const Op op = begin_op(fmt::format("split (color {}, key {})", color, key), limit);
    {
      std::lock_guard lock(g.mu);
      auto& slot = g.slots[static_cast<std::size_t>(rank_)];
      slot.args = CollectiveArgs{};
      slot.is_split = true;
      slot.color = color;
      slot.key = key;
      slot.split_group.reset();
    }
    arrive(op, 1);
    check_same_call(op);

    std::vector<std::pair<int, int>> members;  // (key, old rank), in new-rank order once sorted
    int leader = -1;
    if (color >= 0) {
      for (int q = 0; q < g.size; ++q) {
        const Slot& s = g.slots[static_cast<std::size_t>(q)];
        if (s.color != color) continue;
        members.emplace_back(s.key, q);
        if (leader < 0) leader = q;
      }
      std::sort(members.begin(), members.end());
      if (leader == rank_) {
        g.slots[static_cast<std::size_t>(rank_)].split_group =
            new_group(g.world, static_cast<int>(members.size()),
                      fmt::format("split (color {}) of {}", color, g.label));
      }
    }
    arrive(op, 2);
    std::unique_ptr<Communicator> result;
    if (color >= 0) {
      const auto it = std::find_if(members.begin(), members.end(),
                                   [&](const auto& m) { return m.second == rank_; });
      const int new_rank = static_cast<int>(it - members.begin());
      result = std::make_unique<InProcComm>(g.slots[static_cast<std::size_t>(leader)].split_group,
                                            new_rank, CommOptions{limit});
    }
    arrive(op, 3);
    return result;
  }

  const std::shared_ptr<InProcGroup> group_;
  const int rank_;
  std::uint64_t seq_ = 0;  // communication thread only
  CommThread thread_;      // last: joined before the members its ops use go away
};

}  // namespace
}  // namespace comm_detail

InProcWorld::InProcWorld(int size, const CommOptions& options) {
  ZERO_CHECK_AS(CommError, size >= 1, "InProcWorld: size must be at least 1, got {}", size);
  state_ = std::make_shared<comm_detail::InProcWorldState>(size, options);
  state_->world_group = comm_detail::new_group(state_, size, "world");
}

InProcWorld::~InProcWorld() = default;

int InProcWorld::size() const {
  return state_->size;
}

std::unique_ptr<Communicator> InProcWorld::comm(int rank) {
  {
    std::lock_guard lock(state_->mu);
    ZERO_CHECK_AS(CommError, rank >= 0 && rank < state_->size,
                  "InProcWorld: rank {} out of range for {} ranks", rank, state_->size);
    ZERO_CHECK_AS(CommError, !state_->taken[static_cast<std::size_t>(rank)],
                  "InProcWorld: rank {}'s communicator was already taken", rank);
    state_->taken[static_cast<std::size_t>(rank)] = true;
  }
  return std::make_unique<comm_detail::InProcComm>(state_->world_group, rank, state_->options);
}

void InProcWorld::abort(const std::string& reason) {
  state_->abort(reason);
}

void run_ranks(int world_size, const std::function<void(Communicator&)>& fn,
               const CommOptions& options) {
  InProcWorld world(world_size, options);
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      // Declared outside the try so the world is aborted with the real cause before this
      // rank's communicator goes away.
      std::unique_ptr<Communicator> comm;
      try {
        comm = world.comm(r);
        fn(*comm);
      } catch (const std::exception& e) {
        {
          std::lock_guard lock(mu);
          if (!first) first = std::current_exception();
        }
        world.abort(fmt::format("rank {} failed: {}", r, e.what()));
      } catch (...) {
        {
          std::lock_guard lock(mu);
          if (!first) first = std::current_exception();
        }
        world.abort(fmt::format("rank {} failed with a non-standard exception", r));
      }
      comm.reset();
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace zero
