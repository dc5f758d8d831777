#include "offload/subgroup_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>

#include "zero/base/error.h"
#include "zero/base/half.h"

namespace zero::offload {
namespace {

std::size_t align_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

void fill_value(std::byte* out, DType dtype, std::size_t n, float value) {
  switch (dtype) {
    case DType::F32: std::fill_n(reinterpret_cast<float*>(out), n, value); return;
    case DType::BF16:
      std::fill_n(reinterpret_cast<std::uint16_t*>(out), n, half::float_to_bf16(value));
      return;
    case DType::F16:
      std::fill_n(reinterpret_cast<std::uint16_t*>(out), n, half::float_to_f16(value));
      return;
    case DType::F64: std::fill_n(reinterpret_cast<double*>(out), n, double{value}); return;
  }
}

}  // namespace

SubgroupStore::SubgroupStore(Device& device, std::vector<StoreTensor> tensors,
                             const StoreOptions& options)
    : device_(device), tensors_(std::move(tensors)), options_(options) {
  // No tensors (an optimizer without state whose master weights live elsewhere) is an empty
  // store, in memory only.
  ZERO_CHECK(!tensors_.empty() || !options.nvme, "SubgroupStore: no tensors for the NVMe tier");
  ZERO_CHECK(options.ratio >= 0.0 && options.ratio <= 1.0,
             "offload_optimizer.ratio must be in [0, 1], got {}", options.ratio);
  std::vector<std::size_t> edges = options.boundaries;
  if (edges.empty()) {
    const std::size_t G = std::max<std::size_t>(options.sub_group_elems, 1);
    for (std::size_t b = 0; b < options.total_elems; b += G) edges.push_back(b);
  }
  ZERO_CHECK(std::is_sorted(edges.begin(), edges.end()) &&
                 (edges.empty() || (edges.front() == 0 && edges.back() < options.total_elems)),
             "SubgroupStore: sub-group boundaries must start at 0, ascend and stay below {}",
             options.total_elems);
  std::size_t largest = 0;
  for (std::size_t i = 0; i < edges.size(); ++i) {
    Group g;
    g.begin = edges[i];
    g.end = i + 1 < edges.size() ? edges[i + 1] : options.total_elems;
    if (g.end == g.begin) continue;
    largest = std::max(largest, g.end - g.begin);
    groups_.push_back(std::move(g));
  }
  const auto offloaded = static_cast<std::size_t>(
      std::llround(options.ratio * static_cast<double>(groups_.size())));
  const bool nvme = options.nvme.has_value();
  if (nvme) {
    const NvmeTier& t = *options.nvme;
    ZERO_CHECK(!t.paths.empty(), "{}: no NVMe path", t.key);
    ZERO_CHECK(t.buffer_count >= 1, "offload_optimizer.buffer_count must be at least 1, got {}",
               t.buffer_count);
    for (const std::string& p : t.paths) {
      dirs_.push_back(std::make_unique<SwapDir>(p, t.key));
      align_ = std::max(align_, dirs_.back()->alignment());
      file_names_.push_back((dirs_.back()->path() / t.file_name).string());
      fds_.push_back(dirs_.back()->open(t.file_name));
    }
    for (const StoreTensor& st : tensors_) {
      tensor_offset_.push_back(record_bytes_);
      record_bytes_ += align_up(largest * dtype_size(st.dtype), align_);
    }
    io_ = make_async_io(t.aio);
  }
  std::vector<std::size_t> per_file(dirs_.size(), 0);
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    Group& g = groups_[i];
    const std::size_t n = g.end - g.begin;
    const bool off = i < offloaded;
    if (off && nvme) {
      g.nvme = true;
      g.file = static_cast<int>(i % dirs_.size());
      g.record = per_file[static_cast<std::size_t>(g.file)]++;
      for (const StoreTensor& st : tensors_) {
        device_.ledger().reserve(MemoryKind::Nvme, st.tag, 2 * n * dtype_size(st.dtype));
      }
      continue;
    }
    const MemoryKind kind = off ? options.offload_kind : options.resident_kind;
    // A GPU's own memory is filled through a host copy of the initial values.
    const bool on_host = kind != MemoryKind::Device || device_.host_addressable();
    std::vector<std::byte> initial;
    for (const StoreTensor& st : tensors_) {
      const std::size_t bytes = n * dtype_size(st.dtype);
      g.memory.push_back(device_.allocate(bytes, kind, st.tag));
      auto* data = static_cast<std::byte*>(g.memory.back().data());
      if (on_host) {
        fill_value(data, st.dtype, n, st.initial);
        continue;
      }
      initial.resize(bytes);
      fill_value(initial.data(), st.dtype, n, st.initial);
      device_.copy(data, initial.data(), bytes);
    }
  }
  if (nvme_count() > 0) {
    const int records = std::clamp(options.cache_records, 1, nvme_count());
    for (int c = 0; c < records; ++c) cache_.push_back({alloc_staged(), -1, false, 0});
    for (int b = 0; b < options.nvme->buffer_count; ++b) buffers_.push_back(alloc_staged());
  }
}

