// SharedHostArena: blocks that another process can map, first-fit reuse of freed ranges, freed
// pages returned to the kernel, and a forked child that never hands out its parent's pages.
#include "zero/device/shared_host_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>

#include "zero/device/device.h"

using zero::SharedHostArena;

TEST_CASE("shared host arena blocks are page aligned, reused first fit, and coalesce when freed") {
  SharedHostArena* arena = SharedHostArena::enable();
  REQUIRE(arena != nullptr);
  REQUIRE(SharedHostArena::enable() == arena);  // one per process
  REQUIRE(SharedHostArena::get() == arena);

  auto* a = static_cast<std::byte*>(arena->allocate(100'000));
  auto* b = static_cast<std::byte*>(arena->allocate(5000));
  auto* big = static_cast<std::byte*>(arena->allocate(std::size_t{3} << 20));
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  REQUIRE(big != nullptr);
  REQUIRE(arena->contains(a));
  REQUIRE(arena->contains(big + (std::size_t{3} << 20) - 1));
  REQUIRE(reinterpret_cast<std::uintptr_t>(a) % 4096 == 0);
  REQUIRE(reinterpret_cast<std::uintptr_t>(big) % (std::size_t{2} << 20) == 0);
  REQUIRE(b >= a + 100'000);  // no overlap: 100,000 rounds up to 25 pages
  std::memset(a, 0x5a, 100'000);
  std::memset(big, 0x33, std::size_t{3} << 20);

  // Freed pages go back to the kernel: the same range handed out again reads as zeros.
  arena->free(a, 100'000);
  auto* again = static_cast<std::byte*>(arena->allocate(100'000));
  REQUIRE(again == a);
  REQUIRE(again[0] == std::byte{0});
  REQUIRE(again[99'999] == std::byte{0});

  // Freeing neighbours coalesces: a block as large as all three fits where they were.
  arena->free(again, 100'000);
  arena->free(b, 5000);
  auto* joined = static_cast<std::byte*>(arena->allocate(100'000 + 8192));
  REQUIRE(joined == a);
  arena->free(joined, 100'000 + 8192);
  REQUIRE(big[12345] == std::byte{0x33});  // untouched by its neighbours' frees
  arena->free(big, std::size_t{3} << 20);

  int x = 0;
  REQUIRE_FALSE(arena->contains(&x));
  REQUIRE(arena->allocate(SharedHostArena::kReserveBytes + 1) == nullptr);
}

TEST_CASE("another process maps the arena through /proc and reads a block's bytes in place") {
  SharedHostArena* arena = SharedHostArena::enable();
  REQUIRE(arena != nullptr);
  auto* block = static_cast<std::uint32_t*>(arena->allocate(1 << 20));
  REQUIRE(block != nullptr);
  for (std::uint32_t i = 0; i < (1 << 18); ++i) block[i] = i * 2654435761u;
  const std::uint64_t offset = reinterpret_cast<std::uint64_t>(block) - arena->base();
  const pid_t parent = ::getpid();
  const int fd = arena->fd();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // As a ShmComm peer does: open the parent's descriptor by path, map it read-only.
    const std::string path = "/proc/" + std::to_string(parent) + "/fd/" + std::to_string(fd);
    const int mine = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (mine < 0) ::_exit(2);
    void* map = ::mmap(nullptr, SharedHostArena::kReserveBytes, PROT_READ,
                       MAP_SHARED | MAP_NORESERVE, mine, 0);
    if (map == MAP_FAILED) ::_exit(3);
    const auto* seen = reinterpret_cast<const std::uint32_t*>(static_cast<char*>(map) + offset);
    for (std::uint32_t i = 0; i < (1 << 18); ++i) {
      if (seen[i] != i * 2654435761u) ::_exit(4);
    }
    // A forked child has no arena of its own until it enables one, and never hands out the
    // parent's pages.
    if (SharedHostArena::get() != nullptr) ::_exit(5);
    SharedHostArena* own = SharedHostArena::enable();
    if (own == nullptr || own == arena || own->contains(block)) ::_exit(6);
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  arena->free(block, 1 << 20);
}

TEST_CASE("a CpuDevice's large buffers come from the arena once it is enabled") {
  REQUIRE(SharedHostArena::enable() != nullptr);
  const auto device = zero::make_device("cpu", 0);
  zero::Buffer large = device->allocate(std::size_t{1} << 20, zero::MemoryKind::Device,
                                        zero::MemoryTag::Buckets);
  zero::Buffer small = device->allocate(256, zero::MemoryKind::Device, zero::MemoryTag::Buckets);
  REQUIRE(SharedHostArena::get()->contains(large.data()));
  REQUIRE_FALSE(SharedHostArena::get()->contains(small.data()));
}
