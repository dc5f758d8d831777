// A Communicator whose collectives the host framework carries out: a table of C-style callbacks,
// e.g. wrapping PyTorch's own process group. The C ABI's zero_comm_create_callbacks (zero/zero_c.h)
// forwards here.
//
// Threads: the callbacks are called on the communicator's communication thread, one collective
// at a time, in issue order; never concurrently, never from the thread that issues collectives.
// The Work of a collective completes once its callback has returned.
//
// How the collectives of communicator.h map onto the callbacks (all out of place, blocking):
//   reduce_scatter, all_gather, broadcast, barrier   the callback of the same name, as they are
//   all_reduce                                       the all_reduce callback; send == recv when
//                                                    the caller reduces in place
//   reduce_scatter_in_place(buffer, chunk)           reduce_scatter(buffer, scratch, chunk), then
//                                                    scratch is copied to the rank's chunk
//   all_gather_in_place(buffer, chunk)               all_gather(copy of the rank's chunk, buffer,
//                                                    chunk)
// so `recv` never aliases `send` except in all_reduce. A collective of 0 elements calls no
// callback (every rank has the same count, so every rank skips it alike). The scratch buffer is
// kept, as large as the largest in-place chunk so far.
//
// Failures: a callback that returns non-zero (or throws) fails its collective with
// CommCallbackError (a CommError) naming the op and the code ("the reduce_scatter callback
// returned 3"); every later collective then fails with CommCallbackError too, without calling any
// callback. (The C ABI reports it as ZERO_ERR_CALLBACK.)
//
// Timeouts: NOT enforced. timeout() is kept (and passed on by split()), but a callback that never
// returns blocks its Work, every later one and the destructor forever: bound the time inside the
// callbacks.
//
// Bitwise agreement between ranks, and the reduction rules of communicator.h (16-bit sums in
// fp32, Max propagating NaN), are the callbacks' responsibility.
#pragma once

#include <cstddef>
#include <memory>

#include "zero/base/error.h"
#include "zero/comm/communicator.h"

namespace zero {

// A collective failed because a callback did (returned non-zero or threw), or an earlier one had.
class CommCallbackError : public CommError {
 public:
  using CommError::CommError;
};

// Mirrors zero_comm_callbacks of zero/zero_c.h field for field (zero/comm does not include the C
// header). Codes are the C header's: dtype 0 fp32, 1 fp16, 2 bf16, 3 fp64 (ZERO_DTYPE_*); op 0
// sum, 1 avg, 2 max (ZERO_OP_*). Each collective callback blocks until the collective is done on
// this rank and returns 0 on success, anything else on failure. Sizes are in elements:
//   reduce_scatter: send holds size × recv_elems; rank r's recv gets the reduction over ranks of
//                   send[r·recv_elems, (r+1)·recv_elems)
//   all_gather:     recv (size × send_elems) gets rank q's send at [q·send_elems, ...)
//   all_reduce:     recv gets the elementwise reduction of every rank's send (send may == recv)
//   broadcast:      buffer on every rank gets root's buffer
struct CommCallbacks {
  void* user = nullptr;  // passed to every callback
  int rank = 0;
  int size = 1;
  int (*reduce_scatter)(void* user, const void* send, void* recv, std::size_t recv_elems, int dtype,
                        int op) = nullptr;
  int (*all_gather)(void* user, const void* send, void* recv, std::size_t send_elems,
                    int dtype) = nullptr;
  int (*all_reduce)(void* user, const void* send, void* recv, std::size_t elems, int dtype,
                    int op) = nullptr;
  int (*broadcast)(void* user, void* buffer, std::size_t elems, int dtype, int root) = nullptr;
  int (*barrier)(void* user) = nullptr;
  // Called once, from the communicator's destructor after every issued collective has run. May
  // be null.
  void (*destroy)(void* user) = nullptr;
};

// This rank's endpoint over `callbacks` (copied); backend_name() "callbacks".
// REQUIRES (checked, zero::Error): size >= 1, 0 <= rank < size, every function but destroy
// non-null. When this throws, destroy is not called: `user` stays the caller's.
//
// split(color, key) all-gathers every rank's (color, key) through the callbacks. The callbacks
// reach the whole world only, so a group of more than one rank cannot be carried: if any color
// (>= 0) is shared by two ranks, every rank throws zero::Error naming the groups. Otherwise a
// rank with a negative color gets nullptr and the others a one-rank communicator of their own.
std::unique_ptr<Communicator> make_callback_communicator(const CommCallbacks& callbacks,
                                                         const CommOptions& options = {});

}  // namespace zero
