// A developer's probe for the two GPU figures still short of their goals (docs/gpu-status.md):
// the squared-norm phase of `zero-bench step --device cuda` and the offloaded step's gradient
// landings. Built by hand with nvcc on the GPU machine (scripts/gpu-probe.sh), not by CMake: it
// includes the production kernel's translation unit to time it beside candidate kernels.
//
// Norm: the two production kernels (kernels/cuda_geometry.h: "staged", one CUDA block per
// 4096-element norm block staged in shared memory with eight threads summing; "lanes", every thread
// one of the CPU's lanes straight from memory) forced at every size, the launcher's choice by
// size, and the lanes kernel with other unrolls and block sizes. Every variant's block sums must
// be bitwise the staged kernel's, on bf16, fp16 and fp32 data with ragged tails.
//
// Landing: 8 MiB device-to-pinned copies (the landing's size) timed as the engine times them
// (cudaMemcpy, then a wait on the legacy stream), back to back; with a host pass between copies
// (the unpack that follows each landing, or only its reads of the landed bytes, or only its
// writes elsewhere); into two buffers in turn; as cudaMemcpyAsync on a non-blocking stream; and
// pipelined (a chunk landing while the host unpacks the one before).
//
// Output: one JSON object per line, then a table.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/companions_cuda_kernels.cu"

namespace {

using zero::DType;
namespace zd = zero::kernels::detail;

#define CHECK(call)                                                                        \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,                    \
                   cudaGetErrorString(e_));                                                \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

constexpr long long kBlock = static_cast<long long>(zd::kNormBlockElems);
constexpr int kLanes = zd::kCudaNormLanes;

struct Variant {
  const char* name;
  void (*launch)(const void*, DType, long long, double*);
};

// The production lanes kernel with another unroll or block size (at most kCudaNormLanesThreads).
template <int kUnroll, int kThreads>
void launch_lanes(const void* data, DType dtype, long long numel, double* sums) {
  static_assert(kThreads <= zd::kCudaNormLanesThreads, "the kernel's launch bound");
  const long long nb = (numel + kBlock - 1) / kBlock;
  const auto grid = static_cast<unsigned>((nb * kLanes + kThreads - 1) / kThreads);
  if (dtype == DType::F32) {
    zd::squared_norm_lanes_kernel<DType::F32, kUnroll><<<grid, kThreads>>>(data, numel, nb, sums);
  } else if (dtype == DType::BF16) {
    zd::squared_norm_lanes_kernel<DType::BF16, kUnroll><<<grid, kThreads>>>(data, numel, nb, sums);
  } else {
    zd::squared_norm_lanes_kernel<DType::F16, kUnroll><<<grid, kThreads>>>(data, numel, nb, sums);
  }
}

void check_status(const zd::CudaLaunchStatus& s) {
  if (s.error != nullptr) {
    std::fprintf(stderr, "%s: %s\n", s.kernel, s.error);
    std::exit(1);
  }
}

void launch_dispatch(const void* data, DType dtype, long long numel, double* sums) {
  check_status(zd::launch_squared_norm_blocks(data, dtype, numel, sums, nullptr));
}

template <zd::NormKernel kKernel>
void launch_forced(const void* data, DType dtype, long long numel, double* sums) {
  check_status(zd::launch_squared_norm_blocks_as(kKernel, data, dtype, numel, sums, nullptr));
}

const char* short_name(DType d) {
  return d == DType::F32 ? "fp32" : d == DType::BF16 ? "bf16" : "fp16";
}

