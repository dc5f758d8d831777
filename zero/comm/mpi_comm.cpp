#include "zero/comm/mpi_comm.h"

#include <fmt/format.h>
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "zero/base/error.h"
#include "zero/comm/reduce_math.h"

namespace zero {
namespace comm_detail {

// Receive buffers for the other ranks' contributions, kept between collectives so that a step's
// reductions reuse them instead of allocating (and first-touching) fresh ones every time.
class BufferPool {
 public:
  // A buffer of at least `bytes` bytes (contents undefined): the largest spare one, grown.
  std::vector<std::byte> take(std::size_t bytes) {
    std::vector<std::byte> out;
    std::size_t best = spare_.size();
    for (std::size_t i = 0; i < spare_.size(); ++i) {
      if (best == spare_.size() || spare_[i].size() > spare_[best].size()) best = i;
    }
    if (best != spare_.size()) {
      out = std::move(spare_[best]);
      spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(best));
    }
    if (out.size() < bytes) out.resize(bytes);
    return out;
  }
  void give(std::vector<std::byte>&& buffer) {
    if (!buffer.empty()) spare_.push_back(std::move(buffer));
  }

 private:
  std::vector<std::vector<std::byte>> spare_;
};

struct MpiState {
  MPI_Comm comm = MPI_COMM_NULL;  // MPI's own collectives (all_gather, broadcast, barrier)
  MPI_Comm p2p = MPI_COMM_NULL;   // the point-to-point messages of reductions, matched in order
  int rank = 0;
  int size = 1;
  std::string broken;  // why the communicator is unusable, empty while it is fine
  BufferPool pool;     // used only by the thread that issues and waits (one at a time)
  // Counts the collectives issued, the same on every rank (they issue the same ones in the same
  // order): each message round gets its own tag, so a round posted late (an all_reduce's second)
  // never matches a message of a collective issued after it.
  std::uint64_t issued = 0;

  ~MpiState() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (p2p != MPI_COMM_NULL) MPI_Comm_free(&p2p);
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

namespace {

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
  return std::string(text, static_cast<std::size_t>(len));
}

void check_mpi(int rc, const MpiState& s, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  throw CommError(fmt::format("MpiComm rank {} of {}: {} failed: {}", s.rank, s.size, what,
                              mpi_error_string(rc)));
}

void ensure_mpi_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  // Several communicators may be driven from different threads at once (a HierarchicalComm's
  // levels on its communication thread while the rank's thread uses the world): MPI must allow
  // calls from several threads. Each MpiComm itself is still used by one thread at a time.
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    throw CommError("MpiComm: MPI_Init_thread failed");
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    throw CommError(
        "MpiComm: this MPI library does not support MPI_THREAD_MULTIPLE, which zero needs (its "
        "communicators run collectives from more than one thread); use an MPI built with thread "
        "support (Open MPI and MPICH are, by default)");
  }
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
}

// The element type as MPI moves it: 16-bit floats travel as bits (no MPI arithmetic touches them).
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

// One round of messages of a collective: the requests it posted, then what runs once they are
// all complete (the reduction of what arrived, or nothing).
struct Round {
  std::function<int(std::vector<MPI_Request>&)> post;  // returns an MPI error code
  std::function<void()> finish;
};

class MpiWork final : public WorkState {
 public:
  MpiWork(std::shared_ptr<MpiState> state, std::string what, std::chrono::milliseconds timeout)
      : state_(std::move(state)), what_(std::move(what)), timeout_(timeout) {}
  ~MpiWork() override { state_->pool.give(std::move(scratch)); }

  std::vector<std::byte> scratch;  // the other ranks' contributions, from the pool
  std::vector<Round> rounds;       // run in order; the next is posted when one completes

  // Posts the first round. Throws CommError if MPI refuses it.
  void start() { post_current(); }

