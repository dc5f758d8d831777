#include "zero/comm/shm_comm.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

#include "zero/base/error.h"
#include "zero/comm/comm_thread.h"
#include "zero/comm/shm_group.h"
#include "zero/comm/shm_transport.h"
#include "zero/device/shared_host_arena.h"

namespace zero {
namespace comm_detail {
namespace {

ShmCall to_call(const CollectiveArgs& a) {
  ShmCall c;
  c.kind = static_cast<std::uint32_t>(a.kind);
  c.dtype = static_cast<std::uint32_t>(a.dtype);
  c.op = static_cast<std::uint32_t>(a.op);
  c.root = a.root;
  c.in_place = a.in_place ? 1 : 0;
  c.elems = a.elems;
  c.send = reinterpret_cast<std::uint64_t>(a.send);
  c.recv = reinterpret_cast<std::uint64_t>(a.recv);
  return c;
}

CollectiveArgs to_args(const ShmCall& c) {
  CollectiveArgs a;
  a.kind = static_cast<Collective>(c.kind);
  a.dtype = static_cast<DType>(c.dtype);
  a.op = static_cast<ReduceOp>(c.op);
  a.root = c.root;
  a.in_place = c.in_place != 0;
  a.elems = c.elems;
  return a;
}

bool same_call(const ShmCall& x, const ShmCall& y) {
  if (x.is_split != y.is_split) return false;
  if (x.is_split) return true;
  if (x.kind != y.kind || x.elems != y.elems || x.dtype != y.dtype) return false;
  const auto kind = static_cast<Collective>(x.kind);
  const bool reduces = kind == Collective::ReduceScatter || kind == Collective::AllReduce;
  if (reduces && x.op != y.op) return false;
  if (kind == Collective::Broadcast && x.root != y.root) return false;
  return true;
}

class ShmComm final : public Communicator {
 public:
  ShmComm(std::shared_ptr<ShmGroup> group, const CommOptions& options)
      : Communicator(options),
        group_(std::move(group)),
        scratch_(group_->size() - 1, shm_piece_bytes(group_->tuning(), group_->size())) {}

  ~ShmComm() override {
    const std::size_t outstanding = thread_.outstanding();
    if (outstanding > 0) {
      group_->abort(fmt::format("{} destroyed its communicator with {} collectives outstanding",
                                group_->rank_name(group_->rank()), outstanding));
    }
  }

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  std::string backend_name() const override { return "shm"; }
  ShmTransport transport() const {
    return group_->cross_memory_attach() ? ShmTransport::CrossMemoryAttach : ShmTransport::Segment;
  }
  ShmReadStats read_stats() const { return group_->read_stats(); }
  void* peer_memory(int q, const void* remote, std::size_t bytes) const override {
    if (q == rank()) return const_cast<void*>(remote);
    if (q < 0 || q >= size()) return nullptr;
    return group_->writable(q, reinterpret_cast<std::uint64_t>(remote), bytes);
  }
  const void* peer_readable(int q, const void* remote, std::size_t bytes) const override {
    if (q == rank()) return remote;
    if (q < 0 || q >= size()) return nullptr;
    return group_->direct(q, reinterpret_cast<std::uint64_t>(remote), bytes);
  }

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
  ShmOp begin_op(std::string what, std::chrono::milliseconds limit) {
    return {std::move(what), ++seq_, std::chrono::steady_clock::now() + limit, limit};
  }

  // Publishes this rank's call and meets the others at the op's first barrier.
  void post(const ShmOp& op, const ShmCall& call) {
    ShmRankSlot& mine = group_->slot(group_->rank());
    mine.call = call;
    store_release(mine.reduced, std::uint64_t{0});
    store_release(mine.seq, op.seq);
    group_->arrive(op, /*first=*/true);
  }

  // After the first barrier: every rank must have called the same collective.
  void check_same_call(const ShmOp& op) {
    ShmGroup& g = *group_;
    const ShmCall& mine = g.slot(g.rank()).call;
    bool all_same = true;
    for (int q = 0; q < g.size(); ++q) all_same = all_same && same_call(g.slot(q).call, mine);
    if (all_same) return;
    std::vector<std::string> calls;
    for (int q = 0; q < g.size(); ++q) {
      const ShmCall& c = g.slot(q).call;
      calls.push_back(
          fmt::format("rank {}: {}", q, c.is_split ? "split" : describe(to_args(c), g.size())));
    }
    g.fail(op, fmt::format("ranks issued different collectives as collective #{}: {}", op.seq,
                           fmt::join(calls, "; ")));
  }

