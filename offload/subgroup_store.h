// Where a rank's optimizer tensors (fp32 master weights and optimizer states) live, sub-group by
// sub-group (DESIGN.md §3, offload tiers; SPEC_DEEPSPEED.md §1.9).
//
// The tensors share one element range [0, total); it is cut into sub-groups of `sub_group_elems`
// (DeepSpeed's sub_group_size), or at explicit `boundaries`. The first round(ratio × count) sub-groups are *offloaded* — to
// NVMe when a tier is given, else to `offload_kind` host memory — and the rest stay in
// `resident_kind` memory (ZeRO-Offload++'s ratio). A resident or host sub-group is a buffer per
// tensor; an NVMe sub-group is a record in a swap file (every tensor of the sub-group, each at an
// aligned offset) with two slots: updates go to the spare slot and the slots flip only once every
// write of the update has succeeded, so a failed step never overwrites the only good copy.
// Sub-groups are striped over the NVMe paths.
//
// Three ways in:
//   read()/modify()  any range, sub-group by sub-group; NVMe sub-groups pass through a cache of
//                    `cache_records` records (least recently used out first) that modify()
//                    dirties and flush() (or the eviction) writes back. A sub-group never written
//                    is not read: it starts from the tensors' initial values.
//   update_all()     the optimizer step: every sub-group once, the NVMe ones first, streamed
//                    through `buffer_count` buffers — read sub-group i+1.. ahead (pipeline_read),
//                    step i, write i−1.. behind (pipeline_write). On an I/O error it waits for
//                    every request in flight and throws IoError; no slot has flipped and no
//                    resident sub-group has been visited, so the caller only has to undo what its
//                    callback did outside the store (the model copy). Ranks agree on the outcome
//                    before anything is committed.
//   begin_batch()    makes what read()/modify() write back *pending*: written to the spare slot
//                    and read from there, but committed only by commit_batch(); abort_batch()
//                    forgets every pending write and cached change, without I/O, so the store
//                    holds what it held at begin_batch() (stage 3's parameter records within an
//                    optimizer step).
// The ledger counts NVMe bytes (both slots) under MemoryKind::Nvme by tensor tag, and the swap
// buffers as pinned staging.
//
// Thread safety: the rank's thread only (I/O runs on the AsyncIo's threads).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "offload/async_io.h"
#include "offload/swap_dir.h"
#include "zero/base/dtype.h"
#include "zero/device/device.h"

namespace zero::offload {

struct StoreTensor {
  DType dtype = DType::F32;
  MemoryTag tag = MemoryTag::OptimizerStates;
  float initial = 0.0f;  // the value of a sub-group never written
};

struct NvmeTier {
  std::vector<std::string> paths;  // nvme_path (one or more folders, striped)
  std::string key;                 // the config key the paths came from, for errors
  AioOptions aio;
  int buffer_count = 4;
  bool pipeline_read = false;
  bool pipeline_write = false;
  std::string file_name = "optimizer.swp";  // the swap file in each path's run folder
};

struct StoreOptions {
  std::size_t total_elems = 0;
  std::size_t sub_group_elems = 1'000'000'000;
  // Explicit sub-group starts (ascending, the first 0) instead of sub_group_elems: e.g. one
  // sub-group per stage-3 unit slice. Empty stretches are skipped.
  std::vector<std::size_t> boundaries;
  MemoryKind resident_kind = MemoryKind::Device;
  MemoryKind offload_kind = MemoryKind::Device;  // host offload (no NVMe tier)
  double ratio = 1.0;                            // share of sub-groups offloaded
  std::optional<NvmeTier> nvme;
  // NVMe records read()/modify() keep in pinned host memory (at least 1; offload_param's
  // max_in_cpu, in records). update_all() streams through its own buffers either way.
  int cache_records = 1;
};

class SubgroupStore {
 public:
  struct View {
    int index = 0;
    std::size_t begin = 0;  // the sub-group's elements [begin, end) of the whole range
    std::size_t end = 0;
    bool nvme = false;
    std::vector<std::byte*> tensors;  // tensor k's element `begin`
  };
  using Visit = std::function<void(const View&)>;

  // Allocates the resident and host sub-groups with their initial values and opens the swap
  // files (nothing is written to them yet). Throws ConfigError for a bad nvme path.
  SubgroupStore(Device& device, std::vector<StoreTensor> tensors, const StoreOptions& options);
  ~SubgroupStore();
  SubgroupStore(const SubgroupStore&) = delete;
  SubgroupStore& operator=(const SubgroupStore&) = delete;

  int count() const { return static_cast<int>(groups_.size()); }
  int nvme_count() const;
  std::size_t total_elems() const { return options_.total_elems; }
  const std::vector<StoreTensor>& tensors() const { return tensors_; }
  // The I/O backend in use ("io_uring", "threads"), or "" without an NVMe tier.
  std::string_view io_name() const;
  // The NVMe I/O object (null without an NVMe tier): tests install faults through it.
  AsyncIo* io() { return io_.get(); }

  // Visits the sub-groups overlapping [begin, end), in order.
  void read(std::size_t begin, std::size_t end, const Visit& visit);
  void modify(std::size_t begin, std::size_t end, const Visit& visit);
  // Visits every sub-group held in memory (not on NVMe), in order, without I/O; what the visit
  // writes there stays.
  void visit_memory(const Visit& visit);
  // Writes every cached NVMe sub-group that modify() changed back to its swap file.
  void flush();
  void begin_batch();
  // Writes back what is cached and changed (may throw IoError, the batch still open), then makes
  // every pending write the committed one.
  void commit_batch();
  void abort_batch() noexcept;
  // Records the read()/modify() cache holds (0 without NVMe sub-groups).
  int cache_records() const { return static_cast<int>(cache_.size()); }
  // `agree` (collective runs: every rank calls it once per update, between the NVMe part and the
  // rest) gets whether this rank's I/O succeeded and returns whether every rank's did; when not,
  // this rank throws IoError too, before changing anything.
  using Agree = std::function<bool(bool ok)>;
  // `before_agree`, if given, runs after the NVMe sub-groups were stepped and written (their
  // slots not yet flipped) and before `agree`; an IoError from it fails the update like the
  // store's own (e.g. writing back another store's pending batch).
  void update_all(const Visit& visit, const Agree& agree = nullptr,
                  const std::function<void()>& before_agree = nullptr);

