#include "offload/swap_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "zero/base/error.h"
#include "zero/base/log.h"

namespace zero::offload {
namespace fs = std::filesystem;
namespace {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "host";
  return buf;
}

// "zero-swap.<host>.": the prefix of this host's folders.
std::string prefix() { return "zero-swap." + host_name() + "."; }

bool pid_alive(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

// Direct-I/O alignment of the filesystem under `path` (statx's DIOALIGN where the kernel has it).
std::size_t dio_alignment(const fs::path& path) {
#ifdef STATX_DIOALIGN
  struct statx sx {};
  if (::statx(AT_FDCWD, path.c_str(), 0, STATX_DIOALIGN, &sx) == 0 &&
      (sx.stx_mask & STATX_DIOALIGN) != 0 && sx.stx_dio_offset_align != 0) {
    return std::max<std::size_t>({sx.stx_dio_offset_align, sx.stx_dio_mem_align, 512});
  }
#endif
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && st.st_blksize > 0) {
    return static_cast<std::size_t>(st.st_blksize);
  }
  return 4096;
}

}  // namespace

int remove_stale_swap_dirs(const fs::path& nvme_path) {
  const std::string mine = prefix();
  int removed = 0;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(nvme_path, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind(mine, 0) != 0) continue;
    // <prefix><pid>.<n>
    const std::string rest = name.substr(mine.size());
    char* end = nullptr;
    const long pid = std::strtol(rest.c_str(), &end, 10);
    if (end == rest.c_str() || *end != '.' || pid <= 0 || pid_alive(pid)) continue;
    std::error_code rm;
    const auto n = fs::remove_all(e.path(), rm);
    if (rm) {
      log::warn("could not remove the swap folder {} of a killed run (pid {}): {}",
                e.path().string(), pid, rm.message());
    } else {
      log::note("removed the swap folder {} ({} files) left by a killed run (pid {})",
                e.path().string(), n > 0 ? n - 1 : 0, pid);
      ++removed;
    }
  }
  return removed;
}

SwapDir::SwapDir(const std::string& nvme_path, std::string_view key) {
  const std::string k(key);
  if (nvme_path.empty()) throw ConfigError(k, "is empty: name a folder on a fast disk");
  std::error_code ec;
  const fs::file_status st = fs::status(nvme_path, ec);
  if (!fs::exists(st)) {
    throw ConfigError(k, fmt::format("'{}' does not exist: create the folder or name another one",
                                     nvme_path));
  }
  if (!fs::is_directory(st)) {
    throw ConfigError(k, fmt::format("'{}' is not a folder", nvme_path));
  }
  if (::access(nvme_path.c_str(), W_OK | X_OK) != 0) {
    throw ConfigError(k, fmt::format("'{}' is not writable by this process ({})", nvme_path,
                                     std::strerror(errno)));
  }
  remove_stale_swap_dirs(nvme_path);
  static std::atomic<int> seq{0};
  path_ = fs::path(nvme_path) / fmt::format("{}{}.{}", prefix(), ::getpid(), seq++);
  fs::create_directory(path_, ec);
  if (ec) {
    throw IoError(fmt::format("cannot create the swap folder {}: {}", path_.string(),
                              ec.message()));
  }
  alignment_ = dio_alignment(path_);
}

SwapDir::~SwapDir() {
  for (int fd : fds_) ::close(fd);
  std::error_code ec;
  fs::remove_all(path_, ec);
  if (ec) log::warn("could not remove the swap folder {}: {}", path_.string(), ec.message());
}

int SwapDir::open(const std::string& name) {
  const fs::path file = path_ / name;
  int fd = -1;
  if (direct_) {
    fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EINVAL) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) {
        log::note("{} does not support O_DIRECT (tmpfs?): swap files use the page cache",
                  path_.parent_path().string());
      }
      direct_ = false;
    }
  }
  if (fd < 0) fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw IoError(fmt::format("cannot create the swap file {}: {}", file.string(),
                              std::strerror(errno)));
  }
  fds_.push_back(fd);
  return fd;
}

}  // namespace zero::offload
