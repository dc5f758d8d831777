// HierarchicalComm over device memory (a GPU engine's world): the same two-level collectives with
// the levels on DeviceInProcComm, the reordering and the arithmetic between the levels through the
// device's copies and compute table, the host exchanges on a control communicator. Each rank's
// device here is a CpuDevice, so every result must be bitwise what the host HierarchicalComm over
// InProcComm gives for the same topology (hierarchical_comm_test checks those against references).
// The same on one GPU is engine_gpu_test's.
#include <catch2/catch.hpp>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <chrono>
#include <stdexcept>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/zero/comm/comm_test_util.h"
#include "zero/base/error.h"
#include "zero/comm/communicator.h"
#include "zero/comm/device_inproc_comm.h"
#include "zero/comm/hierarchical_comm.h"
#include "zero/comm/inproc_comm.h"
#include "zero/comm/node_topology.h"
#include "zero/device/cpu_device.h"

using zero::Collective;
using zero::Communicator;
using zero::CpuDevice;
using zero::DType;
using zero::HierarchicalComm;
using zero::ReduceOp;
using zero::run_ranks;
namespace zt = zero::test;

namespace {

zero::NodeTopology topology(int world, int per_node) {
  return zero::resolve_node_topology(world, per_node, [](const char*) { return nullptr; });
}

zt::Place device_memory(zero::Device& device) {
  return [&device](std::size_t bytes) {
    auto buffer = std::make_shared<zero::Buffer>(device.allocate(
        std::max<std::size_t>(bytes, 1), zero::MemoryKind::Device, zero::MemoryTag::Other));
    return std::shared_ptr<std::byte>(buffer, static_cast<std::byte*>(buffer->data()));
  };
}

bool same(const zt::Bytes& a, const zt::Bytes& b) {
  return a.size_bytes() == b.size_bytes() &&
         (a.size_bytes() == 0 || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

}  // namespace

TEST_CASE("two-level collectives on device memory give the host's bits", "[comm]") {
  const std::vector<std::size_t> sizes = {0, 1, 7, 1031};
  for (const auto& [world, per_node] : {std::pair{4, 2}, std::pair{6, 3}, std::pair{6, 2}}) {
    std::vector<zt::Case> cases;
    for (const zt::Case& c : zt::all_cases(world, sizes)) {
      const bool reduces = c.kind == Collective::ReduceScatter || c.kind == Collective::AllReduce;
      if (!(reduces && c.dtype == DType::F64)) cases.push_back(c);  // not reduced on a device
    }
    INFO("world " << world << " as nodes of " << per_node << ", " << cases.size() << " cases");
    zt::Tally tally;
    std::vector<std::string> names(static_cast<std::size_t>(world));
    std::vector<zero::NodeTraffic> host_bytes(static_cast<std::size_t>(world)),
        device_bytes(static_cast<std::size_t>(world));
    std::size_t nonzero = 0;
    run_ranks(world, [&](Communicator& host) {
      const auto r = static_cast<std::size_t>(host.rank());
      CpuDevice device(host.rank());
      const auto on_device = zero::DeviceInProcWorld::join(host, device);
      auto host_nodes = HierarchicalComm::create(host, topology(world, per_node));
      auto device_nodes =
          HierarchicalComm::create(*on_device, topology(world, per_node), &device, &host);
      names[r] = device_nodes->backend_name();
      for (const zt::Case& c : cases) {
        const zt::Bytes expected = zt::perform_case(*host_nodes, c);
        const zt::Bytes got = zt::perform_case(*device_nodes, c, device_memory(device));
        if (r == 0) {
          for (std::size_t i = 0; i < got.elems(); ++i) nonzero += got.get(i) != 0.0;
        }
        tally.check(same(expected, got), fmt::format("rank {}: {}", r, c.name(world)));
      }
      // The quantized reduce-scatter (qgZ), with and without LoCo's error feedback (on the host).
      for (const DType dtype : {DType::F32, DType::BF16}) {
        const std::size_t c = 1031;
        const zt::Bytes in = zt::make_input(5, dtype, host.rank(), static_cast<std::size_t>(world) * c);
        const auto place = device_memory(device);
        const auto d_in = place(in.size_bytes());
        const auto d_out = place(c * zero::dtype_size(dtype));
        std::memcpy(d_in.get(), in.data(), in.size_bytes());
        zero::QuantizationFeedback host_fb, device_fb;
        host_fb.beta = device_fb.beta = 0.5f;
        for (int call = 0; call < 3; ++call) {
          for (zero::QuantizationFeedback* fb : {static_cast<zero::QuantizationFeedback*>(nullptr),
                                                 &host_fb}) {
            zt::Bytes expected(dtype, c), got(dtype, c);
            host_nodes->reduce_scatter(in.data(), expected.data(), c, dtype, ReduceOp::Avg, 4, fb)
                .wait();
            device_nodes
                ->reduce_scatter(d_in.get(), d_out.get(), c, dtype, ReduceOp::Avg, 4,
                                 fb == nullptr ? nullptr : &device_fb)
                .wait();
            std::memcpy(got.data(), d_out.get(), got.size_bytes());
            tally.check(same(expected, got),
                        fmt::format("rank {}: qgZ {} call {}{}", r, zero::dtype_name(dtype), call,
                                    fb != nullptr ? " with LoCo" : ""));
          }
        }
        tally.check(host_fb.state == device_fb.state, "the same LoCo state");
      }
      host_bytes[r] = host_nodes->traffic();
      device_bytes[r] = device_nodes->traffic();
    });
    INFO(tally.report());
    REQUIRE(tally.failed() == 0);
    REQUIRE(tally.checks() == static_cast<std::size_t>(world) * (cases.size() + 2 * 3 * 2 + 2));
    REQUIRE(nonzero > 1031 * 20);  // the outputs hold values, not zeros
    CHECK(names[0].find("hierarchical(device-inproc/device-inproc") == 0);
    for (std::size_t r = 0; r < static_cast<std::size_t>(world); ++r) {
      CHECK(device_bytes[r].intra_bytes == host_bytes[r].intra_bytes);
      CHECK(device_bytes[r].inter_bytes == host_bytes[r].inter_bytes);
      CHECK(device_bytes[r].inter_bytes > 0);
    }
  }
}

// What the engine's bucket check counts beside the buckets (HierarchicalComm::device_scratch) is
// what the collectives keep: each collective alone on a fresh communicator, then a run of several,
// which holds the slot-wise maximum.
TEST_CASE("device_scratch() is the device memory two-level collectives keep", "[comm]") {
  using Scratch = HierarchicalComm::LevelScratch;
  struct Call {
    Collective kind;
    DType dtype;
    ReduceOp op;
    std::size_t elems;
    int bits;
  };
  const std::vector<Call> calls = {
      {Collective::ReduceScatter, DType::F32, ReduceOp::Avg, 1031, 0},
      {Collective::ReduceScatter, DType::BF16, ReduceOp::Sum, 1031, 0},  // widened to fp32
      {Collective::ReduceScatter, DType::BF16, ReduceOp::Max, 1031, 0},  // in bf16
      {Collective::ReduceScatter, DType::BF16, ReduceOp::Avg, 1031, 4},  // qgZ
      {Collective::AllGather, DType::F16, ReduceOp::Sum, 2053, 0},
      {Collective::AllReduce, DType::BF16, ReduceOp::Sum, 1031, 0},  // padded to the node
      {Collective::AllToAll, DType::F32, ReduceOp::Sum, 7, 0},
  };
  const auto total = [](const Scratch& s) { return s[0] + s[1] + s[2]; };
  zt::Tally tally;
  std::vector<std::size_t> smallest(6, SIZE_MAX);
  run_ranks(6, [&](Communicator& host) {
    const auto r = static_cast<std::size_t>(host.rank());
    CpuDevice device(host.rank());
    const auto on_device = zero::DeviceInProcWorld::join(host, device);
    const auto staging = [&] {
      return device.ledger().usage(zero::MemoryKind::Device, zero::MemoryTag::Staging).current_bytes;
    };
    const auto perform = [&](Communicator& comm, const Call& c) {
      if (c.bits == 0) {
        zt::perform_case(comm, zt::Case{c.kind, c.dtype, c.op, c.elems, false, 0, 9},
                         device_memory(device));
        return;
      }
      const auto place = device_memory(device);
      const auto in = place(6 * c.elems * zero::dtype_size(c.dtype));
      const auto out = place(c.elems * zero::dtype_size(c.dtype));
      std::memset(in.get(), 0, 6 * c.elems * zero::dtype_size(c.dtype));
      comm.reduce_scatter(in.get(), out.get(), c.elems, c.dtype, c.op, c.bits).wait();
    };
    Scratch held{};
    for (int per_node : {2, 3}) {
      auto all = HierarchicalComm::create(*on_device, topology(6, per_node), &device, &host);
      for (const Call& c : calls) {
        auto nodes = HierarchicalComm::create(*on_device, topology(6, per_node), &device, &host);
        const std::size_t before = staging();
        perform(*nodes, c);
        const Scratch want = nodes->device_scratch(c.kind, c.elems, c.dtype, c.op, c.bits);
        smallest[r] = std::min(smallest[r], total(want));
        tally.check(staging() - before == total(want),
                    fmt::format("rank {}, nodes of {}: {} of {}: kept {} bytes, counted {}", r,
                                per_node, zero::dtype_name(c.dtype), c.elems, staging() - before,
                                total(want)));
        for (std::size_t s = 0; s < held.size(); ++s) held[s] = std::max(held[s], want[s]);
      }
      // Every call on one communicator: it keeps the slot-wise maximum, nothing more.
      const std::size_t before = staging();
      for (const Call& c : calls) perform(*all, c);
      tally.check(staging() - before == total(held),
                  fmt::format("rank {}, nodes of {}: a run kept {} bytes, counted {}", r, per_node,
                              staging() - before, total(held)));
      held = {};
    }
    // One level (every rank its own node), or the host's memory: nothing counted on the device.
    auto flat = HierarchicalComm::create(*on_device, topology(6, 1), &device, &host);
    auto on_host = HierarchicalComm::create(host, topology(6, 2));
    const Call& c = calls.front();
    tally.check(total(flat->device_scratch(c.kind, c.elems, c.dtype, c.op)) == 0 &&
                    total(on_host->device_scratch(c.kind, c.elems, c.dtype, c.op)) == 0,
                fmt::format("rank {}: none on one level or on the host", r));
  });
  INFO(tally.report());
  REQUIRE(tally.failed() == 0);
  REQUIRE(tally.checks() == 6 * (2 * (calls.size() + 1) + 1));
  for (std::size_t m : smallest) REQUIRE(m > 0);  // every call keeps some: not vacuous
}

TEST_CASE("splits of a two-level device communicator keep the topology and the device",
          "[comm]") {
  zt::Tally tally;
  run_ranks(8, [&](Communicator& host) {
    const int r = host.rank();
    CpuDevice device(r);
    const auto on_device = zero::DeviceInProcWorld::join(host, device);
    auto nodes = HierarchicalComm::create(*on_device, topology(8, 2), &device, &host);
    // {0,1,2,3} and {4,5,6,7}: two nodes of two each, so two levels again, and a split of that.
    auto half = nodes->split(r / 4, r % 4);
    auto* h = dynamic_cast<HierarchicalComm*>(half.get());
    tally.check(h != nullptr && h->two_level(), fmt::format("rank {}: two levels", r));
    auto pair = half->split(r % 2, r);  // {0,2} / {1,3}: one rank per node
    auto buffer = device.allocate(64 * sizeof(float), zero::MemoryKind::Device,
                                  zero::MemoryTag::Other);
    std::vector<float> v(64, static_cast<float>(r + 1));
    device.copy(buffer.data(), v.data(), 64 * sizeof(float));
    half->all_reduce(buffer.data(), buffer.data(), 64, DType::F32, ReduceOp::Sum).wait();
    pair->all_reduce(buffer.data(), buffer.data(), 64, DType::F32, ReduceOp::Sum).wait();
    device.copy(v.data(), buffer.data(), 64 * sizeof(float));
    // The half's sum, then summed over the pair: the two halves' ranks of the same parity.
    const float quarter = r < 4 ? 1 + 2 + 3 + 4 : 5 + 6 + 7 + 8;
    tally.check(v[0] == 2 * quarter && v[63] == 2 * quarter,
                fmt::format("rank {}: {} expected {}", r, v[0], 2 * quarter));
  });
  INFO(tally.report());
  REQUIRE(tally.failed() == 0);
  REQUIRE(tally.checks() == 16);
}

// The host world's abort does not reach the device communicators (DeviceInProcComm's world, or
// NCCL's): a lost rank is noticed at their timeout, here 3 s, and every other rank's collective
// fails naming itself.
TEST_CASE("a rank lost before a two-level collective on device memory ends every rank with an "
          "error at the levels' timeout, not a hang",
          "[comm]") {
  using namespace std::chrono_literals;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> errors(4);
  try {
    run_ranks(
        4,
        [&](Communicator& host) {
          CpuDevice device(host.rank());
          const auto on_device = zero::DeviceInProcWorld::join(host, device, {3s});
          auto nodes = HierarchicalComm::create(*on_device, topology(4, 2), &device, &host);
          if (host.rank() == 3) throw std::runtime_error("rank 3 lost");
          auto buffer = device.allocate(64 * sizeof(float), zero::MemoryKind::Device,
                                        zero::MemoryTag::Other);
          try {
            nodes->all_reduce(buffer.data(), buffer.data(), 64, DType::F32, ReduceOp::Sum).wait();
          } catch (const zero::CommError& e) {
            errors[static_cast<std::size_t>(host.rank())] = e.what();
          }
        },
        zero::CommOptions{20s});
    FAIL("expected rank 3's error");
  } catch (const std::runtime_error& e) {
    REQUIRE(std::string(e.what()) == "rank 3 lost");
  }
  const auto took = std::chrono::steady_clock::now() - start;
  INFO("took " << std::chrono::duration<double>(took).count() << " s");
  for (std::size_t r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(errors[r].find("all_reduce (sum, fp32) of 64 elements") != std::string::npos);
  }
  CHECK(took < 15s);  // the device levels' 3 s timeout, not the host world's 20 s
}

TEST_CASE("an fp64 average on device memory is refused at the call, and the group goes on",
          "[comm]") {
  zt::Tally tally;
  run_ranks(4, [&](Communicator& host) {
    const int r = host.rank();
    CpuDevice device(r);
    const auto on_device = zero::DeviceInProcWorld::join(host, device);
    auto nodes = HierarchicalComm::create(*on_device, topology(4, 2), &device, &host);
    auto buffer = device.allocate(8 * sizeof(double), zero::MemoryKind::Device,
                                  zero::MemoryTag::Other);
    std::string error;
    try {
      nodes->all_reduce(buffer.data(), buffer.data(), 8, DType::F64, ReduceOp::Avg).wait();
    } catch (const zero::CommError& e) {
      error = e.what();
    }
    tally.check(error.find("fp64 average on device memory") != std::string::npos,
                fmt::format("rank {}: '{}'", r, error));
    float x = 1.0f;
    device.copy(buffer.data(), &x, sizeof x);
    nodes->all_reduce(buffer.data(), buffer.data(), 1, DType::F32, ReduceOp::Sum).wait();
    device.copy(&x, buffer.data(), sizeof x);
    tally.check(x == 4.0f, fmt::format("rank {}: the sum after it is {}", r, x));
  });
  INFO(tally.report());
  REQUIRE(tally.failed() == 0);
  REQUIRE(tally.checks() == 8);
}
