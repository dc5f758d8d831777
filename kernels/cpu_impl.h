// Internal: the range functions of one CPU ISA, generic over an Ops type from cpu_simd.h.
// A translation unit includes this with its -m flags and ZERO_KERNELS_ABI set, and instantiates
// make_cpu_kernels<Ops>(). Vector bodies cover whole vectors; the remainder goes through
// ScalarOps with the same element function, so every ISA gives the same bits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "kernels/cpu_kernels.h"
#include "kernels/cpu_simd.h"
#include "kernels/optimizer_math.h"
#include "zero/base/hd.h"

namespace zero::kernels::math {
inline namespace ZERO_KERNELS_ABI {

template <DType kDType>
using DTypeTag = std::integral_constant<DType, kDType>;

// Validated by the drivers before any range function runs.
[[noreturn]] inline void unsupported_combination() {
  std::abort();
}

template <class Fn>
void with_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32: fn(DTypeTag<DType::F32>{}); return;
    case DType::BF16: fn(DTypeTag<DType::BF16>{}); return;
    case DType::F16: fn(DTypeTag<DType::F16>{}); return;
    case DType::F64: break;
  }
  unsupported_combination();
}

template <class Ops, DType kDType>
ZERO_INLINE typename Ops::V load_as_float(const void* base, std::size_t i) {
  if constexpr (kDType == DType::F32) {
    return Ops::load_f32(static_cast<const float*>(base) + i);
  } else if constexpr (kDType == DType::BF16) {
    return Ops::load_bf16(static_cast<const std::uint16_t*>(base) + i);
  } else {
    return Ops::load_f16(static_cast<const std::uint16_t*>(base) + i);
  }
}

template <class Ops, DType kDType>
ZERO_INLINE void store_from_float(void* base, std::size_t i, typename Ops::V x) {
  if constexpr (kDType == DType::F32) {
    Ops::store_f32(static_cast<float*>(base) + i, x);
  } else if constexpr (kDType == DType::BF16) {
    Ops::store_bf16(static_cast<std::uint16_t*>(base) + i, x);
  } else {
    Ops::store_f16(static_cast<std::uint16_t*>(base) + i, x);
  }
}

