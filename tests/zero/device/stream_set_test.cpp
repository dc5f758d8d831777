// StreamSet's ordering between the compute, comm and offload streams, on CpuDevice streams
// (worker threads), so the logic a GPU relies on is checked without one.
#include "zero/device/stream_set.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "zero/device/cpu_device.h"

using zero::StreamRole;

TEST_CASE("work after a handoff sees everything enqueued on the source stream before it") {
  zero::CpuDevice dev(0);
  zero::StreamSet streams(dev);
  std::atomic<int> produced{0};
  std::vector<int> seen;
  for (int round = 1; round <= 20; ++round) {
    // A slow producer on compute; without the handoff the offload stream would run first.
    dev.launch_host(streams.stream(StreamRole::Compute), [&produced, round] {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      produced.store(round);
    });
    streams.handoff(StreamRole::Compute, StreamRole::Offload);
    dev.launch_host(streams.stream(StreamRole::Offload),
                    [&produced, &seen] { seen.push_back(produced.load()); });
  }
  streams.synchronize_all();
  REQUIRE(seen.size() == 20);
  // Round r's reader runs after round r's producer (compute may already be further on).
  for (int i = 0; i < 20; ++i) REQUIRE(seen[i] >= i + 1);
}

TEST_CASE("a chain compute to comm to offload orders all three") {
  zero::CpuDevice dev(0);
  zero::StreamSet streams(dev);
  std::vector<char> order;
  std::mutex mu;
  auto mark = [&](char c) {
    return [&, c] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::lock_guard lock(mu);
      order.push_back(c);
    };
  };
  dev.launch_host(streams.stream(StreamRole::Compute), mark('c'));
  streams.handoff(StreamRole::Compute, StreamRole::Comm);
  dev.launch_host(streams.stream(StreamRole::Comm), mark('m'));
  streams.handoff(StreamRole::Comm, StreamRole::Offload);
  dev.launch_host(streams.stream(StreamRole::Offload), mark('o'));
  streams.last_handoff(StreamRole::Comm).synchronize();
  streams.synchronize_all();
  REQUIRE(order == std::vector<char>{'c', 'm', 'o'});
  REQUIRE(zero::stream_role_name(StreamRole::Offload) == "offload");
}

TEST_CASE("synchronize_all drains every stream and rethrows the first error") {
  zero::CpuDevice dev(0);
  zero::StreamSet streams(dev);
  std::atomic<bool> offload_ran{false};
  dev.launch_host(streams.stream(StreamRole::Comm),
                  [] { throw std::runtime_error("collective failed"); });
  dev.launch_host(streams.stream(StreamRole::Offload), [&] { offload_ran = true; });
  REQUIRE_THROWS_WITH(streams.synchronize_all(), Catch::Contains("collective failed"));
  REQUIRE(offload_ran);
  streams.synchronize_all();  // the error was reported once
}
