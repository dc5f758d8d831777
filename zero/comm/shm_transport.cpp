#include "zero/comm/shm_transport.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "zero/base/error.h"
#include "zero/base/stream_copy.h"
#include "zero/comm/reduce_math.h"

namespace zero::comm_detail {

namespace {

constexpr std::size_t kAlign = 64;
constexpr std::size_t kPage = 4096;

const char* bytes_at(const void* p, std::size_t offset) {
  return static_cast<const char*>(p) + offset;
}
char* bytes_at(void* p, std::size_t offset) {
  return static_cast<char*>(p) + offset;
}

const ShmCall& call_of(const ShmGroup& g, int q) {
  return g.slot(q).call;
}

// dst[i] = reduction over ranks of their send[first + i], for i < count, in pieces: each piece
// is read from every peer into scratch (or, in a peer's shared host arena, in place), then
// reduced with this rank's own input in rank order. `whole_bytes`: reduce_elements' (the
// output a reduce_scatter writes, to stream it past the cache when large; 0 for a piece the
// caller's peers read back at once).
void cma_reduce(ShmGroup& g, const CollectiveArgs& a, const ShmOp& op, ShmScratch& scratch,
                std::size_t first, std::size_t count, void* dst, std::size_t whole_bytes) {
  const int n = g.size();
  const int me = g.rank();
  const std::size_t esz = dtype_size(a.dtype);
  const std::size_t piece = std::max<std::size_t>(scratch.piece_bytes() / esz, 1);
  std::vector<const void*> srcs(static_cast<std::size_t>(n));
  for (std::size_t done = 0; done < count; done += piece) {
    const std::size_t m = std::min(piece, count - done);
    const std::size_t offset = (first + done) * esz;
    int k = 0;
    for (int q = 0; q < n; ++q) {
      if (q == me) {
        srcs[static_cast<std::size_t>(q)] = bytes_at(a.send, offset);
        continue;
      }
      const std::uint64_t remote = call_of(g, q).send + offset;
      if (const void* direct = g.direct(q, remote, m * esz)) {
        g.count_direct(m * esz);
        srcs[static_cast<std::size_t>(q)] = direct;
        continue;
      }
      char* local = scratch.for_peer(k++, remote);
      g.read_peer(q, remote, local, m * esz, op);
      srcs[static_cast<std::size_t>(q)] = local;
    }
    reduce_elements(bytes_at(dst, done * esz), srcs.data(), n, m, a.dtype, a.op, n, whole_bytes);
  }
}

// Copies `bytes` at `remote` in rank q to `local`: a plain copy out of q's shared host arena
// when the bytes are there, else through the kernel, which copies fast only between
// addresses equally aligned modulo 64; otherwise the bytes go through scratch (aligned like
// the remote) and a user-space copy.
void cma_copy(ShmGroup& g, int q, std::uint64_t remote, void* local, std::size_t bytes,
              const ShmOp& op, ShmScratch& scratch) {
  if (const void* direct = g.direct(q, remote, bytes)) {
    g.count_direct(bytes);
    copy_large(local, direct, bytes);
    return;
  }
  if (((remote ^ reinterpret_cast<std::uint64_t>(local)) & (kAlign - 1)) == 0) {
    g.read_peer(q, remote, local, bytes, op);
    return;
  }
  const std::size_t piece = scratch.piece_bytes();
  for (std::size_t done = 0; done < bytes; done += piece) {
    const std::size_t m = std::min(piece, bytes - done);
    char* tmp = scratch.for_peer(0, remote + done);
    g.read_peer(q, remote + done, tmp, m, op);
    std::memcpy(bytes_at(local, done), tmp, m);
  }
}

}  // namespace

ShmScratch::ShmScratch(int peers, std::size_t piece_bytes)
    : piece_bytes_(piece_bytes),
      stride_((piece_bytes + kAlign + kPage - 1) / kPage * kPage),
      base_(static_cast<char*>(
          std::aligned_alloc(kPage, stride_ * static_cast<std::size_t>(std::max(peers, 1))))) {
  ZERO_CHECK_AS(CommError, base_ != nullptr, "ShmComm: cannot allocate {} bytes of scratch",
                stride_ * static_cast<std::size_t>(std::max(peers, 1)));
}

void ShmScratch::Free::operator()(char* p) const {
  std::free(p);
}

char* ShmScratch::for_peer(int k, std::uint64_t remote) const {
  return base_.get() + static_cast<std::size_t>(k) * stride_ + (remote & (kAlign - 1));
}

std::size_t shm_piece_bytes(const ShmTuning& tuning, int world_size) {
  if (tuning.piece_bytes != 0) return tuning.piece_bytes;
  // Large pieces amortise the kernel's per-call work (locking the peer's page tables, pinning
  // its pages): 64 KiB pieces measured half as fast as 1 MiB ones between two ranks. Every
  // peer's piece still fits in a core's share of L2 and L3, so the reduction reads it from cache.
  const std::size_t peers = static_cast<std::size_t>(std::max(world_size - 1, 1));
  const std::size_t piece = (std::size_t{2} << 20) / peers;
  return std::clamp<std::size_t>(piece / kPage * kPage, std::size_t{256} << 10,
                                 std::size_t{1} << 20);
}

void cma_collective(ShmGroup& g, const CollectiveArgs& a, const ShmOp& op, ShmScratch& scratch) {
  const int n = g.size();
  const int me = g.rank();
  const std::size_t esz = dtype_size(a.dtype);
  const auto mine = static_cast<std::size_t>(me);
  switch (a.kind) {
    case Collective::ReduceScatter: {
      if (a.elems == 0) return;
      const std::size_t first = mine * a.elems;
      void* dst = a.in_place ? bytes_at(a.recv, first * esz) : a.recv;
      cma_reduce(g, a, op, scratch, first, a.elems, dst, a.elems * esz);
      return;
    }
    case Collective::AllGather: {
      const std::size_t bytes = a.elems * esz;
      if (bytes == 0) return;
      for (int q = 0; q < n; ++q) {
        const std::size_t offset = static_cast<std::size_t>(q) * bytes;
        if (q == me) {
          if (!a.in_place) std::memcpy(bytes_at(a.recv, offset), a.send, bytes);
          continue;
        }
        const ShmCall& peer = call_of(g, q);
        const std::uint64_t remote = a.in_place ? peer.recv + offset : peer.send;
        cma_copy(g, q, remote, bytes_at(a.recv, offset), bytes, op, scratch);
      }
      return;
    }
    case Collective::AllReduce: {
      // Pipelined: after each piece of its own chunk a rank publishes how far it has reduced,
      // and copies what its peers have published so far, so a piece is copied while it is still
      // in the shared cache and nobody waits for the slowest rank between the two halves. In
      // place this is safe because a rank publishes a piece only after reading every rank's
      // input for it, which is the only use of the others' buffers there.
      const auto [begin, end] = chunk_bounds(a.elems, n, me);
      const std::size_t piece = std::max<std::size_t>(scratch.piece_bytes() / esz, 1);
      std::vector<std::size_t> copied(static_cast<std::size_t>(n), 0);
      auto copy_available = [&](int q) {
        const auto [qb, qe] = chunk_bounds(a.elems, n, q);
        const std::size_t ready = load_acquire(g.slot(q).reduced);
        std::size_t& have = copied[static_cast<std::size_t>(q)];
        if (ready > have) {
          cma_copy(g, q, call_of(g, q).recv + (qb + have) * esz,
                   bytes_at(a.recv, (qb + have) * esz), (ready - have) * esz, op, scratch);
          have = ready;
        }
        return have == qe - qb;
      };
      for (std::size_t done = begin; done < end; done += piece) {
        const std::size_t m = std::min(piece, end - done);
        cma_reduce(g, a, op, scratch, done, m, bytes_at(a.recv, done * esz), 0);
        store_release(g.slot(me).reduced, static_cast<std::uint64_t>(done + m - begin));
        g.ring();
        for (int q = 0; q < n; ++q) {
          if (q != me) copy_available(q);
        }
      }
      for (int q = 0; q < n; ++q) {
        if (q != me)
          g.wait_for(
              q, [&] { return copy_available(q); }, op, "to reduce its chunk");
      }
      return;
    }
    case Collective::Broadcast:
      if (me != a.root && a.elems > 0) {
        cma_copy(g, a.root, call_of(g, a.root).recv, a.recv, a.elems * esz, op, scratch);
      }
      return;
    case Collective::AllToAll: {
      // Block q of the output is block `me` of rank q's input.
      const std::size_t bytes = a.elems * esz;
      if (bytes == 0) return;
      for (int q = 0; q < n; ++q) {
        void* out = bytes_at(a.recv, static_cast<std::size_t>(q) * bytes);
        if (q == me) {
          std::memcpy(out, bytes_at(a.send, mine * bytes), bytes);
        } else {
          cma_copy(g, q, call_of(g, q).send + mine * bytes, out, bytes, op, scratch);
        }
      }
      return;
    }
    case Collective::Barrier: return;
  }
}

namespace {

// Rounds of the staged transport. In round k every publishing rank copies elements
// [k·W, (k+1)·W) of its exposed buffer (clipped to its length) into its window, all meet at a
// barrier, then each consumes what it needs from everyone's windows.
class Stager {
 public:
  Stager(ShmGroup& g, const ShmOp& op, DType dtype)
      : g_(g),
        op_(op),
        esz_(dtype_size(dtype)),
        window_elems_(g.segment().header().window_bytes / esz_) {}

