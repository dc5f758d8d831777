#include "zero/comm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "zero/base/error.h"

namespace zero::comm_detail {

namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kMaxNameBytes = 200;

std::size_t round_up(std::size_t x, std::size_t to) {
  return (x + to - 1) / to * to;
}

std::string errno_text(int err) {
  return std::strerror(err);
}

std::uint64_t random_nonce() {
  std::uint64_t v = 0;
  if (::getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) {
    // No entropy source: the time and pid still differ between runs.
    v = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        (static_cast<std::uint64_t>(::getpid()) << 40);
  }
  return v;
}

struct Layout {
  std::size_t slots_offset;
  std::size_t staging_offset;
  std::size_t bytes;
};

Layout layout_for(int world_size, std::size_t window_bytes) {
  const auto n = static_cast<std::size_t>(world_size);
  Layout l{};
  l.slots_offset = round_up(sizeof(ShmHeader), kPage);
  l.staging_offset = round_up(l.slots_offset + n * sizeof(ShmRankSlot), kPage);
  l.bytes = l.staging_offset + n * 2 * window_bytes;
  return l;
}

// A mapping of an open file, unmapped on scope exit unless released.
struct Mapping {
  void* base = MAP_FAILED;
  std::size_t bytes = 0;
  ~Mapping() {
    if (base != MAP_FAILED) ::munmap(base, bytes);
  }
  void* release() { return std::exchange(base, MAP_FAILED); }
};

// Unlinks `path` if it still names the file open as `fd`.
void unlink_if_same(const std::string& path, int fd) {
  struct stat open_st {};
  struct stat path_st {};
  if (::fstat(fd, &open_st) != 0 || ::lstat(path.c_str(), &path_st) != 0) return;
  if (open_st.st_dev == path_st.st_dev && open_st.st_ino == path_st.st_ino) ::unlink(path.c_str());
}

// Whether the file open as `fd` is a ShmComm segment (initialised or not) that can never
// complete its bootstrap: its creator has exited. A temporary file that is not initialised yet
// is judged by the pid in its name.
bool is_stale(int fd, const std::string& file_name) {
  ShmHeader h{};
  const ssize_t n = ::pread(fd, &h, sizeof(h), 0);
  if (n == static_cast<ssize_t>(sizeof(h)) && h.magic == kShmMagic) {
    return process_exited(h.creator);
  }
  const std::size_t tmp = file_name.rfind(".tmp-");
  if (tmp == std::string::npos) return false;
  const long pid = std::strtol(file_name.c_str() + tmp + 5, nullptr, 10);
  return pid > 0 && process_with_pid(static_cast<std::int32_t>(pid)).pid == 0;
}

bool claim(ShmRankSlot& slot) {
  std::uint32_t expected = kRankFree;
  return std::atomic_ref<std::uint32_t>(slot.state)
      .compare_exchange_strong(expected, kRankClaimed, std::memory_order_acq_rel);
}

}  // namespace

std::string ShmSegment::path_of(const std::string& name) {
  return "/dev/shm/" + name;
}

std::string ShmSegment::name_problem(const std::string& name) {
  if (name.empty()) return "the name is empty";
  if (name.size() > kMaxNameBytes) {
    return fmt::format("the name has {} characters, more than {}", name.size(), kMaxNameBytes);
  }
  if (name.find('/') != std::string::npos) return "the name contains '/'";
  if (name == "." || name == "..") return "the name is '.' or '..'";
  if (name.find('\0') != std::string::npos) return "the name contains a NUL character";
  return {};
}

ShmSegment::ShmSegment(std::string name, void* base, std::size_t bytes, std::uint64_t device,
                       std::uint64_t inode)
    : name_(std::move(name)), base_(base), bytes_(bytes), device_(device), inode_(inode) {}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : name_(std::move(other.name_)),
      base_(std::exchange(other.base_, nullptr)),
      bytes_(other.bytes_),
      device_(other.device_),
      inode_(other.inode_),
      unlinked_(other.unlinked_) {}

ShmSegment::~ShmSegment() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

ShmRankSlot& ShmSegment::slot(int rank) const {
  auto* slots = reinterpret_cast<ShmRankSlot*>(static_cast<char*>(base_) + header().slots_offset);
  return slots[rank];
}

char* ShmSegment::staging(int rank, int parity) const {
  const ShmHeader& h = header();
  return static_cast<char*>(base_) + h.staging_offset +
         (static_cast<std::size_t>(rank) * 2 + static_cast<std::size_t>(parity)) * h.window_bytes;
}

void ShmSegment::unlink_name() noexcept {
  if (unlinked_ || base_ == nullptr) return;
  unlinked_ = true;
  const std::string path = path_of(name_);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;
  if (static_cast<std::uint64_t>(st.st_dev) != device_ ||
      static_cast<std::uint64_t>(st.st_ino) != inode_) {
    return;  // a newer segment of the same name
  }
  ::unlink(path.c_str());
}

