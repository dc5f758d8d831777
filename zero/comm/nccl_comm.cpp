#include "zero/comm/nccl_comm.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "kernels/companions_cuda.h"
#include "zero/base/cuda_error.h"
#include "zero/base/error.h"
#include "zero/comm/completion_poll.h"
#include "zero/comm/nccl_bootstrap.h"

namespace zero {
namespace comm_detail {

struct NcclState {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  int ordinal = 0;
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  cudaEvent_t ordered = nullptr;  // recorded on the legacy default stream before each collective
  std::string broken;  // why the communicator is unusable, empty while it is fine

  std::string who() const { return fmt::format("NcclComm rank {} of {}", rank, size); }

  void abort() noexcept {
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
  }

  ~NcclState() {
    cudaSetDevice(ordinal);
    if (comm != nullptr) {
      // Finalize flushes what was issued; a communicator that fails to finalize is aborted.
      if (ncclCommFinalize(comm) == ncclSuccess || wait_idle()) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
    }
    if (owns_stream && stream != nullptr) cudaStreamDestroy(stream);
    if (ordered != nullptr) cudaEventDestroy(ordered);
  }

  // The collective's stream waits for what the legacy default stream holds: the engine's
  // kernels and the gradients a framework copied into their slots (zero_c.h: such copies are
  // ordered before the legacy stream's later work), without the host waiting.
  void order_after_legacy_stream() {
    if (stream == nullptr || stream == cudaStreamLegacy) return;
    if (ordered == nullptr) {
      ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&ordered, cudaEventDisableTiming));
    }
    ZERO_CUDA_CHECK(cudaEventRecord(ordered, cudaStreamLegacy));
    ZERO_CUDA_CHECK(cudaStreamWaitEvent(stream, ordered, 0));
  }

  // Polls until the communicator leaves ncclInProgress; false on an error.
  bool wait_idle() const noexcept {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return false;
      if (state == ncclSuccess) return true;
      if (state != ncclInProgress) return false;
    }
  }
};

namespace {

std::string nccl_error_text(ncclResult_t result, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  return fmt::format("{}{}{}", ncclGetErrorString(result), last && *last ? ": " : "",
                     last ? last : "");
}

// The communicator's state as a poll: complete once it is no longer ncclInProgress.
PollStatus comm_state(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
  if (rc != ncclSuccess) return {false, nccl_error_text(rc, comm)};
  if (state == ncclInProgress) return {false, {}};
  if (state != ncclSuccess) return {false, nccl_error_text(state, comm)};
  return {true, {}};
}

// A call on a non-blocking communicator: an error throws; ncclInProgress is polled to its end
// with the timeout (NCCL: nothing else may be called on the communicator meanwhile).
void complete_call(ncclResult_t rc, NcclState& s, const std::string& what,
                   std::chrono::milliseconds timeout) {
  const PollTarget target{s.who(), what, timeout};
  auto abort = [&s] { s.abort(); };
  if (rc == ncclInProgress) {
    try {
      poll_until_complete([&s] { return comm_state(s.comm); }, target, abort);
    } catch (const CommError& e) {
      s.broken = e.what();
      throw;
    }
    return;
  }
  if (rc != ncclSuccess) {
    s.broken = fmt::format("{}: {} failed: {}", s.who(), what, nccl_error_text(rc, s.comm));
    s.abort();
    throw CommError(s.broken);
  }
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// Device scratch in stream order, freed in stream order after everything enqueued with it.
void* stream_scratch(std::size_t bytes, cudaStream_t stream) {
  void* p = nullptr;
  ZERO_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
  return p;
}

class NcclWork final : public WorkState {
 public:
  NcclWork(std::shared_ptr<NcclState> state, std::string what, std::chrono::milliseconds timeout)
      : state_(std::move(state)), target_{state_->who(), std::move(what), timeout} {
    ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&done_event_, cudaEventDisableTiming));
  }
  ~NcclWork() override { cudaEventDestroy(done_event_); }

  void record() { ZERO_CUDA_CHECK(cudaEventRecord(done_event_, state_->stream)); }

  void wait() override {
    if (finished()) return;
    run([&] { poll_until_complete(probe(), target_, abort()); });
    done_ = true;
  }
  bool test() override {
    if (finished()) return true;
    run([&] { done_ = poll_once(probe(), target_, abort()); });
    return done_;
  }
  bool order_stream(void* native_stream) override {
    if (finished()) return true;
    ZERO_CUDA_CHECK(cudaSetDevice(state_->ordinal));  // the legacy stream is the device's
    const auto stream = native_stream == nullptr ? cudaStreamLegacy
                                                 : static_cast<cudaStream_t>(native_stream);
    ZERO_CUDA_CHECK(cudaStreamWaitEvent(stream, done_event_, 0));
    return true;
  }

