#include "zero/comm/callback_comm.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "zero/base/error.h"
#include "zero/comm/comm_thread.h"
#include "zero/comm/inproc_comm.h"

namespace zero {
namespace {

// The C header's ZERO_DTYPE_* and ZERO_OP_* values.
int dtype_code(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::BF16: return 2;
    case DType::F64: return 3;
  }
  return -1;
}

int op_code(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return 0;
    case ReduceOp::Avg: return 1;
    case ReduceOp::Max: return 2;
  }
  return -1;
}

class CallbackComm final : public Communicator {
 public:
  CallbackComm(const CommCallbacks& callbacks, const CommOptions& options)
      : Communicator(options), cb_(callbacks) {}

  ~CallbackComm() override {
    // Every callback has returned before the table's owner is told to go away.
    thread_.join();
    if (cb_.destroy == nullptr) return;
    try {
      cb_.destroy(cb_.user);
    } catch (...) {  // NOLINT(bugprone-empty-catch): destructors never throw
    }
  }

  int rank() const override { return cb_.rank; }
  int size() const override { return cb_.size; }
  std::string backend_name() const override { return "callbacks"; }

 protected:
  Work start_impl(const CollectiveArgs& args) override {
    return thread_.submit([this, args] { run(args); });
  }

  std::unique_ptr<Communicator> split_impl(int color, int key) override;

 private:
  // Communication thread only.
  void run(const CollectiveArgs& a) {
    if (!failure_.empty()) {
      const std::string message =
          fmt::format("CallbackComm rank {} of {}: {} not run: an earlier collective failed: {}",
                      rank(), size(), describe(a, size()), failure_);
      if (failure_was_callback_) throw CommCallbackError(message);
      throw CommError(message);
    }
    try {
      run_impl(a);
    } catch (const std::exception& e) {
      failure_ = e.what();
      failure_was_callback_ = dynamic_cast<const CommCallbackError*>(&e) != nullptr;
      throw;
    }
  }

  void run_impl(const CollectiveArgs& a) {
    if (a.kind == Collective::Barrier) {
      call(a, [&] { return cb_.barrier(cb_.user); });
      return;
    }
    if (a.elems == 0) return;
    const int dtype = dtype_code(a.dtype);
    const std::size_t chunk_bytes = a.elems * dtype_size(a.dtype);
    // In place: this rank's chunk of the size() × elems buffer.
    auto own_chunk = [&] {
      return static_cast<char*>(a.recv) + static_cast<std::size_t>(rank()) * chunk_bytes;
    };
    switch (a.kind) {
      case Collective::ReduceScatter: {
        const int op = op_code(a.op);
        if (!a.in_place) {
          call(a, [&] { return cb_.reduce_scatter(cb_.user, a.send, a.recv, a.elems, dtype, op); });
          return;
        }
        void* scratch = scratch_for(chunk_bytes);
        call(a, [&] { return cb_.reduce_scatter(cb_.user, a.send, scratch, a.elems, dtype, op); });
        std::memcpy(own_chunk(), scratch, chunk_bytes);
        return;
      }
      case Collective::AllGather: {
        const void* send = a.send;
        if (a.in_place) {
          void* scratch = scratch_for(chunk_bytes);
          std::memcpy(scratch, own_chunk(), chunk_bytes);
          send = scratch;
        }
        call(a, [&] { return cb_.all_gather(cb_.user, send, a.recv, a.elems, dtype); });
        return;
      }
      case Collective::AllReduce: {
        const int op = op_code(a.op);
        call(a, [&] { return cb_.all_reduce(cb_.user, a.send, a.recv, a.elems, dtype, op); });
        return;
      }
      case Collective::Broadcast:
        call(a, [&] { return cb_.broadcast(cb_.user, a.recv, a.elems, dtype, a.root); });
        return;
      case Collective::AllToAll: {
        // No all-to-all callback: every rank's whole input is all-gathered (size() times the
        // bytes of a real all-to-all) and each keeps the blocks addressed to it.
        const std::size_t world = static_cast<std::size_t>(size());
        auto* gathered = static_cast<char*>(scratch_for(world * world * chunk_bytes));
        call(a, [&] {
          return cb_.all_gather(cb_.user, a.send, gathered, world * a.elems, dtype);
        });
        for (std::size_t q = 0; q < world; ++q) {
          std::memcpy(static_cast<char*>(a.recv) + q * chunk_bytes,
                      gathered + (q * world + static_cast<std::size_t>(rank())) * chunk_bytes,
                      chunk_bytes);
        }
        return;
      }
      case Collective::Barrier: return;
    }
  }

