#include "offload/io_queue.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "zero/base/error.h"

namespace zero::offload::detail {

AsyncIo::Ticket IoQueue::submit(std::vector<IoRequest> batch) {
  const std::size_t block = std::max<std::size_t>(options_.block_size, 1);
  std::lock_guard lock(mu_);
  const Ticket ticket = next_ticket_++;
  Batch& b = batches_[ticket];
  for (IoRequest& r : batch) {
    for (std::size_t done = 0; done < r.bytes; done += block) {
      Piece p{r, ticket, {}};
      p.request.data = static_cast<std::byte*>(r.data) + done;
      p.request.bytes = std::min(block, r.bytes - done);
      p.request.offset = r.offset + done;
      queue_.push_back(std::move(p));
      ++b.pending;
    }
  }
  work_cv_.notify_all();
  return ticket;
}

void IoQueue::wait(Ticket ticket) {
  std::unique_lock lock(mu_);
  auto it = batches_.find(ticket);
  ZERO_CHECK(it != batches_.end(), "AsyncIo::wait: unknown or already waited ticket {}", ticket);
  done_cv_.wait(lock, [&] { return it->second.pending == 0; });
  std::optional<std::string> error = std::move(it->second.error);
  batches_.erase(it);
  if (error) throw IoError(*error);
}

std::uint64_t IoQueue::calls() const {
  std::lock_guard lock(mu_);
  return calls_;
}

void IoQueue::set_fault(FaultFn fault) {
  std::lock_guard lock(mu_);
  fault_ = std::move(fault);
}

std::vector<Piece> IoQueue::take(std::size_t max, bool block) {
  std::unique_lock lock(mu_);
  if (block) work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
  std::vector<Piece> out;
  while (!queue_.empty() && out.size() < max) {
    Piece p = std::move(queue_.front());
    queue_.pop_front();
    if (fault_) p.fault = fault_(calls_, p.request);
    ++calls_;
    out.push_back(std::move(p));
  }
  return out;
}

void IoQueue::complete(const Piece& piece, long long moved) {
  std::lock_guard lock(mu_);
  Batch& b = batches_.at(piece.ticket);
  const IoRequest& r = piece.request;
  if (!b.error && moved != static_cast<long long>(r.bytes)) {
    const char* op = r.op == IoOp::Read ? "read" : "write";
    const std::string why =
        moved < 0 ? std::string(std::strerror(static_cast<int>(-moved)))
                  : fmt::format("short {}: {} of {} bytes", op, moved, r.bytes);
    b.error = fmt::format("{} of {} bytes at offset {} of {} failed: {}", op, r.bytes, r.offset,
                          r.file, why);
  }
  if (--b.pending == 0) done_cv_.notify_all();
}

long long IoQueue::run_blocking(const Piece& piece) {
  const IoRequest& r = piece.request;
  if (piece.fault.kind == Fault::Kind::Error) return -piece.fault.error;
  // A short piece moves half its bytes (rounded down to the 4 KiB direct-I/O granule).
  const std::size_t want = piece.fault.kind == Fault::Kind::Short ? r.bytes / 2 / 4096 * 4096
                                                                   : r.bytes;
  std::size_t done = 0;
  while (done < want) {
    auto* p = static_cast<std::byte*>(r.data) + done;
    const auto off = static_cast<off_t>(r.offset + done);
    const ssize_t n = r.op == IoOp::Read ? ::pread(r.fd, p, want - done, off)
                                         : ::pwrite(r.fd, p, want - done, off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return static_cast<long long>(done);
}

void IoQueue::stop() {
  std::lock_guard lock(mu_);
  stopping_ = true;
  work_cv_.notify_all();
}

}  // namespace zero::offload::detail
