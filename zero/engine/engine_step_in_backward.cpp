// The optimizer step taken during backward, unit by unit as every rank's gradients of a unit
// complete (EngineImpl::StepInBackward in engine_impl.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

#include "zero/base/timer.h"
#include "zero/engine/engine_impl.h"

namespace zero::engine_detail {
namespace {

// The board is one block of the shared host arena, which takes blocks of 64 KiB and more.
constexpr std::size_t kBoardMinBytes = std::size_t{64} << 10;
// How long step()'s start waits for the next post of a peer still in backward before it leaves
// the rest to the step's collectives (which notice a peer that failed; a wait here would not).
constexpr auto kPostWait = std::chrono::milliseconds(250);
// Polls back to back (yielding the core) for this long after a post, then sleeps this long
// between polls, so that a rank sharing its core with a peer still in backward (more ranks
// than cores) leaves it the core.
constexpr auto kPollSpin = std::chrono::milliseconds(1);
constexpr auto kPollSleep = std::chrono::microseconds(20);

std::uint64_t load_acquire(const std::uint64_t& word) {
  // A read-only view of a peer's board: an atomic load never writes.
  return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(word))
      .load(std::memory_order_acquire);
}

}  // namespace

bool EngineImpl::may_step_in_backward() const {
  return !in_backward_.off && !in_backward_.unreadable && ignore_unused_ && norm_after_step() &&
         may_fuse_reduction() && reducer_->holds_lone_units() &&
         compute_.optimizer_step_summed != nullptr;
}

void EngineImpl::set_up_step_in_backward() {
  StepInBackward& b = in_backward_;
  if (b.set_up) return;
  b.set_up = true;
  // One post per layout unit, then the rank's arrival in step().
  const std::size_t bytes = std::max((layout_units_ + 1) * sizeof(BoardPost), kBoardMinBytes);
  b.board = device_.allocate(bytes, MemoryKind::Device, MemoryTag::Staging);
  std::memset(b.board.data(), 0, bytes);
  // Every rank's board address, as 64-bit words an fp64 all-gather copies bit for bit.
  static_assert(sizeof(void*) == sizeof(double));
  const auto W = static_cast<std::size_t>(world_);
  std::vector<const void*> all(W);
  all[static_cast<std::size_t>(rank_)] = b.board.data();
  comm_.all_gather_in_place(all.data(), 1, DType::F64).wait();
  b.boards.assign(W, nullptr);
  float cannot = 0.0f;
  for (int q = 0; q < world_; ++q) {
    const void* view = comm_.peer_readable(q, all[static_cast<std::size_t>(q)], bytes);
    b.boards[static_cast<std::size_t>(q)] = static_cast<const BoardPost*>(view);
    if (view == nullptr) cannot = 1.0f;
  }
  // Every rank steps in backward or none does (one that cannot read a board would never step,
  // and its peers would wait for nothing, but the rule is simpler).
  comm_.all_reduce(&cannot, &cannot, 1, DType::F32, ReduceOp::Max).wait();
  b.unreadable = cannot != 0.0f;
}

bool EngineImpl::arm_step_in_backward() {
  StepInBackward& b = in_backward_;
  if (b.decided) return b.armed;
  b.decided = true;
  // A push is set up by a step (a collective), so a model that pushes steps in backward from the
  // step after.
  const bool pushes = may_push_model();
  b.armed = b.set_up && b.allowed && at_boundary() && may_step_in_backward() &&
            (!pushes || push_.set_up);
  if (!b.armed) return false;
  b.push = pushes && push_.pushed_units > 0;
  b.epoch = static_cast<std::uint64_t>(global_steps_) + 1;
  b.waiting.clear();
  // The step's coefficients, fixed now: at the first unit the boundary's backward completes,
  // which every rank reaches before its step(). A peer may step a unit before this rank does, or this
  // rank none at all, so an lr set between backward and step() must be the next step's on every
  // rank alike, whatever each has stepped (nothing collective: norm_after_step()).
  b.plan = plan_step();
  optimizer_->begin_early(true);
  return true;
}

void EngineImpl::unit_completed_in_backward(int unit) {
  if (!arm_step_in_backward()) return;
  StepInBackward& b = in_backward_;
  bool accumulate = false;
  const std::byte* buffer = static_cast<std::size_t>(unit) < layout_units_
                                ? reducer_->waiting_alone(unit, &accumulate)
                                : nullptr;
  if (buffer != nullptr) {
    auto* board = static_cast<BoardPost*>(b.board.data());
    BoardPost& post = board[static_cast<std::size_t>(unit)];
    post.address = reinterpret_cast<std::uint64_t>(buffer);
    // The gradient bytes and the address before the epoch: a peer that reads this epoch sees them.
    std::atomic_ref<std::uint64_t>(post.epoch).store(b.epoch, std::memory_order_release);
    b.waiting.push_back(unit);
  }
  step_posted_units();
}

