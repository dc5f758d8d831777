#include "offload/async_io.h"

#include <atomic>

#include "offload/io_backends.h"
#include "zero/base/error.h"
#include "zero/base/log.h"

namespace zero::offload {

std::unique_ptr<AsyncIo> make_async_io(const AioOptions& options) {
  ZERO_CHECK(options.queue_depth > 0, "aio.queue_depth must be positive, got {}",
             options.queue_depth);
  ZERO_CHECK(options.block_size > 0, "aio.block_size must be positive, got {}",
             options.block_size);
  if (options.backend == AioOptions::Backend::Threads) return detail::make_thread_io(options);
  std::string why;
  if (auto io = detail::make_uring_io(options, why)) return io;
  ZERO_CHECK(options.backend != AioOptions::Backend::Uring, "io_uring asked for, but {}", why);
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    log::note("NVMe I/O uses {} pread/pwrite thread(s): {}", std::max(options.threads, 1), why);
  }
  return detail::make_thread_io(options);
}

}  // namespace zero::offload
