#include "zero/comm/mpi_comm.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "zero/base/error.h"
#include "zero/base/half.h"
#include "zero/comm/reduce_math.h"

namespace zero {
namespace comm_detail {

struct MpiState {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  std::string broken;  // why the communicator is unusable, empty while it is fine
  // fp32 buffers for widened 16-bit sums, kept between collectives so that a step's reductions
  // reuse them instead of allocating (and first-touching) fresh ones every time.
  std::mutex staging_mutex;
  std::vector<std::vector<float>> spare_staging;

  // A buffer of at least `elems` floats (contents undefined): the largest spare one.
  std::vector<float> take_staging(std::size_t elems) {
    std::vector<float> out;
    {
      std::lock_guard<std::mutex> lock(staging_mutex);
      auto largest = std::max_element(
          spare_staging.begin(), spare_staging.end(),
          [](const auto& a, const auto& b) { return a.capacity() < b.capacity(); });
      if (largest != spare_staging.end()) {
        out = std::move(*largest);
        spare_staging.erase(largest);
      }
    }
    if (out.size() < elems) out.resize(elems);
    return out;
  }
  void give_staging(std::vector<float>&& v) {
    if (v.capacity() == 0) return;
    std::lock_guard<std::mutex> lock(staging_mutex);
    spare_staging.push_back(std::move(v));
  }

  ~MpiState() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
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

template <typename Convert, typename Narrow>
void max_16bit(void* in, void* inout, int* len, Convert to_float, Narrow) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = to_float(a[i]);
    const float acc = to_float(b[i]);
    if (x > acc || x != x) b[i] = a[i];  // Max propagates NaN, as in reduce_math
  }
}

void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  max_16bit(in, inout, len, half::bf16_to_float, half::float_to_bf16);
}
void fp16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  max_16bit(in, inout, len, half::f16_to_float, half::float_to_f16);
}

struct CustomOps {
  MPI_Op bf16_max = MPI_OP_NULL;
  MPI_Op fp16_max = MPI_OP_NULL;
};

// Created once, after MPI is initialised; MPI frees user ops at finalize.
const CustomOps& custom_ops() {
  static const CustomOps ops = [] {
    CustomOps o;
    MPI_Op_create(&bf16_max, 1, &o.bf16_max);
    MPI_Op_create(&fp16_max, 1, &o.fp16_max);
    return o;
  }();
  return ops;
}

void ensure_mpi_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
    throw CommError("MpiComm: MPI_Init_thread failed");
  }
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;  // moved as bits; reductions handled separately
  }
  return MPI_DATATYPE_NULL;
}

bool is_16bit(DType t) {
  return t == DType::BF16 || t == DType::F16;
}

class MpiWork final : public WorkState {
 public:
  MpiWork(std::shared_ptr<MpiState> state, std::string what, std::chrono::milliseconds timeout)
      : state_(std::move(state)), what_(std::move(what)), timeout_(timeout) {}
  ~MpiWork() override {
    state_->give_staging(std::move(staging));
    state_->give_staging(std::move(staging_out));
  }

  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<float> staging;         // fp32 widening of 16-bit sums
  std::vector<float> staging_out;     // fp32 result of an out-of-place widened reduce_scatter
  std::function<void()> on_complete;  // runs once, on the waiting thread, after MPI completes

  void wait() override {
    if (done_) return rethrow_if_failed();
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (int polls = 0;; ++polls) {
      if (poll()) return;
      if (std::chrono::steady_clock::now() > deadline) {
        error_ = fmt::format(
            "MpiComm rank {} of {}: {} did not complete within {} ms; MPI does not report which "
            "ranks have arrived (a rank may not have called it, or called a different "
            "collective)",
            state_->rank, state_->size, what_, timeout_.count());
        state_->broken = error_;
        done_ = true;
        throw CommError(error_);
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

  bool poll() {
    int flag = 0;
    const int rc = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      error_ = fmt::format("MpiComm rank {} of {}: {} failed: {}", state_->rank, state_->size,
                           what_, mpi_error_string(rc));
      state_->broken = error_;
      done_ = true;
      throw CommError(error_);
    }
    if (!flag) return false;
    done_ = true;
    if (on_complete) on_complete();
    return true;
  }

  std::shared_ptr<MpiState> state_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  bool done_ = false;
  std::string error_;
};

}  // namespace
}  // namespace comm_detail

using comm_detail::MpiState;

MpiComm::MpiComm(std::shared_ptr<MpiState> state, const CommOptions& options)
    : Communicator(options), state_(std::move(state)) {}

MpiComm::~MpiComm() = default;

