// In-process ranks whose buffers are device memory: N ranks as N threads of one process, sharing
// one GPU (NCCL refuses two ranks on one GPU), or the CPU stand-in device of the tests.
//
// The rendezvous is InProcComm's (inproc_comm.h): each collective posts its call and its buffer
// addresses through an all-gather of an in-process group, every rank then computes its part
// straight from its peers' buffers, and a barrier keeps every buffer in use until all are done.
// The element work runs through the rank's Device::compute() table, never host code: a
// reduction is the table's `reduce` over every rank's input in rank order, computed by the rank
// that owns the output chunk (all_reduce: chunk_bounds' chunks, then copies of the others); a
// copy is the table's `combine` with scale 1 (an exact copy). So the arithmetic is InProcComm's
// (reduce_math.h: 16-bit sums in fp32 rounded once, Avg divides the sum by size(), Max
// propagates NaN) and the results are bitwise InProcComm's for every dtype it reduces.
//
// Threads: each communicator runs its collectives in issue order on a communication thread of
// its own, bound to the rank's device (Device::bind_thread); the rank's thread enqueues and waits.
// Streams: the table enqueues on CpuExec::cuda_stream (null, CUDA's legacy default stream, as
// the engine's own table calls) and synchronizes before returning, so a collective's kernels and
// copies run after everything the ranks enqueued there before issuing it, and what it wrote is in
// memory once its Work completes. Copies go through the table too, so that one stream orders all
// of the collective's work.
//
// Failures: a timeout or a mismatched call fails as in InProcComm, naming the op, its size and
// the ranks; a rank whose kernels fail aborts the group with its error, so every peer fails
// promptly with it. The group is unusable afterwards.
//
// REQUIRES: every rank's Device computes on memory every other rank's kernels can address: all
// ranks' devices are the same GPU (the same gpu_ordinal()), or host memory (CpuDevice and its
// stand-ins). Buffers are memory of the rank's device (MemoryKind::Device, or any memory its
// kernels address). fp64 is not reduced (the kernels do not cover it): such a reduction fails at
// the call with CommError; fp64 gathers and broadcasts are copied. shares_address_space() is
// false, so exchange_addresses is refused (a peer's device memory is not the host's to write).
// On CUDA the table takes at most kCudaReduceMaxSources (32) ranks' inputs.
#pragma once

#include <memory>
#include <string>

#include "zero/comm/communicator.h"
#include "zero/device/device.h"

namespace zero {

class InProcWorld;

// The shared state of one set of in-process device ranks; as InProcWorld (inproc_comm.h).
// Thread safety: comm() and abort() may be called from any thread.
class DeviceInProcWorld {
 public:
  explicit DeviceInProcWorld(int size, const CommOptions& options = {});
  ~DeviceInProcWorld();
  DeviceInProcWorld(const DeviceInProcWorld&) = delete;
  DeviceInProcWorld& operator=(const DeviceInProcWorld&) = delete;

  int size() const;
  // Rank r's communicator over the memory of `device`.
  // REQUIRES (checked): 0 <= rank < size(), each rank taken at most once. REQUIRES: `device`
  // outlives the communicator and is used by rank r only.
  std::unique_ptr<Communicator> comm(int rank, Device& device);
  // Fails every pending and future collective of the world's communicators (splits included).
  void abort(const std::string& reason);

  // Collective over `host`, whose ranks are threads of this process (shares_address_space()):
  // a DeviceInProcWorld of host.size() ranks, and host.rank()'s communicator of it over
  // `device`. `host` is only used during the call. Throws CommError where `host` does not share
  // its address space.
  static std::unique_ptr<Communicator> join(Communicator& host, Device& device,
                                            const CommOptions& options = {});

 private:
  std::shared_ptr<InProcWorld> world_;
  CommOptions options_;
};

}  // namespace zero
