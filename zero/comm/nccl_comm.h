// Ranks as GPUs, through NCCL. Built only when CUDA and NCCL are found (ZERO_HAVE_NCCL);
// <nccl.h> and <cuda_runtime.h> stay out of this header.
//
// Buffers are device memory of the communicator's GPU. Every collective is enqueued, inside an
// NCCL group, on the communication stream (the caller's, or one the communicator creates) and
// returns at once, ordered after the work the legacy default stream holds when it is called
// (where the engine's kernels run and where a framework's gradient copies are ordered), without
// the host waiting; the Work records a CUDA event after it. wait() polls that event and
// ncclCommGetAsyncError (completion_poll.h) until the op is done, NCCL reports an error, or
// timeout() has passed since wait() was entered; on error or timeout the communicator is aborted
// (ncclCommAbort, which also frees a GPU stuck in the collective) and CommError names the op, its
// size and NCCL's error. The communicator is unusable afterwards, as every backend's.
//
// NCCL runs in non-blocking mode (ncclConfig_t blocking = 0): initialisation, splits and group
// ends that return ncclInProgress are polled with the same timeout, so a rank that never joins
// makes the others fail with a CommError instead of hanging.
//
// Reductions: fp32 and fp64 go to NCCL as they are (ncclSum, ncclAvg, ncclMax), in NCCL's order
// (ring or tree): results agree with InProcComm within rounding, not bitwise (MpiComm, which
// reduces in rank order itself, is bitwise).
// bf16/fp16 Sum and Avg are widened to fp32 in stream-ordered scratch, reduced in fp32 and
// rounded once at the end, as the contract says (Avg multiplies the fp32 sum by 1/size() where
// the contract divides: within one rounding of fp32 before the final rounding to 16 bits).
// bf16/fp16 Max is NCCL's own (exact; NaN propagation is NCCL's). A barrier is an all-reduce of
// one float. Element counts are size_t (NCCL's count type).
//
// Thread safety: as every Communicator; NCCL additionally requires that ranks of one process
// issue collectives on different communicators in the same order.
#pragma once

#include <memory>

#include "zero/comm/communicator.h"

namespace zero {

namespace comm_detail {
struct NcclState;
}

struct NcclCommOptions {
  CommOptions comm;
  // The GPU this rank uses (cudaSetDevice ordinal). REQUIRES: distinct per rank of one host.
  int cuda_ordinal = 0;
  // The stream collectives are enqueued on (a cudaStream_t, e.g. a StreamSet's comm stream);
  // null: the communicator creates its own non-blocking stream.
  void* stream = nullptr;
};

class NcclComm final : public Communicator {
 public:
  // Collective over every rank of `host`: rank 0 makes the unique id, `host` broadcasts it
  // (nccl_bootstrap.h), and each rank joins as host.rank() of host.size() on its GPU. `host` is
  // only used during the call. Throws CommError (init failed or timed out) or CudaError.
  static std::unique_ptr<NcclComm> create(Communicator& host, const NcclCommOptions& options);
  ~NcclComm() override;

  int rank() const override;
  int size() const override;
  std::string backend_name() const override { return "nccl"; }
  // The stream collectives run on (a cudaStream_t).
  void* stream() const;

 protected:
  Work start_impl(const CollectiveArgs& args) override;
  std::unique_ptr<Communicator> split_impl(int color, int key) override;

 private:
  NcclComm(std::shared_ptr<comm_detail::NcclState> state, const CommOptions& options);

  std::shared_ptr<comm_detail::NcclState> state_;
};

}  // namespace zero