SubgroupStore::~SubgroupStore() {
  for (const Group& g : groups_) {
    if (!g.nvme) continue;
    for (const StoreTensor& st : tensors_) {
      device_.ledger().release(MemoryKind::Nvme, st.tag,
                               2 * (g.end - g.begin) * dtype_size(st.dtype));
    }
  }
  io_.reset();  // waits for anything in flight before the buffers go
}

int SubgroupStore::nvme_count() const {
  return static_cast<int>(std::count_if(groups_.begin(), groups_.end(),
                                        [](const Group& g) { return g.nvme; }));
}

std::string_view SubgroupStore::io_name() const { return io_ ? io_->name() : ""; }

SubgroupStore::Staged SubgroupStore::alloc_staged() {
  Staged s;
  s.memory = device_.allocate(record_bytes_ + align_, MemoryKind::PinnedHost, MemoryTag::Staging);
  const auto addr = reinterpret_cast<std::uintptr_t>(s.memory.data());
  s.data = static_cast<std::byte*>(s.memory.data()) + (align_up(addr, align_) - addr);
  return s;
}

SubgroupStore::View SubgroupStore::memory_view(Group& g, int index) {
  View v{index, g.begin, g.end, false, {}};
  for (Buffer& b : g.memory) v.tensors.push_back(static_cast<std::byte*>(b.data()));
  return v;
}

SubgroupStore::View SubgroupStore::staged_view(const Group& g, int index,
                                               std::byte* record) const {
  View v{index, g.begin, g.end, true, {}};
  for (std::size_t k = 0; k < tensors_.size(); ++k) v.tensors.push_back(record + tensor_offset_[k]);
  return v;
}

void SubgroupStore::fill_initial(const Group& g, std::byte* record) const {
  for (std::size_t k = 0; k < tensors_.size(); ++k) {
    fill_value(record + tensor_offset_[k], tensors_[k].dtype, g.end - g.begin,
               tensors_[k].initial);
  }
}

IoRequest SubgroupStore::request(const Group& g, int slot, IoOp op, std::byte* record) const {
  const auto f = static_cast<std::size_t>(g.file);
  const std::uint64_t offset = (2 * g.record + static_cast<std::size_t>(slot)) * record_bytes_;
  return {op, fds_[f], record, record_bytes_, offset, file_names_[f]};
}

// The slot an update writes: the one not holding the committed values (slot 0 before any).
int SubgroupStore::spare_slot(const Group& g) { return g.written ? 1 - g.active : 0; }

// The cached record of NVMe sub-group `index`, loaded (or initialised) on a miss into the least
// recently used entry, which is written back first if it was changed.
std::byte* SubgroupStore::load(int index, bool for_write) {
  auto entry = std::find_if(cache_.begin(), cache_.end(),
                            [index](const Cached& c) { return c.index == index; });
  if (entry == cache_.end()) {
    entry = std::min_element(cache_.begin(), cache_.end(),
                             [](const Cached& a, const Cached& b) { return a.used < b.used; });
    write_back(*entry);
    entry->index = -1;
    const Group& g = groups_[static_cast<std::size_t>(index)];
    if (g.pending || g.written) {
      // In a batch, a record written back this batch is read from its pending (spare) slot.
      const int slot = g.pending ? spare_slot(g) : g.active;
      io_->wait(io_->submit({request(g, slot, IoOp::Read, entry->staged.data)}));
    } else {
      fill_initial(g, entry->staged.data);
    }
    entry->index = index;
  }
  entry->used = ++tick_;
  entry->dirty = entry->dirty || for_write;
  return entry->staged.data;
}

