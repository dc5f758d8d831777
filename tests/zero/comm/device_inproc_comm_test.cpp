// DeviceInProcComm (in-process ranks whose buffers are device memory) on the CPU: each rank's
// device is a CpuDevice, so its compute table is the CPU's, and every collective must give
// bitwise what InProcComm gives over the same ranks. The same communicator on one GPU is
// engine_gpu_test's.
#include "zero/comm/device_inproc_comm.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/compute.h"
#include "tests/zero/comm/comm_test_util.h"
#include "zero/base/error.h"
#include "zero/base/half.h"
#include "zero/comm/communicator.h"
#include "zero/comm/inproc_comm.h"
#include "zero/device/cpu_device.h"

using namespace std::chrono_literals;
using zero::Collective;
using zero::CommError;
using zero::CommOptions;
using zero::Communicator;
using zero::CpuDevice;
using zero::DType;
using zero::ReduceOp;
using zero::run_ranks;
namespace zt = zero::test;

namespace {

// Buffers of `device`'s MemoryKind::Device memory for perform_case.
zt::Place device_memory(zero::Device& device) {
  return [&device](std::size_t bytes) {
    auto buffer = std::make_shared<zero::Buffer>(device.allocate(
        std::max<std::size_t>(bytes, 1), zero::MemoryKind::Device, zero::MemoryTag::Other));
    return std::shared_ptr<std::byte>(buffer, static_cast<std::byte*>(buffer->data()));
  };
}

// A CpuDevice whose reductions fail, as a GPU's kernel launch can.
class FailingDevice final : public CpuDevice {
 public:
  using CpuDevice::CpuDevice;
  const zero::kernels::ComputeKernels& compute() const override {
    static const zero::kernels::ComputeKernels table = [] {
      zero::kernels::ComputeKernels t = zero::kernels::cpu_compute_kernels();
      t.reduce = [](void*, const void* const*, int, std::size_t, DType, zero::kernels::ReduceKind,
                    float, const zero::kernels::CpuExec&) {
        throw zero::Error("injected reduce failure");
      };
      return t;
    }();
    return table;
  }
};

}  // namespace

TEST_CASE("every collective on device memory gives InProcComm's bits at world sizes 1-4",
          "[comm]") {
  const std::vector<std::size_t> sizes = {0, 1, 7, 1031, 65537};
  for (int world : {1, 2, 3, 4}) {
    std::vector<zt::Case> cases;
    for (const zt::Case& c : zt::all_cases(world, sizes)) {
      const bool reduces = c.kind == Collective::ReduceScatter || c.kind == Collective::AllReduce;
      if (!(reduces && c.dtype == DType::F64)) cases.push_back(c);  // refused: its own case
    }
    INFO("world " << world << ", " << cases.size() << " cases, sizes 0, 1, 7, 1031, 65537");
    zt::Tally tally;
    std::atomic<std::size_t> nonzero{0};
    run_ranks(world, [&](Communicator& host) {
      CpuDevice device(host.rank());
      const std::unique_ptr<Communicator> comm = zero::make_gpu_communicator(host, device);
      tally.check(comm->backend_name() == "device-inproc", "the factory's choice");
      for (const zt::Case& c : cases) {
        const zt::Bytes expected = zt::perform_case(host, c);
        const zt::Bytes got = zt::perform_case(*comm, c, device_memory(device));
        for (std::size_t i = 0; i < got.elems(); ++i) nonzero += got.get(i) != 0.0;
        tally.check(expected.size_bytes() == got.size_bytes() &&
                        std::memcmp(expected.data(), got.data(), got.size_bytes()) == 0,
                    fmt::format("rank {}: {}", host.rank(), c.name(world)));
      }
    });
    INFO(tally.report());
    REQUIRE(tally.failed() == 0);
    REQUIRE(tally.checks() == static_cast<std::size_t>(world) * (cases.size() + 1));
    // Not vacuous: the outputs hold the inputs' values, not zeros.
    REQUIRE(nonzero > static_cast<std::size_t>(world) * 65537 * 20);
  }
}

TEST_CASE("device max propagates NaN and 16-bit sums round once, as InProcComm's", "[comm]") {
  const float tiny = std::ldexp(1.0f, -9);  // rounds away in bf16 alone, not in an fp32 sum
  std::vector<std::vector<float>> maxima(4);
  std::vector<std::uint16_t> sums(4);
  run_ranks(4, [&](Communicator& host) {
    const auto r = static_cast<std::size_t>(host.rank());
    CpuDevice device(host.rank());
    auto comm = zero::DeviceInProcWorld::join(host, device);
    std::vector<float> x = {r == 1 ? std::numeric_limits<float>::quiet_NaN() : 1.0f,
                            static_cast<float>(r)};
    comm->all_reduce(x.data(), x.data(), 2, DType::F32, ReduceOp::Max).wait();
    maxima[r] = x;
    std::uint16_t b = zero::half::float_to_bf16(r == 0 ? 1.0f : tiny);
    comm->all_reduce(&b, &b, 1, DType::BF16, ReduceOp::Sum).wait();
    sums[r] = b;
  });
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(std::isnan(maxima[r][0]));
    CHECK(maxima[r][1] == 3.0f);
    CHECK(sums[r] == zero::half::float_to_bf16(1.0f + 3 * tiny));
    CHECK(sums[r] != zero::half::float_to_bf16(1.0f));
  }
}

