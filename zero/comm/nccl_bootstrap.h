// How the ranks of a new NCCL communicator agree on its unique id: the root makes it and
// broadcasts its 128 bytes over a host communicator the launcher already gave (ShmComm on one
// host, MpiComm across hosts; launcher_env.h). No NCCL dependency, so a CPU test checks it over
// InProcComm.
#pragma once

#include <array>
#include <cstddef>
#include <functional>

#include "zero/comm/communicator.h"

namespace zero {

// NCCL_UNIQUE_ID_BYTES.
inline constexpr std::size_t kNcclUniqueIdBytes = 128;
using NcclIdBytes = std::array<std::byte, kNcclUniqueIdBytes>;

// Collective over `host`: rank `root` calls `make_id` (ncclGetUniqueId) and every rank returns
// its bytes. A failure of make_id on the root is sent as an all-zero id and turned into CommError
// on every rank (nobody waits for a communicator that will not come); the root rethrows its own
// error. Throws CommError when the broadcast fails or times out (host's timeout).
NcclIdBytes share_unique_id(Communicator& host, int root,
                            const std::function<NcclIdBytes()>& make_id);

}  // namespace zero