int ShmSegment::remove_stale() {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  const uid_t me = ::geteuid();
  while (const dirent* e = ::readdir(dir)) {
    const std::string file_name = e->d_name;
    if (file_name == "." || file_name == "..") continue;
    const std::string path = path_of(file_name);
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != me) continue;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (is_stale(fd, file_name)) {
      unlink_if_same(path, fd);
      ++removed;
    }
    ::close(fd);
  }
  ::closedir(dir);
  return removed;
}

ShmSegment ShmSegment::create(const std::string& name, int world_size, std::size_t window_bytes) {
  const Layout layout = layout_for(world_size, window_bytes);
  const std::uint64_t nonce = random_nonce();
  const std::string path = path_of(name);
  const std::string tmp =
      fmt::format("{}.tmp-{}-{:08x}", path, ::getpid(), static_cast<std::uint32_t>(nonce));
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ZERO_CHECK_AS(CommError, fd >= 0, "ShmComm: cannot create the segment file {}: {}", tmp,
                errno_text(errno));
  auto fail = [&](const std::string& what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw CommError(fmt::format("ShmComm: {} ({} bytes for {} ranks) failed: {}", what,
                                layout.bytes, world_size, errno_text(err)));
  };
  if (::ftruncate(fd, static_cast<off_t>(layout.bytes)) != 0) fail("sizing " + tmp);
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("stat of " + tmp);
  Mapping map;
  map.bytes = layout.bytes;
  map.base = ::mmap(nullptr, layout.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map.base == MAP_FAILED) fail("mapping " + tmp);

  auto& h = *static_cast<ShmHeader*>(map.base);
  h.version = kShmLayoutVersion;
  h.world_size = world_size;
  h.nonce = nonce;
  h.creator = current_process();
  h.segment_bytes = layout.bytes;
  h.slots_offset = layout.slots_offset;
  h.staging_offset = layout.staging_offset;
  h.window_bytes = window_bytes;
  store_release(h.magic, kShmMagic);
  ShmSegment segment(name, map.release(), layout.bytes, static_cast<std::uint64_t>(st.st_dev),
                     static_cast<std::uint64_t>(st.st_ino));
  claim(segment.slot(0));
  // The rename is what publishes the segment: before it, no rank can see a half-made one.
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw CommError(fmt::format("ShmComm: cannot rename {} to {}: {}", tmp, path, errno_text(err)));
  }
  ::close(fd);
  return segment;
}

ShmSegment ShmSegment::attach(const std::string& name, int rank, int world_size,
                              std::chrono::steady_clock::time_point deadline,
                              std::chrono::milliseconds timeout,
                              const std::optional<ProcessId>& creator) {
  const std::string path = path_of(name);
  std::string ignored;  // why the last file found under the name was not used
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
      struct stat st {};
      Mapping map;
      if (::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) >= sizeof(ShmHeader)) {
        map.bytes = static_cast<std::size_t>(st.st_size);
        map.base = ::mmap(nullptr, map.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      }
      struct FdCloser {
        int owned;
        ~FdCloser() { ::close(owned); }
      } closer{fd};
      if (map.base != MAP_FAILED) {
        const auto& h = *static_cast<const ShmHeader*>(map.base);
        if (load_acquire(h.magic) != kShmMagic || h.version != kShmLayoutVersion ||
            h.segment_bytes != map.bytes) {
          ignored = "a file that is not a ShmComm segment of this version";
        } else if (process_exited(h.creator)) {
          ignored = fmt::format("a stale segment made by pid {}, which has exited", h.creator.pid);
          unlink_if_same(path, fd);
        } else if (creator && (h.creator.pid != creator->pid ||
                               h.creator.start_ticks != creator->start_ticks)) {
          ignored = fmt::format("a segment made by pid {}, not by rank 0 (pid {})", h.creator.pid,
                                creator->pid);
        } else {
          ZERO_CHECK_AS(CommError, h.world_size == world_size,
                        "ShmComm rank {}: segment {} was made by pid {} for {} ranks, but this "
                        "rank was told the world has {}",
                        rank, path, h.creator.pid, h.world_size, world_size);
          ShmSegment segment(name, map.release(), map.bytes, static_cast<std::uint64_t>(st.st_dev),
                             static_cast<std::uint64_t>(st.st_ino));
          if (!claim(segment.slot(rank))) {
            throw CommError(fmt::format(
                "ShmComm rank {}: the place of rank {} in segment {} (made by pid {}) is already "
                "taken by pid {}: two launches share the name, or two processes were given rank "
                "{}",
                rank, rank, path, h.creator.pid, load_acquire(segment.slot(rank).process.pid),
                rank));
          }
          return segment;
        }
      }
    } else if (errno != ENOENT) {
      ignored = fmt::format("cannot open it: {}", errno_text(errno));
    }
    if (creator && process_exited(*creator)) {
      throw CommError(
          fmt::format("ShmComm rank {}: rank 0 (pid {}) exited before it created segment {}", rank,
                      creator->pid, path));
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      throw CommError(fmt::format(
          "ShmComm rank {} of {}: segment {} did not appear within {} ms; rank 0 creates it (is "
          "rank 0 running, with the same name?){}",
          rank, world_size, path, timeout.count(), ignored.empty() ? "" : "; ignored " + ignored));
    }
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
}

}  // namespace zero::comm_detail
