// The compute seam: every kernel the engine (and a communicator of device memory) calls, as one
// small table a backend provides (STYLE.md: a backend is a table of operations). The engine takes
// the table once from its Device (Device::compute()) and never names a backend's kernels itself, so
// a CUDA table can stand in for the CPU one without a branch in the engine.
//
// Every entry has the contract of the CPU function it points to (kernels/optimizer.h,
// unscale.h, norm.h, combine.h, reduce.h, quantize.h); all backends give bitwise the same
// results. Memory passed in must be addressable by the backend (host memory for the CPU table,
// device memory for the CUDA table). `exec` says how the calling rank runs CPU kernels (threads,
// ISA); the CUDA table takes its stream from exec.cuda_stream and, like the CPU table, returns
// once the results are in memory (it synchronizes that stream).
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "kernels/isa.h"
#include "kernels/optimizer.h"
#include "kernels/reduce.h"
#include "zero/base/dtype.h"

namespace zero::kernels {

// One array of an entry that takes several (the `_many` entries): data in the backend's memory.
struct ArrayRef {
  void* data = nullptr;
  DType dtype = DType::F32;
  std::size_t numel = 0;
};

// One pair of a combine_many call: dst ← src (see combine below), both in the backend's memory.
struct CombineRef {
  void* dst = nullptr;
  DType dst_dtype = DType::F32;
  const void* src = nullptr;
  DType src_dtype = DType::F32;
  std::size_t numel = 0;
};

struct ComputeKernels {
  std::string_view backend;  // "cpu", "cuda"
  // True when every call ends with a wait for a device: callers then gather work into the
  // `_many` entries. (On the CPU a `_many` entry is the single calls in turn, and a caller that
  // hands each piece on as soon as it is done, e.g. to a copy engine, keeps that overlap.)
  bool waits_per_call = false;
  void (*optimizer_step)(const OptimizerHyper& hyper, const StepScalars& scalars,
                         const OptimizerTensors& tensors, const CpuExec& exec);
  // optimizer_step over several tensors of the same dtypes with one hyper and scalars: one
  // multi-tensor launch and one wait on a device backend; the same bits as one call per tensor.
  void (*optimizer_step_many)(const OptimizerHyper& hyper, const StepScalars& scalars,
                              std::span<const OptimizerTensors> tensors, const CpuExec& exec);
  // optimizer_step that also leaves the gradient's norm block sums in block_sums (kernels/
  // optimizer.h, optimizer_step_norm_cpu), reading the gradient once. Null where a backend has
  // none (CUDA): the caller then takes the norm in a pass of its own.
  void (*optimizer_step_norm)(const OptimizerHyper& hyper, const StepScalars& scalars,
                              const OptimizerTensors& tensors, double* block_sums,
                              const CpuExec& exec) = nullptr;
  // optimizer_step (block_sums null) or optimizer_step_norm of the gradient `sources` sum, each
  // element summed as it is stepped (kernels/optimizer.h, optimizer_step_summed_cpu). Null where
  // a backend has none (CUDA): the caller then sums into memory first (reduce).
  void (*optimizer_step_summed)(const OptimizerHyper& hyper, const StepScalars& scalars,
                                const OptimizerTensors& tensors, const GradSources& sources,
                                double* block_sums, const CpuExec& exec) = nullptr;
  // The norm's block sums of the gradient `sources` sum, in one walk over the sources (kernels/
  // optimizer.h, squared_norm_summed_cpu). Null where a backend has none (CUDA).
  void (*squared_norm_summed)(const GradSources& sources, DType dtype, std::size_t numel,
                              double* block_sums, const CpuExec& exec) = nullptr;
  // data[i] ← data[i]·scale in place; true when a result is ±inf or NaN.
  bool (*unscale_and_check)(void* data, DType dtype, std::size_t numel, float scale,
                            const CpuExec& exec);
  // Σ data[i]² in double, in a fixed order.
  double (*squared_l2_norm)(const void* data, DType dtype, std::size_t numel, const CpuExec& exec);
  // The two above over several arrays at once, with one wait on a device backend (the engine's
  // per-step checks over every unit's gradient slice). unscale_and_check_many: each array in
  // place, true when any result is ±inf or NaN. squared_l2_norm_many: each array's
  // squared_l2_norm added to a sum from 0.0 in array order, bitwise what the single calls give.
  bool (*unscale_and_check_many)(std::span<const ArrayRef> arrays, float scale,
                                 const CpuExec& exec);
  double (*squared_l2_norm_many)(std::span<const ArrayRef> arrays, const CpuExec& exec);
  // dst ← src·scale (+ dst with accumulate), rounded once to dst's dtype.
  void (*combine)(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::size_t numel,
                  float scale, bool accumulate, const CpuExec& exec);
  // combine over several pairs with one scale and accumulate flag (a bucket's pieces): one wait
  // on a device backend; the same bits as one call per pair.
  void (*combine_many)(std::span<const CombineRef> pairs, float scale, bool accumulate,
                       const CpuExec& exec);
  void (*fill_zero)(void* dst, DType dtype, std::size_t numel, const CpuExec& exec);
  // The communicators' reduction (reduce.h): dst[i] ← srcs[0][i] ⊕ … ⊕ srcs[nsrc-1][i] left to
  // right in fp32, divided by `divisor` unless it is 0, rounded once to `dtype`. `srcs` is a host
  // array of `nsrc` pointers into the backend's memory; dst may alias one of them exactly. What
  // DeviceInProcComm reduces device buffers with. The CUDA table takes at most
  // kCudaReduceMaxSources sources (companions_cuda.h).
  void (*reduce)(void* dst, const void* const* srcs, int nsrc, std::size_t numel, DType dtype,
                 ReduceKind kind, float divisor, const CpuExec& exec);
  // Block quantization (quantize.h: the layout, the bytes, fp64 on the CPU only): out ← the
  // quantized src; dst ← the dequantized `in`, rounded once to dst's dtype; acc[i] += the
  // dequantized element i in fp32. What qwZ's gathers and quantized frozen weights run on.
  void (*quantize)(const void* src, DType dtype, std::size_t n, int bits, void* out,
                   const CpuExec& exec);
  void (*dequantize)(const void* in, std::size_t n, int bits, void* dst, DType dtype,
                     const CpuExec& exec);
  void (*dequantize_add)(const void* in, std::size_t n, int bits, float* acc,
                         const CpuExec& exec);
  // The optimizer step's memory roofline (traffic_probe.h): its loads and stores, no arithmetic.
  void (*traffic_probe)(const OptimizerTensors& tensors, int state_count, const CpuExec& exec);
};

// The table of the CPU kernels (SIMD and OpenMP, ISA chosen per call from exec.isa).
const ComputeKernels& cpu_compute_kernels();
// The table of the CUDA kernels (kernels/companions_cuda.h, optimizer_cuda.h). Defined only in a
// build with CUDA (library zero_kernels_cuda); CudaDevice::compute() returns it.
const ComputeKernels& cuda_compute_kernels();

}  // namespace zero::kernels