  // Runs one callback; a non-zero return or an exception becomes CommError naming the op.
  template <typename F>
  void call(const CollectiveArgs& a, F&& callback) {
    int rc = 0;
    try {
      rc = callback();
    } catch (const std::exception& e) {
      throw CommCallbackError(
          fmt::format("CallbackComm rank {} of {}: the {} callback threw: {} ({})", rank(), size(),
                      collective_name(a.kind), e.what(), describe(a, size())));
    } catch (...) {
      throw CommCallbackError(fmt::format(
          "CallbackComm rank {} of {}: the {} callback threw a non-standard exception ({})", rank(),
          size(), collective_name(a.kind), describe(a, size())));
    }
    if (rc != 0) {
      throw CommCallbackError(
          fmt::format("CallbackComm rank {} of {}: the {} callback returned {} ({})", rank(),
                      size(), collective_name(a.kind), rc, describe(a, size())));
    }
  }

  void* scratch_for(std::size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }

  const CommCallbacks cb_;
  std::string failure_;                // communication thread only
  bool failure_was_callback_ = false;  // communication thread only
  std::vector<std::byte> scratch_;     // communication thread only
  comm_detail::CommThread thread_;     // last: joined before the members its ops use go away
};

std::unique_ptr<Communicator> CallbackComm::split_impl(int color, int key) {
  const auto world = static_cast<std::size_t>(size());
  // fp64 carries every int exactly, and is a dtype every callback table supports.
  const std::array<double, 2> mine = {static_cast<double>(color), static_cast<double>(key)};
  std::vector<double> all(2 * world);
  all_gather(mine.data(), all.data(), mine.size(), DType::F64).wait();

  std::map<int, std::vector<int>> ranks_by_color;
  for (std::size_t q = 0; q < world; ++q) {
    const auto c = static_cast<int>(all[2 * q]);
    if (c >= 0) ranks_by_color[c].push_back(static_cast<int>(q));
  }
  std::vector<std::string> shared;
  for (const auto& [c, ranks] : ranks_by_color) {
    if (ranks.size() > 1)
      shared.push_back(fmt::format("color {}: ranks [{}]", c, fmt::join(ranks, ", ")));
  }
  if (!shared.empty()) {
    throw Error(fmt::format(
        "CallbackComm::split(color {}, key {}) on rank {} of {}: a callback communicator's "
        "collectives reach the whole world only, so it can split into groups of one rank only, "
        "but {}",
        color, key, rank(), size(), fmt::join(shared, "; ")));
  }
  if (color < 0) return nullptr;
  InProcWorld self(1, CommOptions{timeout()});
  return self.comm(0);
}

}  // namespace

std::unique_ptr<Communicator> make_callback_communicator(const CommCallbacks& callbacks,
                                                         const CommOptions& options) {
  ZERO_CHECK(callbacks.size >= 1, "callback communicator: size must be at least 1, got {}",
             callbacks.size);
  ZERO_CHECK(callbacks.rank >= 0 && callbacks.rank < callbacks.size,
             "callback communicator: rank {} out of range for size {}", callbacks.rank,
             callbacks.size);
  std::vector<std::string_view> missing;
  if (callbacks.reduce_scatter == nullptr) missing.push_back("reduce_scatter");
  if (callbacks.all_gather == nullptr) missing.push_back("all_gather");
  if (callbacks.all_reduce == nullptr) missing.push_back("all_reduce");
  if (callbacks.broadcast == nullptr) missing.push_back("broadcast");
  if (callbacks.barrier == nullptr) missing.push_back("barrier");
  ZERO_CHECK(missing.empty(),
             "callback communicator (rank {} of {}): null callbacks: {} (only destroy may be null)",
             callbacks.rank, callbacks.size, fmt::join(missing, ", "));
  return std::make_unique<CallbackComm>(callbacks, options);
}

}  // namespace zero