std::unique_ptr<MpiComm> MpiComm::world(const CommOptions& options) {
  comm_detail::ensure_mpi_initialized();
  (void)comm_detail::custom_ops();
  auto state = std::make_shared<MpiState>();
  comm_detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &state->comm), *state, "MPI_Comm_dup");
  MPI_Comm_set_errhandler(state->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(state->comm, &state->rank);
  MPI_Comm_size(state->comm, &state->size);
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
  if (a.kind == Collective::ReduceScatter) {
    ZERO_CHECK_AS(CommError,
                  a.elems * static_cast<std::size_t>(s.size) <= static_cast<std::size_t>(INT_MAX),
                  "MpiComm: {} exceeds MPI's int count; split the buffer", what);
  }
  auto work = std::make_shared<MpiWork>(state_, what, timeout());
  const int count = static_cast<int>(a.elems);
  const MPI_Datatype type = mpi_type(a.dtype);
  const std::size_t esz = dtype_size(a.dtype);
  const int world = s.size;
  const int me = s.rank;
  const bool widen = is_16bit(a.dtype) && a.op != ReduceOp::Max;
  const MPI_Op op = a.op == ReduceOp::Max ? (a.dtype == DType::BF16  ? custom_ops().bf16_max
                                             : a.dtype == DType::F16 ? custom_ops().fp16_max
                                                                     : MPI_MAX)
                                          : MPI_SUM;
  const float divisor = a.op == ReduceOp::Avg ? static_cast<float>(world) : 1.0f;
  int rc = MPI_SUCCESS;

  switch (a.kind) {
    case Collective::ReduceScatter: {
      const std::size_t total = a.elems * static_cast<std::size_t>(world);
      void* own_chunk =
          a.in_place ? static_cast<char*>(a.recv) + static_cast<std::size_t>(me) * a.elems * esz
                     : a.recv;
      if (widen) {
        work->staging = s.take_staging(total);
        widen_to_f32(a.send, work->staging.data(), total, a.dtype);
        work->staging_out = s.take_staging(a.elems);
        rc = MPI_Ireduce_scatter_block(work->staging.data(), work->staging_out.data(), count,
                                       MPI_FLOAT, MPI_SUM, s.comm, &work->request);
        MpiWork* w = work.get();
        work->on_complete = [w, own_chunk, a, divisor] {
          narrow_from_f32(w->staging_out.data(), own_chunk, a.elems, a.dtype, divisor);
        };
      } else {
        // With MPI_IN_PLACE the result lands at the start of the buffer; move it to this rank's
        // chunk afterwards (no overlap unless rank 0, where it is already in place).
        rc = MPI_Ireduce_scatter_block(a.in_place ? MPI_IN_PLACE : a.send, a.recv, count, type, op,
                                       s.comm, &work->request);
        work->on_complete = [a, own_chunk, esz, world] {
          if (a.in_place && own_chunk != a.recv && a.elems > 0) {
            std::memcpy(own_chunk, a.recv, a.elems * esz);
          }
          if (a.op == ReduceOp::Avg) divide_in_place(own_chunk, a.elems, a.dtype, world);
        };
      }
      break;
    }
    case Collective::AllGather:
      rc = a.in_place
               ? MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a.recv, count, type, s.comm,
                                &work->request)
               : MPI_Iallgather(a.send, count, type, a.recv, count, type, s.comm, &work->request);
      break;
    case Collective::AllReduce:
      if (widen) {
        work->staging = s.take_staging(a.elems);
        widen_to_f32(a.send, work->staging.data(), a.elems, a.dtype);
        rc = MPI_Iallreduce(MPI_IN_PLACE, work->staging.data(), count, MPI_FLOAT, MPI_SUM, s.comm,
                            &work->request);
        MpiWork* w = work.get();
        work->on_complete = [w, a, divisor] {
          narrow_from_f32(w->staging.data(), a.recv, a.elems, a.dtype, divisor);
        };
      } else {
        rc = MPI_Iallreduce(a.in_place ? MPI_IN_PLACE : a.send, a.recv, count, type, op, s.comm,
                            &work->request);
        if (a.op == ReduceOp::Avg) {
          work->on_complete = [a, world] { divide_in_place(a.recv, a.elems, a.dtype, world); };
        }
      }
      break;
    case Collective::Broadcast:
      rc = MPI_Ibcast(a.recv, count, type, a.root, s.comm, &work->request);
      break;
    case Collective::Barrier: rc = MPI_Ibarrier(s.comm, &work->request); break;
  }
  check_mpi(rc, s, what);
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
  MPI_Comm_set_errhandler(state->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(state->comm, &state->rank);
  MPI_Comm_size(state->comm, &state->size);
  return std::unique_ptr<Communicator>(new MpiComm(std::move(state), CommOptions{timeout()}));
}

}  // namespace zero