  void wait() override {
    if (done_) return rethrow_if_failed();
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (int polls = 0;; ++polls) {
      if (poll()) return;
      if (std::chrono::steady_clock::now() > deadline) {
        fail(fmt::format(
            "MpiComm rank {} of {}: {} did not complete within {} ms; MPI does not report which "
            "ranks have arrived (a rank may not have called it, or called a different "
            "collective)",
            state_->rank, state_->size, what_, timeout_.count()));
      }
      // Spin briefly for small ops, then give the cores to the ranks we are waiting for.
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  bool test() override {
    if (done_) {
      rethrow_if_failed();
      return true;
    }
    return poll();
  }

 private:
  void rethrow_if_failed() const {
    if (!error_.empty()) throw CommError(error_);
  }

  [[noreturn]] void fail(std::string message) {
    error_ = std::move(message);
    state_->broken = error_;
    done_ = true;
    throw CommError(error_);
  }

  void post_current() {
    requests_.clear();
    const int rc = rounds[current_].post(requests_);
    if (rc != MPI_SUCCESS) {
      fail(fmt::format("MpiComm rank {} of {}: {} failed: {}", state_->rank, state_->size, what_,
                       mpi_error_string(rc)));
    }
  }

  // Advances through the rounds as far as MPI has delivered; true once the last has finished.
  bool poll() {
    while (true) {
      int flag = 0;
      const int rc = MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                                 MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) {
        fail(fmt::format("MpiComm rank {} of {}: {} failed: {}", state_->rank, state_->size,
                         what_, mpi_error_string(rc)));
      }
      if (!flag) return false;
      if (rounds[current_].finish) rounds[current_].finish();
      if (++current_ == rounds.size()) {
        done_ = true;
        return true;
      }
      post_current();
    }
  }

  std::shared_ptr<MpiState> state_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  std::vector<MPI_Request> requests_;
  std::size_t current_ = 0;
  bool done_ = false;
  std::string error_;
};

// A rank-ordered reduction over point-to-point messages, as InProcComm takes it: every rank
// sends part q of its input to rank q and receives part `me` of every other rank's into
// `scratch`; the finish step reduces the parts in rank order (reduce_math), so the result is
// bitwise the reference's at any world size and 16-bit floats are summed in fp32 registers,
// never through a widened copy.
struct Exchange {
  MPI_Comm comm;
  MPI_Datatype type;
  std::size_t esz;
  int me;
  int world;
  int tag;  // of the first round; the second uses tag + 1
};

// MPI guarantees tags up to at least 32767; two per collective, reused after 16383 collectives.
int tag_of(std::uint64_t collective) {
  return static_cast<int>(collective % 16383) * 2;
}

// Posts the sends of part q = [offset(q), offset(q) + count(q)) of `input` to rank q, and the
// receives of `count(me)` elements from every other rank into `scratch` slot by rank.
template <typename Part>
int post_exchange(const Exchange& x, const std::byte* input, std::byte* scratch, Part part,
                  std::vector<MPI_Request>& requests) {
  const std::size_t own_count = part(x.me).second;
  for (int k = 1; k < x.world; ++k) {
    const int q = (x.me + k) % x.world;  // staggered, so the ranks do not all send to rank 0 first
    const int from = (x.me - k + x.world) % x.world;
    const auto [offset, count] = part(q);
    MPI_Request send = MPI_REQUEST_NULL;
    MPI_Request recv = MPI_REQUEST_NULL;
    int rc = MPI_Irecv(scratch + static_cast<std::size_t>(from) * own_count * x.esz,
                       static_cast<int>(own_count), x.type, from, x.tag, x.comm, &recv);
    if (rc != MPI_SUCCESS) return rc;
    requests.push_back(recv);
    rc = MPI_Isend(input + offset * x.esz, static_cast<int>(count), x.type, q, x.tag, x.comm,
                   &send);
    if (rc != MPI_SUCCESS) return rc;
    requests.push_back(send);
  }
  return MPI_SUCCESS;
}

// The second round of an all_reduce: sends this rank's reduced part of `out` to every other rank
// and receives theirs into place (tag + 1).
template <typename Part>
int post_gather(const Exchange& x, std::byte* out, Part part, std::vector<MPI_Request>& requests) {
  const auto [own_offset, own_count] = part(x.me);
  for (int k = 1; k < x.world; ++k) {
    const int q = (x.me + k) % x.world;
    const auto [offset, count] = part(q);
    MPI_Request recv = MPI_REQUEST_NULL;
    MPI_Request send = MPI_REQUEST_NULL;
    int rc = MPI_Irecv(out + offset * x.esz, static_cast<int>(count), x.type, q, x.tag + 1, x.comm,
                       &recv);
    if (rc != MPI_SUCCESS) return rc;
    requests.push_back(recv);
    rc = MPI_Isend(out + own_offset * x.esz, static_cast<int>(own_count), x.type, q, x.tag + 1,
                   x.comm, &send);
    if (rc != MPI_SUCCESS) return rc;
    requests.push_back(send);
  }
  return MPI_SUCCESS;
}

// dst = the rank-order reduction of `own` (this rank's part) and the other ranks' parts in
// `scratch` (slot r holds rank r's, `count` elements each; this rank's slot is unused).
void reduce_parts(const Exchange& x, void* dst, const std::byte* own, const std::byte* scratch,
                  std::size_t count, DType dtype, ReduceOp op) {
  std::vector<const void*> srcs(static_cast<std::size_t>(x.world));
  for (int r = 0; r < x.world; ++r) {
    srcs[static_cast<std::size_t>(r)] =
        r == x.me ? own : scratch + static_cast<std::size_t>(r) * count * x.esz;
  }
  reduce_elements(dst, srcs.data(), x.world, count, dtype, op, x.world);
}

}  // namespace
}  // namespace comm_detail

