// Every ISA path and every thread count give bitwise the same optimizer step, with or without
// its norm taken on the way.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/norm.h"
#include "kernels/optimizer.h"
#include "kernels/reduce.h"
#include "tests/kernels/test_util.h"

namespace zk = zero::kernels;
using zero::DType;

namespace {

// Several tiles, plus a tail shorter than any vector.
constexpr std::size_t kNumel = 3 * 16384 + 1000 + 13;

struct Buffers {
  std::vector<float> master;
  std::vector<std::byte> grad, state0, state1, out;

  Buffers(DType grad_dtype, DType state_dtype, DType out_dtype) {
    master = zk::test::random_floats(kNumel, 1, -1.0f, 1.0f);
    const auto g = zk::test::random_floats(kNumel, 2, -1.0f, 1.0f);
    const auto s = zk::test::random_floats(kNumel, 3, 0.0f, 0.1f);
    grad = encode(g, grad_dtype);
    state0 = encode(s, state_dtype);
    state1 = encode(s, state_dtype);
    out.assign(kNumel * zero::dtype_size(out_dtype), std::byte{0});
  }
  static std::vector<std::byte> encode(const std::vector<float>& v, DType dtype) {
    std::vector<std::byte> b(v.size() * zero::dtype_size(dtype));
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (dtype == DType::F32) {
        std::memcpy(b.data() + 4 * i, &v[i], 4);
      } else {
        // Any 16-bit pattern works as input here; take bf16 truncation for both formats.
        std::uint32_t u;
        std::memcpy(&u, &v[i], 4);
        const auto h =
            static_cast<std::uint16_t>(dtype == DType::BF16 ? u >> 16 : (u >> 16) & 0x3bff);
        std::memcpy(b.data() + 2 * i, &h, 2);
      }
    }
    return b;
  }
  zk::OptimizerTensors view(DType grad_dtype, DType state_dtype, bool with_out, DType out_dtype) {
    return {master.data(),
            grad.data(),
            grad_dtype,
            state0.data(),
            state1.data(),
            state_dtype,
            with_out ? out.data() : nullptr,
            out_dtype,
            kNumel};
  }
  bool operator==(const Buffers&) const = default;
};

std::vector<zk::OptimizerHyper> all_optimizers() {
  std::vector<zk::OptimizerHyper> out;
  for (auto kind : {zk::OptimizerKind::Adam, zk::OptimizerKind::AdamW, zk::OptimizerKind::Adagrad,
                    zk::OptimizerKind::Lion, zk::OptimizerKind::Sgd}) {
    zk::OptimizerHyper h;
    h.kind = kind;
    h.weight_decay = 0.05;
    if (kind == zk::OptimizerKind::Sgd) {
      h.momentum = 0.9;
      h.nesterov = true;
    }
    out.push_back(h);
  }
  zk::OptimizerHyper plain_sgd;
  plain_sgd.kind = zk::OptimizerKind::Sgd;
  out.push_back(plain_sgd);
  return out;
}

}  // namespace

