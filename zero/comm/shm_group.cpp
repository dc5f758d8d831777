#include "zero/comm/shm_group.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <thread>
#include <utility>

#include "zero/base/error.h"
#include "zero/base/log.h"
#include "zero/device/shared_host_arena.h"

namespace zero::comm_detail {

namespace {

using Clock = std::chrono::steady_clock;

// How long a waiter spins before it sleeps on the futex, and how long one sleep lasts at most
// (the period at which it looks for exited peers).
constexpr auto kSpin = std::chrono::microseconds(20);
constexpr auto kSleepSlice = std::chrono::milliseconds(20);

std::atomic_ref<std::uint32_t> atomic32(std::uint32_t& x) {
  return std::atomic_ref<std::uint32_t>(x);
}
std::atomic_ref<std::uint64_t> atomic64(std::uint64_t& x) {
  return std::atomic_ref<std::uint64_t>(x);
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// With Yama's ptrace_scope 1 only a process's ancestors may read its memory, which excludes
// sibling ranks; declaring any process an allowed tracer lifts that for this process. Scope 0
// needs nothing, and scopes 2 and 3 cannot be lifted this way (the probe then fails).
void allow_peer_reads() {
  const int fd = ::open("/proc/sys/kernel/yama/ptrace_scope", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char c = 0;
  const ssize_t n = ::read(fd, &c, 1);
  ::close(fd);
  if (n == 1 && c == '1') ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

ShmTuning resolve_tuning(ShmTuning t) {
  if (t.transport != ShmTransport::Auto) return t;
  if (const char* env = std::getenv("ZERO_SHM_TRANSPORT")) {
    const std::string v = env;
    if (v == "cma") {
      t.transport = ShmTransport::CrossMemoryAttach;
    } else if (v == "segment") {
      t.transport = ShmTransport::Segment;
    } else {
      ZERO_CHECK_AS(CommError, v.empty() || v == "auto",
                    "ZERO_SHM_TRANSPORT={}: expected cma, segment or auto", v);
    }
  }
  return t;
}

}  // namespace

void* map_staggered(int fd, std::size_t bytes, std::uint64_t own_base, std::uint64_t index,
                    bool writable) {
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  if (own_base == 0) {
    return ::mmap(nullptr, bytes, prot, MAP_SHARED | MAP_NORESERVE, fd, 0);
  }
  // Reserve a period more than needed, place the view in it, give back the rest.
  const std::size_t span = bytes + kStaggerPeriod;
  void* reserved =
      ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) return MAP_FAILED;
  const auto lo = reinterpret_cast<std::uint64_t>(reserved);
  const std::uint64_t want = (own_base + index * kStagger) % kStaggerPeriod;
  const std::uint64_t at = lo + (want - lo % kStaggerPeriod + kStaggerPeriod) % kStaggerPeriod;
  void* view = ::mmap(reinterpret_cast<void*>(at), bytes, prot,
                      MAP_SHARED | MAP_NORESERVE | MAP_FIXED, fd, 0);
  if (view == MAP_FAILED) {
    const int err = errno;
    ::munmap(reserved, span);
    errno = err;
    return MAP_FAILED;
  }
  if (at > lo) ::munmap(reserved, at - lo);
  if (lo + span > at + bytes) ::munmap(reinterpret_cast<void*>(at + bytes), lo + span - at - bytes);
  return view;
}

ShmGroup::ShmGroup(ShmSegment segment, const ShmJoinArgs& args)
    : segment_(std::move(segment)),
      rank_(args.rank),
      size_(args.world_size),
      label_(args.label),
      tuning_(args.tuning),
      expected_(args.expected),
      watches_(static_cast<std::size_t>(args.world_size)) {}

ShmGroup::~ShmGroup() {
  store_release(slot(rank_).state, static_cast<std::uint32_t>(kRankClosed));
  ring();
  for (const PeerArena& a : arenas_) {
    if (a.local != nullptr) ::munmap(const_cast<std::byte*>(a.local), a.bytes);
  }
}

std::shared_ptr<ShmGroup> ShmGroup::join(const ShmJoinArgs& in) {
  ShmJoinArgs args = in;
  args.tuning = resolve_tuning(in.tuning);
  const auto start = Clock::now();
  const auto deadline = start + args.timeout;
  std::optional<ProcessId> creator;
  if (!args.expected.empty()) creator = args.expected[0];
  if (args.rank == 0) ShmSegment::remove_stale();
  ShmSegment segment =
      args.rank == 0 ? ShmSegment::create(args.name, args.world_size, args.tuning.window_bytes)
                     : ShmSegment::attach(args.name, args.rank, args.world_size, deadline,
                                          args.timeout, creator);
  std::shared_ptr<ShmGroup> g(new ShmGroup(std::move(segment), args));
  ShmRankSlot& mine = g->slot(g->rank_);
  allow_peer_reads();
  g->probe_word_ = g->nonce() ^ (0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(args.rank + 1));
  mine.process = current_process();
  mine.probe_address = reinterpret_cast<std::uint64_t>(&g->probe_word_);
  mine.probe_value = g->probe_word_;
  mine.arena_fd = -1;
  if (const SharedHostArena* arena = SharedHostArena::get()) {
    mine.arena_fd = arena->fd();
    mine.arena_base = arena->base();
    mine.arena_bytes = arena->reserve_bytes();
  }
  store_release(mine.state, static_cast<std::uint32_t>(kRankAttached));

  const ShmOp op{fmt::format("bootstrap of segment {}", ShmSegment::path_of(args.name)), 0,
                 deadline, args.timeout};
  try {
    g->arrive(op, /*first=*/true);
  } catch (...) {
    // Nobody may find a segment whose bootstrap failed; the mappings that exist stay valid.
    g->segment_.unlink_name();
    throw;
  }
  g->segment_.unlink_name();
  g->probe_cross_memory_attach(op);
  if (g->cma_) g->map_peer_arenas();
  return g;
}

// Needs what cross-memory attach needs (PTRACE_MODE_READ on the peer, for /proc/<pid>/fd); a
// peer whose arena cannot be mapped is read through the kernel, as without one.
void ShmGroup::map_peer_arenas() {
  arenas_.assign(static_cast<std::size_t>(size_), PeerArena{});
  const SharedHostArena* own = SharedHostArena::get();
  const std::uint64_t own_base = own != nullptr ? own->base() : 0;
  std::uint64_t staggered = 0;
  for (int q = 0; q < size_; ++q) {
    const ShmRankSlot& peer = slot(q);
    if (q == rank_ || peer.arena_fd < 0 || peer.arena_bytes == 0) continue;
    const std::string path = fmt::format("/proc/{}/fd/{}", peer.process.pid, peer.arena_fd);
    // Writable where the peer's memfd opens for writing (peer_memory()), else read-only.
    bool writable = true;
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      writable = false;
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    }
    void* local = MAP_FAILED;
    if (fd >= 0) {
      local = map_staggered(fd, peer.arena_bytes, own_base, ++staggered, writable);
      ::close(fd);
    }
    if (local == MAP_FAILED) {
      log::note("ShmComm: cannot map {}'s shared host arena ({}: {}); its buffers are read "
                "through the kernel",
                rank_name(q), path, std::strerror(errno));
      continue;
    }
    arenas_[static_cast<std::size_t>(q)] = {peer.arena_base, peer.arena_bytes,
                                            static_cast<std::byte*>(local), writable};
  }
}

void* ShmGroup::writable(int q, std::uint64_t remote, std::size_t bytes) const {
  if (direct(q, remote, bytes) == nullptr || !arenas_[static_cast<std::size_t>(q)].writable) {
    return nullptr;
  }
  const PeerArena& a = arenas_[static_cast<std::size_t>(q)];
  return a.local + (remote - a.remote_base);
}

const void* ShmGroup::direct(int q, std::uint64_t remote, std::size_t bytes) const {
  if (arenas_.empty()) return nullptr;
  const PeerArena& a = arenas_[static_cast<std::size_t>(q)];
  if (a.local == nullptr || remote < a.remote_base || remote - a.remote_base > a.bytes ||
      bytes > a.bytes - (remote - a.remote_base)) {
    return nullptr;
  }
  return a.local + (remote - a.remote_base);
}

void ShmGroup::probe_cross_memory_attach(const ShmOp& op) {
  ShmRankSlot& mine = slot(rank_);
  std::vector<std::string> problems;
  if (tuning_.transport == ShmTransport::Segment) {
    problems.push_back("the segment transport was asked for");
  } else {
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const ShmRankSlot& peer = slot(q);
      std::uint64_t word = 0;
      iovec local{&word, sizeof(word)};
      iovec remote{reinterpret_cast<void*>(peer.probe_address), sizeof(word)};
      if (!same_pid_namespace(peer.process)) {
        problems.push_back(fmt::format("{} is in another pid namespace", rank_name(q)));
      } else if (::process_vm_readv(peer.process.pid, &local, 1, &remote, 1, 0) !=
                 static_cast<ssize_t>(sizeof(word))) {
        problems.push_back(
            fmt::format("reading {} failed: {}", rank_name(q), std::strerror(errno)));
      } else if (word != peer.probe_value) {
        problems.push_back(fmt::format("reading {} gave the wrong bytes", rank_name(q)));
      }
    }
  }
  store_release(mine.cma, problems.empty() ? 1u : 2u);
  arrive(op, /*first=*/false);
  cma_ = true;
  std::vector<int> unable;
  for (int q = 0; q < size_; ++q) {
    if (load_acquire(slot(q).cma) != 1) {
      cma_ = false;
      unable.push_back(q);
    }
  }
  if (!cma_ && tuning_.transport == ShmTransport::CrossMemoryAttach) {
    const std::string mine_why =
        problems.empty() ? "" : fmt::format(" (this rank: {})", fmt::join(problems, "; "));
    fail(op, fmt::format("cross-memory attach was asked for, but ranks [{}] cannot read every "
                         "peer{}",
                         fmt::join(unable, ", "), mine_why));
  }
}

std::string ShmGroup::rank_name(int q) const {
  const std::int32_t pid = load_acquire(slot(q).process.pid);
  if (pid == 0 && static_cast<std::size_t>(q) < expected_.size()) {
    return fmt::format("rank {} (pid {})", q, expected_[static_cast<std::size_t>(q)].pid);
  }
  return pid == 0 ? fmt::format("rank {}", q) : fmt::format("rank {} (pid {})", q, pid);
}

std::string ShmGroup::prefix() const {
  return fmt::format("ShmComm rank {} of {} ({} ranks, segment {})", rank_, label_, size_,
                     ShmSegment::path_of(segment_.name()));
}

bool ShmGroup::aborted() const {
  return load_acquire(segment_.header().abort_state) != 0;
}

std::string ShmGroup::abort_reason() const {
  const ShmHeader& h = segment_.header();
  while (load_acquire(h.abort_state) == 1) std::this_thread::yield();
  return std::string(h.abort_reason, strnlen(h.abort_reason, kShmAbortReasonBytes));
}

void ShmGroup::abort(const std::string& reason) noexcept {
  ShmHeader& h = segment_.header();
  std::uint32_t expected = 0;
  if (atomic32(h.abort_state).compare_exchange_strong(expected, 1)) {
    const std::size_t n = std::min(reason.size(), kShmAbortReasonBytes - 1);
    std::memcpy(h.abort_reason, reason.data(), n);
    h.abort_reason[n] = '\0';
    store_release(h.abort_state, 2u);
  }
  ring();
}

void ShmGroup::fail(const ShmOp& op, const std::string& reason) {
  abort(reason);
  // The first reason stands: a rank that saw a peer exit aborts the group before it exits
  // itself, so whoever then sees that rank gone names the peer that caused it.
  throw CommError(fmt::format("{}: {} (collective #{}) failed: {}", prefix(), op.what, op.seq,
                              abort_reason()));
}

void ShmGroup::ring() const {
  ShmHeader& h = segment_.header();
  atomic32(h.bell).fetch_add(1, std::memory_order_seq_cst);
  if (atomic32(h.sleepers).load(std::memory_order_seq_cst) > 0) {
    ::syscall(SYS_futex, &h.bell, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
}

void ShmGroup::sleep_on_bell(std::uint32_t seen, std::chrono::nanoseconds limit) const {
  ShmHeader& h = segment_.header();
  const auto ns = std::max<std::int64_t>(limit.count(), 0);
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  // Shared (not FUTEX_PRIVATE): the word is in a mapping of several processes.
  ::syscall(SYS_futex, &h.bell, FUTEX_WAIT, seen, &ts, nullptr, 0);
}

std::optional<std::string> ShmGroup::gone(int q) {
  const ShmRankSlot& s = slot(q);
  const std::uint32_t state = load_acquire(s.state);
  if (state == kRankClosed) return fmt::format("{} destroyed its communicator", rank_name(q));
  ProcessWatch& watch = watches_[static_cast<std::size_t>(q)];
  if (!watch.watching()) {
    if (state == kRankAttached) {
      watch = ProcessWatch(s.process);
    } else if (static_cast<std::size_t>(q) < expected_.size()) {
      watch = ProcessWatch(expected_[static_cast<std::size_t>(q)]);
    } else {
      return std::nullopt;  // not attached yet, and nobody said who will
    }
  }
  if (watch.exited()) return fmt::format("{} exited", rank_name(q));
  return std::nullopt;
}

void ShmGroup::arrive(const ShmOp& op, bool first) {
  const std::uint64_t step = ++step_;
  if (aborted()) fail(op, abort_reason());
  ShmHeader& h = segment_.header();
  atomic64(slot(rank_).step).store(step, std::memory_order_seq_cst);
  ring();

  auto everyone = [&] {
    for (int q = 0; q < size_; ++q) {
      if (atomic64(slot(q).step).load(std::memory_order_acquire) < step) return false;
    }
    return true;
  };
  const auto spin_until = Clock::now() + kSpin;
  do {
    for (int i = 0; i < 64; ++i) {
      if (everyone()) return;
      cpu_relax();
    }
  } while (Clock::now() < spin_until);

  for (;;) {
    atomic32(h.sleepers).fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t bell = atomic32(h.bell).load(std::memory_order_seq_cst);
    const bool done = everyone();
    const auto now = Clock::now();
    if (!done && !aborted() && now < op.deadline) {
      sleep_on_bell(bell, std::min<Clock::duration>(kSleepSlice, op.deadline - now));
    }
    atomic32(h.sleepers).fetch_sub(1, std::memory_order_seq_cst);
    if (done || everyone()) return;
    if (aborted()) fail(op, abort_reason());
    for (int q = 0; q < size_; ++q) {
      if (atomic64(slot(q).step).load(std::memory_order_acquire) >= step) continue;
      if (auto why = gone(q)) fail(op, *why);
    }
    if (Clock::now() >= op.deadline) break;
  }

  std::vector<int> arrived;
  std::vector<std::string> missing;
  for (int q = 0; q < size_; ++q) {
    const ShmRankSlot& s = slot(q);
    if (load_acquire(s.step) >= step) {
      arrived.push_back(q);
    } else if (load_acquire(s.state) < kRankAttached) {
      missing.push_back(fmt::format("{} (not attached)", q));
    } else {
      missing.push_back(fmt::format("{} (pid {}, last reached collective #{})", q,
                                    load_acquire(s.process.pid), load_acquire(s.seq)));
    }
  }
  const std::string message = fmt::format(
      "{}: {} (collective #{}) timed out after {} ms {}: arrived ranks [{}]; missing ranks [{}]",
      prefix(), op.what, op.seq, op.timeout.count(),
      first ? "waiting for every rank to arrive" : "waiting for every rank to finish",
      fmt::join(arrived, ", "), fmt::join(missing, ", "));
  abort(message);
  throw CommError(message);
}

void ShmGroup::wait_for_impl(int q, const std::function<bool()>& ready, const ShmOp& op,
                             const char* waiting_for) {
  ShmHeader& h = segment_.header();
  const auto spin_until = Clock::now() + kSpin;
  do {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return;
      cpu_relax();
    }
  } while (Clock::now() < spin_until);
  for (;;) {
    atomic32(h.sleepers).fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t bell = atomic32(h.bell).load(std::memory_order_seq_cst);
    const bool done = ready();
    const auto now = Clock::now();
    if (!done && !aborted() && now < op.deadline) {
      sleep_on_bell(bell, std::min<Clock::duration>(kSleepSlice, op.deadline - now));
    }
    atomic32(h.sleepers).fetch_sub(1, std::memory_order_seq_cst);
    if (done || ready()) return;
    if (aborted()) fail(op, abort_reason());
    if (auto why = gone(q)) fail(op, *why);
    if (Clock::now() >= op.deadline) break;
  }
  fail(op, fmt::format("timed out after {} ms waiting for {} {}", op.timeout.count(), rank_name(q),
                       waiting_for));
}

void ShmGroup::read_peer(int q, std::uint64_t remote, void* local, std::size_t bytes,
                         const ShmOp& op) {
  const pid_t pid = slot(q).process.pid;
  auto* dst = static_cast<char*>(local);
  stats_.kernel_bytes += bytes;
  while (bytes > 0) {
    iovec l{dst, bytes};
    iovec r{reinterpret_cast<void*>(remote), bytes};
    const ssize_t n = ::process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n > 0) {
      dst += n;
      remote += static_cast<std::uint64_t>(n);
      bytes -= static_cast<std::size_t>(n);
      continue;
    }
    const int err = n < 0 ? errno : EFAULT;
    if (err == EINTR) continue;
    if (err == ESRCH || process_exited(slot(q).process)) {
      fail(op, fmt::format("{} exited", rank_name(q)));
    }
    fail(op, fmt::format("reading {} bytes at {:#x} of {}'s memory failed: {} (was a buffer "
                         "freed before the collective completed?)",
                         bytes, remote, rank_name(q), std::strerror(err)));
  }
}

}  // namespace zero::comm_detail
