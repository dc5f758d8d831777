#include "zero/device/memory_ledger.h"

#include <fmt/format.h>

#include "zero/base/error.h"
#include "zero/base/format.h"

namespace zero {

namespace {
std::size_t index(MemoryKind kind) {
  return static_cast<std::size_t>(kind);
}
std::size_t index(MemoryTag tag) {
  return static_cast<std::size_t>(tag);
}

void add(MemoryUsage& u, std::size_t bytes) {
  u.current_bytes += bytes;
  if (u.current_bytes > u.peak_bytes) u.peak_bytes = u.current_bytes;
  ++u.live_allocations;
  ++u.total_allocations;
}

void remove(MemoryUsage& u, std::size_t bytes) {
  ZERO_ASSERT(u.current_bytes >= bytes && u.live_allocations > 0);
  u.current_bytes -= bytes;
  --u.live_allocations;
}
}  // namespace

std::string_view memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::Device: return "device";
    case MemoryKind::PinnedHost: return "pinned_host";
    case MemoryKind::Host: return "host";
    case MemoryKind::Nvme: return "nvme";
  }
  return "?";
}

std::string_view memory_tag_name(MemoryTag tag) {
  switch (tag) {
    case MemoryTag::LowPrecisionParams: return "low_precision_params";
    case MemoryTag::Gradients: return "gradients";
    case MemoryTag::MasterParams: return "master_params";
    case MemoryTag::OptimizerStates: return "optimizer_states";
    case MemoryTag::Buckets: return "buckets";
    case MemoryTag::GatherBuffers: return "gather_buffers";
    case MemoryTag::SecondaryParams: return "secondary_params";
    case MemoryTag::Staging: return "staging";
    case MemoryTag::Other: return "other";
  }
  return "?";
}

const MemoryUsage& MemorySnapshot::at(MemoryKind kind, MemoryTag tag) const {
  return by_kind_tag[index(kind)][index(tag)];
}

const MemoryUsage& MemorySnapshot::total(MemoryKind kind) const {
  return by_kind[index(kind)];
}

std::string MemorySnapshot::to_string() const {
  std::string out;
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    const auto kind = static_cast<MemoryKind>(k);
    if (by_kind[k].peak_bytes == 0) continue;
    if (!out.empty()) out += '\n';
    out += fmt::format("rank {} {}: {} (peak {})", rank, memory_kind_name(kind),
                       format_bytes(by_kind[k].current_bytes), format_bytes(by_kind[k].peak_bytes));
    const char* sep = " = ";
    for (std::size_t t = 0; t < kNumMemoryTags; ++t) {
      if (by_kind_tag[k][t].current_bytes == 0) continue;
      out += fmt::format("{}{} {}", sep, memory_tag_name(static_cast<MemoryTag>(t)),
                         format_bytes(by_kind_tag[k][t].current_bytes));
      sep = ", ";
    }
  }
  return out.empty() ? fmt::format("rank {}: no memory recorded", rank) : out;
}

void MemoryLedger::set_budget(MemoryKind kind, std::optional<std::size_t> bytes) {
  std::lock_guard lock(mu_);
  budget_[index(kind)] = bytes;
}

std::optional<std::size_t> MemoryLedger::budget(MemoryKind kind) const {
  std::lock_guard lock(mu_);
  return budget_[index(kind)];
}

void MemoryLedger::reserve(MemoryKind kind, MemoryTag tag, std::size_t bytes) {
  std::unique_lock lock(mu_);
  const auto& budget = budget_[index(kind)];
  const std::size_t current = totals_[index(kind)].current_bytes;
  if (budget && (bytes > *budget || current > *budget - bytes)) {
    lock.unlock();
    throw OutOfMemory(out_of_memory_message(
        kind, tag, bytes, fmt::format("the per-rank budget is {} bytes", *budget)));
  }
  add(usage_[index(kind)][index(tag)], bytes);
  add(totals_[index(kind)], bytes);
}

void MemoryLedger::release(MemoryKind kind, MemoryTag tag, std::size_t bytes) noexcept {
  std::lock_guard lock(mu_);
  remove(usage_[index(kind)][index(tag)], bytes);
  remove(totals_[index(kind)], bytes);
}

MemoryUsage MemoryLedger::usage(MemoryKind kind, MemoryTag tag) const {
  std::lock_guard lock(mu_);
  return usage_[index(kind)][index(tag)];
}

MemoryUsage MemoryLedger::total(MemoryKind kind) const {
  std::lock_guard lock(mu_);
  return totals_[index(kind)];
}

MemorySnapshot MemoryLedger::snapshot_locked() const {
  MemorySnapshot s;
  s.rank = rank_;
  s.by_kind_tag = usage_;
  s.by_kind = totals_;
  s.budget_bytes = budget_;
  return s;
}

MemorySnapshot MemoryLedger::snapshot() const {
  std::lock_guard lock(mu_);
  return snapshot_locked();
}

void MemoryLedger::reset_peaks() {
  std::lock_guard lock(mu_);
  for (auto& per_kind : usage_) {
    for (auto& u : per_kind) u.peak_bytes = u.current_bytes;
  }
  for (auto& u : totals_) u.peak_bytes = u.current_bytes;
}

std::string MemoryLedger::out_of_memory_message(MemoryKind kind, MemoryTag tag, std::size_t bytes,
                                                std::string_view reason) const {
  MemorySnapshot s;
  {
    std::lock_guard lock(mu_);
    s = snapshot_locked();
  }
  std::string in_use;
  for (std::size_t t = 0; t < kNumMemoryTags; ++t) {
    const auto& u = s.by_kind_tag[index(kind)][t];
    if (u.current_bytes == 0) continue;
    in_use += fmt::format("{}{} {} bytes", in_use.empty() ? "" : ", ",
                          memory_tag_name(static_cast<MemoryTag>(t)), u.current_bytes);
  }
  return fmt::format(
      "out of {} memory on rank {}: allocating {} bytes ({}) of {} failed: {}; {} bytes in use{}",
      memory_kind_name(kind), rank_, bytes, format_bytes(bytes), memory_tag_name(tag), reason,
      s.by_kind[index(kind)].current_bytes, in_use.empty() ? "" : " (" + in_use + ")");
}

}  // namespace zero