void SubgroupStore::write_back(Cached& c) {
  if (c.index < 0 || !c.dirty) return;
  Group& g = groups_[static_cast<std::size_t>(c.index)];
  // Into the spare slot, then flip (or, in a batch, flip at commit_batch()): a failed write
  // leaves the committed slot as it was.
  const int spare = spare_slot(g);
  io_->wait(io_->submit({request(g, spare, IoOp::Write, c.staged.data)}));
  if (batch_) {
    g.pending = true;
  } else {
    g.active = spare;
    g.written = true;
  }
  c.dirty = false;
}

void SubgroupStore::visit_memory(const Visit& visit) {
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    if (!groups_[i].nvme) visit(memory_view(groups_[i], static_cast<int>(i)));
  }
}

void SubgroupStore::begin_batch() {
  ZERO_ASSERT(!batch_);
  batch_ = true;
}

void SubgroupStore::commit_batch() {
  ZERO_ASSERT(batch_);
  flush();
  for (Group& g : groups_) {
    if (!g.pending) continue;
    g.active = spare_slot(g);
    g.written = true;
    g.pending = false;
  }
  batch_ = false;
}

void SubgroupStore::abort_batch() noexcept {
  if (!batch_) return;
  // A cached record may hold the batch's values (changed, or read from a pending slot).
  drop_cache();
  for (Group& g : groups_) g.pending = false;
  batch_ = false;
}

void SubgroupStore::flush() {
  for (Cached& c : cache_) write_back(c);
}

// Forgets every cached record (after flush(): none is dirty).
void SubgroupStore::drop_cache() {
  for (Cached& c : cache_) {
    c.index = -1;
    c.dirty = false;
  }
}

void SubgroupStore::visit_range(std::size_t begin, std::size_t end, bool for_write,
                                const Visit& visit) {
  // The first sub-group that ends after `begin`.
  const auto first = std::partition_point(groups_.begin(), groups_.end(),
                                          [&](const Group& g) { return g.end <= begin; });
  for (auto i = static_cast<std::size_t>(first - groups_.begin());
       i < groups_.size() && groups_[i].begin < end; ++i) {
    Group& g = groups_[i];
    const int index = static_cast<int>(i);
    visit(g.nvme ? staged_view(g, index, load(index, for_write)) : memory_view(g, index));
  }
}

void SubgroupStore::read(std::size_t begin, std::size_t end, const Visit& visit) {
  visit_range(begin, end, false, visit);
}

void SubgroupStore::modify(std::size_t begin, std::size_t end, const Visit& visit) {
  visit_range(begin, end, true, visit);
}