 private:
  bool finished() const {
    if (!error_.empty()) throw CommError(error_);
    return done_;
  }
  std::function<PollStatus()> probe() {
    return [this] {
      if (state_->comm == nullptr) return PollStatus{false, "the communicator was aborted"};
      PollStatus status = comm_state(state_->comm);
      if (!status.error.empty()) return status;
      const cudaError_t rc = cudaEventQuery(done_event_);
      if (rc == cudaErrorNotReady) return PollStatus{false, {}};
      if (rc != cudaSuccess) {
        cudaGetLastError();
        return PollStatus{false, fmt::format("cudaEventQuery: {} ({})", cudaGetErrorName(rc),
                                             cudaGetErrorString(rc))};
      }
      return PollStatus{true, {}};
    };
  }
  std::function<void()> abort() {
    return [this] { state_->abort(); };
  }
  template <class Fn>
  void run(Fn&& fn) {
    try {
      fn();
    } catch (const CommError& e) {
      error_ = e.what();
      state_->broken = error_;
      throw;
    }
  }

  std::shared_ptr<NcclState> state_;
  PollTarget target_;
  cudaEvent_t done_event_ = nullptr;
  bool done_ = false;
  std::string error_;
};

}  // namespace
}  // namespace comm_detail

using comm_detail::NcclState;

NcclComm::NcclComm(std::shared_ptr<NcclState> state, const CommOptions& options)
    : Communicator(options), state_(std::move(state)) {}

NcclComm::~NcclComm() = default;

std::unique_ptr<NcclComm> NcclComm::create(Communicator& host, const NcclCommOptions& options) {
  using namespace comm_detail;
  const NcclIdBytes id_bytes = share_unique_id(host, 0, [] {
    ncclUniqueId id;
    const ncclResult_t rc = ncclGetUniqueId(&id);
    ZERO_CHECK_AS(CommError, rc == ncclSuccess, "ncclGetUniqueId failed: {}",
                  nccl_error_text(rc, nullptr));
    NcclIdBytes bytes;
    static_assert(sizeof(id.internal) == kNcclUniqueIdBytes);
    std::memcpy(bytes.data(), id.internal, bytes.size());
    return bytes;
  });
  auto state = std::make_shared<NcclState>();
  state->rank = host.rank();
  state->size = host.size();
  state->ordinal = options.cuda_ordinal;
  ZERO_CUDA_CHECK(cudaSetDevice(options.cuda_ordinal));
  if (options.stream != nullptr) {
    state->stream = static_cast<cudaStream_t>(options.stream);
  } else {
    ZERO_CUDA_CHECK(cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking));
    state->owns_stream = true;
  }
  ncclUniqueId id;
  std::memcpy(id.internal, id_bytes.data(), id_bytes.size());
  ncclConfig_t config = nonblocking_config();
  const ncclResult_t rc =
      ncclCommInitRankConfig(&state->comm, state->size, id, state->rank, &config);
  complete_call(rc, *state, fmt::format("ncclCommInitRankConfig on GPU {}", state->ordinal),
                options.comm.timeout);
  return std::unique_ptr<NcclComm>(new NcclComm(std::move(state), options.comm));
}

int NcclComm::rank() const {
  return state_->rank;
}
int NcclComm::size() const {
  return state_->size;
}
void* NcclComm::stream() const {
  return state_->stream;
}