  // consume(begin, len, window_of) with window_of(q) rank q's window for this round, which holds
  // its elements [begin, begin + len) (as far as its length reaches).
  template <typename Consume>
  void stream(std::size_t max_len, const void* mine, std::size_t my_len, bool publish,
              Consume&& consume) {
    for (std::size_t begin = 0; begin < max_len; begin += window_elems_) {
      const int parity = static_cast<int>(round_++ % 2);
      if (publish && begin < my_len) {
        std::memcpy(g_.segment().staging(g_.rank(), parity), bytes_at(mine, begin * esz_),
                    std::min(window_elems_, my_len - begin) * esz_);
      }
      g_.arrive(op_, /*first=*/false);
      const ShmSegment& seg = g_.segment();
      consume(begin, std::min(window_elems_, max_len - begin),
              [&](int q) -> const char* { return seg.staging(q, parity); });
    }
  }

 private:
  ShmGroup& g_;
  const ShmOp& op_;
  const std::size_t esz_;
  const std::size_t window_elems_;
  std::uint64_t round_ = 0;  // continues across streams, so consecutive rounds alternate
};

}  // namespace

void staged_collective(ShmGroup& g, const CollectiveArgs& a, const ShmOp& op) {
  const int n = g.size();
  const int me = g.rank();
  const std::size_t esz = dtype_size(a.dtype);
  const auto mine = static_cast<std::size_t>(me);
  Stager stager(g, op, a.dtype);
  std::vector<const void*> srcs(static_cast<std::size_t>(n));
  // Reduces the part of [begin, begin + len) inside [lo, hi) from every window into
  // out(element index).
  auto reduce_window = [&](std::size_t begin, std::size_t len, auto window_of, std::size_t lo,
                           std::size_t hi, auto out, std::size_t whole_bytes) {
    const std::size_t from = std::max(begin, lo);
    const std::size_t to = std::min(begin + len, hi);
    if (from >= to) return;
    for (int q = 0; q < n; ++q) {
      srcs[static_cast<std::size_t>(q)] = window_of(q) + (from - begin) * esz;
    }
    reduce_elements(out(from), srcs.data(), n, to - from, a.dtype, a.op, n, whole_bytes);
  };

  switch (a.kind) {
    case Collective::ReduceScatter: {
      const std::size_t total = static_cast<std::size_t>(n) * a.elems;
      const std::size_t lo = mine * a.elems;
      stager.stream(total, a.send, total, true, [&](std::size_t begin, std::size_t len, auto w) {
        reduce_window(begin, len, w, lo, lo + a.elems, [&](std::size_t i) {
          return a.in_place ? bytes_at(a.recv, i * esz) : bytes_at(a.recv, (i - lo) * esz);
        }, a.elems * esz);
      });
      return;
    }
    case Collective::AllGather: {
      const void* exposed = a.in_place ? bytes_at(a.recv, mine * a.elems * esz) : a.send;
      stager.stream(
          a.elems, exposed, a.elems, true, [&](std::size_t begin, std::size_t len, auto w) {
            for (int q = 0; q < n; ++q) {
              if (q == me && a.in_place) continue;
              std::memcpy(bytes_at(a.recv, (static_cast<std::size_t>(q) * a.elems + begin) * esz),
                          w(q), len * esz);
            }
          });
      return;
    }
    case Collective::AllReduce: {
      const auto [lo, hi] = chunk_bounds(a.elems, n, me);
      stager.stream(a.elems, a.send, a.elems, true,
                    [&](std::size_t begin, std::size_t len, auto w) {
                      // Cached: the second stream below reads the chunk straight back.
                      reduce_window(
                          begin, len, w, lo, hi,
                          [&](std::size_t i) { return bytes_at(a.recv, i * esz); }, 0);
                    });
      const auto [b0, e0] = chunk_bounds(a.elems, n, 0);  // the longest chunk
      stager.stream(e0 - b0, bytes_at(a.recv, lo * esz), hi - lo, true,
                    [&](std::size_t begin, std::size_t len, auto w) {
                      for (int q = 0; q < n; ++q) {
                        const auto [qb, qe] = chunk_bounds(a.elems, n, q);
                        if (q == me || begin >= qe - qb) continue;
                        std::memcpy(bytes_at(a.recv, (qb + begin) * esz), w(q),
                                    std::min(len, qe - qb - begin) * esz);
                      }
                    });
      return;
    }
    case Collective::Broadcast:
      stager.stream(a.elems, a.recv, a.elems, me == a.root,
                    [&](std::size_t begin, std::size_t len, auto w) {
                      if (me != a.root) {
                        std::memcpy(bytes_at(a.recv, begin * esz), w(a.root), len * esz);
                      }
                    });
      return;
    case Collective::AllToAll: {
      // Every rank streams its whole input; each keeps block `me` of every peer's.
      const std::size_t total = static_cast<std::size_t>(n) * a.elems;
      const std::size_t lo = mine * a.elems, hi = lo + a.elems;
      stager.stream(total, a.send, total, true, [&](std::size_t begin, std::size_t len, auto w) {
        const std::size_t from = std::max(begin, lo), to = std::min(begin + len, hi);
        if (from >= to) return;
        for (int q = 0; q < n; ++q) {
          std::memcpy(bytes_at(a.recv, (static_cast<std::size_t>(q) * a.elems + from - lo) * esz),
                      w(q) + (from - begin) * esz, (to - from) * esz);
        }
      });
      return;
    }
    case Collective::Barrier: return;
  }
}

}  // namespace zero::comm_detail
