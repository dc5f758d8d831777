#include "zero/comm/testing/faulty_communicator.h"

#include <fmt/format.h>

#include "zero/base/error.h"

namespace zero {

namespace {
class FailedWork final : public WorkState {
 public:
  explicit FailedWork(std::string message) : message_(std::move(message)) {}
  void wait() override { throw CommError(message_); }
  bool test() override { throw CommError(message_); }

 private:
  std::string message_;
};
}  // namespace

FaultyCommunicator::FaultyCommunicator(Communicator& inner, std::size_t fail_call, Mode mode)
    : Communicator(CommOptions{inner.timeout()}),
      inner_(inner),
      fail_call_(fail_call),
      mode_(mode) {}

std::string FaultyCommunicator::backend_name() const {
  return fmt::format("faulty({})", inner_.backend_name());
}

std::string FaultyCommunicator::count(const std::string& what) {
  ++calls_;
  if (calls_ != fail_call_) return {};
  return fmt::format("FaultyCommunicator: injected failure of call #{} ({}) on rank {}", calls_,
                     what, rank());
}

Work FaultyCommunicator::start_impl(const CollectiveArgs& args) {
  const std::string error = count(describe(args, size()));
  if (error.empty()) return inner_.start(args);
  if (mode_ == Mode::ThrowOnCall) throw CommError(error);
  return Work(std::make_shared<FailedWork>(error));
}

std::unique_ptr<Communicator> FaultyCommunicator::split_impl(int color, int key) {
  const std::string error = count(fmt::format("split (color {}, key {})", color, key));
  if (!error.empty()) throw CommError(error);
  return inner_.split(color, key);
}

}  // namespace zero