void SubgroupStore::update_all(const Visit& visit, const Agree& agree,
                               const std::function<void()>& before_agree) {
  ZERO_ASSERT(!batch_);
  flush();
  drop_cache();
  std::vector<int> nv;
  std::exception_ptr failure;
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    if (groups_[i].nvme) nv.push_back(static_cast<int>(i));
  }
  if (!nv.empty()) {
    const NvmeTier& t = *options_.nvme;
    const std::size_t B = buffers_.size();
    // Sub-groups read ahead of the one being stepped: every buffer but the one stepping (and,
    // with pipeline_write, the one writing behind).
    const std::size_t ahead =
        t.pipeline_read ? (B > (t.pipeline_write ? 2u : 1u) ? B - (t.pipeline_write ? 2 : 1) : 0)
                        : 0;
    std::vector<std::optional<AsyncIo::Ticket>> reading(nv.size()), writing(B);
    auto settle = [&](std::optional<AsyncIo::Ticket>& ticket) {
      if (!ticket) return;
      const AsyncIo::Ticket tk = *ticket;
      ticket.reset();
      try {
        io_->wait(tk);
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    };
    std::size_t issued = 0;  // reads issued for nv[0, issued)
    for (std::size_t k = 0; k < nv.size() && !failure; ++k) {
      for (; issued < nv.size() && issued <= k + ahead; ++issued) {
        const std::size_t b = issued % B;
        settle(writing[b]);  // the buffer's last write-back must finish before it is reused
        if (failure) break;
        const Group& g = groups_[static_cast<std::size_t>(nv[issued])];
        if (g.written) {
          reading[issued] = io_->submit({request(g, g.active, IoOp::Read, buffers_[b].data)});
        } else {
          fill_initial(g, buffers_[b].data);
        }
      }
      if (failure) break;
      settle(reading[k]);
      if (failure) break;
      const std::size_t b = k % B;
      const Group& g = groups_[static_cast<std::size_t>(nv[k])];
      try {
        visit(staged_view(g, nv[k], buffers_[b].data));
      } catch (...) {
        failure = std::current_exception();
        break;
      }
      const int spare = spare_slot(g);
      writing[b] = io_->submit({request(g, spare, IoOp::Write, buffers_[b].data)});
      if (!t.pipeline_write) settle(writing[b]);
    }
    for (auto& r : reading) settle(r);
    for (auto& w : writing) settle(w);
  }
  if (!failure && before_agree) {
    try {
      before_agree();
    } catch (const IoError&) {
      failure = std::current_exception();
    }
  }
  const bool all_ok = agree ? agree(!failure) : !failure;
  if (failure) std::rethrow_exception(failure);
  if (!all_ok) {
    throw IoError("the optimizer step failed on another rank (NVMe I/O); this rank's step is "
                  "undone too");
  }
  visit_memory(visit);
  // Every write succeeded: the new values become the committed ones.
  for (int i : nv) {
    Group& g = groups_[static_cast<std::size_t>(i)];
    g.active = spare_slot(g);
    g.written = true;
  }
}

SubgroupStore::Replacement SubgroupStore::replacement(int tensor) {
  ZERO_ASSERT(tensor >= 0 && static_cast<std::size_t>(tensor) < tensors_.size());
  const StoreTensor& st = tensors_[static_cast<std::size_t>(tensor)];
  // No cached change may reach a spare slot (and flip it) while replacements fill them.
  flush();
  drop_cache();
  Replacement r;
  r.store_ = this;
  r.tensor_ = tensor;
  r.dtype_ = st.dtype;
  std::size_t largest_nvme = 0;
  for (const Group& g : groups_) {
    const std::size_t bytes = (g.end - g.begin) * dtype_size(st.dtype);
    r.begins_.push_back(g.begin);
    Buffer b;
    bool staged = false;  // b is host staging memory, copied into the tensor on adopt()
    if (g.nvme) {
      largest_nvme = std::max(largest_nvme, bytes);
    } else {
      const Buffer& old = g.memory[static_cast<std::size_t>(tensor)];
      try {
        b = device_.allocate(bytes, old.kind(), old.tag());
      } catch (const OutOfMemory&) {
        // No room for two copies under the budget: stage in host memory and copy on adopt().
      }
      staged = b.empty() && bytes > 0;
      if (staged) b = device_.allocate(bytes, MemoryKind::Host, MemoryTag::Staging);
    }
    r.swap_.push_back(!g.nvme && !staged);
    r.memory_.push_back(std::move(b));
  }
  r.begins_.push_back(options_.total_elems);
  if (largest_nvme > 0) {
    // The tensor's area in a record (records are sized for the largest sub-group).
    const auto t = static_cast<std::size_t>(tensor);
    const std::size_t block =
        (t + 1 < tensor_offset_.size() ? tensor_offset_[t + 1] : record_bytes_) - tensor_offset_[t];
    ZERO_ASSERT(block >= largest_nvme);
    r.block_bytes_ = block;
    r.block_memory_ = device_.allocate(block + align_, MemoryKind::Host, MemoryTag::Staging);
    const auto addr = reinterpret_cast<std::uintptr_t>(r.block_memory_.data());
    r.block_ = static_cast<std::byte*>(r.block_memory_.data()) + (align_up(addr, align_) - addr);
    std::memset(r.block_, 0, block);  // the tail past the values lands in the slot's padding
  }
  return r;
}

