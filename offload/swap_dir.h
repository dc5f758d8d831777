// A run's folder of swap files under one `nvme_path`.
//
// The folder is `<nvme_path>/zero-swap.<host>.<pid>.<n>`: created empty, removed with its files
// when the SwapDir is destroyed. Creating one first removes the folders that runs of this host
// left behind when they were killed (their pid is gone), with a note naming each. Files are
// opened with O_DIRECT; on a filesystem that refuses it (tmpfs) they are opened buffered, said
// once. alignment() is what direct I/O needs of offsets, sizes and buffer addresses here.
//
// Thread safety: a SwapDir is used by one rank's thread; its files' descriptors may be used by
// I/O threads.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace zero::offload {

class SwapDir {
 public:
  // Throws ConfigError at `key` (e.g. "zero_optimization.offload_optimizer.nvme_path") when
  // `nvme_path` is missing, not a folder or not writable.
  SwapDir(const std::string& nvme_path, std::string_view key);
  ~SwapDir();
  SwapDir(const SwapDir&) = delete;
  SwapDir& operator=(const SwapDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Opens (creating, truncating) a swap file in the folder; returns its descriptor, which the
  // SwapDir closes. Throws IoError naming the path.
  int open(const std::string& name);
  bool direct() const { return direct_; }
  // Bytes that offsets, lengths and buffer addresses of direct I/O are multiples of.
  std::size_t alignment() const { return alignment_; }

 private:
  std::filesystem::path path_;
  std::vector<int> fds_;
  bool direct_ = true;
  std::size_t alignment_ = 4096;
};

// The folders of dead runs under `nvme_path` (on this host), removed; returns how many.
int remove_stale_swap_dirs(const std::filesystem::path& nvme_path);

}  // namespace zero::offload
