// NcclComm on every visible GPU: one in-process rank per GPU, the unique id bootstrapped over
// InProcComm, each collective checked against values computed on the host; 16-bit sums reduced
// in fp32; split; a timeout naming the op. Exits 77, reported as skipped, without a GPU.
#define CATCH_CONFIG_RUNNER
#include "zero/comm/nccl_comm.h"

#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <vector>

#include "kernels/cuda_device_count.h"
#include "zero/base/error.h"
#include "zero/base/half.h"
#include "zero/comm/inproc_comm.h"

using namespace std::chrono_literals;
using zero::DType;
using zero::ReduceOp;

namespace {

int gpus() {
  return zero::kernels::cuda_device_count();
}

// Runs fn(nccl) on one thread per GPU.
void on_every_gpu(const std::function<void(zero::NcclComm&)>& fn,
                  std::chrono::milliseconds timeout = 60s) {
  zero::CommOptions options;
  options.timeout = timeout;
  zero::run_ranks(
      gpus(),
      [&](zero::Communicator& host) {
        zero::NcclCommOptions nccl;
        nccl.comm = options;
        nccl.cuda_ordinal = host.rank();
        auto comm = zero::NcclComm::create(host, nccl);
        fn(*comm);
      },
      options);
}

template <class T>
std::vector<T> download(const void* device, std::size_t n) {
  std::vector<T> host(n);
  REQUIRE(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return host;
}

template <class T>
void* upload(const std::vector<T>& host) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, host.size() * sizeof(T)) == cudaSuccess);
  REQUIRE(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  return p;
}

// Two 64 MiB device buffers; keep() queues 100 copies between them on the legacy default stream,
// milliseconds of work for a collective to be ordered (or not) after.
class BusyLegacyStream {
 public:
  BusyLegacyStream() {
    REQUIRE(cudaMalloc(&a_, kBytes) == cudaSuccess);
    REQUIRE(cudaMalloc(&b_, kBytes) == cudaSuccess);
  }
  ~BusyLegacyStream() {
    cudaFree(a_);
    cudaFree(b_);
  }
  BusyLegacyStream(const BusyLegacyStream&) = delete;
  BusyLegacyStream& operator=(const BusyLegacyStream&) = delete;
  void keep() {
    for (int i = 0; i < 100; ++i) {
      REQUIRE(cudaMemcpyAsync(b_, a_, kBytes, cudaMemcpyDeviceToDevice, nullptr) == cudaSuccess);
    }
  }

 private:
  static constexpr std::size_t kBytes = std::size_t{64} << 20;
  void* a_ = nullptr;
  void* b_ = nullptr;
};

// What rank q contributes at element i of the ordering tests' all-gathers.
float rank_value(int q, std::size_t i) {
  return static_cast<float>(q * 1000 + i % 997);
}

// Every rank's chunk of `elems` in a gathered device buffer holds rank_value (sampled).
void require_gathered(const void* device, int world, std::size_t elems) {
  const auto got = download<float>(device, world * elems);
  for (int q = 0; q < world; ++q) {
    for (std::size_t i = 0; i < elems; i += 4099) REQUIRE(got[q * elems + i] == rank_value(q, i));
  }
}

}  // namespace

TEST_CASE("all_reduce, reduce_scatter, all_gather and broadcast give the expected values") {
  const int world = gpus();
  const std::size_t chunk = 1000;
  on_every_gpu([&](zero::NcclComm& comm) {
    const int r = comm.rank();
    std::vector<float> mine(world * chunk);
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<float>(r + 1) * (i % 7);
    void* buf = upload(mine);
    comm.all_reduce(buf, buf, mine.size(), DType::F32, ReduceOp::Sum).wait();
    const float ranks_sum = world * (world + 1) / 2.0f;
    auto reduced = download<float>(buf, mine.size());
    for (std::size_t i = 0; i < mine.size(); ++i) REQUIRE(reduced[i] == ranks_sum * (i % 7));

    void* rs_in = upload(mine);
    comm.reduce_scatter_in_place(rs_in, chunk, DType::F32, ReduceOp::Sum).wait();
    auto scattered = download<float>(static_cast<float*>(rs_in) + r * chunk, chunk);
    for (std::size_t i = 0; i < chunk; ++i) {
      REQUIRE(scattered[i] == ranks_sum * ((r * chunk + i) % 7));
    }

    std::vector<float> gathered_host(world * chunk, -1.0f);
    for (std::size_t i = 0; i < chunk; ++i) gathered_host[r * chunk + i] = static_cast<float>(r);
    void* gathered = upload(gathered_host);
    comm.all_gather_in_place(gathered, chunk, DType::F32).wait();
    auto all = download<float>(gathered, world * chunk);
    for (int q = 0; q < world; ++q) REQUIRE(all[q * chunk] == static_cast<float>(q));

    std::vector<float> b(10, static_cast<float>(r + 100));
    void* bc = upload(b);
    comm.broadcast(bc, 10, DType::F32, world - 1).wait();
    REQUIRE(download<float>(bc, 10)[0] == static_cast<float>(world + 99));
    comm.barrier().wait();
    for (void* p : {buf, rs_in, gathered, bc}) cudaFree(p);
  });
}

