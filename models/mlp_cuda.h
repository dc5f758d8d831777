// The teacher-student MLP of models/mlp.h on one GPU: the same forward and backward, with the
// products on cuBLAS (cublasGemmEx) and the rest in small CUDA kernels, reading the weights and
// writing the gradients where the engine keeps them in GPU memory. The CPU model
// (models::forward_backward) is the oracle it is tested against (tests/models/mlp_cuda_test.cpp).
//
// A plain C++ header: no CUDA type appears here, so host code includes it in every build. In a
// build without CUDA the constructor throws (there is no GPU model to make).
#pragma once

#include <memory>
#include <span>

#include "models/mlp.h"

namespace zero::models {

// Precisions, as the CPU's rule "the products run in the weights' precision" with a GPU that has
// every product: F32 weights run fp32 products (CUBLAS_COMPUTE_32F, no TF32); BF16 and F16 weights
// run bf16 and fp16 products with fp32 accumulation, their operands rounded to the weights' type
// (layer inputs and output gradients, as a 16-bit framework keeps them). So fp16 differs from the
// CPU, which widens fp16 weights to fp32 for want of an fp16 product. Between products the
// activations and output gradients stay in fp32; the loss is summed in double; a bias gradient is
// the rows' fp32 sum in ascending order (as on the CPU), a weight gradient cuBLAS's fp32 sum, each
// rounded once into the slot's dtype by zero/base/half.h's conversions. The products are cuBLAS's:
// not bitwise equal to oneDNN's, and repeatable only on the same GPU model, cuBLAS version and
// shapes.
//
// Streams and memory: each CudaMlp owns a CUDA stream and a cuBLAS handle on its GPU, and scratch
// memory for the activations of the largest batch seen so far (cudaMalloc, outside any Device's
// ledger), kept until it is destroyed.
// Thread safety: one thread calls a CudaMlp at a time; ranks as threads each make their own.
class CudaMlp {
 public:
  // For `shape` on GPU `ordinal` (a cudaSetDevice ordinal). Throws CudaError when the GPU, the
  // stream or the cuBLAS handle cannot be had, zero::Error in a build without CUDA.
  CudaMlp(const MlpShape& shape, int ordinal);
  ~CudaMlp();
  CudaMlp(const CudaMlp&) = delete;
  CudaMlp& operator=(const CudaMlp&) = delete;

  const MlpShape& shape() const { return shape_; }
  int ordinal() const { return ordinal_; }

  // models::forward_backward's contract (mlp.h), with device memory:
  //   weights[i].bytes and the slots sink.slot(i) returns are GPU memory on this GPU, complete
  //     and unused by other work when handed over (as Engine::param() and Engine::grad() are);
  //     `batch` is host memory, copied to the GPU.
  //   sink.slot and sink.on_layer_grads are called in the CPU model's order, on the calling
  //     thread. Before each on_layer_grads(k) the stream is synchronized: layer k's two gradients
  //     are in their slots and its weights are read no more, so the callback may reduce the
  //     gradients on another stream and free the weights.
  //   The weights must stay valid until on_layer_grads of their layer (or the return).
  // Returns the unscaled loss. Throws zero::Error for the CPU model's argument errors, CudaError
  // (naming the call, file and line) for a failed CUDA or cuBLAS call; an exception leaves only
  // after the work already enqueued has finished, so no kernel writes a slot after it.
  double forward_backward(std::span<const ParamView> weights, const Batch& batch, float loss_scale,
                          const GradSink& sink);

 private:
  struct Impl;
  MlpShape shape_;
  int ordinal_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::models
