// Waiting for an operation a library runs on its own (a CUDA stream, NCCL's proxy threads) by
// polling it, with the communicators' timeout rule: the op has `timeout` from the moment the
// wait starts; then, or as soon as the library reports an error, `on_failure` runs once (NCCL:
// abort the communicator, which is what frees a rank stuck in a kernel) and CommError is thrown
// naming who, the op and what went wrong. No CUDA dependency: NcclComm's Work is this loop over
// cudaEventQuery and ncclCommGetAsyncError, and a CPU test drives it with fakes.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace zero {

struct PollStatus {
  bool complete = false;
  std::string error;  // non-empty: the op failed, with the library's words
};

struct PollTarget {
  std::string who;   // "NcclComm rank 1 of 4"
  std::string what;  // describe(args): "all_reduce (sum, fp32) of 1000 elements, 4000 bytes"
  std::chrono::milliseconds timeout{0};
};

// Calls `probe` until it reports completion (returns) or an error, or until `target.timeout`
// has passed (throws CommError after `on_failure`). Spins briefly, then sleeps between polls so
// a waiting rank leaves the cores to the ranks it waits for. A probe that throws is a failure
// too: its exception's message becomes the error.
void poll_until_complete(const std::function<PollStatus()>& probe, const PollTarget& target,
                         const std::function<void()>& on_failure = {});

// One poll, for Work::test(): true when complete; throws like poll_until_complete on an error.
bool poll_once(const std::function<PollStatus()>& probe, const PollTarget& target,
               const std::function<void()>& on_failure = {});

}  // namespace zero
