// The io_uring backend of AsyncIo: one thread owns a ring of `queue_depth` entries and keeps it
// filled from the queue as pieces complete (or, without overlap_events, refills only once the
// ring is empty).
#include <cstring>
#include <thread>

#include "offload/io_backends.h"
#include "offload/io_queue.h"

#ifdef ZERO_HAVE_URING
#include <liburing.h>
#endif

namespace zero::offload::detail {

#ifdef ZERO_HAVE_URING
namespace {

class UringIo final : public IoQueue {
 public:
  UringIo(const AioOptions& options, io_uring ring) : IoQueue(options), ring_(ring) {
    worker_ = std::thread([this] { run(); });
  }
  ~UringIo() override {
    stop();
    worker_.join();
    io_uring_queue_exit(&ring_);
  }
  std::string_view name() const override { return "io_uring"; }

 private:
  void run() {
    const auto depth = static_cast<std::size_t>(std::max(options().queue_depth, 1));
    std::size_t inflight = 0;
    for (;;) {
      if (inflight < depth && (options().overlap_events || inflight == 0)) {
        std::vector<Piece> pieces = take(depth - inflight, inflight == 0);
        if (pieces.empty() && inflight == 0) return;  // stopping, queue drained
        for (Piece& p : pieces) inflight += start(std::move(p));
        if (!options().single_submit) io_uring_submit(&ring_);
      }
      if (inflight == 0) continue;
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        // The ring itself failed: every piece in flight fails with that error.
        fail_all(rc);
        inflight = 0;
        continue;
      }
      finish(cqe);
      --inflight;
      while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
        finish(cqe);
        --inflight;
      }
    }
  }

  // Puts a piece in the ring (1), or completes it at once when a fault decides it (0).
  std::size_t start(Piece piece) {
    if (piece.fault.kind != Fault::Kind::None) {
      complete(piece, run_blocking(piece));
      return 0;
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {  // cannot happen with at most queue_depth in flight; stay correct
      complete(piece, run_blocking(piece));
      return 0;
    }
    auto* owned = new Piece(std::move(piece));
    const IoRequest& r = owned->request;
    if (r.op == IoOp::Read) {
      io_uring_prep_read(sqe, r.fd, r.data, static_cast<unsigned>(r.bytes), r.offset);
    } else {
      io_uring_prep_write(sqe, r.fd, r.data, static_cast<unsigned>(r.bytes), r.offset);
    }
    io_uring_sqe_set_data(sqe, owned);
    in_ring_.push_back(owned);
    if (options().single_submit) io_uring_submit(&ring_);
    return 1;
  }

  void finish(io_uring_cqe* cqe) {
    auto* p = static_cast<Piece*>(io_uring_cqe_get_data(cqe));
    const long long res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    std::erase(in_ring_, p);
    complete(*p, res);
    delete p;
  }

  void fail_all(int error) {
    for (Piece* p : in_ring_) {
      complete(*p, error);
      delete p;
    }
    in_ring_.clear();
  }

  io_uring ring_;
  std::vector<Piece*> in_ring_;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<AsyncIo> make_uring_io(const AioOptions& options, std::string& why) {
  io_uring ring;
  const auto entries = static_cast<unsigned>(std::max(options.queue_depth, 1));
  const int rc = io_uring_queue_init(entries, &ring, 0);
  if (rc < 0) {
    why = std::string("the kernel refused an io_uring (") + std::strerror(-rc) + ")";
    return nullptr;
  }
  return std::make_unique<UringIo>(options, ring);
}

#else

std::unique_ptr<AsyncIo> make_uring_io(const AioOptions&, std::string& why) {
  why = "this build has no io_uring (liburing was not found at configure time)";
  return nullptr;
}

#endif

}  // namespace zero::offload::detail
