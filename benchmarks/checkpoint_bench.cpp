// zero-bench checkpoint: Engine::save_checkpoint, Engine::load_checkpoint and zero_to_fp32, each as
// GB/s of the checkpoint bytes next to plain sequential I/O of the same bytes in the same run.
//
// W in-process ranks train 8 synthetic layers (fp32 model, AdamW, so a rank file holds master,
// exp_avg and exp_avg_sq) for one step, then:
//   save   best of 3R saves, each under a new tag as training saves global_stepN (every rank
//          writes its file, fsync, rename; rank 0 the manifest) vs  W threads each write()+fsync()
//          a new file of its rank file's size, the fastest of R tries each with 1, 2 and 8 MiB
//          write() calls (the engine's writer makes aligned 2 MiB ones). A save over an existing
//          tag also removes the old checkpoint's files (their cached pages and disk blocks: 45-90
//          ms for 201 MB here); its best of R is reported apart, as replace_seconds.
//   load   best of 2R loads after a first one (the ranged reads of each rank's new partition,
//          every file's checksums verified, the model copy refreshed) vs  W threads each read
//          the same checkpoint's file into memory just before each of those loads, the two ways
//          in turn, so that a slow moment of the machine falls on both sides. The first load
//          writes memory the process never touched before, a cost of another kind: it is
//          reported apart, as first_seconds.
// Each side gets as many timed tries as its limit: the disk and the memory of a shared machine
// have slow and fast moments, and the best of more tries finds a faster one.
//   zero_to_fp32  the tool (next to zero-bench in the build tree) as a child process, its wall
//          time and peak RSS (wait4) vs  one thread reading the master bytes and writing the
//          consolidated file's bytes (read + write + fsync)
//   deepspeed_to_fp32 (with --deepspeed DIR, a DeepSpeed checkpoint directory) zero_to_fp32 on it
//          vs  one thread reading its .pt files and writing the consolidated file's bytes
// The page cache is not dropped (that needs root and disturbs the machine): both sides of every
// comparison read what was just written, so they meet the same cache.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/bench_flags.h"
#include "benchmarks/commands.h"
#include "cli/flags.h"
#include "config/ds_config.h"
#include "kernels/cast.h"
#include "zero/base/error.h"
#include "zero/base/stream_copy.h"
#include "zero/base/timer.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/comm/inproc_comm.h"
#include "zero/device/device.h"
#include "zero/engine.h"
#include "zero/io/safetensors.h"

namespace zero::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kUsage =
    "usage: zero-bench checkpoint [--json] [--params N] [--world-size W] [--stage S] [--reps R] "
    "[--dir PATH] [--deepspeed DS_CHECKPOINT_DIR]";
constexpr int kLayers = 8;
constexpr std::size_t kIoChunk = std::size_t{8} << 20;

struct Args {
  bool json = false;
  std::size_t params = std::size_t{32} << 20;
  int world = 2;
  int stage = 2;
  int reps = 3;
  std::string dir;
  std::string deepspeed;  // a DeepSpeed checkpoint directory to convert, when given
};

Args parse(std::span<const std::string> argv) {
  Args a;
  auto number = [&](cli::FlagArg& arg, double lo, double hi) {
    const std::string given = flag_value(arg, kUsage);
    std::string text = given;
    double scale = 1;
    if (!text.empty() && (text.back() == 'M' || text.back() == 'K' || text.back() == 'G')) {
      scale = text.back() == 'K' ? 1024.0 : text.back() == 'M' ? 1048576.0 : 1073741824.0;
      text.pop_back();
    }
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end) * scale;
    ZERO_CHECK(!text.empty() && *end == '\0' && v >= lo && v <= hi && v == std::floor(v),
               "{} {}: expected a whole number in [{}, {}]", arg.name(), given, lo, hi);
    return v;
  };
  for (std::size_t i = 0; i < argv.size(); ++i) {
    cli::FlagArg arg(argv, i);
    const std::string& f = arg.name();
    if (f == "--json") {
      arg.no_value();
      a.json = true;
    } else if (f == "--params") {
      a.params = static_cast<std::size_t>(number(arg, kLayers * 64, 1e10));
    } else if (f == "--world-size") {
      a.world = static_cast<int>(number(arg, 1, 64));
    } else if (f == "--stage") {
      a.stage = static_cast<int>(number(arg, 0, 3));
    } else if (f == "--reps") {
      a.reps = static_cast<int>(number(arg, 1, 100));
    } else if (f == "--dir") {
      a.dir = flag_value(arg, kUsage);
    } else if (f == "--deepspeed") {
      a.deepspeed = flag_value(arg, kUsage);
    } else {
      ZERO_CHECK(false, "unexpected argument '{}'; {}", argv[i], kUsage);
    }
  }
  if (a.dir.empty())
    a.dir = (fs::temp_directory_path() / ("zero-bench-checkpoint-" + std::to_string(::getpid())))
                .string();
  return a;
}

