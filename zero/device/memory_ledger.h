// Per-rank accounting of every allocation the runtime makes, by purpose (tag) and memory kind.
//
// Each Device owns one MemoryLedger; every Buffer it hands out is recorded here when allocated
// and removed when freed. The engine reports it through `engine.memory()` as a MemorySnapshot.
// Layers that hold memory a Device did not allocate (NVMe swap files in offload/) record it with
// reserve()/release() directly.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace zero {

// Where bytes live. Nvme is accounting only: no Device allocates it.
enum class MemoryKind : std::uint8_t { Device, PinnedHost, Host, Nvme };
inline constexpr std::size_t kNumMemoryKinds = 4;

// What the bytes are for (faiss-style allocation tags).
enum class MemoryTag : std::uint8_t {
  LowPrecisionParams,  // the model's fp16/bf16 (or fp32) parameter copy
  Gradients,
  MasterParams,  // fp32 master weights
  OptimizerStates,
  Buckets,        // gradient reduction buckets
  GatherBuffers,  // stage 3 gathered units, all-gather destinations
  Staging,        // host<->device and NVMe staging, dtype conversion scratch
  Other,
  SecondaryParams,  // stage 3 with hpZ: this rank's block of its secondary partitions
};
inline constexpr std::size_t kNumMemoryTags = 9;

// "device", "pinned_host", "host", "nvme".
std::string_view memory_kind_name(MemoryKind kind);
// "low_precision_params", "gradients", "master_params", "optimizer_states", "buckets",
// "gather_buffers", "staging", "other", "secondary_params".
std::string_view memory_tag_name(MemoryTag tag);

struct MemoryUsage {
  std::size_t current_bytes = 0;
  std::size_t peak_bytes = 0;  // high-water mark of current_bytes since construction/reset_peaks
  std::size_t live_allocations = 0;
  std::size_t total_allocations = 0;  // ever made, for spotting per-step allocation churn
};

// A copyable picture of a ledger at one moment.
struct MemorySnapshot {
  int rank = 0;
  std::array<std::array<MemoryUsage, kNumMemoryTags>, kNumMemoryKinds> by_kind_tag{};
  std::array<MemoryUsage, kNumMemoryKinds> by_kind{};  // peak is of the kind's total
  std::array<std::optional<std::size_t>, kNumMemoryKinds> budget_bytes{};

  const MemoryUsage& at(MemoryKind kind, MemoryTag tag) const;
  const MemoryUsage& total(MemoryKind kind) const;
  // One line per kind with a non-zero peak, listing the tags in use, e.g.
  // "rank 0 host: 12.0 MiB (peak 16.0 MiB) = gradients 8.0 MiB, master_params 4.0 MiB".
  std::string to_string() const;
};

// Thread safety: every method may be called from any thread.
class MemoryLedger {
 public:
  explicit MemoryLedger(int rank = 0) : rank_(rank) {}
  MemoryLedger(const MemoryLedger&) = delete;
  MemoryLedger& operator=(const MemoryLedger&) = delete;

  int rank() const { return rank_; }

  // Caps the total bytes of `kind` on this rank (nullopt: no cap). Does not affect memory
  // already recorded, even if it exceeds the new budget.
  void set_budget(MemoryKind kind, std::optional<std::size_t> bytes);
  std::optional<std::size_t> budget(MemoryKind kind) const;

  // Records `bytes` under (kind, tag). Throws OutOfMemory, naming the tag, the request and the
  // current usage, when that would exceed the kind's budget; nothing is recorded then.
  void reserve(MemoryKind kind, MemoryTag tag, std::size_t bytes);
  // REQUIRES: a matching reserve() of the same bytes under the same (kind, tag).
  void release(MemoryKind kind, MemoryTag tag, std::size_t bytes) noexcept;

  MemoryUsage usage(MemoryKind kind, MemoryTag tag) const;
  MemoryUsage total(MemoryKind kind) const;
  MemorySnapshot snapshot() const;
  // Sets every peak to the current value (e.g. to measure one step).
  void reset_peaks();

  // The message OutOfMemory carries: what was asked for and what is in use. Public so a Device
  // whose allocator fails can throw the same message.
  std::string out_of_memory_message(MemoryKind kind, MemoryTag tag, std::size_t bytes,
                                    std::string_view reason) const;

 private:
  MemorySnapshot snapshot_locked() const;

  const int rank_;
  mutable std::mutex mu_;
  std::array<std::array<MemoryUsage, kNumMemoryTags>, kNumMemoryKinds> usage_{};
  std::array<MemoryUsage, kNumMemoryKinds> totals_{};
  std::array<std::optional<std::size_t>, kNumMemoryKinds> budget_{};
};

}  // namespace zero
