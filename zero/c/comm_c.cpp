// zero_comm_*: the communicators a C caller can build an engine over (zero/zero_c.h).
#include <chrono>
#include <memory>
#include <string>

#include "zero/c/handles.h"
#include "zero/c/status.h"
#include "zero/comm/callback_comm.h"
#include "zero/comm/launcher_env.h"
#include "zero/comm/shm_comm.h"

namespace {

using zero::c_abi::guarded;

zero::CommOptions options_of(int timeout_ms) {
  ZERO_C_REQUIRE(timeout_ms >= 0, "timeout_ms is {}; expected 0 (the default, 300 s) or more",
                 timeout_ms);
  zero::CommOptions options;
  if (timeout_ms > 0) options.timeout = std::chrono::milliseconds(timeout_ms);
  return options;
}

const char* static_backend_name(const zero::Communicator& comm) {
  const std::string name = comm.backend_name();
  if (name == "shm") return "shm";
  if (name == "mpi") return "mpi";
  if (name == "callbacks") return "callbacks";
  return "inproc";
}

int make_handle(std::unique_ptr<zero::Communicator> comm, zero_comm** out) {
  auto handle = std::make_unique<zero_comm>();
  handle->backend = static_backend_name(*comm);
  handle->comm = std::move(comm);
  *out = handle.release();
  return ZERO_OK;
}

const zero::Communicator& checked(const zero_comm* comm) {
  ZERO_C_REQUIRE(comm != nullptr && comm->comm != nullptr, "comm is null");
  return *comm->comm;
}

zero::Communicator& checked(zero_comm* comm) {
  ZERO_C_REQUIRE(comm != nullptr && comm->comm != nullptr, "comm is null");
  return *comm->comm;
}

zero::DType dtype_of(int dtype) {
  switch (dtype) {
    case ZERO_DTYPE_F32: return zero::DType::F32;
    case ZERO_DTYPE_F16: return zero::DType::F16;
    case ZERO_DTYPE_BF16: return zero::DType::BF16;
    case ZERO_DTYPE_F64: return zero::DType::F64;
    default: break;
  }
  throw zero::c_abi::ArgumentError(
      fmt::format("dtype is {}; expected ZERO_DTYPE_F32 (0), F16 (1), BF16 (2) or F64 (3)", dtype));
}

zero::ReduceOp op_of(int op) {
  switch (op) {
    case ZERO_OP_SUM: return zero::ReduceOp::Sum;
    case ZERO_OP_AVG: return zero::ReduceOp::Avg;
    case ZERO_OP_MAX: return zero::ReduceOp::Max;
    default: break;
  }
  throw zero::c_abi::ArgumentError(
      fmt::format("op is {}; expected ZERO_OP_SUM (0), ZERO_OP_AVG (1) or ZERO_OP_MAX (2)", op));
}

}  // namespace

extern "C" {

int zero_comm_create_env(int timeout_ms, zero_comm** out) {
  return guarded("zero_comm_create_env", [&] {
    ZERO_C_REQUIRE(out != nullptr, "out is null");
    make_handle(zero::make_env_communicator(options_of(timeout_ms)), out);
  });
}

int zero_comm_create_shm(const char* name, int rank, int world_size, int timeout_ms,
                         zero_comm** out) {
  return guarded("zero_comm_create_shm", [&] {
    ZERO_C_REQUIRE(out != nullptr, "out is null");
    ZERO_C_REQUIRE(name != nullptr, "name is null");
    make_handle(zero::make_shm_communicator(name, rank, world_size, options_of(timeout_ms)), out);
  });
}

int zero_comm_create_mpi(int timeout_ms, zero_comm** out) {
  return guarded("zero_comm_create_mpi", [&] {
    ZERO_C_REQUIRE(out != nullptr, "out is null");
    make_handle(zero::make_communicator("mpi", options_of(timeout_ms)), out);
  });
}

int zero_comm_create_callbacks(const zero_comm_callbacks* callbacks, zero_comm** out) {
  return guarded("zero_comm_create_callbacks", [&] {
    ZERO_C_REQUIRE(out != nullptr, "out is null");
    ZERO_C_REQUIRE(callbacks != nullptr, "callbacks is null");
    const zero_comm_callbacks& c = *callbacks;
    ZERO_C_REQUIRE(c.size >= 1 && c.rank >= 0 && c.rank < c.size,
                   "callbacks->rank is {} and size {}; expected 0 <= rank < size", c.rank, c.size);
    ZERO_C_REQUIRE(c.reduce_scatter && c.all_gather && c.all_reduce && c.broadcast && c.barrier,
                   "every callback but destroy must be set (reduce_scatter, all_gather, "
                   "all_reduce, broadcast, barrier)");
    const zero::CommCallbacks table{c.user,           c.rank,       c.size,
                                    c.reduce_scatter, c.all_gather, c.all_reduce,
                                    c.broadcast,      c.barrier,    c.destroy};
    make_handle(zero::make_callback_communicator(table), out);
  });
}

int zero_comm_rank(const zero_comm* comm, int* rank) {
  return guarded("zero_comm_rank", [&] {
    ZERO_C_REQUIRE(rank != nullptr, "rank is null");
    *rank = checked(comm).rank();
  });
}

int zero_comm_size(const zero_comm* comm, int* size) {
  return guarded("zero_comm_size", [&] {
    ZERO_C_REQUIRE(size != nullptr, "size is null");
    *size = checked(comm).size();
  });
}

int zero_comm_backend(const zero_comm* comm, const char** name) {
  return guarded("zero_comm_backend", [&] {
    ZERO_C_REQUIRE(name != nullptr, "name is null");
    checked(comm);
    *name = comm->backend;
  });
}

int zero_comm_all_reduce(zero_comm* comm, const void* send, void* recv, size_t elems, int dtype,
                         int op) {
  return guarded("zero_comm_all_reduce", [&] {
    checked(comm).all_reduce(send, recv, elems, dtype_of(dtype), op_of(op)).wait();
  });
}

int zero_comm_broadcast(zero_comm* comm, void* buffer, size_t elems, int dtype, int root) {
  return guarded("zero_comm_broadcast",
                 [&] { checked(comm).broadcast(buffer, elems, dtype_of(dtype), root).wait(); });
}

int zero_comm_barrier(zero_comm* comm) {
  return guarded("zero_comm_barrier", [&] { checked(comm).barrier().wait(); });
}

int zero_comm_destroy(zero_comm* comm) {
  delete comm;  // communicator destructors never throw (STYLE.md, Errors)
  return ZERO_OK;
}

}  // extern "C"
