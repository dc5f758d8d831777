// The threads backend of AsyncIo: `intra_op_parallelism` threads, each taking one piece at a time
// and running it with pread/pwrite.
#include <thread>

#include "offload/io_backends.h"
#include "offload/io_queue.h"

namespace zero::offload::detail {
namespace {

class ThreadIo final : public IoQueue {
 public:
  explicit ThreadIo(const AioOptions& options) : IoQueue(options) {
    const int n = std::max(options.threads, 1);
    for (int i = 0; i < n; ++i) workers_.emplace_back([this] { run(); });
  }
  ~ThreadIo() override {
    stop();
    for (std::thread& t : workers_) t.join();
  }
  std::string_view name() const override { return "threads"; }

 private:
  void run() {
    for (;;) {
      std::vector<Piece> pieces = take(1, true);
      if (pieces.empty()) return;
      complete(pieces[0], run_blocking(pieces[0]));
    }
  }
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<AsyncIo> make_thread_io(const AioOptions& options) {
  return std::make_unique<ThreadIo>(options);
}

}  // namespace zero::offload::detail
