#include "zero/comm/mics_comm.h"

#include <fmt/format.h>

#include "zero/base/error.h"
#include "zero/comm/comm_thread.h"
#include "zero/comm/node_topology.h"

namespace zero {

std::unique_ptr<MicsComm> MicsComm::create(Communicator& world, int shard_size) {
  const int w = world.size();
  if (shard_size < 1 || shard_size > w || w % shard_size != 0) {
    throw ConfigError("zero_optimization.mics_shard_size",
                      fmt::format("{} does not divide the world size {}: shard groups hold equal "
                                  "blocks of consecutive ranks; use one of {}",
                                  shard_size, w, divisors_of(w)));
  }
  const int r = world.rank();
  auto shard = world.split(r / shard_size, r % shard_size);
  auto across = world.split(r % shard_size, r / shard_size);
  return std::unique_ptr<MicsComm>(
      new MicsComm(std::move(shard), std::move(across), r / shard_size, w / shard_size));
}

MicsComm::MicsComm(std::unique_ptr<Communicator> shard, std::unique_ptr<Communicator> across,
                   int replica, int replicas)
    : Communicator(CommOptions{shard->timeout()}),
      shard_(std::move(shard)),
      across_(std::move(across)),
      replica_(replica),
      replicas_(replicas),
      thread_(std::make_unique<comm_detail::CommThread>()) {}

MicsComm::~MicsComm() {
  thread_->join();
}

std::string MicsComm::backend_name() const {
  return fmt::format("mics({} x {})", shard_->backend_name(), replicas_);
}

Work MicsComm::start_impl(const CollectiveArgs& args) {
  return thread_->submit([this, args] { run(args); });
}

std::unique_ptr<Communicator> MicsComm::split_impl(int color, int key) {
  std::unique_ptr<Communicator> result;
  thread_->submit([&] { result = shard_->split(color, key); }).wait();
  return result;
}

void MicsComm::run(const CollectiveArgs& a) {
  shard_->start(a).wait();
  if (a.kind != Collective::ReduceScatter || replicas_ == 1 || a.elems == 0) return;
  void* chunk = a.in_place ? static_cast<std::byte*>(a.recv) +
                                 static_cast<std::size_t>(rank()) * a.elems * dtype_size(a.dtype)
                           : a.recv;
  across_->all_reduce(chunk, chunk, a.elems, a.dtype, a.op).wait();
}

}  // namespace zero