using comm_detail::MpiState;

MpiComm::MpiComm(std::shared_ptr<MpiState> state, const CommOptions& options)
    : Communicator(options), state_(std::move(state)) {}

MpiComm::~MpiComm() = default;

namespace {

// Fills in rank, size and the point-to-point duplicate of `state.comm`.
void adopt(MpiState& state) {
  MPI_Comm_set_errhandler(state.comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(state.comm, &state.rank);
  MPI_Comm_size(state.comm, &state.size);
  comm_detail::check_mpi(MPI_Comm_dup(state.comm, &state.p2p), state, "MPI_Comm_dup");
  MPI_Comm_set_errhandler(state.p2p, MPI_ERRORS_RETURN);
}

}  // namespace

std::unique_ptr<MpiComm> MpiComm::world(const CommOptions& options) {
  comm_detail::ensure_mpi_initialized();
  auto state = std::make_shared<MpiState>();
  comm_detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &state->comm), *state, "MPI_Comm_dup");
  adopt(*state);
  return std::unique_ptr<MpiComm>(new MpiComm(std::move(state), options));
}

int MpiComm::rank() const {
  return state_->rank;
}
int MpiComm::size() const {
  return state_->size;
}

Work MpiComm::start_impl(const CollectiveArgs& a) {
  using namespace comm_detail;
  MpiState& s = *state_;
  const std::string what = describe(a, s.size);
  ZERO_CHECK_AS(CommError, s.broken.empty(),
                "MpiComm rank {}: cannot start {}: unusable after an earlier failure: {}", s.rank,
                what, s.broken);
  ZERO_CHECK_AS(CommError, a.elems <= static_cast<std::size_t>(INT_MAX),
                "MpiComm: {} exceeds MPI's int count; split the buffer", what);
  auto work = std::make_shared<MpiWork>(state_, what, timeout());
  const int count = static_cast<int>(a.elems);
  const MPI_Datatype type = mpi_type(a.dtype);
  const std::size_t esz = dtype_size(a.dtype);
  const Exchange x{s.p2p, type, esz, s.rank, s.size, tag_of(s.issued++)};
  const auto world = static_cast<std::size_t>(s.size);
  MpiState* sp = &s;

  switch (a.kind) {
    case Collective::ReduceScatter: {
      // Part q is chunk q of the input; this rank's result is its own chunk.
      const auto* input = static_cast<const std::byte*>(a.in_place ? a.recv : a.send);
      auto* out = a.in_place ? static_cast<std::byte*>(a.recv) + x.me * a.elems * esz
                             : static_cast<std::byte*>(a.recv);
      const auto part = [n = a.elems](int q) {
        return std::pair<std::size_t, std::size_t>(static_cast<std::size_t>(q) * n, n);
      };
      work->scratch = sp->pool.take(world * a.elems * esz);
      std::byte* scratch = work->scratch.data();
      work->rounds.push_back(
          {[x, input, scratch, part](std::vector<MPI_Request>& r) {
             return post_exchange(x, input, scratch, part, r);
           },
           [x, out, input, scratch, a] {
             reduce_parts(x, out, input + x.me * a.elems * x.esz, scratch, a.elems, a.dtype, a.op);
           }});
      break;
    }
    case Collective::AllReduce: {
      // Round 1 reduces part `me` (chunk_bounds) into `recv`; round 2 gathers the other parts.
      const auto* input = static_cast<const std::byte*>(a.send);
      auto* out = static_cast<std::byte*>(a.recv);
      const auto part = [n = a.elems, world = s.size](int q) {
        const auto [begin, end] = chunk_bounds(n, world, q);
        return std::pair<std::size_t, std::size_t>(begin, end - begin);
      };
      const auto [own_offset, own_count] = part(x.me);
      work->scratch = sp->pool.take(world * own_count * esz);
      std::byte* scratch = work->scratch.data();
      work->rounds.push_back(
          {[x, input, scratch, part](std::vector<MPI_Request>& r) {
             return post_exchange(x, input, scratch, part, r);
           },
           [x, out, input, scratch, a, own_offset, own_count] {
             reduce_parts(x, out + own_offset * x.esz, input + own_offset * x.esz, scratch,
                          own_count, a.dtype, a.op);
           }});
      work->rounds.push_back({[x, out, part](std::vector<MPI_Request>& r) {
                                return post_gather(x, out, part, r);
                              },
                              nullptr});
      break;
    }
    case Collective::AllGather:
      work->rounds.push_back({[a, count, type, sp](std::vector<MPI_Request>& r) {
                                r.push_back(MPI_REQUEST_NULL);
                                return a.in_place
                                           ? MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL,
                                                            a.recv, count, type, sp->comm, &r[0])
                                           : MPI_Iallgather(a.send, count, type, a.recv, count,
                                                            type, sp->comm, &r[0]);
                              },
                              nullptr});
      break;
    case Collective::Broadcast:
      work->rounds.push_back({[a, count, type, sp](std::vector<MPI_Request>& r) {
                                r.push_back(MPI_REQUEST_NULL);
                                return MPI_Ibcast(a.recv, count, type, a.root, sp->comm, &r[0]);
                              },
                              nullptr});
      break;
    case Collective::AllToAll:
      work->rounds.push_back({[a, count, type, sp](std::vector<MPI_Request>& r) {
                                r.push_back(MPI_REQUEST_NULL);
                                return MPI_Ialltoall(a.send, count, type, a.recv, count, type,
                                                     sp->comm, &r[0]);
                              },
                              nullptr});
      break;
    case Collective::Barrier:
      work->rounds.push_back({[sp](std::vector<MPI_Request>& r) {
                                r.push_back(MPI_REQUEST_NULL);
                                return MPI_Ibarrier(sp->comm, &r[0]);
                              },
                              nullptr});
      break;
  }
  work->start();
  return Work(work);
}

std::unique_ptr<Communicator> MpiComm::split_impl(int color, int key) {
  MpiState& s = *state_;
  ZERO_CHECK_AS(CommError, s.broken.empty(),
                "MpiComm rank {}: cannot split: unusable after an earlier failure: {}", s.rank,
                s.broken);
  auto state = std::make_shared<MpiState>();
  comm_detail::check_mpi(
      MPI_Comm_split(s.comm, color < 0 ? MPI_UNDEFINED : color, key, &state->comm), s,
      fmt::format("MPI_Comm_split (color {}, key {})", color, key));
  if (state->comm == MPI_COMM_NULL) return nullptr;
  adopt(*state);
  return std::unique_ptr<Communicator>(new MpiComm(std::move(state), CommOptions{timeout()}));
}

}  // namespace zero