// Gradient-like values (about 1e-3, both signs) in the dtype's bits, from a fixed LCG.
std::vector<unsigned char> random_bytes(DType dtype, long long numel, unsigned seed) {
  const std::size_t esize = dtype == DType::F32 ? 4 : 2;
  std::vector<unsigned char> out(static_cast<std::size_t>(numel) * esize);
  std::uint64_t s = 0x9e3779b97f4a7c15ull ^ seed;
  for (long long i = 0; i < numel; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float u = static_cast<float>((s >> 40) & 0xffffff) / 16777216.0f;  // [0, 1)
    const float v = (u - 0.5f) * 4e-3f;
    if (dtype == DType::F32) {
      std::memcpy(&out[i * 4], &v, 4);
    } else {
      const std::uint16_t b =
          dtype == DType::BF16 ? zero::half::float_to_bf16(v) : zero::half::float_to_f16(v);
      std::memcpy(&out[i * 2], &b, 2);
    }
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct NormResult {
  const char* variant;
  const char* dtype;
  long long numel;
  double median_us;
  double gbps;
  bool bitwise;
  int blocks_per_sm;
};

void run_norm(const std::vector<Variant>& variants, DType dtype, long long numel,
              std::vector<NormResult>& results) {
  const std::vector<unsigned char> host = random_bytes(dtype, numel, 7);
  void* data = nullptr;
  CHECK(cudaMalloc(&data, host.size()));
  CHECK(cudaMemcpy(data, host.data(), host.size(), cudaMemcpyHostToDevice));
  const long long nb = (numel + kBlock - 1) / kBlock;
  double* sums = nullptr;
  CHECK(cudaMalloc(&sums, nb * sizeof(double)));
  std::vector<double> reference, got(nb);
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (const Variant& v : variants) {
    CHECK(cudaMemset(sums, 0xff, nb * sizeof(double)));  // NaN: an unwritten sum fails
    v.launch(data, dtype, numel, sums);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(got.data(), sums, nb * sizeof(double), cudaMemcpyDeviceToHost));
    if (reference.empty()) reference = got;
    const bool same = std::memcmp(got.data(), reference.data(), nb * sizeof(double)) == 0;
    bool nonzero = false;
    for (double s : reference) nonzero = nonzero || s > 0;
    if (!nonzero) {
      std::fprintf(stderr, "reference sums are all zero: the data is wrong\n");
      std::exit(1);
    }
    for (int w = 0; w < 3; ++w) v.launch(data, dtype, numel, sums);
    std::vector<double> times;
    for (int r = 0; r < 25; ++r) {
      CHECK(cudaEventRecord(a));
      v.launch(data, dtype, numel, sums);
      CHECK(cudaEventRecord(b));
      CHECK(cudaEventSynchronize(b));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      times.push_back(ms * 1e3);
    }
    const double us = median(times);
    results.push_back({v.name, short_name(dtype), numel, us,
                       static_cast<double>(host.size()) / (us * 1e-6) / 1e9, same, 0});
  }
  CHECK(cudaFree(data));
  CHECK(cudaFree(sums));
}

int occupancy(const void* kernel, int threads, std::size_t smem) {
  int blocks = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem));
  return blocks;
}

// Device-to-device copy of `bytes`, counting read and written bytes: the HBM roofline.
double copy_gbps(std::size_t bytes) {
  void *s = nullptr, *d = nullptr;
  CHECK(cudaMalloc(&s, bytes));
  CHECK(cudaMalloc(&d, bytes));
  CHECK(cudaMemset(s, 1, bytes));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<double> times;
  for (int r = 0; r < 13; ++r) {
    CHECK(cudaEventRecord(a));
    CHECK(cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice));
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 3) times.push_back(ms * 1e-3);
  }
  CHECK(cudaFree(s));
  CHECK(cudaFree(d));
  return 2.0 * static_cast<double>(bytes) / median(times) / 1e9;
}

// The landing experiments: n copies of `bytes` from device memory into one pinned buffer.
struct LandResult {
  const char* how;
  double best_gbps, mean_gbps;
};

enum class Between { Nothing, Unpack, ReadOnly, WriteOnly };