TEST_CASE("splits of a device communicator reduce within their colors", "[comm]") {
  zt::Tally tally;
  run_ranks(4, [&](Communicator& host) {
    CpuDevice device(host.rank());
    auto comm = zero::DeviceInProcWorld::join(host, device);
    auto half = comm->split(host.rank() % 2, -host.rank());
    tally.check(half && half->size() == 2 && half->rank() == (host.rank() < 2 ? 1 : 0),
                "split order by key");
    float x = static_cast<float>(host.rank() + 1);
    half->all_reduce(&x, &x, 1, DType::F32, ReduceOp::Sum).wait();
    tally.check(x == (host.rank() % 2 == 0 ? 1.0f + 3.0f : 2.0f + 4.0f), "split sum");
    tally.check(comm->split(-1, 0) == nullptr, "color -1 joins no group");
  });
  INFO(tally.report());
  REQUIRE(tally.failed() == 0);
}

TEST_CASE("device ranks calling different collectives fail with CommError naming both calls",
          "[comm]") {
  CommOptions options;
  options.timeout = 10s;
  std::atomic<int> named{0};
  REQUIRE_THROWS_AS(
      run_ranks(
          2,
          [&](Communicator& host) {
            CpuDevice device(host.rank());
            auto comm = zero::DeviceInProcWorld::join(host, device, options);
            std::vector<float> v(16, 1.0f);
            try {
              if (host.rank() == 0) {
                comm->all_reduce(v.data(), v.data(), 16, DType::F32, ReduceOp::Sum).wait();
              } else {
                comm->broadcast(v.data(), 8, DType::F32, 0).wait();
              }
            } catch (const CommError& e) {
              const std::string m = e.what();
              named +=
                  m.find("rank 0: all_reduce (sum, fp32) of 16 elements") != std::string::npos &&
                  m.find("rank 1: broadcast (fp32, root 0) of 8 elements") != std::string::npos;
              throw;
            }
          },
          options),
      CommError);
  REQUIRE(named == 2);
}

TEST_CASE("a device collective a rank never calls times out naming the op and the ranks",
          "[comm]") {
  CommOptions options;
  options.timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    run_ranks(2, [&](Communicator& host) {
      CpuDevice device(host.rank());
      auto comm = zero::DeviceInProcWorld::join(host, device, options);
      std::vector<float> v(4, 1.0f);
      if (host.rank() == 0)
        comm->all_reduce(v.data(), v.data(), 4, DType::F32, ReduceOp::Avg).wait();
      host.barrier().wait();  // rank 1 waits here until rank 0 fails and aborts the world
    });
  } catch (const CommError& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("DeviceInProcComm rank 0 of 2: all_reduce (avg, fp32) of 4 elements") !=
        std::string::npos);
  CHECK(message.find("timed out") != std::string::npos);
  CHECK(message.find("missing ranks [1") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
}

TEST_CASE("a rank whose device fails a reduction fails its peers promptly with its error",
          "[comm]") {
  CommOptions options;
  options.timeout = 60s;
  const auto start = std::chrono::steady_clock::now();
  std::atomic<int> told{0};
  REQUIRE_THROWS_AS(
      run_ranks(
          3,
          [&](Communicator& host) {
            std::unique_ptr<zero::Device> device = host.rank() == 1
                                                       ? std::make_unique<FailingDevice>(1)
                                                       : std::make_unique<CpuDevice>(host.rank());
            auto comm = zero::DeviceInProcWorld::join(host, *device, options);
            std::vector<float> v(30, 1.0f), r(10);
            try {
              comm->reduce_scatter(v.data(), r.data(), 10, DType::F32, ReduceOp::Sum).wait();
            } catch (const CommError& e) {
              told +=
                  std::string(e.what()).find("rank 1 of 3: reduce_scatter") != std::string::npos &&
                  std::string(e.what()).find("injected reduce failure") != std::string::npos;
              throw;
            }
          },
          options),
      CommError);
  REQUIRE(told == 3);
  REQUIRE(std::chrono::steady_clock::now() - start < 10s);
}

TEST_CASE("what a device communicator does not do is refused by name", "[comm]") {
  zt::Tally tally;
  auto throws_with = [&](const auto& call, const std::string& text) {
    try {
      call();
      tally.check(false, "no error, expected: " + text);
    } catch (const CommError& e) {
      tally.check(std::string(e.what()).find(text) != std::string::npos, e.what());
    }
  };
  run_ranks(2, [&](Communicator& host) {
    CpuDevice device(host.rank());
    auto comm = zero::DeviceInProcWorld::join(host, device);
    tally.check(comm->backend_name() == "device-inproc", "backend name");
    tally.check(!comm->shares_address_space(), "no shared address space");
    double d = 1;
    throws_with([&] { comm->all_reduce(&d, &d, 1, DType::F64, ReduceOp::Sum); },
                "fp64 is not reduced on device memory");
    void* p = &d;
    throws_with([&] { comm->exchange_addresses(std::span<void* const>(&p, 1)); },
                "do not share an address space");
    comm->all_gather_in_place(&d, 1, DType::F64).wait();  // fp64 is copied, though
    comm->barrier().wait();
  });
  INFO(tally.report());
  REQUIRE(tally.failed() == 0);
  REQUIRE(tally.checks() == 8);
}
