// The process's shared host arena: host memory that the other processes of a ShmComm group can
// map and read with plain loads, so a collective's inputs need no kernel copy (process_vm_readv)
// to reach a peer.
//
// One memfd per process, sized kReserveBytes but sparse (pages exist only once touched), mapped
// once here. CpuDevice carves its blocks of at least kMinBytes from it while the arena is
// enabled; make_shm_communicator() enables it, so the buffers an engine allocates after its
// communicator (buckets, gather buffers) are shareable. A peer maps the arena through
// /proc/<pid>/fd/<fd> (the same permission process_vm_readv needs) and finds a block at the same
// offset from the arena's base in both processes.
//
// Freed blocks give their pages back to the kernel (FALLOCATE_PUNCH_HOLE) and their range to a
// first-fit free list; when the reserve is exhausted allocate() returns null and the caller
// falls back to private memory (which peers read through the kernel, as before).
// Thread safety: every member may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace zero {

class SharedHostArena {
 public:
  static constexpr std::size_t kReserveBytes = std::size_t{256} << 30;
  static constexpr std::size_t kMinBytes = std::size_t{64} << 10;

  // Creates the process's arena on first call; later calls return it. Null when the kernel
  // refuses a memfd (said once on the log); nothing else changes then.
  static SharedHostArena* enable();
  // The arena if enable() made one in this process, else null.
  static SharedHostArena* get();
  // The arena, this process's or (after a fork) a parent's, whose range holds p; else null.
  static SharedHostArena* any_containing(const void* p);

  // `bytes` rounded up to 4 KiB (2 MiB alignment from 2 MiB on), or null when no range is free.
  void* allocate(std::size_t bytes) noexcept;
  // REQUIRES: p came from allocate(bytes) and was not freed. In a forked child, a block of its
  // parent's arena is left alone (its pages are the parent's too).
  void free(void* p, std::size_t bytes) noexcept;
  bool contains(const void* p) const noexcept;

  int fd() const { return fd_; }
  std::uint64_t base() const { return reinterpret_cast<std::uint64_t>(base_); }
  std::size_t reserve_bytes() const { return kReserveBytes; }

  SharedHostArena(const SharedHostArena&) = delete;
  SharedHostArena& operator=(const SharedHostArena&) = delete;

 private:
  SharedHostArena(int fd, std::byte* base);

  const int fd_;
  const int owner_pid_;
  std::byte* const base_;
  std::mutex mu_;
  std::map<std::size_t, std::size_t> free_;  // offset -> bytes, coalesced
};

}  // namespace zero