void run_landing(std::size_t bytes, std::vector<LandResult>& out) {
  void* dev = nullptr;
  void* pinned[4] = {nullptr, nullptr, nullptr, nullptr};
  CHECK(cudaMalloc(&dev, bytes));
  CHECK(cudaMemset(dev, 3, bytes));
  for (void*& p : pinned) {
    CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
    std::memset(p, 0, bytes);
  }
  std::vector<float> widened(bytes / 2);
  std::vector<double> sums(1);
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The host's pass between landings, on OpenMP's threads as the engine's CPU table runs it: the
  // unpack (bf16 bits widened into fp32), only its reads of the landed bytes, or only its writes.
  auto host_pass = [&](Between what, const void* landed) {
    const auto n = static_cast<long long>(bytes / 2);
    const auto* src = static_cast<const std::uint16_t*>(landed);
    float* dst = widened.data();
    double acc = 0;
#pragma omp parallel for schedule(static) reduction(+ : acc)
    for (long long i = 0; i < n; ++i) {
      if (what == Between::Unpack) {
        const std::uint32_t w = static_cast<std::uint32_t>(src[i]) << 16;
        std::memcpy(&dst[i], &w, 4);
      } else if (what == Between::ReadOnly) {
        acc += src[i];
      } else {
        dst[i] = static_cast<float>(i);
      }
    }
    sums[0] = acc;
  };
  auto measure = [&](const char* how, bool async, Between between, int buffers) {
    std::vector<double> secs;
    for (int r = 0; r < 20; ++r) {
      void* dst = pinned[r % buffers];
      const auto t0 = std::chrono::steady_clock::now();
      if (async) {
        CHECK(cudaMemcpyAsync(dst, dev, bytes, cudaMemcpyDefault, stream));
        CHECK(cudaStreamSynchronize(stream));
      } else {
        CHECK(cudaMemcpy(dst, dev, bytes, cudaMemcpyDefault));
        CHECK(cudaStreamSynchronize(nullptr));
      }
      const auto t1 = std::chrono::steady_clock::now();
      if (r >= 4) secs.push_back(std::chrono::duration<double>(t1 - t0).count());
      if (between != Between::Nothing) host_pass(between, dst);
    }
    double sum = 0;
    for (double x : secs) sum += x;
    const double best = *std::min_element(secs.begin(), secs.end());
    out.push_back({how, bytes / best / 1e9, bytes / (sum / secs.size()) / 1e9});
  };
  measure("cudaMemcpy back to back", false, Between::Nothing, 1);
  measure("cudaMemcpy, host unpack between", false, Between::Unpack, 1);
  measure("cudaMemcpy, host reads landing between", false, Between::ReadOnly, 1);
  measure("cudaMemcpy, host writes elsewhere between", false, Between::WriteOnly, 1);
  measure("cudaMemcpy, unpack between, two buffers", false, Between::Unpack, 2);
  measure("cudaMemcpy, unpack between, four buffers", false, Between::Unpack, 4);
  measure("cudaMemcpyAsync non-blocking stream", true, Between::Nothing, 1);
  measure("cudaMemcpyAsync, host unpack between", true, Between::Unpack, 1);
  // Pipelined: chunk r lands in one buffer while the host unpacks chunk r - 1 from the other.
  {
    std::vector<double> secs;
    for (int r = 0; r < 21; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      CHECK(cudaMemcpyAsync(pinned[r % 2], dev, bytes, cudaMemcpyDefault, stream));
      if (r > 0) host_pass(Between::Unpack, pinned[(r + 1) % 2]);
      CHECK(cudaStreamSynchronize(stream));
      const auto t1 = std::chrono::steady_clock::now();
      if (r >= 5) secs.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    double sum = 0;
    for (double x : secs) sum += x;
    const double best = *std::min_element(secs.begin(), secs.end());
    out.push_back({"pipelined: land r while unpacking r-1 (per chunk)", bytes / best / 1e9,
                   bytes / (sum / secs.size()) / 1e9});
  }
  // The unpack alone, for the pipeline's other term.
  {
    std::vector<double> secs;
    for (int r = 0; r < 12; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      host_pass(Between::Unpack, pinned[0]);
      const auto t1 = std::chrono::steady_clock::now();
      if (r >= 2) secs.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    double sum = 0;
    for (double x : secs) sum += x;
    out.push_back({"host unpack alone (landed bytes per s)",
                   bytes / *std::min_element(secs.begin(), secs.end()) / 1e9,
                   bytes / (sum / secs.size()) / 1e9});
  }
  for (void* p : pinned) {  // every buffer was landed into by the four-buffer run
    if (static_cast<const unsigned char*>(p)[bytes - 1] != 3) {
      std::fprintf(stderr, "landing copy wrong\n");
      std::exit(1);
    }
  }
  CHECK(cudaStreamDestroy(stream));
  for (void* p : pinned) CHECK(cudaFreeHost(p));
  CHECK(cudaFree(dev));
}

}  // namespace

int main() {
  int device = 0;
  CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("{\"gpu\": \"%s\", \"sms\": %d}\n", prop.name, prop.multiProcessorCount);

  const std::vector<Variant> variants = {
      {"staged (production)", &launch_forced<zd::NormKernel::Staged>},
      {"lanes (production: unroll 16, 256 thr)", &launch_forced<zd::NormKernel::Lanes>},
      {"dispatch (production, by size)", &launch_dispatch},
      {"probe lanes unroll 8, 256 threads", &launch_lanes<8, 256>},
      {"probe lanes unroll 32, 256 threads", &launch_lanes<32, 256>},
      {"probe lanes unroll 16, 128 threads", &launch_lanes<16, 128>},
  };
  const int occ_prod = occupancy(reinterpret_cast<const void*>(zd::squared_norm_staged_kernel),
                                 zd::kCudaNormThreads, 0);
  const int occ_lanes = occupancy(
      reinterpret_cast<const void*>(zd::squared_norm_lanes_kernel<DType::BF16>), 256, 0);
  std::vector<NormResult> results;
  const long long big = 64ll << 20;
  run_norm(variants, DType::BF16, big, results);
  run_norm(variants, DType::BF16, big - 1234, results);
  run_norm(variants, DType::BF16, 8ll << 20, results);
  run_norm(variants, DType::F16, (8ll << 20) + 77, results);
  run_norm(variants, DType::F32, big - 4095, results);
  run_norm(variants, DType::BF16, 1ll << 20, results);
  run_norm(variants, DType::BF16, 4ll << 20, results);
  run_norm(variants, DType::BF16, 100000, results);
  const double roof = copy_gbps(256ull << 20);
  bool all_same = true;
  for (const NormResult& r : results) {
    all_same = all_same && r.bitwise;
    std::printf(
        "{\"probe\": \"norm\", \"variant\": \"%s\", \"dtype\": \"%s\", \"numel\": %lld, "
        "\"median_us\": %.2f, \"read_gb_per_s\": %.1f, \"copy_roofline_gb_per_s\": %.1f, "
        "\"bitwise_production\": %s}\n",
        r.variant, r.dtype, r.numel, r.median_us, r.gbps, roof, r.bitwise ? "true" : "false");
  }
  std::printf("{\"probe\": \"occupancy\", \"production_blocks_per_sm\": %d, "
              "\"lanes_blocks_per_sm\": %d}\n",
              occ_prod, occ_lanes);

  std::vector<LandResult> land;
  run_landing(8ull << 20, land);
  for (const LandResult& l : land) {
    std::printf("{\"probe\": \"landing\", \"how\": \"%s\", \"bytes\": %llu, \"best_gb_per_s\": "
                "%.2f, \"mean_gb_per_s\": %.2f}\n",
                l.how, 8ull << 20, l.best_gbps, l.mean_gbps);
  }

  std::printf("\n%-42s %-5s %10s %9s %8s\n", "norm variant", "dtype", "numel", "us", "GB/s");
  for (const NormResult& r : results) {
    std::printf("%-42s %-5s %10lld %9.1f %8.1f%s\n", r.variant, r.dtype, r.numel, r.median_us,
                r.gbps, r.bitwise ? "" : "  NOT BITWISE");
  }
  std::printf("copy roofline (read+write) %.0f GB/s; blocks per SM: production %d, lanes %d\n",
              roof, occ_prod, occ_lanes);
  for (const LandResult& l : land) {
    std::printf("landing 8 MiB, %-50s best %6.2f GB/s, mean %6.2f GB/s\n", l.how, l.best_gbps,
                l.mean_gbps);
  }
  return all_same ? 0 : 3;
}
