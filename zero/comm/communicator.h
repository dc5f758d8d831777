// Collective communication between the ranks of one data-parallel group.
//
// A Communicator is one rank's endpoint. Every collective is asynchronous: it returns a Work
// handle at once and runs on the backend's communication thread (InProcComm) or inside the
// library's progress engine (MpiComm) while the caller computes; wait() blocks until it is done.
//
// Contracts common to every backend:
//   * Every rank of the group issues the same collectives, with the same element count, dtype,
//     op and root, in the same order (as with MPI and NCCL). Ops issued on one communicator run
//     in issue order.
//   * Buffers belong to the collective from the call until wait() returns (or test() returns
//     true): the caller must not write any buffer, nor read an output buffer, before then, and
//     must keep them alive. Dropping a Work does not cancel the op.
//   * Reductions over 16-bit floats (bf16, fp16) are taken in fp32 and rounded once to the
//     element type at the end; Avg divides the fp32 (fp64 for fp64) sum by size() before that
//     rounding. fp32 sums in fp32, fp64 in fp64. Max propagates NaN.
//   * A collective that does not complete within timeout() fails with CommError naming the op,
//     its size and, where the backend can know it, which ranks arrived. After a timeout or any
//     other failure the group is unusable: later collectives fail with CommError too.
//   * Thread safety: one thread at a time issues collectives on a Communicator and waits on its
//     Works (the rank's thread). Different communicators may be used from different threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zero/base/dtype.h"

namespace zero {

class Device;  // zero/device/device.h

enum class ReduceOp { Sum, Avg, Max };
std::string_view reduce_op_name(ReduceOp op);  // "sum", "avg", "max"

enum class Collective { ReduceScatter, AllGather, AllReduce, Broadcast, Barrier, AllToAll };
std::string_view collective_name(Collective c);  // "reduce_scatter", "all_gather", ...

// LoCo error feedback for a quantized reduce-scatter (ZeRO++'s zeropp_loco_param, arXiv
// 2407.04480): at each point where values are quantized, the error left by the last call at that
// point is added back before quantizing, and the new error is blended into it:
//   x' = x + e;  q = Q(x');  e = beta · e + (1 − beta) · (x' − deQ(q))
// so errors that would repeat step after step cancel over steps instead of accumulating. `state`
// holds every point's e between calls (8-bit blocks, kernels/quantize.h): the caller keeps one per
// tensor it reduces (the same tensor, the same shape, call after call), sized and interpreted by
// the backend; an empty state, or one of another size, means e = 0. clear() forgets the errors;
// rescale() multiplies them (the loss scale changed). Only a backend that quantizes reads it.
struct QuantizationFeedback {
  float beta = 0.0f;  // in [0, 1): the share of the old error kept
  std::vector<std::byte> state;
  float multiplier = 1.0f;  // the stored errors are multiplier · state (reset when written)
  void clear() {
    state = {};  // the memory too
    multiplier = 1.0f;
  }
  void rescale(float factor) { multiplier *= factor; }
};

// One collective call as every backend receives it (after the public method checked it).
struct CollectiveArgs {
  Collective kind = Collective::Barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  // ReduceScatter: elements each rank receives; AllGather: elements each rank contributes;
  // AllReduce, Broadcast: elements of the whole buffer; Barrier: 0; AllToAll: elements of one
  // block (each rank sends and receives size() blocks).
  std::size_t elems = 0;
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  // ReduceScatter/AllGather over one buffer of size() × elems (send == recv); AllReduce with
  // send == recv.
  bool in_place = false;
  // ReduceScatter (Sum or Avg of fp32, bf16 or fp16): a hint that the values may cross the slow
  // link between nodes quantized to this many bits (4 or 8; 0: exact), as ZeRO++'s qgZ does. A
  // HierarchicalComm of several nodes of several ranks honours it (hierarchical_comm.h, with its
  // error bound); every other backend reduces exactly.
  int quantize_bits = 0;
  // With quantize_bits: LoCo error feedback (above), or null for none. The caller must not touch
  // it until the collective completes.
  QuantizationFeedback* feedback = nullptr;
  // The caller waits for the Work before it issues anything else (the `_now` calls): a backend
  // with a communication thread then runs the op on the calling thread when nothing else is in
  // flight, in the same order and with the same result, without the two thread hand-offs.
  bool waited = false;
};

// "all_reduce (sum, fp32) of 1000 elements, 4000 bytes"; reduce_scatter and all_gather name the
// per-rank chunk and the whole buffer ("of 4 x 1000 elements, 16000 bytes").
std::string describe(const CollectiveArgs& args, int world_size);

// The shared state behind a Work, implemented by each backend.
class WorkState {
 public:
  virtual ~WorkState() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
  // Work::order_stream's backend part; the default: the op does not complete on a CUDA stream.
  virtual bool order_stream(void* native_stream) {
    (void)native_stream;
    return false;
  }
};

// Completion handle of one collective. Cheap to copy (copies share the op).
class Work {
 public:
  Work() = default;  // an op that is already complete
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}