  void run_collective(const CollectiveArgs& a, std::chrono::milliseconds limit) {
    ShmGroup& g = *group_;
    const ShmOp op = begin_op(describe(a, g.size()), limit);
    post(op, to_call(a));
    check_same_call(op);
    if (g.cross_memory_attach()) {
      cma_collective(g, a, op, scratch_);
    } else {
      staged_collective(g, a, op);
    }
    g.arrive(op, /*first=*/false);  // nobody leaves (reuses buffers or slot) while a peer reads
  }

  std::unique_ptr<Communicator> run_split(int color, int key, std::chrono::milliseconds limit) {
    ShmGroup& g = *group_;
    const ShmOp op = begin_op(fmt::format("split (color {}, key {})", color, key), limit);
    ShmCall call;
    call.is_split = 1;
    call.color = color;
    call.key = key;
    post(op, call);
    check_same_call(op);

    std::vector<std::pair<int, int>> members;  // (key, old rank), in new-rank order once sorted
    for (int q = 0; q < g.size() && color >= 0; ++q) {
      const ShmCall& c = g.slot(q).call;
      if (c.color == color) members.emplace_back(c.key, q);
    }
    std::sort(members.begin(), members.end());
    std::vector<ProcessId> expected;
    int new_rank = -1;
    for (const auto& [member_key, old_rank] : members) {
      if (old_rank == g.rank()) new_rank = static_cast<int>(expected.size());
      expected.push_back(g.process(old_rank));
    }
    g.arrive(op, /*first=*/false);  // every rank has read the slots
    if (color < 0) return nullptr;

    ShmJoinArgs join;
    // From this group's random nonce: unique per run, and short whatever the parent's name.
    join.name = fmt::format("zero-shm-{:016x}-{}-{}", g.nonce(), op.seq, color);
    join.rank = new_rank;
    join.world_size = static_cast<int>(members.size());
    join.timeout = limit;
    join.tuning = g.tuning();
    join.label = fmt::format("split (color {}) of {}", color, g.label());
    join.expected = std::move(expected);
    return std::make_unique<ShmComm>(ShmGroup::join(join), CommOptions{limit});
  }

  const std::shared_ptr<ShmGroup> group_;
  ShmScratch scratch_;     // communication thread only
  std::uint64_t seq_ = 0;  // communication thread only
  CommThread thread_;      // last: joined before the members its ops use go away
};

}  // namespace
}  // namespace comm_detail

std::unique_ptr<Communicator> make_shm_communicator(const std::string& name, int rank,
                                                    int world_size, const CommOptions& options,
                                                    const ShmTuning& tuning) {
  const std::string problem = comm_detail::ShmSegment::name_problem(name);
  ZERO_CHECK_AS(CommError, problem.empty(), "make_shm_communicator: bad segment name \"{}\": {}",
                name, problem);
  ZERO_CHECK_AS(CommError, world_size >= 1,
                "make_shm_communicator: world size must be at least 1, got {}", world_size);
  ZERO_CHECK_AS(CommError, rank >= 0 && rank < world_size,
                "make_shm_communicator: rank {} out of range for {} ranks", rank, world_size);
  ZERO_CHECK_AS(CommError, tuning.window_bytes >= 4096 && tuning.window_bytes % 8 == 0,
                "make_shm_communicator: window_bytes {} must be at least 4096 and a multiple of 8",
                tuning.window_bytes);
  ZERO_CHECK_AS(CommError, tuning.piece_bytes % 8 == 0,
                "make_shm_communicator: piece_bytes {} must be a multiple of 8",
                tuning.piece_bytes);
  // Buffers the engine allocates from now on come from the shared host arena, which the peers
  // map at bootstrap and read without a kernel copy (ZERO_SHM_ARENA=0: not, to compare).
  const char* arena = std::getenv("ZERO_SHM_ARENA");
  if (arena == nullptr || std::string_view(arena) != "0") (void)SharedHostArena::enable();
  comm_detail::ShmJoinArgs join;
  join.name = name;
  join.rank = rank;
  join.world_size = world_size;
  join.timeout = options.timeout;
  join.tuning = tuning;
  return std::make_unique<comm_detail::ShmComm>(comm_detail::ShmGroup::join(join), options);
}

std::optional<ShmTransport> shm_transport(const Communicator& comm) {
  if (const auto* shm = dynamic_cast<const comm_detail::ShmComm*>(&comm)) return shm->transport();
  return std::nullopt;
}

std::optional<ShmReadStats> shm_read_stats(const Communicator& comm) {
  if (const auto* shm = dynamic_cast<const comm_detail::ShmComm*>(&comm)) return shm->read_stats();
  return std::nullopt;
}

std::string_view shm_transport_name(ShmTransport transport) {
  switch (transport) {
    case ShmTransport::Auto: return "auto";
    case ShmTransport::CrossMemoryAttach: return "cma";
    case ShmTransport::Segment: return "segment";
  }
  return "?";
}

}  // namespace zero