  // New values of one tensor, written where they will stay (a checkpoint load). A memory
  // sub-group gets a fresh buffer of its memory kind and the tensor's tag, which adopt() swaps in
  // (or, when the kind's budget has no room for a second copy, pageable host staging that adopt()
  // copies). An NVMe sub-group gets no copy in memory: its values go through one block buffer
  // straight into the tensor's part of the sub-group's spare slot, written as soon as the
  // sub-group's last element is, and adopt() makes that slot the committed one. So a load needs
  // one sub-group's block of memory per tensor beyond the resident state, and adopt() does no
  // I/O. The store is untouched until adopt(); Replacements dropped instead leave it exactly as
  // it was. The caller writes every element, in increasing order (for_range's stretches), holds
  // at most one Replacement per tensor at a time, and changes nothing else in the store until
  // adopt() (replacement() first writes back what the cache changed: it may throw IoError).
  class Replacement {
   public:
    int tensor() const { return tensor_; }
    DType dtype() const { return dtype_; }
    // Calls fn(dst, first, n) for the stretches of elements [begin, end) of the whole range,
    // one per sub-group, in order: dst holds elements [first, first + n), to be written by fn.
    // Throws IoError when an NVMe sub-group completed by the stretch cannot be written.
    using Stretch = std::function<void(std::byte* dst, std::size_t first, std::size_t n)>;
    void for_range(std::size_t begin, std::size_t end, const Stretch& fn);
    // Calls fn(src, first, n) the same way with the values written (NVMe sub-groups read back
    // from their spare slot: IoError). REQUIRES: the elements were written.
    using Reader = std::function<void(const std::byte* src, std::size_t first, std::size_t n)>;
    void read_range(std::size_t begin, std::size_t end, const Reader& fn);

   private:
    friend class SubgroupStore;
    template <typename Fn>
    void each_stretch(std::size_t begin, std::size_t end, Fn&& fn);
    void transfer_block(std::size_t g, IoOp op, std::size_t bytes);

    SubgroupStore* store_ = nullptr;
    int tensor_ = 0;
    DType dtype_ = DType::F32;
    std::vector<std::size_t> begins_;  // sub-group g holds [begins_[g], begins_[g + 1])
    std::vector<Buffer> memory_;       // one per memory sub-group (empty for NVMe ones)
    std::vector<bool> swap_;           // adopt() swaps memory_[g] in, else copies it
    Buffer block_memory_;              // NVMe sub-groups: the block being filled, aligned
    std::byte* block_ = nullptr;
    std::size_t block_bytes_ = 0;  // the tensor's area in a record
  };
  Replacement replacement(int tensor);
  // Makes the replacements' values the tensors' (one call for all of them): swaps each memory
  // buffer it can with the sub-group's (the old one is freed with the replacement), copies the
  // others, and flips each NVMe sub-group to the slot the replacements wrote. No I/O.
  // REQUIRES: each came from this store's replacement(), every element written; with NVMe
  // sub-groups, one replacement of every tensor.
  void adopt(std::vector<Replacement>&& all);

 private:
  struct Group {
    std::size_t begin = 0;
    std::size_t end = 0;
    bool nvme = false;
    std::vector<Buffer> memory;  // resident and host groups: one buffer per tensor
    int file = 0;                // NVMe: which swap file
    std::size_t record = 0;      // NVMe: the record's index in its file
    int active = 0;              // NVMe: the slot holding the committed values
    bool written = false;        // NVMe: a slot holds values
    bool pending = false;        // NVMe: the spare slot holds this batch's values
  };
  struct Staged {  // one aligned swap buffer
    Buffer memory;
    std::byte* data = nullptr;
  };
  struct Cached {  // one record of the read()/modify() cache
    Staged staged;
    int index = -1;  // the sub-group it holds, or -1
    bool dirty = false;
    std::uint64_t used = 0;  // the last use's tick, for least-recently-used eviction
  };

  View memory_view(Group& g, int index);
  View staged_view(const Group& g, int index, std::byte* record) const;
  void fill_initial(const Group& g, std::byte* record) const;
  IoRequest request(const Group& g, int slot, IoOp op, std::byte* record) const;
  static int spare_slot(const Group& g);
  std::byte* load(int index, bool for_write);
  void write_back(Cached& c);
  void drop_cache();
  void visit_range(std::size_t begin, std::size_t end, bool for_write, const Visit& visit);
  Staged alloc_staged();

  Device& device_;
  const std::vector<StoreTensor> tensors_;
  const StoreOptions options_;
  std::vector<Group> groups_;
  // NVMe tier.
  std::vector<std::unique_ptr<SwapDir>> dirs_;
  std::vector<int> fds_;
  std::vector<std::string> file_names_;
  std::unique_ptr<AsyncIo> io_;
  std::size_t align_ = 4096;
  std::vector<std::size_t> tensor_offset_;  // inside a record
  std::size_t record_bytes_ = 0;            // aligned
  std::vector<Cached> cache_;
  std::uint64_t tick_ = 0;
  bool batch_ = false;
  std::vector<Staged> buffers_;  // update_all's pipeline
};

}  // namespace zero::offload