Work NcclComm::start_impl(const CollectiveArgs& a) {
  using namespace comm_detail;
  NcclState& s = *state_;
  const std::string what = describe(a, s.size);
  ZERO_CHECK_AS(CommError, s.broken.empty() && s.comm != nullptr,
                "{}: cannot start {}: unusable after an earlier failure: {}", s.who(), what,
                s.broken);
  ZERO_CUDA_CHECK(cudaSetDevice(s.ordinal));
  auto work = std::make_shared<NcclWork>(state_, what, timeout());
  s.order_after_legacy_stream();
  const std::size_t esz = dtype_size(a.dtype);
  const auto world = static_cast<std::size_t>(s.size);
  const auto me = static_cast<std::size_t>(s.rank);
  char* const recv = static_cast<char*>(a.recv);
  const bool reduces = a.kind == Collective::ReduceScatter || a.kind == Collective::AllReduce;
  const bool widen = reduces && a.elems > 0 && a.op != ReduceOp::Max &&
                     (a.dtype == DType::BF16 || a.dtype == DType::F16);

  // What NCCL sees: the caller's buffers, or fp32 scratch for a widened 16-bit reduction.
  // ReduceScatter in place is NCCL's in-place form (the result in this rank's chunk).
  const void* send = a.kind == Collective::AllGather && a.in_place
                         ? recv + me * a.elems * esz
                         : (a.kind == Collective::Broadcast ? a.recv : a.send);
  void* out =
      a.kind == Collective::ReduceScatter && a.in_place ? recv + me * a.elems * esz : a.recv;
  void* const final_out = out;
  ncclDataType_t type = nccl_type(a.dtype);
  ncclRedOp_t op = nccl_op(a.op);
  std::size_t count = a.elems;
  float* wide = nullptr;
  if (widen) {
    const std::size_t in_elems = a.kind == Collective::ReduceScatter ? world * a.elems : a.elems;
    const std::size_t out_offset = a.kind == Collective::ReduceScatter ? in_elems : 0;
    wide = static_cast<float*>(stream_scratch((out_offset + a.elems) * sizeof(float), s.stream));
    kernels::combine_cuda_async(wide, DType::F32, a.send, a.dtype, in_elems, 1.0f, false, s.stream);
    send = wide;
    out = wide + out_offset;
    type = ncclFloat32;
    op = ncclSum;
  }
  if (a.kind == Collective::Barrier) {
    wide = static_cast<float*>(stream_scratch(sizeof(float), s.stream));
    ZERO_CUDA_CHECK(cudaMemsetAsync(wide, 0, sizeof(float), s.stream));
    send = out = wide;
    type = ncclFloat32;
    op = ncclSum;
    count = 1;
  }

  ncclResult_t rc = ncclGroupStart();
  if (rc == ncclSuccess) {
    switch (a.kind) {
      case Collective::ReduceScatter:
        rc = ncclReduceScatter(send, out, count, type, op, s.comm, s.stream);
        break;
      case Collective::AllGather:
        rc = ncclAllGather(send, out, count, type, s.comm, s.stream);
        break;
      case Collective::AllReduce:
      case Collective::Barrier:
        rc = ncclAllReduce(send, out, count, type, op, s.comm, s.stream);
        break;
      case Collective::Broadcast:
        rc = ncclBroadcast(send, out, count, type, a.root, s.comm, s.stream);
        break;
      case Collective::AllToAll:
        // Point to point inside the group: block q to rank q, block q from rank q.
        for (std::size_t q = 0; q < world && rc == ncclSuccess; ++q) {
          const std::size_t offset = q * a.elems * esz;
          rc = ncclSend(static_cast<const char*>(send) + offset, count, type, static_cast<int>(q),
                        s.comm, s.stream);
          if (rc == ncclSuccess) {
            rc = ncclRecv(recv + offset, count, type, static_cast<int>(q), s.comm, s.stream);
          }
        }
        break;
    }
    const ncclResult_t end = ncclGroupEnd();
    if (rc == ncclSuccess) rc = end;
  }
  // NCCL enqueues its kernels at ncclGroupEnd, and a non-blocking communicator may still be
  // enqueuing: only after this may more work go onto the stream.
  complete_call(rc, s, what, timeout());
  if (widen) {
    const float scale = a.op == ReduceOp::Avg ? 1.0f / static_cast<float>(world) : 1.0f;
    kernels::combine_cuda_async(final_out, a.dtype, out, DType::F32, a.elems, scale, false,
                                s.stream);
  }
  if (wide != nullptr) ZERO_CUDA_CHECK(cudaFreeAsync(wide, s.stream));
  work->record();
  return Work(work);
}

std::unique_ptr<Communicator> NcclComm::split_impl(int color, int key) {
  using namespace comm_detail;
  NcclState& s = *state_;
  ZERO_CHECK_AS(CommError, s.broken.empty() && s.comm != nullptr,
                "{}: cannot split: unusable after an earlier failure: {}", s.who(), s.broken);
  ZERO_CUDA_CHECK(cudaSetDevice(s.ordinal));
  auto state = std::make_shared<NcclState>();
  state->ordinal = s.ordinal;
  ZERO_CUDA_CHECK(cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking));
  state->owns_stream = true;
  ncclConfig_t config = nonblocking_config();
  const ncclResult_t rc =
      ncclCommSplit(s.comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &state->comm, &config);
  const std::string what = fmt::format("ncclCommSplit (color {}, key {})", color, key);
  // A non-blocking split completes like a collective of the parent: NCCL fills in the new handle
  // when the parent's state leaves ncclInProgress (not necessarily before ncclCommSplit returns:
  // the first run on a GPU got a null handle by reading it at once), and the new communicator may
  // still be connecting after that.
  // (The second H100 run saw ncclSuccess returned with the handle still null, so it is awaited
  // whatever the call returned.)
  complete_call(rc, s, what, timeout());
  std::atomic_ref<ncclComm_t> handle(state->comm);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (color >= 0 && handle.load() == nullptr && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  ZERO_CHECK_AS(CommError, color < 0 || handle.load() != nullptr,
                "{}: {} returned {} without a communicator", s.who(), what, static_cast<int>(rc));
  if (state->comm != nullptr) {
    poll_until_complete([&state] { return comm_state(state->comm); }, {s.who(), what, timeout()},
                        [&state] { state->abort(); });
  }
  if (state->comm == nullptr) return nullptr;
  ZERO_CHECK_AS(CommError,
                ncclCommUserRank(state->comm, &state->rank) == ncclSuccess &&
                    ncclCommCount(state->comm, &state->size) == ncclSuccess,
                "{}: the communicator split off (color {}) cannot say its rank and size", s.who(),
                color);
  return std::unique_ptr<Communicator>(new NcclComm(std::move(state), CommOptions{timeout()}));
}

}  // namespace zero