  // Blocks until the op completes. Throws CommError if it failed (timed out, a peer failed, a
  // fault was injected); calling again rethrows. After a successful wait the buffers are the
  // caller's again.
  void wait() {
    if (state_) state_->wait();
  }
  // Does not block. True once the op completed successfully; throws like wait() if it failed.
  bool test() { return state_ ? state_->test() : true; }
  // Where the op completes on a CUDA stream (NCCL): makes `native_stream` (a cudaStream_t; null:
  // CUDA's legacy default stream) wait for it on the GPU and returns true at once, the host not
  // waiting; the op's buffers are then ready for work enqueued on that stream afterwards (not for
  // the host, nor for other streams). False, doing nothing, where the op is the host's to wait for
  // (every other backend): call wait(). A failure of an op only ordered so surfaces at a later
  // wait() on the same communicator (the communicator is broken then), not here. Throws like
  // wait() where the op already failed.
  bool order_stream(void* native_stream) {
    return state_ ? state_->order_stream(native_stream) : true;
  }

 private:
  std::shared_ptr<WorkState> state_;
};

struct CommOptions {
  // A collective not complete after this long fails with CommError instead of hanging.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "inproc", "shm", "mpi", "faulty(...)".
  virtual std::string backend_name() const = 0;

  // Out of place: `send` holds size() × recv_elems elements; rank r's `recv` (recv_elems) gets
  // the reduction over ranks of send[r·recv_elems, (r+1)·recv_elems).
  Work reduce_scatter(const void* send, void* recv, std::size_t recv_elems, DType dtype,
                      ReduceOp op, int quantize_bits = 0,
                      QuantizationFeedback* feedback = nullptr);
  // In place over a flat buffer of size() × chunk_elems elements (the flat layout's padded unit):
  // afterwards rank r's chunk [r·chunk, (r+1)·chunk) holds the reduction; the other chunks'
  // contents are unspecified.
  Work reduce_scatter_in_place(void* buffer, std::size_t chunk_elems, DType dtype, ReduceOp op,
                               int quantize_bits = 0, QuantizationFeedback* feedback = nullptr);
  // Out of place: `recv` (size() × send_elems) gets rank q's `send` at [q·send_elems, ...).
  Work all_gather(const void* send, void* recv, std::size_t send_elems, DType dtype);
  // In place: rank r's contribution is already at [r·chunk, (r+1)·chunk) of `buffer`
  // (size() × chunk_elems); afterwards every chunk holds its owner's contribution.
  Work all_gather_in_place(void* buffer, std::size_t chunk_elems, DType dtype);
  // `recv` gets the elementwise reduction of every rank's `send`. send == recv is allowed.
  Work all_reduce(const void* send, void* recv, std::size_t elems, DType dtype, ReduceOp op);
  // `buffer` on every rank gets root's `buffer`.
  Work broadcast(void* buffer, std::size_t elems, DType dtype, int root);
  // Out of place: block q of `send` (size() × elems) goes to rank q, and block q of `recv`
  // (size() × elems) comes from rank q; a copy, no arithmetic. `send` and `recv` do not overlap.
  // InProcComm, ShmComm, MpiComm and HierarchicalComm carry it; NcclComm, DeviceInProcComm and
  // CallbackComm fail it with CommError (ZeRO++'s quantized gradients need it, on the CPU).
  Work all_to_all(const void* send, void* recv, std::size_t elems, DType dtype);
  Work barrier();
  // The same, waited for (CollectiveArgs::waited): throws CommError where the Work's wait would.
  // For the short collectives a caller blocks on anyway (a step's barriers and scalars).
  void barrier_now();
  void all_reduce_now(const void* send, void* recv, std::size_t elems, DType dtype, ReduceOp op);
  void all_gather_in_place_now(void* buffer, std::size_t chunk_elems, DType dtype);

  // Checks the arguments (null buffers with elements, sizes that overflow, root out of range)
  // and issues the collective. The named methods above all come here.
  Work start(const CollectiveArgs& args);