TEST_CASE("every ISA and thread count produce bitwise identical optimizer steps") {
  const auto isas = zk::test::runnable_isas();
  INFO("runnable ISAs: " << isas.size());
  REQUIRE(!isas.empty());
  for (const auto& hyper : all_optimizers()) {
    for (DType grad : {DType::F32, DType::BF16, DType::F16}) {
      for (DType state : {DType::F32, DType::BF16}) {
        for (DType out : {DType::F64, DType::BF16, DType::F16}) {
          const bool with_out = out != DType::F64;
          const DType out_dtype = with_out ? out : DType::BF16;
          INFO(zk::optimizer_name(hyper.kind)
               << " grad " << zero::dtype_name(grad) << " state " << zero::dtype_name(state)
               << " out " << zero::dtype_name(out));
          Buffers expected(grad, state, out_dtype);
          const Buffers initial = expected;
          for (int step = 1; step <= 2; ++step) {
            zk::optimizer_step_cpu(hyper, {1e-2, step, 0.5},
                                   expected.view(grad, state, with_out, out_dtype),
                                   {1, zk::Isa::Scalar});
          }
          REQUIRE(expected.master != initial.master);
          for (zk::Isa isa : isas) {
            for (int threads : {1, 2, 3, 7}) {
              INFO("isa " << zk::isa_name(isa) << " threads " << threads);
              Buffers got = initial;
              for (int step = 1; step <= 2; ++step) {
                zk::optimizer_step_cpu(hyper, {1e-2, step, 0.5},
                                       got.view(grad, state, with_out, out_dtype), {threads, isa});
              }
              REQUIRE(got == expected);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("ZERO_ISA chooses the path Auto resolves to, and an unknown name is an error") {
  const char* saved = std::getenv("ZERO_ISA");
  const std::string restore = saved ? saved : "";
  setenv("ZERO_ISA", "scalar", 1);
  REQUIRE(zk::resolve_isa(zk::Isa::Auto) == zk::Isa::Scalar);
  setenv("ZERO_ISA", "sse9", 1);
  REQUIRE_THROWS_WITH(zk::resolve_isa(zk::Isa::Auto), Catch::Contains("ZERO_ISA=sse9"));
  unsetenv("ZERO_ISA");
  REQUIRE(zk::resolve_isa(zk::Isa::Auto) == zk::best_isa());
  REQUIRE(zk::resolve_isa(zk::Isa::Scalar) == zk::Isa::Scalar);
  if (saved) setenv("ZERO_ISA", restore.c_str(), 1);
  REQUIRE(zk::parse_isa("avx512") == zk::Isa::Avx512);
  REQUIRE_FALSE(zk::parse_isa("AVX512").has_value());
}

TEST_CASE("the step with its norm steps as the step alone and sums the norm's blocks") {
  // optimizer_step_norm_cpu reads each tile's gradient for its norm blocks, then steps the tile:
  // the step's bits are optimizer_step_cpu's, each block sum squared_l2_norm_cpu's of the block,
  // and their sum in order squared_l2_norm_cpu's of the array, for every ISA and thread count.
  constexpr std::size_t kBlock = zk::kNormBlockElems;
  const auto isas = zk::test::runnable_isas();
  REQUIRE(!isas.empty());
  zk::OptimizerHyper adamw;
  adamw.weight_decay = 0.05;
  for (std::size_t numel : {std::size_t{1}, std::size_t{100}, kBlock, kBlock + 1, kNumel}) {
    for (DType grad : {DType::F32, DType::BF16, DType::F16}) {
      INFO("numel " << numel << " grad " << zero::dtype_name(grad));
      Buffers expected(grad, DType::F32, DType::BF16);
      const Buffers initial = expected;
      zk::OptimizerTensors t = expected.view(grad, DType::F32, true, DType::BF16);
      t.numel = numel;
      zk::optimizer_step_cpu(adamw, {1e-2, 3, 0.5}, t, {1, zk::Isa::Scalar});
      REQUIRE(expected.master != initial.master);
      const std::size_t blocks = (numel + kBlock - 1) / kBlock;
      std::vector<double> want(blocks);
      for (std::size_t b = 0; b < blocks; ++b) {
        want[b] =
            zk::squared_l2_norm_cpu(initial.grad.data() + b * kBlock * zero::dtype_size(grad), grad,
                                    std::min(kBlock, numel - b * kBlock), {1, zk::Isa::Scalar});
        REQUIRE(want[b] > 0.0);
      }
      const double whole = zk::squared_l2_norm_cpu(initial.grad.data(), grad, numel);
      for (zk::Isa isa : isas) {
        for (int threads : {1, 2, 3}) {
          INFO("isa " << zk::isa_name(isa) << " threads " << threads);
          Buffers got = initial;
          zk::OptimizerTensors g = got.view(grad, DType::F32, true, DType::BF16);
          g.numel = numel;
          std::vector<double> sums(blocks + 1, -1.0);  // one more: nothing is written past them
          zk::optimizer_step_norm_cpu(adamw, {1e-2, 3, 0.5}, g, sums.data(), {threads, isa});
          REQUIRE(got == expected);
          REQUIRE(sums.back() == -1.0);
          sums.pop_back();
          REQUIRE(std::memcmp(sums.data(), want.data(), blocks * sizeof(double)) == 0);
          const std::size_t first[2] = {0, blocks};
          REQUIRE(zk::sum_norm_blocks(sums, first) == whole);
        }
      }
    }
  }
}

TEST_CASE("the step of a gradient summed from its sources gives the bits of reduce, then step") {
  // optimizer_step_summed_cpu sums each element of the gradient from its sources as it steps it
  // (and, given block_sums, adds its squares into the norm's blocks): bitwise reduce_cpu into an
  // array, then optimizer_step_cpu (or optimizer_step_norm_cpu) of that array; and
  // squared_norm_summed_cpu those blocks alone. For every
  // optimizer, dtype, source count, divisor, size (tails shorter than a vector or a norm block),
  // ISA and thread count.
  constexpr std::size_t kBlock = zk::kNormBlockElems;
  const auto isas = zk::test::runnable_isas();
  REQUIRE(!isas.empty());
  struct Case {
    zk::OptimizerHyper hyper;
    DType grad, state, out;
    bool with_out;
    int count;
    float divisor;
    std::size_t numel;
  };
  std::vector<Case> cases;
  zk::OptimizerHyper adamw;
  adamw.weight_decay = 0.05;
  for (DType grad : {DType::F32, DType::BF16, DType::F16}) {
    for (DType state : {DType::F32, DType::BF16}) {
      for (int out = 0; out < 3; ++out) {
        for (int count : {1, 2, 3}) {
          for (float divisor : {0.0f, static_cast<float>(count)}) {
            cases.push_back({adamw, grad, state, out == 2 ? DType::F32 : DType::BF16, out > 0,
                             count, divisor, kNumel});
          }
        }
      }
    }
  }
  for (const zk::OptimizerHyper& h : all_optimizers()) {
    cases.push_back({h, DType::F32, DType::F32, DType::BF16, true, 2, 2.0f, kNumel});
  }
  for (std::size_t numel : {std::size_t{1}, std::size_t{100}, kBlock + 1}) {
    cases.push_back({adamw, DType::BF16, DType::F32, DType::BF16, true, 2, 2.0f, numel});
  }
  const zk::StepScalars scalars{1e-2, 3, 0.5};
  const zk::CpuExec scalar{1, zk::Isa::Scalar};
  for (const Case& c : cases) {
    INFO(zk::optimizer_name(c.hyper.kind) << " grad " << zero::dtype_name(c.grad) << " state "
                                          << zero::dtype_name(c.state) << " out "
                                          << (c.with_out ? zero::dtype_name(c.out) : "none")
                                          << ", " << c.count << " sources / " << c.divisor
                                          << ", numel " << c.numel);
    std::vector<std::vector<std::byte>> sources;
    std::vector<const void*> arrays;
    for (int k = 0; k < c.count; ++k) {
      sources.push_back(Buffers::encode(
          zk::test::random_floats(kNumel, 10 + static_cast<std::uint32_t>(k), -1.0f, 1.0f),
          c.grad));
    }
    for (const auto& s : sources) arrays.push_back(s.data());
    const zk::GradSources summed{arrays.data(), c.count, c.divisor};
    const Buffers initial(c.grad, c.state, c.out);
    const std::size_t blocks = (c.numel + kBlock - 1) / kBlock;
    for (bool norm : {false, true}) {
      INFO((norm ? "with" : "without") << " the norm");
      // The reference: the sum in memory, then the step (with its norm) reading it.
      Buffers expected = initial;
      zk::reduce_cpu(expected.grad.data(), arrays.data(), c.count, c.numel, c.grad,
                     zk::ReduceKind::Sum, c.divisor, zk::Isa::Scalar);
      zk::OptimizerTensors t = expected.view(c.grad, c.state, c.with_out, c.out);
      t.numel = c.numel;
      std::vector<double> want(blocks);
      if (norm) {
        zk::optimizer_step_norm_cpu(c.hyper, scalars, t, want.data(), scalar);
        for (double w : want) REQUIRE(w > 0.0);
      } else {
        zk::optimizer_step_cpu(c.hyper, scalars, t, scalar);
      }
      REQUIRE(expected.master != initial.master);
      for (zk::Isa isa : isas) {
        for (int threads : {1, 2, 3}) {
          INFO("isa " << zk::isa_name(isa) << " threads " << threads);
          Buffers got = initial;
          zk::OptimizerTensors g = got.view(c.grad, c.state, c.with_out, c.out);
          g.numel = c.numel;
          g.grad = nullptr;  // not read
          std::vector<double> sums(blocks + 1, -1.0);  // one more: nothing is written past them
          zk::optimizer_step_summed_cpu(c.hyper, scalars, g, summed, norm ? sums.data() : nullptr,
                                        {threads, isa});
          got.grad = expected.grad;  // the sum was never stored: compare the rest
          REQUIRE(got == expected);
          if (norm) {
            REQUIRE(std::memcmp(sums.data(), want.data(), blocks * sizeof(double)) == 0);
            // The norm's blocks alone, in a walk of their own.
            std::vector<double> alone(blocks + 1, -1.0);
            zk::squared_norm_summed_cpu(summed, c.grad, c.numel, alone.data(), {threads, isa});
            REQUIRE(std::memcmp(alone.data(), want.data(), blocks * sizeof(double)) == 0);
            REQUIRE(alone.back() == -1.0);
          } else {
            REQUIRE(sums[0] == -1.0);
          }
          REQUIRE(sums.back() == -1.0);
        }
      }
    }
  }
}

TEST_CASE("a summed gradient's sources are checked as the gradient is, by count and divisor") {
  Buffers b(DType::F32, DType::F32, DType::BF16);
  zk::OptimizerTensors t = b.view(DType::F32, DType::F32, false, DType::BF16);
  const zk::OptimizerHyper adamw;
  const void* ok[2] = {b.grad.data(), b.grad.data()};
  const void* null_one[2] = {b.grad.data(), nullptr};
  const auto run = [&](const void* const* arrays, int count, float divisor) {
    zk::optimizer_step_summed_cpu(adamw, {}, t, {arrays, count, divisor}, nullptr);
  };
  REQUIRE_THROWS_WITH(run(ok, 0, 0.0f), Catch::Contains("1 to 16 sources, got 0"));
  REQUIRE_THROWS_WITH(run(ok, 17, 0.0f), Catch::Contains("got 17"));
  REQUIRE_THROWS_WITH(run(ok, 2, -1.0f), Catch::Contains("divisor must be finite and >= 0"));
  REQUIRE_THROWS_WITH(run(null_one, 2, 0.0f), Catch::Contains("grad"));
  const std::vector<float> before = b.master;
  REQUIRE_NOTHROW(run(ok, 2, 2.0f));
  REQUIRE(b.master != before);
}
