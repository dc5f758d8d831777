// cuda_compute_kernels (compute.h): the CUDA kernels as the engine's compute table. Each entry
// enqueues on exec.cuda_stream and synchronizes it before returning, the CPU table's contract;
// the scalar results (overflow flag, norm partials) come back through scratch the calling thread
// keeps (ResultScratch).
#include <cuda_runtime.h>

#include <span>
#include <vector>

#include "kernels/companions_cuda.h"
#include "kernels/compute.h"
#include "kernels/norm.h"
#include "kernels/optimizer_cuda.h"
#include "kernels/quantize_cuda.h"
#include "zero/base/cuda_error.h"

namespace zero::kernels {

namespace {

cudaStream_t stream_of(const CpuExec& exec) {
  return static_cast<cudaStream_t>(exec.cuda_stream);
}

void synchronize(const CpuExec& exec) {
  ZERO_CUDA_CHECK(cudaStreamSynchronize(stream_of(exec)));
}

// Where the entries that bring a result back to the host (the overflow flag, the norm's block
// sums) put it: device memory and pinned host memory kept by the calling thread, on the current
// device, grown as needed, so a call allocates nothing and its copy back needs no staging. (With
// a cudaMallocAsync and a pageable copy back per call, one call of the norm over a small model
// took about 0.4 ms on an H200.) Every entry waits for its stream before returning, so the next
// call of the thread finds the scratch unused.
class ResultScratch {
 public:
  static ResultScratch& of_thread() {
    thread_local ResultScratch scratch;
    return scratch;
  }
  ~ResultScratch() {  // at thread exit; errors (a runtime already unloaded) are moot then
    release_device();
    if (host_ != nullptr) cudaFreeHost(host_);
  }
  ResultScratch(const ResultScratch&) = delete;
  ResultScratch& operator=(const ResultScratch&) = delete;

  void* device(std::size_t bytes) {
    int ordinal = 0;
    ZERO_CUDA_CHECK(cudaGetDevice(&ordinal));
    if (device_ != nullptr && (ordinal != ordinal_ || device_bytes_ < bytes)) release_device();
    if (device_ == nullptr) {
      const std::size_t n = grown(bytes);
      ZERO_CUDA_CHECK(cudaMalloc(&device_, n));
      device_bytes_ = n;
      ordinal_ = ordinal;
    }
    return device_;
  }
  void* host(std::size_t bytes) {
    if (host_ != nullptr && host_bytes_ < bytes) {
      cudaFreeHost(host_);
      host_ = nullptr;
    }
    if (host_ == nullptr) {
      const std::size_t n = grown(bytes);
      ZERO_CUDA_CHECK(cudaHostAlloc(&host_, n, cudaHostAllocPortable));
      host_bytes_ = n;
    }
    return host_;
  }

 private:
  ResultScratch() = default;
  static std::size_t grown(std::size_t bytes) {
    std::size_t n = 4096;
    while (n < bytes) n *= 2;
    return n;
  }
  void release_device() {
    if (device_ == nullptr) return;
    int current = 0;
    if (cudaGetDevice(&current) == cudaSuccess && current != ordinal_) {
      cudaSetDevice(ordinal_);
      cudaFree(device_);
      cudaSetDevice(current);
    } else {
      cudaFree(device_);
    }
    device_ = nullptr;
    device_bytes_ = 0;
  }

