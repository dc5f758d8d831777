// Asynchronous file I/O for the NVMe tier (the `aio` block of a ds_config).
//
// A caller submits a batch of reads and writes and gets a ticket; wait(ticket) blocks until every
// request of the batch has finished and throws IoError — naming the operation, the file, the
// offset and the reason — for the first one that failed. Requests are cut into `block_size`
// pieces; at most `queue_depth` pieces are in flight. Two backends do the same work:
//   io_uring  one thread owns a ring (liburing), keeps it filled as pieces complete;
//   threads   `intra_op_parallelism` threads doing pread/pwrite, used when io_uring is not built
//             in or the kernel refuses a ring (said once, in the log).
// name() says which one runs. Neither retries: a short read is an error (the tier never reads
// past what it wrote), a short write or ENOSPC is an error.
//
// Fault injection (tests, and the fault-injecting runs the offload issue asks for): set_fault()
// installs a function consulted before every piece with its call index (0, 1, ... over the
// object's life); it can fail the piece with an errno, or make it short (half the bytes move).
//
// Thread safety: submit() and wait() may be called from any thread; a ticket is waited once.
// The buffers of a batch must stay valid until its wait() returns (or the AsyncIo is destroyed,
// which waits for everything in flight).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zero::offload {

struct AioOptions {
  std::size_t block_size = std::size_t{1} << 20;  // aio.block_size: bytes per piece
  int queue_depth = 8;                            // aio.queue_depth: pieces in flight
  int threads = 1;                                // aio.intra_op_parallelism (threads backend)
  bool single_submit = false;  // aio.single_submit: one piece per submission system call
  bool overlap_events = true;  // aio.overlap_events: refill as pieces complete (else in batches)
  enum class Backend { Auto, Uring, Threads } backend = Backend::Auto;
};

enum class IoOp : std::uint8_t { Read, Write };

struct IoRequest {
  IoOp op = IoOp::Read;
  int fd = -1;
  void* data = nullptr;
  std::size_t bytes = 0;
  std::uint64_t offset = 0;
  std::string file;  // for error messages
};

// What an injected fault does to one piece.
struct Fault {
  enum class Kind { None, Error, Short } kind = Kind::None;
  int error = 0;  // errno for Kind::Error (EIO, ENOSPC, ...)
};
using FaultFn = std::function<Fault(std::uint64_t call_index, const IoRequest& piece)>;

class AsyncIo {
 public:
  using Ticket = std::uint64_t;
  virtual ~AsyncIo() = default;
  AsyncIo(const AsyncIo&) = delete;
  AsyncIo& operator=(const AsyncIo&) = delete;

  // "io_uring" or "threads".
  virtual std::string_view name() const = 0;
  // Starts every request of `batch`; returns at once. An empty batch is a valid ticket.
  virtual Ticket submit(std::vector<IoRequest> batch) = 0;
  // Blocks until the batch finished; throws IoError for its first failed piece.
  virtual void wait(Ticket ticket) = 0;
  // Pieces started so far (the index the next fault call sees).
  virtual std::uint64_t calls() const = 0;
  // Installs (or with nullptr removes) a fault function. Call before submitting.
  virtual void set_fault(FaultFn fault) = 0;

 protected:
  AsyncIo() = default;
};

// The backend `options.backend` names; Auto is io_uring when it is built in and the kernel gives
// a ring, else the thread pool, with one log note saying why.
std::unique_ptr<AsyncIo> make_async_io(const AioOptions& options);

}  // namespace zero::offload
