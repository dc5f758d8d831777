#include "zero/comm/nccl_bootstrap.h"

#include <algorithm>
#include <exception>

#include "zero/base/error.h"

namespace zero {

NcclIdBytes share_unique_id(Communicator& host, int root,
                            const std::function<NcclIdBytes()>& make_id) {
  ZERO_CHECK(root >= 0 && root < host.size(),
             "NCCL bootstrap: root {} is out of range for {} ranks", root, host.size());
  // Moved as 32 fp32 words: a broadcast copies bits and never computes with them.
  static_assert(kNcclUniqueIdBytes % sizeof(float) == 0);
  alignas(float) NcclIdBytes id{};
  std::exception_ptr root_error;
  if (host.rank() == root) {
    try {
      id = make_id();
    } catch (...) {
      root_error = std::current_exception();
      id.fill(std::byte{0});
    }
  }
  host.broadcast(id.data(), kNcclUniqueIdBytes / sizeof(float), DType::F32, root).wait();
  if (root_error) std::rethrow_exception(root_error);
  const bool empty =
      std::all_of(id.begin(), id.end(), [](std::byte b) { return b == std::byte{0}; });
  ZERO_CHECK_AS(CommError, !empty,
                "NCCL bootstrap (rank {} of {}): root rank {} could not create the unique id "
                "(ncclGetUniqueId failed there; its error is in that rank's output)",
                host.rank(), host.size(), root);
  return id;
}

}  // namespace zero
