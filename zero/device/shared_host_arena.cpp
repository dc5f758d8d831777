#include "zero/device/shared_host_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <vector>

#include "zero/base/log.h"

namespace zero {
namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kHugePage = std::size_t{2} << 20;

std::mutex g_mu;
// Every arena made in this process or, before a fork, its parents; never freed, as blocks may
// live until the process exits. The last one is this process's if its owner is this pid.
std::vector<SharedHostArena*> g_arenas;
bool g_refused = false;

std::size_t round_up(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}

}  // namespace

SharedHostArena::SharedHostArena(int fd, std::byte* base)
    : fd_(fd), owner_pid_(::getpid()), base_(base) {
  free_.emplace(0, kReserveBytes);
}

SharedHostArena* SharedHostArena::enable() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_arenas.empty() && g_arenas.back()->owner_pid_ == ::getpid()) return g_arenas.back();
  if (g_refused) return nullptr;
  const int fd = ::memfd_create("zero-shared-host-arena", MFD_CLOEXEC);
  void* base = MAP_FAILED;
  if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(kReserveBytes)) == 0) {
    base = ::mmap(nullptr, kReserveBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd,
                  0);
  }
  if (base == MAP_FAILED) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    g_refused = true;
    log::warn("shared host arena: cannot make a {} GiB memfd mapping ({}); ShmComm peers read "
             "buffers through the kernel instead",
             kReserveBytes >> 30, std::strerror(err));
    return nullptr;
  }
  // A parent's arena, if this is a forked child, stays mapped for its blocks but is no longer
  // handed out (its pages are the parent's too).
  g_arenas.push_back(new SharedHostArena(fd, static_cast<std::byte*>(base)));
  return g_arenas.back();
}

SharedHostArena* SharedHostArena::get() {
  std::lock_guard<std::mutex> lock(g_mu);
  return !g_arenas.empty() && g_arenas.back()->owner_pid_ == ::getpid() ? g_arenas.back()
                                                                          : nullptr;
}

SharedHostArena* SharedHostArena::any_containing(const void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (SharedHostArena* a : g_arenas) {
    if (a->contains(p)) return a;
  }
  return nullptr;
}

void* SharedHostArena::allocate(std::size_t bytes) noexcept {
  if (bytes == 0 || bytes > kReserveBytes) return nullptr;
  const std::size_t size = round_up(bytes, kPage);
  const std::size_t align = size >= kHugePage ? kHugePage : kPage;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const std::size_t begin = it->first, end = it->first + it->second;
    const auto at = reinterpret_cast<std::uintptr_t>(base_);  // aligned in the address space
    const std::size_t start = round_up(at + begin, align) - at;
    if (start + size > end) continue;
    free_.erase(it);
    if (start > begin) free_.emplace(begin, start - begin);
    if (start + size < end) free_.emplace(start + size, end - start - size);
    return base_ + start;
  }
  return nullptr;
}

void SharedHostArena::free(void* p, std::size_t bytes) noexcept {
  const std::size_t size = round_up(bytes, kPage);
  const auto offset = static_cast<std::size_t>(static_cast<std::byte*>(p) - base_);
  if (owner_pid_ != ::getpid()) return;  // a parent's block in a forked child: its pages too
  // The pages go back to the kernel; a later block here starts zero-filled.
  (void)::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                    static_cast<off_t>(size));
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = free_.emplace(offset, size);
  if (!inserted) return;  // a double free; nothing sane to do
  if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

bool SharedHostArena::contains(const void* p) const noexcept {
  const auto* b = static_cast<const std::byte*>(p);
  return b >= base_ && b < base_ + kReserveBytes;
}

}  // namespace zero