// Calls fn(g, at, n, data) for the part [at, at + n) of [begin, end) in sub-group g, in order,
// with data the replacement's bytes of element `at` (the block buffer for an NVMe sub-group).
template <typename Fn>
void SubgroupStore::Replacement::each_stretch(std::size_t begin, std::size_t end, Fn&& fn) {
  ZERO_ASSERT(begin <= end && end <= begins_.back());
  const std::size_t esize = dtype_size(dtype_);
  // The first sub-group that ends after `begin`.
  auto g = static_cast<std::size_t>(std::upper_bound(begins_.begin() + 1, begins_.end(), begin) -
                                    (begins_.begin() + 1));
  for (std::size_t at = begin; at < end; ++g) {
    const std::size_t n = std::min(end, begins_[g + 1]) - at;
    std::byte* base = store_->groups_[g].nvme ? block_ : static_cast<std::byte*>(memory_[g].data());
    if (n > 0) fn(g, at, n, base + (at - begins_[g]) * esize);
    at += n;
  }
}

// The tensor's area of NVMe sub-group g's spare slot, `bytes` of it, from or into the block.
void SubgroupStore::Replacement::transfer_block(std::size_t g, IoOp op, std::size_t bytes) {
  const Group& group = store_->groups_[g];
  IoRequest req = store_->request(group, spare_slot(group), op, block_);
  req.offset += store_->tensor_offset_[static_cast<std::size_t>(tensor_)];
  req.bytes = bytes;
  store_->io_->wait(store_->io_->submit({req}));
}

void SubgroupStore::Replacement::for_range(std::size_t begin, std::size_t end, const Stretch& fn) {
  each_stretch(begin, end, [&](std::size_t g, std::size_t at, std::size_t n, std::byte* data) {
    fn(data, at, n);
    // An NVMe sub-group's last element is in: its block goes to the tensor's area of the spare
    // slot (the committed slot stays as it was until adopt()), the whole area, past a short
    // sub-group's values too, so that the swap file reaches the end of every record a later
    // read of a whole record asks for.
    if (store_->groups_[g].nvme && at + n == begins_[g + 1]) {
      transfer_block(g, IoOp::Write, block_bytes_);
    }
  });
}

void SubgroupStore::Replacement::read_range(std::size_t begin, std::size_t end, const Reader& fn) {
  const std::size_t esize = dtype_size(dtype_);
  each_stretch(begin, end, [&](std::size_t g, std::size_t at, std::size_t n, std::byte* data) {
    if (store_->groups_[g].nvme) {
      transfer_block(g, IoOp::Read,
                     align_up((begins_[g + 1] - begins_[g]) * esize, store_->align_));
    }
    fn(data, at, n);
  });
}

void SubgroupStore::adopt(std::vector<Replacement>&& all) {
  std::vector<bool> covered(tensors_.size(), false);
  for (Replacement& r : all) {
    ZERO_ASSERT(r.store_ == this && r.memory_.size() == groups_.size());
    const auto t = static_cast<std::size_t>(r.tensor_);
    covered[t] = true;
    const std::size_t esize = dtype_size(r.dtype_);
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      Group& g = groups_[i];
      if (g.nvme) continue;
      if (r.swap_[i]) {
        std::swap(g.memory[t], r.memory_[i]);
        continue;
      }
      device_.copy(g.memory[t].data(), r.memory_[i].data(), (g.end - g.begin) * esize);
    }
  }
  if (nvme_count() == 0) return;
  ZERO_ASSERT(std::all_of(covered.begin(), covered.end(), [](bool c) { return c; }));
  // Every tensor's part of every NVMe sub-group's spare slot holds the new values.
  drop_cache();
  for (Group& g : groups_) {
    if (!g.nvme) continue;
    g.active = spare_slot(g);
    g.written = true;
  }
}

}  // namespace zero::offload