void EngineImpl::step_posted_units() {
  StepInBackward& b = in_backward_;
  if (!b.armed || b.waiting.empty()) return;
  const auto W = static_cast<std::size_t>(world_);
  std::size_t kept = 0;
  for (const int unit : b.waiting) {
    const auto u = static_cast<std::size_t>(unit);
    bool everywhere = true;
    for (std::size_t q = 0; q < W && everywhere; ++q) {
      everywhere = load_acquire(b.boards[q][u].epoch) == b.epoch;
    }
    if (!everywhere) {
      b.waiting[kept++] = unit;
      continue;
    }
    const std::size_t bytes = layout_->unit(unit).padded_elems * dtype_size(reducer_->comm_dtype());
    b.sources.assign(W, nullptr);
    bool readable = true;
    for (std::size_t q = 0; q < W; ++q) {
      const auto* remote = reinterpret_cast<const void*>(b.boards[q][u].address);
      b.sources[q] = static_cast<const std::byte*>(
          comm_.peer_readable(static_cast<int>(q), remote, bytes));
      readable = readable && b.sources[q] != nullptr;
    }
    // This rank's own slice may lie only in its own memory (GradientReducer::lend_own_slice).
    b.sources[static_cast<std::size_t>(rank_)] = reducer_->local_view(unit);
    if (!readable) continue;  // step() sums it (or has it reduced) with the rest
    ScopedTimer timer(timings_.step_in_backward_s);
    bool accumulate = false;
    (void)reducer_->waiting_alone(unit, &accumulate);
    b.adds = accumulate;
    b.unit = unit;
    push_.active = b.push;
    struct Done {
      EngineImpl& e;
      ~Done() {
        e.in_backward_.unit = -1;
        e.end_push();
      }
    } done{*this};
    optimizer_->step_unit(unit, b.plan->hypers, b.plan->scalars);
    ++timings_.units_stepped_in_backward;
  }
  b.waiting.resize(kept);
}

void EngineImpl::step_posted_units_until_arrived() {
  StepInBackward& b = in_backward_;
  if (!b.set_up || b.unreadable || !at_boundary()) return;
  const auto W = static_cast<std::size_t>(world_);
  const std::uint64_t epoch = static_cast<std::uint64_t>(global_steps_) + 1;
  auto* board = static_cast<BoardPost*>(b.board.data());
  // After every post of this rank's: a peer that reads the arrival sees them all.
  std::atomic_ref<std::uint64_t>(board[layout_units_].epoch)
      .store(epoch, std::memory_order_release);
  if (!b.armed) return;
  auto arrived = [&] {
    for (std::size_t q = 0; q < W; ++q) {
      if (load_acquire(b.boards[q][layout_units_].epoch) != epoch) return false;
    }
    return true;
  };
  // A peer that has not arrived is still in backward and may post more: each post is stepped as
  // it comes, while the step's collectives could only wait. A peer that posts nothing for
  // kPostWait leaves the rest to them.
  auto last_post = std::chrono::steady_clock::now();
  for (;;) {
    const std::size_t before = b.waiting.size();
    step_posted_units();
    if (b.waiting.empty()) return;
    if (arrived()) {
      step_posted_units();  // what they posted before arriving
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (b.waiting.size() < before) last_post = now;
    if (now - last_post > kPostWait) return;
    if (now - last_post < kPollSpin) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kPollSleep);
    }
  }
}

void EngineImpl::end_step_in_backward() {
  StepInBackward& b = in_backward_;
  if (b.armed) optimizer_->end_early();
  b.decided = b.armed = false;
  b.waiting.clear();
  b.plan.reset();
  b.unit = -1;
}

void EngineImpl::check_not_begun_in_backward(const char* what) const {
  ZERO_CHECK(!step_begun_in_backward(),
             "{} on rank {} between backward and step(): this micro-step's optimizer step has "
             "begun in backward (its units were stepped as their gradients completed), so the "
             "parameters and optimizer state are half stepped; call step() first, or turn the "
             "step in backward off (set_step_in_backward(false), or ZERO_STEP_IN_BACKWARD=0)",
             what, rank_);
}

void EngineImpl::set_accumulation_boundary(bool boundary) {
  ZERO_CHECK(boundary || !step_begun_in_backward(),
             "set_accumulation_boundary(false) on rank {}: this micro-step's optimizer step has "
             "begun in backward (its units were stepped as their gradients completed); mark the "
             "boundary before backward, or turn the step in backward off "
             "(set_step_in_backward(false), or ZERO_STEP_IN_BACKWARD=0)",
             rank_);
  forced_boundary_ = boundary;
}

void EngineImpl::clear_accumulation_boundary() {
  ZERO_CHECK(micro_in_window_ + 1 >= gas_ || !step_begun_in_backward(),
             "clear_accumulation_boundary on rank {}: this micro-step's optimizer step has begun "
             "in backward, and the count of gradient_accumulation_steps ({}) does not end the "
             "window here; mark the boundary before backward, or turn the step in backward off "
             "(set_step_in_backward(false), or ZERO_STEP_IN_BACKWARD=0)",
             rank_, gas_);
  forced_boundary_.reset();
}

}  // namespace zero::engine_detail
