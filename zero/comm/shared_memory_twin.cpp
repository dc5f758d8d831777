#include "zero/comm/shared_memory_twin.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <random>

#include "zero/base/error.h"
#include "zero/comm/shm_comm.h"
#include "zero/comm/shm_segment.h"

namespace zero::comm_detail {

std::string agreed_segment_name(Communicator& comm, std::string_view kind) {
  constexpr std::size_t kBytes = 256;
  std::array<char, kBytes> buf{};
  if (comm.rank() == 0) {
    std::random_device rd;
    const std::string name = fmt::format("zero-{}-{}-{:08x}{:08x}", kind, ::getpid(), rd(), rd());
    ZERO_ASSERT(name.size() < kBytes);
    std::memcpy(buf.data(), name.data(), name.size());
  }
  // A broadcast copies bytes; the dtype only sets the element size.
  comm.broadcast(buf.data(), kBytes / 4, DType::F32, 0).wait();
  return std::string(buf.data(), strnlen(buf.data(), kBytes));
}

std::unique_ptr<Communicator> shared_memory_twin(Communicator& group, const CommOptions& options) {
  if (group.size() == 1 || group.shares_address_space()) return nullptr;
  const std::string name = agreed_segment_name(group, "node");
  const std::string probe = ShmSegment::path_of(name + ".probe");
  if (group.rank() == 0) {
    const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) ::close(fd);
  }
  group.barrier().wait();
  // 1 where this rank sees rank 0's probe; the sum says whether all do.
  double seen = ::access(probe.c_str(), F_OK) == 0 ? 1.0 : 0.0;
  group.all_reduce(&seen, &seen, 1, DType::F64, ReduceOp::Sum).wait();
  if (group.rank() == 0) ::unlink(probe.c_str());
  if (seen != static_cast<double>(group.size())) return nullptr;
  return make_shm_communicator(name, group.rank(), group.size(), options);
}

}  // namespace zero::comm_detail
