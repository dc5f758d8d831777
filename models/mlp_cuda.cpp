#include "models/mlp_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "models/gemm.h"
#include "models/mlp_checks.h"
#include "models/mlp_cuda_kernels.h"
#include "zero/base/cuda_error.h"
#include "zero/base/error.h"

// cuBLAS reports a cublasStatus_t, not a cudaError_t: the same CudaError, with cuBLAS's names.
#define ZERO_CUBLAS_CHECK(call)                                             \
  do {                                                                      \
    const cublasStatus_t zero_cublas_status_ = (call);                      \
    if (zero_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {        \
      ::zero::throw_cuda_error(#call, __FILE__, __LINE__,                   \
                               cublasGetStatusName(zero_cublas_status_),    \
                               cublasGetStatusString(zero_cublas_status_)); \
    }                                                                       \
  } while (0)

namespace zero::models {

namespace {

namespace cd = cuda_detail;

// GPU memory that only grows, so steady-state steps allocate nothing.
class DeviceScratch {
 public:
  DeviceScratch() = default;
  DeviceScratch(DeviceScratch&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), capacity_(std::exchange(other.capacity_, 0)) {}
  DeviceScratch& operator=(DeviceScratch&&) = delete;
  ~DeviceScratch() {
    if (data_ != nullptr) cudaFree(data_);
  }

  // At least `bytes`, contents undefined after a growth. REQUIRES: no enqueued work uses the
  // memory when it grows (cudaFree would wait for it, but the new block is another address).
  void reserve(std::size_t bytes) {
    if (bytes <= capacity_) return;
    if (data_ != nullptr) {
      ZERO_CUDA_CHECK(cudaFree(data_));
      data_ = nullptr;
      capacity_ = 0;
    }
    ZERO_CUDA_CHECK(cudaMalloc(&data_, bytes));
    capacity_ = bytes;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

}  // namespace

struct CudaMlp::Impl {
  int ordinal = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  std::size_t largest_layer_elems = 0;  // of any layer's weight, for weight_grad

  std::vector<DeviceScratch> values;   // values[k]: layer k's input, fp32 (k = 0: the batch's)
  std::vector<DeviceScratch> rounded;  // values[k] in the 16-bit product type
  DeviceScratch output, targets;       // rows × OUT, fp32
  DeviceScratch grad_out, grad_in;     // backward's dy and dx, fp32
  DeviceScratch grad_out_rounded;      // dy in the 16-bit product type
  DeviceScratch weight_grad;           // a weight gradient's fp32 sums, for a 16-bit slot
  DeviceScratch loss;                  // one double

  Impl(const MlpShape& shape, int gpu) : ordinal(gpu) {
    for (std::size_t k = 0; k < shape.layers(); ++k) {
      largest_layer_elems = std::max(largest_layer_elems, shape.widths[k] * shape.widths[k + 1]);
    }
    values.resize(shape.layers());
    rounded.resize(shape.layers());
    try {
      ZERO_CUDA_CHECK(cudaSetDevice(ordinal));
      ZERO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      ZERO_CUBLAS_CHECK(cublasCreate(&blas));
      ZERO_CUBLAS_CHECK(cublasSetStream(blas, stream));
      // CUBLAS_COMPUTE_32F without TF32: an fp32 model's products are fp32 products.
      ZERO_CUBLAS_CHECK(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH));
    } catch (...) {
      release();
      throw;
    }
  }
  ~Impl() { release(); }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void release() noexcept {
    cudaSetDevice(ordinal);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (blas != nullptr) cublasDestroy(blas);
    if (stream != nullptr) cudaStreamDestroy(stream);
    blas = nullptr;
    stream = nullptr;
  }

  // Waits for everything enqueued, errors ignored: what is left after an exception.
  void drain() noexcept {
    cudaSetDevice(ordinal);
    cudaStreamSynchronize(stream);
    (void)cudaGetLastError();
  }

  void reserve(const MlpShape& shape, std::size_t rows, bool narrow) {
    const std::size_t layers = shape.layers();
    std::size_t widest = 0;  // of any layer's output: backward's dy and dx
    for (std::size_t k = 0; k < layers; ++k) {
      values[k].reserve(rows * shape.widths[k] * sizeof(float));
      if (narrow) rounded[k].reserve(rows * shape.widths[k] * 2);
      widest = std::max(widest, shape.widths[k + 1]);
    }
    output.reserve(rows * shape.widths.back() * sizeof(float));
    targets.reserve(rows * shape.widths.back() * sizeof(float));
    grad_out.reserve(rows * widest * sizeof(float));
    grad_in.reserve(rows * widest * sizeof(float));
    if (narrow) grad_out_rounded.reserve(rows * widest * 2);
    loss.reserve(sizeof(double));
  }

  void copy_in(DeviceScratch& to, const std::vector<float>& from) {
    if (from.empty()) return;
    // From pageable memory: `from` has been read when the call returns.
    ZERO_CUDA_CHECK(cudaMemcpyAsync(to.as<float>(), from.data(), from.size() * sizeof(float),
                                    cudaMemcpyHostToDevice, stream));
  }

  // A product as models/gemm.h describes it (row-major, densely packed), with C in fp32 and
  // beta 0: the only form the MLP needs.
  void product(const Gemm& p) {
    ZERO_ASSERT(p.output == DType::F32 && p.beta == 0.0f);
    if (p.m == 0 || p.n == 0) return;
    if (p.k == 0) {  // an empty sum
      ZERO_CUDA_CHECK(cudaMemsetAsync(p.c, 0, p.m * p.n * sizeof(float), stream));
      return;
    }
    // cuBLAS is column-major, and a row-major matrix read column-major is its transpose. So the
    // row-major C = op(A) · op(B) is the column-major Cᵀ = op(B)ᵀ · op(A)ᵀ: B's buffer first,
    // each buffer with the transpose flag it has in the row-major product, and each leading
    // dimension the row length of its row-major buffer.
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType_t type = cuda_type(p.inputs);
    const auto m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
    ZERO_CUBLAS_CHECK(cublasGemmEx(blas, p.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   p.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, p.b,
                                   type, p.b_transposed ? k : n, p.a, type, p.a_transposed ? m : k,
                                   &beta, p.c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
  }

  // models::forward_backward on the GPU; arguments checked by the caller.
  double run(const MlpShape& shape, std::span<const ParamView> weights, const Batch& batch,
             float loss_scale, const GradSink& sink) {
    const std::size_t layers = shape.layers();
    const auto rows = static_cast<long long>(batch.rows);
    const DType compute = weights.front().dtype;
    const bool narrow = compute != DType::F32;
    ZERO_CUDA_CHECK(cudaSetDevice(ordinal));
    reserve(shape, batch.rows, narrow);
    copy_in(values[0], batch.inputs);
    copy_in(targets, batch.targets);

    // Layer k's input as a product operand: rounded to the product type for a 16-bit model.
    auto input_operand = [&](std::size_t k) -> const void* {
      return narrow ? static_cast<const void*>(rounded[k].as<std::uint16_t>())
                    : static_cast<const void*>(values[k].as<float>());
    };

    for (std::size_t k = 0; k < layers; ++k) {
      const std::size_t in = shape.widths[k], out = shape.widths[k + 1];
      if (narrow) {
        ZERO_CUDA_CHECK(cd::launch_round(values[k].as<float>(), rounded[k].as<std::uint16_t>(),
                                         compute, rows * static_cast<long long>(in), stream));
      }
      const bool hidden = k + 1 < layers;
      float* y = hidden ? values[k + 1].as<float>() : output.as<float>();
      // y = x · Wᵀ + b, then the ReLU between layers.
      product({.m = batch.rows,
               .n = out,
               .k = in,
               .a = input_operand(k),
               .b = weights[2 * k].bytes.data(),
               .b_transposed = true,
               .c = y,
               .inputs = compute});
      ZERO_CUDA_CHECK(cd::launch_bias_act(y, weights[2 * k + 1].bytes.data(), compute, rows,
                                          static_cast<long long>(out), hidden, stream));
    }

    // d(scale · loss)/dy = scale · (y - target) / (rows · OUT), the factor in fp32 as on the CPU.
    const std::size_t count = batch.rows * shape.widths.back();
    const float grad_scale = loss_scale / static_cast<float>(std::max<std::size_t>(1, count));
    float* dy = grad_out.as<float>();
    float* dx = grad_in.as<float>();
    ZERO_CUDA_CHECK(cd::launch_mse(output.as<float>(), targets.as<float>(),
                                   static_cast<long long>(count), grad_scale, dy, loss.as<double>(),
                                   stream));
    double host_loss = 0;
    // Into pageable memory: complete when the call returns.
    ZERO_CUDA_CHECK(cudaMemcpyAsync(&host_loss, loss.as<double>(), sizeof(double),
                                    cudaMemcpyDeviceToHost, stream));

    for (std::size_t k = layers; k-- > 0;) {
      const std::size_t in = shape.widths[k], out = shape.widths[k + 1];
      ZERO_CUDA_CHECK(cudaSetDevice(ordinal));  // a callback may have made another GPU current
      const void* dy_operand = dy;
      if (narrow) {
        ZERO_CUDA_CHECK(cd::launch_round(dy, grad_out_rounded.as<std::uint16_t>(), compute,
                                         rows * static_cast<long long>(out), stream));
        dy_operand = grad_out_rounded.as<std::uint16_t>();
      }

      const GradView gb = checked_slot(sink, 2 * k + 1, out);
      ZERO_CUDA_CHECK(cd::launch_column_sums(dy, rows, static_cast<long long>(out), gb.bytes.data(),
                                             gb.dtype, stream));

      // dW = dyᵀ · x: straight into an fp32 slot, through fp32 sums rounded once into a 16-bit
      // one (cuBLAS's own 16-bit output may reduce split sums in 16 bits).
      const GradView gw = checked_slot(sink, 2 * k, in * out);
      const bool direct = gw.dtype == DType::F32;
      if (!direct) weight_grad.reserve(largest_layer_elems * sizeof(float));
      float* dw = direct ? reinterpret_cast<float*>(gw.bytes.data()) : weight_grad.as<float>();
      product({.m = out,
               .n = in,
               .k = batch.rows,
               .a = dy_operand,
               .a_transposed = true,
               .b = input_operand(k),
               .c = dw,
               .inputs = compute});
      if (!direct) {
        ZERO_CUDA_CHECK(cd::launch_round(dw, gw.bytes.data(), gw.dtype,
                                         static_cast<long long>(in * out), stream));
      }

      // dx = dy · W, then through the ReLU that produced x.
      if (k > 0) {
        product({.m = batch.rows,
                 .n = in,
                 .k = out,
                 .a = dy_operand,
                 .b = weights[2 * k].bytes.data(),
                 .c = dx,
                 .inputs = compute});
        ZERO_CUDA_CHECK(cd::launch_relu_backward(dx, values[k].as<float>(),
                                                 rows * static_cast<long long>(in), stream));
      }
      // The gradients are in their slots and W_k is read no more only once the stream is done:
      // the callback may hand both to work on other streams.
      ZERO_CUDA_CHECK(cudaStreamSynchronize(stream));
      if (sink.on_layer_grads) sink.on_layer_grads(k);
      std::swap(dy, dx);
    }
    return host_loss;
  }
};

CudaMlp::CudaMlp(const MlpShape& shape, int ordinal) : shape_(shape), ordinal_(ordinal) {
  ZERO_CHECK(shape_.widths.size() >= 2, "CudaMlp: a shape needs at least two widths");
  for (std::size_t w : shape_.widths) {
    ZERO_CHECK(w > 0 && w <= static_cast<std::size_t>(INT_MAX),
               "CudaMlp: {} has a width of {}; cuBLAS takes 1 to {}", shape_.to_string(), w,
               INT_MAX);
  }
  impl_ = std::make_unique<Impl>(shape_, ordinal_);
}

CudaMlp::~CudaMlp() = default;

double CudaMlp::forward_backward(std::span<const ParamView> weights, const Batch& batch,
                                 float loss_scale, const GradSink& sink) {
  ZERO_CHECK(static_cast<bool>(sink.slot), "mlp: forward_backward needs GradSink::slot");
  check_weights(shape_, weights);
  check_batch(shape_, batch);
  ZERO_CHECK(batch.rows <= static_cast<std::size_t>(INT_MAX),
             "CudaMlp: a batch of {} rows; cuBLAS takes at most {}", batch.rows, INT_MAX);
  try {
    return impl_->run(shape_, weights, batch, loss_scale, sink);
  } catch (...) {
    impl_->drain();
    throw;
  }
}

}  // namespace zero::models
