// Fault injection for tests: a Communicator that forwards to another one and fails its N-th call.
//
// Calls are counted across collectives and split(), from 1. The failing call never reaches the
// wrapped communicator, so on a multi-rank group the peers of the failing rank see a missing
// rank (InProcComm: a timeout naming it, or a prompt abort when run_ranks sees the exception).
// Forwarded collectives use the wrapped communicator's timeout.
#pragma once

#include <cstddef>
#include <memory>

#include "zero/comm/communicator.h"

namespace zero {

class FaultyCommunicator final : public Communicator {
 public:
  enum class Mode {
    ThrowOnCall,  // the N-th call throws CommError at once
    FailOnWait,   // the N-th call returns a Work whose wait()/test() throws CommError
  };

  // REQUIRES: `inner` outlives this wrapper. fail_call 0 never fails.
  FaultyCommunicator(Communicator& inner, std::size_t fail_call, Mode mode = Mode::ThrowOnCall);

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend_name() const override;

  // Calls made so far, the failed one included.
  std::size_t calls() const { return calls_; }

 protected:
  Work start_impl(const CollectiveArgs& args) override;
  std::unique_ptr<Communicator> split_impl(int color, int key) override;

 private:
  // Counts the call; returns the error to inject, or an empty string.
  std::string count(const std::string& what);

  Communicator& inner_;
  const std::size_t fail_call_;
  const Mode mode_;
  std::size_t calls_ = 0;
};

}  // namespace zero
