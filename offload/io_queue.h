// The part both AsyncIo backends share (internal to offload/): batches cut into pieces, a queue
// of pieces for the backend's worker threads, per-batch completion and the first error, fault
// injection, and the blocking pread/pwrite of one piece.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "offload/async_io.h"

namespace zero::offload::detail {

struct Piece {
  IoRequest request;  // one block of a request (file name shared through the batch)
  AsyncIo::Ticket ticket = 0;
  Fault fault;  // decided when the piece is taken
};

class IoQueue : public AsyncIo {
 public:
  explicit IoQueue(const AioOptions& options) : options_(options) {}

  Ticket submit(std::vector<IoRequest> batch) override;
  void wait(Ticket ticket) override;
  std::uint64_t calls() const override;
  void set_fault(FaultFn fault) override;

 protected:
  // Backends: up to `max` pieces, blocking while the queue is empty unless `block` is false.
  // Empty when stopping (and the queue drained) or, non-blocking, when nothing is queued.
  std::vector<Piece> take(std::size_t max, bool block);
  // Reports a piece done: `moved` bytes transferred, or -errno.
  void complete(const Piece& piece, long long moved);
  // Runs one piece with pread/pwrite on the calling thread (honouring its fault).
  static long long run_blocking(const Piece& piece);
  // Ends take(): called by the backend's destructor before joining its threads.
  void stop();
  const AioOptions& options() const { return options_; }

 private:
  struct Batch {
    std::size_t pending = 0;
    std::optional<std::string> error;
  };
  const AioOptions options_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<Piece> queue_;
  std::unordered_map<Ticket, Batch> batches_;
  Ticket next_ticket_ = 1;
  std::uint64_t calls_ = 0;
  FaultFn fault_;
  bool stopping_ = false;
};

}  // namespace zero::offload::detail
