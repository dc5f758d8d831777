// Both AsyncIo backends move the same bytes, report failures naming file and offset, and honour
// injected faults; SwapDir validates its path, removes dead runs' folders and cleans up.
#include "offload/async_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include "offload/swap_dir.h"
#include "tests/temp_dir.h"
#include "zero/base/error.h"

namespace zero::offload {
namespace {

struct Aligned {
  explicit Aligned(std::size_t n) : bytes(n) {
    REQUIRE(::posix_memalign(&ptr, 4096, n) == 0);
  }
  ~Aligned() { std::free(ptr); }
  std::byte* data() const { return static_cast<std::byte*>(ptr); }
  void* ptr = nullptr;
  std::size_t bytes;
};

std::vector<AioOptions::Backend> backends() {
  return {AioOptions::Backend::Auto, AioOptions::Backend::Threads};
}

TEST_CASE("both backends write and read back every byte, in pieces, with a deep queue") {
  test::TempDir tmp("zero_aio");
  for (AioOptions::Backend backend : backends()) {
    AioOptions o;
    o.backend = backend;
    o.block_size = 64 << 10;
    o.queue_depth = 4;
    o.threads = 2;
    auto io = make_async_io(o);
    INFO(io->name());
    SwapDir dir(tmp.str(), "nvme_path");
    const int fd = dir.open("data.swp");
    const std::size_t n = (1 << 20) + 3 * 4096;  // not a multiple of the block size
    Aligned out(n), in(n);
    for (std::size_t i = 0; i < n; ++i) out.data()[i] = static_cast<std::byte>((i * 131) % 251);
    std::memset(in.data(), 0, n);
    io->wait(io->submit({{IoOp::Write, fd, out.data(), n, 8192, "data.swp"}}));
    io->wait(io->submit({{IoOp::Read, fd, in.data(), n, 8192, "data.swp"}}));
    REQUIRE(std::memcmp(in.data(), out.data(), n) == 0);
    CHECK(io->calls() == 2 * ((n + o.block_size - 1) / o.block_size));
    // An empty batch is a ticket too.
    io->wait(io->submit({}));
  }
}

TEST_CASE("a read past the end, or an injected error, names the file and the offset") {
  test::TempDir tmp("zero_aio");
  for (AioOptions::Backend backend : backends()) {
    AioOptions o;
    o.backend = backend;
    auto io = make_async_io(o);
    INFO(io->name());
    SwapDir dir(tmp.str(), "nvme_path");
    const int fd = dir.open("x.swp");
    Aligned buf(8192);
    std::memset(buf.data(), 1, 8192);
    CHECK_THROWS_WITH(io->wait(io->submit({{IoOp::Read, fd, buf.data(), 8192, 0, "x.swp"}})),
                      Catch::Contains("x.swp") && Catch::Contains("short read") &&
                          Catch::Contains("offset 0"));
    const std::uint64_t before = io->calls();
    io->set_fault([before](std::uint64_t call, const IoRequest&) {
      return call == before ? Fault{Fault::Kind::Error, ENOSPC} : Fault{};
    });
    CHECK_THROWS_WITH(
        io->wait(io->submit({{IoOp::Write, fd, buf.data(), 4096, 4096, "x.swp"}})),
        Catch::Contains("write of 4096 bytes at offset 4096 of x.swp") &&
            Catch::Contains(std::strerror(ENOSPC)));
    io->set_fault([](std::uint64_t, const IoRequest&) { return Fault{Fault::Kind::Short, 0}; });
    CHECK_THROWS_WITH(io->wait(io->submit({{IoOp::Write, fd, buf.data(), 8192, 0, "x.swp"}})),
                      Catch::Contains("short write: 4096 of 8192 bytes"));
    io->set_fault(nullptr);
    io->wait(io->submit({{IoOp::Write, fd, buf.data(), 8192, 0, "x.swp"}}));
  }
}

TEST_CASE("a swap folder is checked, made, cleaned up, and dead runs' folders are removed") {
  test::TempDir tmp("zero_swapdir");
  CHECK_THROWS_WITH(SwapDir(tmp / "missing", "zero_optimization.offload_optimizer.nvme_path"),
                    Catch::Contains("does not exist") && Catch::Contains("missing"));
  { std::ofstream(tmp / "file") << "x"; }
  CHECK_THROWS_WITH(SwapDir(tmp / "file", "k"), Catch::Contains("is not a folder"));
  std::filesystem::path made;
  {
    SwapDir dir(tmp.str(), "k");
    made = dir.path();
    REQUIRE(std::filesystem::is_directory(made));
    dir.open("a.swp");
    CHECK(std::filesystem::exists(made / "a.swp"));
    CHECK(dir.alignment() >= 512);
  }
  CHECK_FALSE(std::filesystem::exists(made));
  // A folder named for a pid that does not exist (pid_max is at most 2^22) is a killed run's.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::filesystem::path stale =
      tmp.path() / (std::string("zero-swap.") + host + ".4194999.0");
  std::filesystem::create_directories(stale);
  { std::ofstream(stale / "optimizer.swp") << "old"; }
  const std::filesystem::path alive =
      tmp.path() / (std::string("zero-swap.") + host + "." + std::to_string(::getpid()) + ".999");
  std::filesystem::create_directories(alive);
  CHECK(remove_stale_swap_dirs(tmp.path()) == 1);
  CHECK_FALSE(std::filesystem::exists(stale));
  CHECK(std::filesystem::exists(alive));  // this process is alive
}

}  // namespace
}  // namespace zero::offload