  int ordinal_ = -1;
  void* device_ = nullptr;
  std::size_t device_bytes_ = 0;
  void* host_ = nullptr;
  std::size_t host_bytes_ = 0;
};

void optimizer_step(const OptimizerHyper& hyper, const StepScalars& scalars,
                    const OptimizerTensors& tensors, const CpuExec& exec) {
  optimizer_step_cuda(hyper, scalars, std::span(&tensors, 1), CudaExec{exec.cuda_stream});
  synchronize(exec);
}

void optimizer_step_many(const OptimizerHyper& hyper, const StepScalars& scalars,
                         std::span<const OptimizerTensors> tensors, const CpuExec& exec) {
  if (tensors.empty()) return;
  optimizer_step_cuda(hyper, scalars, tensors, CudaExec{exec.cuda_stream});
  synchronize(exec);
}

bool unscale_and_check_many(std::span<const ArrayRef> arrays, float scale, const CpuExec& exec) {
  ResultScratch& scratch = ResultScratch::of_thread();
  auto* device_flag = static_cast<int*>(scratch.device(sizeof(int)));
  auto* host_flag = static_cast<int*>(scratch.host(sizeof(int)));
  ZERO_CUDA_CHECK(cudaMemsetAsync(device_flag, 0, sizeof(int), stream_of(exec)));
  for (const ArrayRef& a : arrays) {
    if (a.numel > 0) {
      unscale_and_check_cuda_async(a.data, a.dtype, a.numel, scale, device_flag, exec.cuda_stream);
    }
  }
  ZERO_CUDA_CHECK(cudaMemcpyAsync(host_flag, device_flag, sizeof(int), cudaMemcpyDeviceToHost,
                                  stream_of(exec)));
  synchronize(exec);
  return *host_flag != 0;
}

bool unscale_and_check(void* data, DType dtype, std::size_t numel, float scale,
                       const CpuExec& exec) {
  if (numel == 0) return false;
  const ArrayRef array{data, dtype, numel};
  return unscale_and_check_many(std::span(&array, 1), scale, exec);
}

// Every array's block sums into one scratch, then one copy back and one wait; the sums are added
// on the host in squared_l2_norm_cpu's order (block sums in index order per array, arrays in
// order).
double squared_l2_norm_many(std::span<const ArrayRef> arrays, const CpuExec& exec) {
  std::vector<std::size_t> first(arrays.size() + 1, 0);
  for (std::size_t a = 0; a < arrays.size(); ++a) {
    first[a + 1] = first[a] + squared_norm_cuda_block_count(arrays[a].numel);
  }
  const std::size_t blocks = first.back();
  if (blocks == 0) return 0.0;
  ResultScratch& scratch = ResultScratch::of_thread();
  auto* device_sums = static_cast<double*>(scratch.device(blocks * sizeof(double)));
  auto* host_sums = static_cast<double*>(scratch.host(blocks * sizeof(double)));
  squared_norm_blocks_many_cuda_async(arrays, device_sums, exec.cuda_stream);
  ZERO_CUDA_CHECK(cudaMemcpyAsync(host_sums, device_sums, blocks * sizeof(double),
                                  cudaMemcpyDeviceToHost, stream_of(exec)));
  synchronize(exec);
  return sum_norm_blocks(std::span<const double>(host_sums, blocks), first);
}

double squared_l2_norm(const void* data, DType dtype, std::size_t numel, const CpuExec& exec) {
  const ArrayRef array{const_cast<void*>(data), dtype, numel};
  return squared_l2_norm_many(std::span(&array, 1), exec);
}

void combine(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::size_t numel,
             float scale, bool accumulate, const CpuExec& exec) {
  combine_cuda_async(dst, dst_dtype, src, src_dtype, numel, scale, accumulate, exec.cuda_stream);
  synchronize(exec);
}

void combine_many(std::span<const CombineRef> pairs, float scale, bool accumulate,
                  const CpuExec& exec) {
  if (pairs.empty()) return;
  for (const CombineRef& p : pairs) {
    combine_cuda_async(p.dst, p.dst_dtype, p.src, p.src_dtype, p.numel, scale, accumulate,
                       exec.cuda_stream);
  }
  synchronize(exec);
}

void fill_zero(void* dst, DType dtype, std::size_t numel, const CpuExec& exec) {
  fill_zero_cuda_async(dst, dtype, numel, exec.cuda_stream);
  synchronize(exec);
}

void reduce(void* dst, const void* const* srcs, int nsrc, std::size_t numel, DType dtype,
            ReduceKind kind, float divisor, const CpuExec& exec) {
  reduce_cuda_async(dst, srcs, nsrc, numel, dtype, kind, divisor, exec.cuda_stream);
  synchronize(exec);
}

void quantize(const void* src, DType dtype, std::size_t n, int bits, void* out,
              const CpuExec& exec) {
  quantize_cuda_async(src, dtype, n, bits, out, exec.cuda_stream);
  synchronize(exec);
}

void dequantize(const void* in, std::size_t n, int bits, void* dst, DType dtype,
                const CpuExec& exec) {
  dequantize_cuda_async(in, n, bits, dst, dtype, exec.cuda_stream);
  synchronize(exec);
}

void dequantize_add(const void* in, std::size_t n, int bits, float* acc, const CpuExec& exec) {
  dequantize_add_cuda_async(in, n, bits, acc, exec.cuda_stream);
  synchronize(exec);
}

void traffic_probe(const OptimizerTensors& tensors, int state_count, const CpuExec& exec) {
  traffic_probe_cuda(tensors, state_count, CudaExec{exec.cuda_stream});
  synchronize(exec);
}

}  // namespace

const ComputeKernels& cuda_compute_kernels() {
  static const ComputeKernels table{
      .backend = "cuda",
      .waits_per_call = true,
      .optimizer_step = &optimizer_step,
      .optimizer_step_many = &optimizer_step_many,
      .optimizer_step_norm = nullptr,  // the engine takes the norm in its own launch
      .optimizer_step_summed = nullptr,  // the engine sums into memory first
      .squared_norm_summed = nullptr,
      .unscale_and_check = &unscale_and_check,
      .squared_l2_norm = &squared_l2_norm,
      .unscale_and_check_many = &unscale_and_check_many,
      .squared_l2_norm_many = &squared_l2_norm_many,
      .combine = &combine,
      .combine_many = &combine_many,
      .fill_zero = &fill_zero,
      .reduce = &reduce,
      .quantize = &quantize,
      .dequantize = &dequantize,
      .dequantize_add = &dequantize_add,
      .traffic_probe = &traffic_probe,
  };
  return table;
}

}  // namespace zero::kernels
