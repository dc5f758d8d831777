// The two AsyncIo backends (internal to offload/; make_async_io() chooses).
#pragma once

#include <memory>
#include <string>

#include "offload/async_io.h"

namespace zero::offload::detail {

std::unique_ptr<AsyncIo> make_thread_io(const AioOptions& options);
// Null, with `why` set, when io_uring is not built in or the kernel refuses a ring.
std::unique_ptr<AsyncIo> make_uring_io(const AioOptions& options, std::string& why);

}  // namespace zero::offload::detail