// Writes `bytes` to `path` sequentially, `chunk` bytes a write() (write + fsync), and returns
// the seconds.
double plain_write(const std::string& path, std::size_t bytes, std::size_t chunk = kIoChunk) {
  std::vector<char> buf(std::min(bytes, chunk), 'z');
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZERO_CHECK_AS(IoError, fd >= 0, "cannot create {}: {}", path, std::strerror(errno));
  for (std::size_t done = 0; done < bytes;) {
    const ssize_t n = ::write(fd, buf.data(), std::min(buf.size(), bytes - done));
    ZERO_CHECK_AS(IoError, n > 0, "write to {} failed: {}", path, std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
  ZERO_CHECK_AS(IoError, ::fsync(fd) == 0, "fsync of {} failed", path);
  ::close(fd);
  return seconds_since(start);
}

// Reads `path` sequentially through a reused kIoChunk buffer: the page cache's copy speed, with
// nothing kept. Returns the seconds.
double plain_read(const std::string& path) {
  std::vector<char> buf(kIoChunk);
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZERO_CHECK_AS(IoError, fd >= 0, "cannot open {}: {}", path, std::strerror(errno));
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
  return seconds_since(start);
}

// Reads `path` into `dst` (already faulted in, the file's size): what any load must do at least,
// since it keeps every byte it reads. Two plain ways, whichever the caller asks for: large preads
// (the kernel's copy), or a populated read-only mapping copied out with non-temporal stores.
// Returns the seconds.
double plain_read_into(const std::string& path, std::span<std::byte> dst, bool mapped) {
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZERO_CHECK_AS(IoError, fd >= 0, "cannot open {}: {}", path, std::strerror(errno));
  if (mapped) {
    void* map = ::mmap(nullptr, dst.size(), PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    ZERO_CHECK_AS(IoError, map != MAP_FAILED, "cannot map {}: {}", path, std::strerror(errno));
    copy_streaming(dst.data(), map, dst.size());
    ::munmap(map, dst.size());
    ::close(fd);
    return seconds_since(start);
  }
  for (std::size_t done = 0; done < dst.size();) {
    const ssize_t n = ::pread(fd, dst.data() + done, std::min(kIoChunk, dst.size() - done),
                              static_cast<off_t>(done));
    ZERO_CHECK_AS(IoError, n > 0, "read of {} failed: {}", path,
                  n < 0 ? std::strerror(errno) : "file shorter than written");
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return seconds_since(start);
}

// Runs fn(rank) on `threads` threads at once and returns the wall seconds of the whole.
double concurrently(int threads, const std::function<void(int)>& fn) {
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(fn, t);
  for (auto& t : pool) t.join();
  return seconds_since(start);
}

std::size_t dir_bytes(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}

struct Figure {
  std::string op;
  std::size_t bytes = 0;
  double seconds = 0;
  std::string limit;
  double limit_seconds = 0;
  std::optional<long> peak_rss_bytes;
  // A second yardstick for the same bytes: reading them through a reused buffer, nothing kept.
  std::optional<double> cache_read_seconds;
  // The first repetition's seconds, when it differs in kind from the rest (a load's first
  // replacements are memory the process never touched before).
  std::optional<double> first_seconds;
  // A save's best seconds over a checkpoint of the same tag (removing the old one's files too).
  std::optional<double> replace_seconds;
};

void print(const Args& a, const Figure& f) {
  const double gbps = static_cast<double>(f.bytes) / f.seconds / 1e9;
  const double limit_gbps = static_cast<double>(f.bytes) / f.limit_seconds / 1e9;
  if (a.json) {
    nlohmann::ordered_json j{{"bench", "checkpoint"},     {"op", f.op},
                             {"params", a.params},        {"world_size", a.world},
                             {"stage", a.stage},          {"bytes", f.bytes},
                             {"seconds", f.seconds},      {"gb_per_s", gbps},
                             {"limit", f.limit},          {"limit_gb_per_s", limit_gbps},
                             {"ratio", gbps / limit_gbps}};
    if (f.peak_rss_bytes) j["peak_rss_bytes"] = *f.peak_rss_bytes;
    if (f.first_seconds) j["first_seconds"] = *f.first_seconds;
    if (f.replace_seconds) j["replace_seconds"] = *f.replace_seconds;
    if (f.cache_read_seconds) {
      const double cache_gbps = static_cast<double>(f.bytes) / *f.cache_read_seconds / 1e9;
      j["cache_read_gb_per_s"] = cache_gbps;
      j["ratio_to_cache_read"] = gbps / cache_gbps;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%-13s %10.1f MB %9.3f s %8.2f GB/s   %-17s %8.2f GB/s   ratio %.2f", f.op.c_str(),
                static_cast<double>(f.bytes) / 1e6, f.seconds, gbps, f.limit.c_str(), limit_gbps,
                gbps / limit_gbps);
    if (f.cache_read_seconds)
      std::printf("   (%.2f of a read through a reused buffer)",
                  f.seconds > 0 ? *f.cache_read_seconds / f.seconds : 0.0);
    if (f.first_seconds) std::printf("   (first %.3f s)", *f.first_seconds);
    if (f.replace_seconds) std::printf("   (over the same tag %.3f s)", *f.replace_seconds);
    if (f.peak_rss_bytes)
      std::printf("   peak RSS %.1f MB", static_cast<double>(*f.peak_rss_bytes) / 1e6);
    std::printf("\n");
  }
}

// Runs `tool checkpoint out` as a child process `reps` times: the best wall time and the largest
// peak RSS (wait4).
std::pair<double, long> time_tool(const std::string& tool, const std::string& checkpoint,
                                  const std::string& out, int reps) {
  double best = std::numeric_limits<double>::infinity();
  long peak_rss = 0;
  for (int rep = 0; rep < reps; ++rep) {
    const auto start = Clock::now();
    const pid_t pid = ::fork();
    ZERO_CHECK(pid >= 0, "fork failed: {}", std::strerror(errno));
    if (pid == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      ::execl(tool.c_str(), tool.c_str(), checkpoint.c_str(), out.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int status = 0;
    rusage usage{};
    ::wait4(pid, &status, 0, &usage);
    ZERO_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "{} {} {} failed (status {})", tool,
               checkpoint, out, status);
    best = std::min(best, seconds_since(start));
    peak_rss = std::max(peak_rss, usage.ru_maxrss * 1024L);
  }
  return {best, peak_rss};
}

// The plain equivalent of a conversion: read `inputs` sequentially, write `out_bytes`.
double plain_copy_seconds(const std::vector<std::string>& inputs, std::size_t out_bytes,
                          const std::string& scratch, int reps) {
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < reps; ++rep) {
    const auto start = Clock::now();
    for (const std::string& f : inputs) plain_read(f);
    plain_write(scratch, out_bytes);
    best = std::min(best, seconds_since(start));
  }
  return best;
}

// zero_to_fp32 from this build: next to zero-bench's own directory.
std::string zero_to_fp32_path() {
  const fs::path self = fs::read_symlink("/proc/self/exe");
  const fs::path tool = self.parent_path().parent_path() / "tools" / "zero_to_fp32";
  ZERO_CHECK(fs::exists(tool), "zero_to_fp32 not found at {} (build the zero_to_fp32 target)",
             tool.string());
  return tool.string();
}

}  // namespace

int run_checkpoint(std::span<const std::string> argv) {
  const Args a = parse(argv);
  fs::create_directories(a.dir);
  const std::string ckpt_dir = (fs::path(a.dir) / "ckpt").string();
  nlohmann::json cfg_json = {
      {"train_micro_batch_size_per_gpu", 1},
      {"gradient_accumulation_steps", 1},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
      {"zero_optimization", {{"stage", a.stage}, {"stage3_param_persistence_threshold", 0}}}};
  const config::DsConfig cfg =
      config::load_config_json(cfg_json, {.world_size = a.world, .values = {}});
  std::vector<ParamSpec> specs;
  for (int k = 0; k < kLayers; ++k) {
    specs.push_back({fmt::format("layers.{}.weight", k),
                     {static_cast<std::int64_t>(a.params / kLayers)},
                     DType::F32,
                     0,
                     k,
                     true});
  }
  if (!a.json) {
    std::printf(
        "zero-bench checkpoint: %zu fp32 parameters (AdamW), %d in-process ranks, ZeRO stage %d, "
        "in %s\n",
        a.params, a.world, a.stage, a.dir.c_str());
  }
  double best_save = std::numeric_limits<double>::infinity();
  double best_load = best_save;
  double first_load = best_save;
  double best_replace = best_save;
  auto tag_of = [](int r) { return fmt::format("bench{}", r); };
  // Rank `rank`'s file of the checkpoint saved as tag_of(r).
  auto rank_file = [&](int r, int rank) {
    return (fs::path(ckpt_dir) / tag_of(r) / ckpt::rank_file_name(rank, a.world)).string();
  };
  // A load keeps what it reads, so its limit is reading each rank's file into memory of the
  // file's size (faulted in here, as the engine's memory is), the faster of two plain ways.
  std::vector<std::vector<std::byte>> into(static_cast<std::size_t>(a.world));
  double plain_r = std::numeric_limits<double>::infinity();
  // As many timed tries as the limits get: R tries of three write sizes, of two read ways.
  const int saves = 3 * a.reps;
  const int loads = 2 * a.reps + 1;  // the first, cold one apart
  run_ranks(a.world, [&](Communicator& comm) {
    auto device = make_device("cpu", comm.rank());
    auto engine = Engine::create(cfg, comm, *device, specs, [](std::size_t i, std::span<float> v) {
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = 0.001f * static_cast<float>((i + j) % 1000);
    });
    // One step so the optimizer states are not zero.
    for (int u = 0; u < kLayers; ++u) engine->gather(u);
    for (std::size_t i = specs.size(); i-- > 0;) {
      std::span<std::byte> g = engine->grad(i);
      std::vector<float> v(g.size() / 4, 0.01f * static_cast<float>(comm.rank() + 1));
      std::memcpy(g.data(), v.data(), g.size());
      engine->grad_ready(i);
      engine->release(static_cast<int>(i));
    }
    engine->step();
    // 3R saves, each under a tag of its own as training saves global_stepN (the one before
    // removed untimed), and 2R + 1 loads of the newest, interleaved: the first load apart, 2R
    // after it. Then R saves over the last tag: replacing a checkpoint also removes the old one's
    // files (their cached pages and disk blocks), reported apart as replace_seconds.
    auto timed = [&](const std::function<void()>& fn) {
      comm.barrier().wait();
      const auto start = Clock::now();
      fn();
      comm.barrier().wait();
      return seconds_since(start);
    };
    for (int r = 0; r < std::max(saves, loads); ++r) {
      if (r < saves) {
        const double save_s = timed([&] { engine->save_checkpoint(ckpt_dir, tag_of(r)); });
        if (comm.rank() == 0) {
          best_save = std::min(best_save, save_s);
          if (r > 0) fs::remove_all(fs::path(ckpt_dir) / tag_of(r - 1));
        }
      }
      if (r >= loads) continue;
      if (r > 0) {
        // The newest tag is r's (loads < saves): its files, as the load reads them.
        std::vector<std::byte>& buffer = into[static_cast<std::size_t>(comm.rank())];
        const std::string file = rank_file(r, comm.rank());
        buffer.resize(fs::file_size(file), std::byte{1});
        const double read_s = timed([&] { plain_read_into(file, buffer, r % 2 == 0); });
        if (comm.rank() == 0) plain_r = std::min(plain_r, read_s);
      }
      const double load_s = timed([&] { engine->load_checkpoint(ckpt_dir); });
      if (comm.rank() == 0) {
        if (r == 0) {
          first_load = load_s;
        } else {
          best_load = std::min(best_load, load_s);
        }
      }
    }
    for (int r = 0; r < a.reps; ++r) {
      const double s = timed([&] { engine->save_checkpoint(ckpt_dir, tag_of(saves - 1)); });
      if (comm.rank() == 0) best_replace = std::min(best_replace, s);
    }
  });
  const fs::path tag_dir = fs::path(ckpt_dir) / tag_of(saves - 1);
  const std::size_t ckpt_bytes = dir_bytes(tag_dir);
  std::vector<std::string> rank_files;
  for (int r = 0; r < a.world; ++r) rank_files.push_back(rank_file(saves - 1, r));

  // The same bytes, plainly: a save's limit, and reading through a reused buffer (the page
  // cache's copy speed, nothing kept), reported beside the load's.
  into.clear();
  double plain_w = std::numeric_limits<double>::infinity(), cache_r = plain_w;
  auto plain_file = [&](int r) { return (fs::path(a.dir) / fmt::format("plain_{}", r)).string(); };
  for (int rep = 0; rep < a.reps; ++rep) {
    for (const std::size_t chunk :
         {std::size_t{1} << 20, std::size_t{2} << 20, std::size_t{8} << 20}) {
      for (int r = 0; r < a.world; ++r) fs::remove(plain_file(r));  // a new file, as a save's
      plain_w =
          std::min(plain_w, concurrently(a.world, [&](int r) {
                     plain_write(plain_file(r),
                                 fs::file_size(rank_files[static_cast<std::size_t>(r)]), chunk);
                   }));
    }
    cache_r = std::min(cache_r, concurrently(a.world, [&](int r) { plain_read(plain_file(r)); }));
  }
  print(a, {"save", ckpt_bytes, best_save, "sequential-write", plain_w, {}, {}, {}, best_replace});
  print(a,
        {"load", ckpt_bytes, best_load, "read-into-memory", plain_r, {}, cache_r, first_load, {}});

  // zero_to_fp32 as a child process.
  const std::string tool = zero_to_fp32_path();
  const std::string out = (fs::path(a.dir) / "consolidated.safetensors").string();
  const auto [tool_s, peak_rss] = time_tool(tool, ckpt_dir, out, a.reps);
  const std::size_t out_bytes = fs::file_size(out);
  // Validated: the consolidated file holds every layer in full.
  const auto reader = io::SafetensorsReader::open(out);
  ZERO_CHECK(reader.tensors().size() == specs.size(), "zero_to_fp32 wrote {} tensors, expected {}",
             reader.tensors().size(), specs.size());
  const double plain_copy =
      plain_copy_seconds(rank_files, out_bytes, (fs::path(a.dir) / "plain_copy").string(), a.reps);
  print(a,
        {"zero_to_fp32", out_bytes, tool_s, "sequential-copy", plain_copy, peak_rss, {}, {}, {}});

  if (!a.deepspeed.empty()) {
    // A DeepSpeed checkpoint: GB/s of its .pt bytes.
    std::vector<std::string> pt_files;
    std::size_t pt_bytes = 0;
    for (const auto& e : fs::recursive_directory_iterator(a.deepspeed)) {
      if (e.is_regular_file() && e.path().extension() == ".pt") {
        pt_files.push_back(e.path().string());
        pt_bytes += e.file_size();
      }
    }
    ZERO_CHECK(!pt_files.empty(), "--deepspeed {}: no .pt files below it", a.deepspeed);
    const std::string ds_out = (fs::path(a.dir) / "deepspeed.safetensors").string();
    const auto [ds_s, ds_rss] = time_tool(tool, a.deepspeed, ds_out, a.reps);
    const std::size_t ds_out_bytes = fs::file_size(ds_out);
    ZERO_CHECK(!io::SafetensorsReader::open(ds_out).tensors().empty(),
               "zero_to_fp32 wrote no tensors from {}", a.deepspeed);
    const double ds_plain = plain_copy_seconds(pt_files, ds_out_bytes,
                                               (fs::path(a.dir) / "plain_copy").string(), a.reps);
    print(a,
          {"deepspeed_to_fp32", pt_bytes, ds_s, "sequential-copy", ds_plain, ds_rss, {}, {}, {}});
  }
  fs::remove_all(a.dir);
  return 0;
}

}  // namespace zero::bench