  // Collective over this communicator, blocking: ranks with the same color form a new group,
  // ordered by (key, rank). A negative color joins no group and gets nullptr. The new
  // communicator inherits timeout(). Ordered after the collectives already issued.
  std::unique_ptr<Communicator> split(int color, int key);

  // Whether every rank of the group lives in this process (in-process ranks), so that a rank may
  // write a peer's memory directly, ordered by the collectives around the writes. A backend that
  // says so keeps its collectives' synchronizing: a rank that leaves a collective saw every write
  // its peers made before they entered it. False unless the backend says otherwise.
  virtual bool shares_address_space() const { return false; }
  // Collective (one all-gather), only where shares_address_space(): every rank's `local`
  // addresses, rank-major (rank q's i-th address at [q·local.size() + i]).
  // REQUIRES: shares_address_space(); the same local.size() on every rank.
  std::vector<void*> exchange_addresses(std::span<void* const> local);
  // Where `bytes` at address `remote` of rank q's process (learnt from q, e.g. through an
  // all-gather of host memory) can be read and written with plain loads and stores by this
  // process, or null: the address itself for this rank and where shares_address_space(); for
  // ShmComm, a view of q's shared host arena when the bytes lie in it
  // (zero/device/shared_host_arena.h). Writes through it reach q as a shares_address_space()
  // rank's do: q sees them once it has left a collective that the writer entered after them.
  // Thread safety: any thread.
  virtual void* peer_memory(int q, const void* remote, std::size_t bytes) const;
  // The same for reading only: also where the bytes could be mapped only for reading (ShmComm
  // where q's arena does not open for writing). Reads see q's writes as above.
  virtual const void* peer_readable(int q, const void* remote, std::size_t bytes) const {
    return peer_memory(q, remote, bytes);
  }

  std::chrono::milliseconds timeout() const { return timeout_; }
  // Applies to collectives issued after the call.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 protected:
  explicit Communicator(const CommOptions& options) : timeout_(options.timeout) {}

  // May assume the arguments were checked.
  virtual Work start_impl(const CollectiveArgs& args) = 0;
  virtual std::unique_ptr<Communicator> split_impl(int color, int key) = 0;

 private:
  std::chrono::milliseconds timeout_;
};

// Collective: checks that `value` is byte-identical on every rank of `comm`. All-reduces a
// 64-bit hash of it (its max and min); on mismatch all-gathers the per-rank hashes and throws
// CommError on every rank naming `what` and which ranks hold which value. Used at init for the
// resolved config, the layout and the parameter specs.
void check_agreement(Communicator& comm, std::string_view what, std::span<const std::byte> value);
inline void check_agreement(Communicator& comm, std::string_view what, std::string_view value) {
  check_agreement(comm, what, std::as_bytes(std::span(value.data(), value.size())));
}

// The process-level communicator of `backend`: "mpi" (MPI_COMM_WORLD; initialises MPI if
// needed), "nccl", or "shm" / "env" (both make_env_communicator(): the ranks of the launcher
// that started this process, over shared memory when they share a host; zero/comm/
// launcher_env.h). Throws zero::Error naming the backend when this build lacks it. In-process
// ranks come from InProcWorld / run_ranks (zero/comm/inproc_comm.h) instead.
std::unique_ptr<Communicator> make_communicator(std::string_view backend,
                                                const CommOptions& options = {});
// Whether make_communicator(backend) can succeed in this build.
bool communicator_available(std::string_view backend);
// An NCCL communicator of the ranks of `host` (each on GPU `cuda_ordinal`), for an engine whose
// device is that GPU; `host` stays the engine's control communicator (EngineOptions::
// control_comm). Collective over `host`. Throws zero::Error when this build has no NCCL.
std::unique_ptr<Communicator> make_gpu_communicator(Communicator& host, int cuda_ordinal,
                                                    const CommOptions& options = {});
// The communicator of device memory for an engine on `device`, over the ranks of `host`, which
// stays the engine's control communicator. Collective over `host`. In-process ranks
// (host.shares_address_space()) get a DeviceInProcComm (zero/comm/device_inproc_comm.h) when
// there are several and all compute on the same GPU (NCCL refuses two ranks on one GPU), or when
// the device is not a GPU (gpu_ordinal() -1: a CPU stand-in); otherwise NCCL on
// device.gpu_ordinal(), as above (a single rank too, and in a build without NCCL a single
// in-process rank gets a DeviceInProcComm). Throws zero::Error when NCCL is needed and not built,
// and when in-process ranks share a GPU but are not all on one (neither backend serves that).
std::unique_ptr<Communicator> make_gpu_communicator(Communicator& host, Device& device,
                                                    const CommOptions& options = {});

}  // namespace zero