// The engine's kernels and a framework's gradient copies run on the legacy default stream, and
// the kernels of a framework's forward may still read a released gather buffer that the next
// all-gather writes: a collective must come after what that stream holds when it starts (the
// stream is kept busy for milliseconds first, so a collective not ordered after it would read the
// source before it is written and write the destination before it is read).
TEST_CASE("a collective is ordered after the work the legacy default stream holds") {
  const int world = gpus();
  constexpr std::size_t kElems = 1 << 18;
  on_every_gpu([&](zero::NcclComm& comm) {
    const int r = comm.rank();
    float* pinned = nullptr;
    REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), kElems * sizeof(float)) ==
            cudaSuccess);
    for (std::size_t i = 0; i < kElems; ++i) pinned[i] = rank_value(r, i);
    void* src = upload(std::vector<float>(kElems, 0.0f));
    const std::vector<float> old_values(world * kElems, -3.0f);
    void* dst = upload(old_values);
    void* seen = upload(std::vector<float>(world * kElems, 0.0f));
    BusyLegacyStream busy;
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

    busy.keep();
    // Written on the legacy stream before the collective starts: the source, and a read of the
    // destination's old values.
    REQUIRE(cudaMemcpyAsync(src, pinned, kElems * sizeof(float), cudaMemcpyHostToDevice,
                            nullptr) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(seen, dst, world * kElems * sizeof(float), cudaMemcpyDeviceToDevice,
                            nullptr) == cudaSuccess);
    comm.all_gather(src, dst, kElems, DType::F32).wait();
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

    require_gathered(dst, world, kElems);
    REQUIRE(download<float>(seen, world * kElems) == old_values);
    for (void* p : {src, dst, seen}) cudaFree(p);
    cudaFreeHost(pinned);
  });
}

// Work::order_stream: a stream waits for the collective on the GPU, the host not waiting (stage 3's
// gathers for a framework's stream). The collective itself waits for milliseconds of work queued
// on the legacy stream, so a copy on a non-blocking stream not ordered after it would read the
// destination's old values at once.
TEST_CASE("order_stream makes a stream wait for the collective on the GPU, not the host") {
  const int world = gpus();
  constexpr std::size_t kElems = 1 << 18;
  on_every_gpu([&](zero::NcclComm& comm) {
    const int r = comm.rank();
    std::vector<float> mine(kElems);
    for (std::size_t i = 0; i < kElems; ++i) mine[i] = rank_value(r, i);
    void* src = upload(mine);
    void* dst = upload(std::vector<float>(world * kElems, -3.0f));
    void* seen_legacy = upload(std::vector<float>(world * kElems, 0.0f));
    void* seen_side = upload(std::vector<float>(world * kElems, 0.0f));
    BusyLegacyStream busy;
    cudaStream_t side = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

    busy.keep();
    zero::Work work = comm.all_gather(src, dst, kElems, DType::F32);
    REQUIRE(work.order_stream(nullptr));  // the legacy default stream
    REQUIRE(work.order_stream(side));
    const std::size_t bytes = world * kElems * sizeof(float);
    REQUIRE(cudaMemcpyAsync(seen_legacy, dst, bytes, cudaMemcpyDeviceToDevice, nullptr) ==
            cudaSuccess);
    REQUIRE(cudaMemcpyAsync(seen_side, dst, bytes, cudaMemcpyDeviceToDevice, side) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    work.wait();  // done already; still fine to wait for

    require_gathered(seen_legacy, world, kElems);
    require_gathered(seen_side, world, kElems);
    REQUIRE(cudaStreamDestroy(side) == cudaSuccess);
    for (void* p : {src, dst, seen_legacy, seen_side}) cudaFree(p);
  });
}

TEST_CASE("a bf16 sum is reduced in fp32 and rounded once") {
  const int world = gpus();
  on_every_gpu([&](zero::NcclComm& comm) {
    // 1 + world × 2^-9: each addend alone rounds away in bf16, their fp32 sum does not.
    const std::uint16_t one = zero::half::float_to_bf16(comm.rank() == 0 ? 1.0f : 0.0f);
    const std::uint16_t small = zero::half::float_to_bf16(1.0f / 512);
    std::vector<std::uint16_t> v(64, comm.rank() == 0 ? one : small);
    void* d = upload(v);
    comm.all_reduce(d, d, v.size(), DType::BF16, ReduceOp::Sum).wait();
    const float expected = zero::half::bf16_to_float(
        zero::half::float_to_bf16(1.0f + static_cast<float>(world - 1) / 512));
    REQUIRE(zero::half::bf16_to_float(download<std::uint16_t>(d, 64)[5]) == expected);
    cudaFree(d);
  });
}

TEST_CASE("split makes sub-groups that reduce among themselves") {
  on_every_gpu([&](zero::NcclComm& comm) {
    auto half = comm.split(comm.rank() % 2, comm.rank());
    REQUIRE(half != nullptr);
    std::vector<float> one(4, 1.0f);
    void* d = upload(one);
    half->all_reduce(d, d, 4, DType::F32, ReduceOp::Sum).wait();
    REQUIRE(download<float>(d, 4)[0] == static_cast<float>(half->size()));
    cudaFree(d);
  });
}

TEST_CASE("a collective only some ranks call times out with a CommError naming it") {
  if (gpus() < 2) {
    WARN("one GPU: a missing peer cannot be staged");
    return;
  }
  REQUIRE_THROWS_WITH(on_every_gpu(
                          [&](zero::NcclComm& comm) {
                            if (comm.rank() != 0) return;
                            std::vector<float> v(16, 1.0f);
                            void* d = upload(v);
                            comm.all_reduce(d, d, 16, DType::F32, ReduceOp::Sum).wait();
                          },
                          500ms),
                      Catch::Contains("all_reduce") && Catch::Contains("did not complete"));
}

int main(int argc, char** argv) {
  if (gpus() == 0) {
    std::fprintf(stderr, "nccl_comm_test: no CUDA device, skipped\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