// A norm block's eight lane sums added in the fixed tree.
inline double add_norm_lanes(const double lanes[8]) {
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// kOut is F64 when there is no low-precision param copy to write.
template <OptimizerKind kKind, int kStates, DType kGrad, DType kState, DType kOut>
struct StepElement {
  static constexpr DType kGradDType = kGrad;
  template <class Ops>
  ZERO_INLINE static void run(const StepCoeffs& c, const OptimizerTensors& t, std::size_t i) {
    step<Ops>(c, t, i, load_as_float<Ops, kGrad>(t.grad, i));
  }
  // The step of element (or vector) i with its gradient g, read already.
  template <class Ops>
  ZERO_INLINE static void step(const StepCoeffs& c, const OptimizerTensors& t, std::size_t i,
                               typename Ops::V g) {
    using V = typename Ops::V;
    V p = Ops::load_f32(t.master + i);
    V s0 = kStates > 0 ? load_as_float<Ops, kState>(t.state0, i) : V(0.0f);
    V s1 = kStates > 1 ? load_as_float<Ops, kState>(t.state1, i) : V(0.0f);
    optimizer_update<kKind>(c, p, g, s0, s1);
    Ops::store_f32(t.master + i, p);
    if constexpr (kStates > 0) store_from_float<Ops, kState>(t.state0, i, s0);
    if constexpr (kStates > 1) store_from_float<Ops, kState>(t.state1, i, s1);
    if constexpr (kOut != DType::F64) store_from_float<Ops, kOut>(t.param_out, i, p);
  }
};

template <class Ops, class Element>
void optimizer_loop(const StepCoeffs& coeffs, const OptimizerTensors& tensors, std::size_t begin,
                    std::size_t end) {
  // Local copies: stores through the arrays cannot alias them, so the compiler keeps the
  // broadcast coefficients and the array pointers in registers.
  const StepCoeffs c = coeffs;
  const OptimizerTensors t = tensors;
  std::size_t i = begin;
  for (; i + Ops::kWidth <= end; i += Ops::kWidth) Element::template run<Ops>(c, t, i);
  for (; i < end; ++i) Element::template run<ScalarOps>(c, t, i);
}

// reduce's value at i before it is stored: srcs[0][i] ⊕ … ⊕ srcs[nsrc-1][i] left to right in
// fp32 (Sum: +; Max: max_nan), divided by `divisor` unless it is 0.
template <class Ops, DType kDType, bool kMax>
ZERO_INLINE typename Ops::V reduced_value(const void* const* srcs, int nsrc, float divisor,
                                          std::size_t i) {
  using V = typename Ops::V;
  V acc = load_as_float<Ops, kDType>(srcs[0], i);
  for (int k = 1; k < nsrc; ++k) {
    const V x = load_as_float<Ops, kDType>(srcs[k], i);
    if constexpr (kMax) {
      acc = Ops::max_nan(acc, x);
    } else {
      acc = acc + x;
    }
  }
  if (divisor != 0.0f) acc = acc / V(divisor);
  return acc;
}

// The sum of the gradient's sources at i, as reduce_at (below) stores it in the gradient dtype
// and as the step's load then reads it back: rounded through that dtype.
template <class Ops, DType kGrad>
ZERO_INLINE typename Ops::V summed_gradient(const void* const* srcs, int nsrc, float divisor,
                                            std::size_t i) {
  const typename Ops::V acc = reduced_value<Ops, kGrad, false>(srcs, nsrc, divisor, i);
  if constexpr (kGrad == DType::F32) {
    return acc;
  } else {
    std::uint16_t rounded[Ops::kWidth];
    store_from_float<Ops, kGrad>(rounded, 0, acc);
    return load_as_float<Ops, kGrad>(rounded, 0);
  }
}

// optimizer_loop over a gradient summed from `sources` in the same walk (begin a multiple
// of the norm block). kNorm: each norm block's squares of the summed gradient are added as
// squared_norm_block_range adds them (vectors into the ISA's lanes, a tail into lane k % 8) and
// block_sums[(b - begin) / kNormBlockElems] ← the block's sum.
template <class Ops, class Element, bool kNorm>
void optimizer_summed_loop(const StepCoeffs& coeffs, const OptimizerTensors& tensors,
                           const GradSources& sources, std::size_t begin, std::size_t end,
                           double* block_sums) {
  constexpr DType kGrad = Element::kGradDType;
  constexpr std::size_t kBlock = detail::kNormBlockElems;
  const StepCoeffs c = coeffs;
  const OptimizerTensors t = tensors;
  // Local copies: stores through the arrays cannot alias them, so they stay in registers.
  const void* srcs[GradSources::kMaxCount];
  const int nsrc = sources.count;
  for (int k = 0; k < nsrc; ++k) srcs[k] = sources.arrays[k];
  const float divisor = sources.divisor;
  for (std::size_t b = begin; b < end; b += kBlock) {
    const std::size_t block_end = std::min(end, b + kBlock);
    double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::size_t i = b;
    if constexpr (Ops::kWidth > 1) {
      typename Ops::SquareAcc acc;
      for (; i + Ops::kWidth <= block_end; i += Ops::kWidth) {
        const typename Ops::V g = summed_gradient<Ops, kGrad>(srcs, nsrc, divisor, i);
        if constexpr (kNorm) Ops::accumulate_squares(g, acc);
        Element::template step<Ops>(c, t, i, g);
      }
      if constexpr (kNorm) Ops::spill(acc, lanes);
    }
    for (; i < block_end; ++i) {
      const float g = summed_gradient<ScalarOps, kGrad>(srcs, nsrc, divisor, i);
      if constexpr (kNorm) ScalarOps::accumulate_squares(g, lanes, (i - b) % 8);
      Element::template step<ScalarOps>(c, t, i, g);
    }
    if constexpr (kNorm) block_sums[(b - begin) / kBlock] = add_norm_lanes(lanes);
  }
}

// No step: optimizer_summed_loop with kNorm then only sums the norm's blocks.
template <DType kGrad>
struct NoStep {
  static constexpr DType kGradDType = kGrad;
  template <class Ops>
  static void step(const StepCoeffs&, const OptimizerTensors&, std::size_t, typename Ops::V) {}
};

template <class Ops>
void norm_summed_range(const GradSources& sources, DType dtype, std::size_t begin,
                       std::size_t end, double* block_sums) {
  with_dtype(dtype, [&](auto tag) {
    optimizer_summed_loop<Ops, NoStep<decltype(tag)::value>, true>(StepCoeffs{}, OptimizerTensors{},
                                                                   sources, begin, end, block_sums);
  });
}

// Calls loop.template operator()<Element>() with kKind's step element of t's dtypes.
template <OptimizerKind kKind, int kStates, class Loop>
void with_dtypes_element(const OptimizerTensors& t, Loop&& loop) {
  with_dtype(t.grad_dtype, [&](auto grad) {
    with_dtype(t.state_dtype, [&](auto state) {
      auto run = [&](auto out) {
        using Element = StepElement<kKind, kStates, decltype(grad)::value, decltype(state)::value,
                                    decltype(out)::value>;
        loop.template operator()<Element>();
      };
      if (t.param_out == nullptr) {
        run(DTypeTag<DType::F64>{});
      } else if (t.param_out_dtype == DType::BF16) {
        run(DTypeTag<DType::BF16>{});
      } else if (t.param_out_dtype == DType::F16) {
        run(DTypeTag<DType::F16>{});
      } else if (t.param_out_dtype == DType::F32) {
        run(DTypeTag<DType::F32>{});
      } else {
        unsupported_combination();
      }
    });
  });
}

// Calls loop.template operator()<Element>() with the step element of c's optimizer and t's dtypes.
template <class Loop>
void with_step_element(const StepCoeffs& c, const OptimizerTensors& t, Loop&& loop) {
  switch (c.kind) {
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW:
      return with_dtypes_element<OptimizerKind::AdamW, 2>(t, loop);
    case OptimizerKind::Adagrad:
      return with_dtypes_element<OptimizerKind::Adagrad, 1>(t, loop);
    case OptimizerKind::Lion:
      return with_dtypes_element<OptimizerKind::Lion, 1>(t, loop);
    case OptimizerKind::Sgd:
      if (c.sgd.use_momentum) return with_dtypes_element<OptimizerKind::Sgd, 1>(t, loop);
      return with_dtypes_element<OptimizerKind::Sgd, 0>(t, loop);
  }
  unsupported_combination();
}

template <class Ops>
void optimizer_range(const StepCoeffs& c, const OptimizerTensors& t, std::size_t begin,
                     std::size_t end) {
  with_step_element(c, t, [&]<class Element>() { optimizer_loop<Ops, Element>(c, t, begin, end); });
}

template <class Ops>
void optimizer_summed_range(const StepCoeffs& c, const OptimizerTensors& t,
                            const GradSources& sources, std::size_t begin, std::size_t end,
                            double* block_sums) {
  with_step_element(c, t, [&]<class Element>() {
    if (block_sums != nullptr) {
      optimizer_summed_loop<Ops, Element, true>(c, t, sources, begin, end, block_sums);
    } else {
      optimizer_summed_loop<Ops, Element, false>(c, t, sources, begin, end, nullptr);
    }
  });
}

// The roofline probe: each array the optimizer reads is read and each it writes is written, in
// the same order and widths (every load of a vector before its stores, as in StepElement), with
// one add in place of the update and a truncating bf16 store.
template <int kStates, DType kGrad, DType kState, DType kOut>
struct ProbeElement {
  template <class Ops>
  ZERO_INLINE static void run(const OptimizerTensors& t, std::size_t i) {
    using V = typename Ops::V;
    const V g = load_as_float<Ops, kGrad>(t.grad, i);
    const V p = Ops::load_f32(t.master + i) + g;
    const V s0 = kStates > 0 ? load_as_float<Ops, kState>(t.state0, i) + g : g;
    const V s1 = kStates > 1 ? load_as_float<Ops, kState>(t.state1, i) + g : g;
    Ops::store_f32(t.master + i, p);
    if constexpr (kStates > 0) store_state<Ops>(t.state0, i, s0);
    if constexpr (kStates > 1) store_state<Ops>(t.state1, i, s1);
    if constexpr (kOut == DType::BF16) {
      Ops::store_bf16_truncated(static_cast<std::uint16_t*>(t.param_out) + i, p);
    } else if constexpr (kOut == DType::F32) {
      Ops::store_f32(static_cast<float*>(t.param_out) + i, p);
    } else if constexpr (kOut == DType::F16) {
      Ops::store_f16(static_cast<std::uint16_t*>(t.param_out) + i, p);
    }
  }
  template <class Ops>
  ZERO_INLINE static void store_state(void* base, std::size_t i, typename Ops::V x) {
    if constexpr (kState == DType::F32) {
      Ops::store_f32(static_cast<float*>(base) + i, x);
    } else if constexpr (kState == DType::BF16) {
      Ops::store_bf16_truncated(static_cast<std::uint16_t*>(base) + i, x);
    } else {
      Ops::store_f16(static_cast<std::uint16_t*>(base) + i, x);
    }
  }
};

template <class Ops, int kStates>
void probe_dispatch(const OptimizerTensors& tensors, std::size_t begin, std::size_t end) {
  const OptimizerTensors t = tensors;  // as optimizer_loop: the pointers stay in registers
  with_dtype(t.grad_dtype, [&](auto grad) {
    with_dtype(t.state_dtype, [&](auto state) {
      auto run = [&](auto out) {
        using Element = ProbeElement<kStates, decltype(grad)::value, decltype(state)::value,
                                     decltype(out)::value>;
        std::size_t i = begin;
        for (; i + Ops::kWidth <= end; i += Ops::kWidth) Element::template run<Ops>(t, i);
        for (; i < end; ++i) Element::template run<ScalarOps>(t, i);
      };
      if (t.param_out == nullptr) {
        run(DTypeTag<DType::F64>{});
      } else if (t.param_out_dtype == DType::BF16) {
        run(DTypeTag<DType::BF16>{});
      } else if (t.param_out_dtype == DType::F32) {
        run(DTypeTag<DType::F32>{});
      } else {
        run(DTypeTag<DType::F16>{});
      }
    });
  });
}

template <class Ops>
void probe_range(const OptimizerTensors& t, int state_count, std::size_t begin, std::size_t end) {
  switch (state_count) {
    case 0: return probe_dispatch<Ops, 0>(t, begin, end);
    case 1: return probe_dispatch<Ops, 1>(t, begin, end);
    case 2: return probe_dispatch<Ops, 2>(t, begin, end);
    default: unsupported_combination();
  }
}

template <class Ops>
bool unscale_range(void* data, DType dtype, float scale, std::size_t begin, std::size_t end) {
  bool nonfinite = false;
  with_dtype(dtype, [&](auto tag) {
    constexpr DType kDType = decltype(tag)::value;
    using V = typename Ops::V;
    const V s(scale);
    std::size_t i = begin;
    for (; i + Ops::kWidth <= end; i += Ops::kWidth) {
      const V x = load_as_float<Ops, kDType>(data, i) * s;
      nonfinite |= Ops::any_nonfinite(x);
      store_from_float<Ops, kDType>(data, i, x);
    }
    for (; i < end; ++i) {
      const float x = load_as_float<ScalarOps, kDType>(data, i) * scale;
      nonfinite |= ScalarOps::any_nonfinite(x);
      store_from_float<ScalarOps, kDType>(data, i, x);
    }
  });
  return nonfinite;
}

template <class Ops>
double squared_norm_block_range(const void* data, DType dtype, std::size_t begin, std::size_t end) {
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  with_dtype(dtype, [&](auto tag) {
    constexpr DType kDType = decltype(tag)::value;
    std::size_t i = begin;
    if constexpr (Ops::kWidth > 1) {
      typename Ops::SquareAcc acc;
      for (; i + Ops::kWidth <= end; i += Ops::kWidth) {
        Ops::accumulate_squares(load_as_float<Ops, kDType>(data, i), acc);
      }
      Ops::spill(acc, lanes);
    }
    for (; i < end; ++i) {
      ScalarOps::accumulate_squares(load_as_float<ScalarOps, kDType>(data, i), lanes,
                                    (i - begin) % 8);
    }
  });
  return add_norm_lanes(lanes);
}

// kNormBlocksAtOnce whole norm blocks from `begin`, their lanes advanced side by side: a block's
// lanes are one chain of dependent adds, so one block at a time waits on the add's latency
// (about 7-9 GB/s on one core of the 2-core VM), while several chains fill the pipeline. Each
// block's lanes see the same adds in the same order as squared_norm_block_range's: the same sums.
template <class Ops>
void squared_norm_blocks_range(const void* data, DType dtype, std::size_t begin, double* sums) {
  constexpr std::size_t kBlocks = detail::kNormBlocksAtOnce;
  constexpr std::size_t kElems = detail::kNormBlockElems;
  if constexpr (Ops::kWidth == 1) {
    for (std::size_t j = 0; j < kBlocks; ++j)
      sums[j] =
          squared_norm_block_range<Ops>(data, dtype, begin + j * kElems, begin + (j + 1) * kElems);
  } else {
    static_assert(kElems % Ops::kWidth == 0, "a norm block is whole vectors");
    with_dtype(dtype, [&](auto tag) {
      constexpr DType kDType = decltype(tag)::value;
      typename Ops::SquareAcc acc[kBlocks];
      for (std::size_t i = begin; i < begin + kElems; i += Ops::kWidth) {
        for (std::size_t j = 0; j < kBlocks; ++j)
          Ops::accumulate_squares(load_as_float<Ops, kDType>(data, i + j * kElems), acc[j]);
      }
      for (std::size_t j = 0; j < kBlocks; ++j) {
        double lanes[8];
        Ops::spill(acc[j], lanes);
        sums[j] = add_norm_lanes(lanes);
      }
    });
  }
}

template <class Ops>
void cast_range(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t begin,
                std::size_t end) {
  with_dtype(src_dtype, [&](auto from) {
    with_dtype(dst_dtype, [&](auto to) {
      constexpr DType kFrom = decltype(from)::value;
      constexpr DType kTo = decltype(to)::value;
      std::size_t i = begin;
      for (; i + Ops::kWidth <= end; i += Ops::kWidth) {
        store_from_float<Ops, kTo>(dst, i, load_as_float<Ops, kFrom>(src, i));
      }
      for (; i < end; ++i) {
        store_from_float<ScalarOps, kTo>(dst, i, load_as_float<ScalarOps, kFrom>(src, i));
      }
    });
  });
}

// One element (or vector) of reduce: every source read before dst is written, so dst may alias
// a source exactly.
template <class Ops, DType kDType, bool kMax>
ZERO_INLINE void reduce_at(void* dst, const void* const* srcs, int nsrc, float divisor,
                           std::size_t i) {
  store_from_float<Ops, kDType>(dst, i, reduced_value<Ops, kDType, kMax>(srcs, nsrc, divisor, i));
}

// The cache line a streaming reduce stores at a time.
inline constexpr std::size_t kLine = 64;

// reduce_at over the kLine-byte lines of dst from element i on, each line computed into a local
// line and stored with non-temporal stores (SSE2, every x86-64 ISA has it); returns the first
// element not done. The caller fences. Elsewhere than x86-64 it does nothing.
template <class Ops, DType kDType, bool kMax>
std::size_t reduce_streamed_lines(void* dst, const void* const* srcs, int nsrc, float divisor,
                                  std::size_t i, std::size_t end) {
#if defined(__x86_64__)
  constexpr std::size_t kLineElems = kLine / dtype_size(kDType);
  static_assert(kLineElems % Ops::kWidth == 0);
  auto* const out = static_cast<std::byte*>(dst);
  alignas(kLine) std::byte line[kLine];
  for (; i + kLineElems <= end; i += kLineElems) {
    for (std::size_t k = 0; k < kLineElems; k += Ops::kWidth) {
      store_from_float<Ops, kDType>(line, k, reduced_value<Ops, kDType, kMax>(srcs, nsrc, divisor,
                                                                              i + k));
    }
    auto* to = reinterpret_cast<__m128i*>(out + i * dtype_size(kDType));
    const auto* from = reinterpret_cast<const __m128i*>(line);
    for (std::size_t q = 0; q < kLine / 16; ++q) _mm_stream_si128(to + q, _mm_load_si128(from + q));
  }
#endif
  return i;
}

template <class Ops>
void reduce_range(void* dst, const void* const* srcs, int nsrc, DType dtype, bool max,
                  float divisor, std::size_t begin, std::size_t end, bool streaming) {
  with_dtype(dtype, [&](auto tag) {
    constexpr DType kDType = decltype(tag)::value;
    auto run = [&](auto is_max) {
      constexpr bool kMax = decltype(is_max)::value;
      std::size_t i = begin;
      if (streaming) {
        // Ordinary stores up to dst's first line boundary, then whole lines streamed.
        const auto addr = reinterpret_cast<std::uintptr_t>(dst) + i * dtype_size(kDType);
        const std::size_t head =
            std::min(end - i, (kLine - addr % kLine) % kLine / dtype_size(kDType));
        for (const std::size_t stop = i + head; i < stop; ++i)
          reduce_at<ScalarOps, kDType, kMax>(dst, srcs, nsrc, divisor, i);
        i = reduce_streamed_lines<Ops, kDType, kMax>(dst, srcs, nsrc, divisor, i, end);
      }
      for (; i + Ops::kWidth <= end; i += Ops::kWidth)
        reduce_at<Ops, kDType, kMax>(dst, srcs, nsrc, divisor, i);
      for (; i < end; ++i) reduce_at<ScalarOps, kDType, kMax>(dst, srcs, nsrc, divisor, i);
    };
    if (max) {
      run(std::true_type{});
    } else {
      run(std::false_type{});
    }
  });
}

template <class Ops>
constexpr detail::CpuKernels make_cpu_kernels() {
  return detail::CpuKernels{&optimizer_range<Ops>,
                            &probe_range<Ops>,
                            &unscale_range<Ops>,
                            &squared_norm_block_range<Ops>,
                            &squared_norm_blocks_range<Ops>,
                            &cast_range<Ops>,
                            &reduce_range<Ops>,
                            &optimizer_summed_range<Ops>,
                            &norm_summed_range<Ops>};
}

}  // namespace ZERO_KERNELS_ABI
}  // namespace zero::kernels::math
