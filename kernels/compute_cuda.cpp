// cuda_compute_kernels (compute.h): the CUDA kernels as the engine's compute table. Each entry
// enqueues on exec.cuda_stream and synchronizes it before returning, the CPU table's contract;
// the scalar results (overflow flag, norm partials) come back through stream-ordered scratch.
#include <cuda_runtime.h>

#include <span>
#include <vector>

#include "kernels/companions_cuda.h"
#include "kernels/compute.h"
#include "kernels/optimizer_cuda.h"
#include "zero/base/cuda_error.h"

namespace zero::kernels {

namespace {

cudaStream_t stream_of(const CpuExec& exec) {
  return static_cast<cudaStream_t>(exec.cuda_stream);
}

void synchronize(const CpuExec& exec) {
  ZERO_CUDA_CHECK(cudaStreamSynchronize(stream_of(exec)));
}

// Device scratch allocated and freed in stream order (cudaMallocAsync), so it costs no device
// synchronization and is reused by the driver's pool.
class StreamScratch {
 public:
  StreamScratch(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
    ZERO_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream_));
  }
  ~StreamScratch() { cudaFreeAsync(data_, stream_); }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  void* data() const { return data_; }

 private:
  cudaStream_t stream_;
  void* data_ = nullptr;
};

void optimizer_step(const OptimizerHyper& hyper, const StepScalars& scalars,
                    const OptimizerTensors& tensors, const CpuExec& exec) {
  optimizer_step_cuda(hyper, scalars, std::span(&tensors, 1), CudaExec{exec.cuda_stream});
  synchronize(exec);
}

bool unscale_and_check(void* data, DType dtype, std::size_t numel, float scale,
                       const CpuExec& exec) {
  if (numel == 0) return false;
  StreamScratch flag(sizeof(int), stream_of(exec));
  auto* device_flag = static_cast<int*>(flag.data());
  ZERO_CUDA_CHECK(cudaMemsetAsync(device_flag, 0, sizeof(int), stream_of(exec)));
  unscale_and_check_cuda_async(data, dtype, numel, scale, device_flag, exec.cuda_stream);
  int host_flag = 0;
  ZERO_CUDA_CHECK(cudaMemcpyAsync(&host_flag, device_flag, sizeof(int), cudaMemcpyDeviceToHost,
                                  stream_of(exec)));
  synchronize(exec);
  return host_flag != 0;
}

double squared_l2_norm(const void* data, DType dtype, std::size_t numel, const CpuExec& exec) {
  if (numel == 0) return 0.0;
  const std::size_t blocks = squared_norm_cuda_block_count(numel);
  StreamScratch sums(blocks * sizeof(double), stream_of(exec));
  auto* device_sums = static_cast<double*>(sums.data());
  squared_norm_blocks_cuda_async(data, dtype, numel, device_sums, exec.cuda_stream);
  std::vector<double> host_sums(blocks);
  ZERO_CUDA_CHECK(cudaMemcpyAsync(host_sums.data(), device_sums, blocks * sizeof(double),
                                  cudaMemcpyDeviceToHost, stream_of(exec)));
  synchronize(exec);
  double sum = 0.0;  // squared_l2_norm_cpu's order: block sums in index order
  for (double s : host_sums) sum += s;
  return sum;
}

void combine(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::size_t numel,
             float scale, bool accumulate, const CpuExec& exec) {
  combine_cuda_async(dst, dst_dtype, src, src_dtype, numel, scale, accumulate, exec.cuda_stream);
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

void traffic_probe(const OptimizerTensors& tensors, int state_count, const CpuExec& exec) {
  traffic_probe_cuda(tensors, state_count, CudaExec{exec.cuda_stream});
  synchronize(exec);
}

}  // namespace

const ComputeKernels& cuda_compute_kernels() {
  static const ComputeKernels table{
      .backend = "cuda",
      .optimizer_step = &optimizer_step,
      .unscale_and_check = &unscale_and_check,
      .squared_l2_norm = &squared_l2_norm,
      .combine = &combine,
      .fill_zero = &fill_zero,
      .reduce = &reduce,
      .traffic_probe = &traffic_probe,
  };
  return table;
}

}  // namespace zero::kernels
