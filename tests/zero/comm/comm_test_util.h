// Shared by the InProcComm and MpiComm tests: deterministic inputs and a straightforward
// reference for every collective, written independently of zero/comm's own reduction code.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zero/base/half.h"
#include "zero/comm/communicator.h"

namespace zero::test {

constexpr std::uint64_t kSeed = 0x5eed2024;

inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A value in [-4, 4) with a full mantissa, the same on every rank that asks.
inline double input_value(std::uint64_t case_id, int rank, std::size_t i) {
  const std::uint64_t h =
      mix(kSeed ^ mix(case_id * 1000003 + static_cast<std::uint64_t>(rank)) ^ mix(i));
  return static_cast<double>(h >> 11) / static_cast<double>(std::uint64_t{1} << 53) * 8.0 - 4.0;
}

// Typed element storage as raw bytes (8-byte aligned).
class Bytes {
 public:
  Bytes(DType t, std::size_t elems)
      : dtype_(t), elems_(elems), words_((elems * dtype_size(t) + 7) / 8 + 1, 0) {}
  void* data() { return words_.data(); }
  const void* data() const { return words_.data(); }
  std::size_t elems() const { return elems_; }
  std::size_t size_bytes() const { return elems_ * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }

  // Stores v rounded to the element type.
  void set(std::size_t i, double v) {
    auto* p = static_cast<char*>(data()) + i * dtype_size(dtype_);
    switch (dtype_) {
      case DType::F32: {
        const float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::F64: std::memcpy(p, &v, 8); break;
      case DType::BF16: {
        const auto b = half::float_to_bf16(static_cast<float>(v));
        std::memcpy(p, &b, 2);
        break;
      }
      case DType::F16: {
        const auto b = half::float_to_f16(static_cast<float>(v));
        std::memcpy(p, &b, 2);
        break;
      }
    }
  }
  double get(std::size_t i) const {
    const auto* p = static_cast<const char*>(data()) + i * dtype_size(dtype_);
    switch (dtype_) {
      case DType::F32: {
        float f;
        std::memcpy(&f, p, 4);
        return f;
      }
      case DType::F64: {
        double d;
        std::memcpy(&d, p, 8);
        return d;
      }
      case DType::BF16: {
        std::uint16_t b;
        std::memcpy(&b, p, 2);
        return half::bf16_to_float(b);
      }
      case DType::F16: {
        std::uint16_t b;
        std::memcpy(&b, p, 2);
        return half::f16_to_float(b);
      }
    }
    return 0;
  }
  bool same_bits(std::size_t i, const Bytes& other, std::size_t j) const {
    const std::size_t esz = dtype_size(dtype_);
    return std::memcmp(static_cast<const char*>(data()) + i * esz,
                       static_cast<const char*>(other.data()) + j * esz, esz) == 0;
  }

 private:
  DType dtype_;
  std::size_t elems_;
  std::vector<std::uint64_t> words_;
};

// Rank `rank`'s input for a case: `elems` values, stored in the element type.
inline Bytes make_input(std::uint64_t case_id, DType t, int rank, std::size_t elems) {
  Bytes b(t, elems);
  for (std::size_t i = 0; i < elems; ++i) b.set(i, input_value(case_id, rank, i));
  return b;
}

// The documented reduction: in rank order, in fp32 for fp32 and 16-bit types (rounded once at
// the end), in fp64 for fp64; Avg divides the sum by the number of ranks.
inline double reference_reduce(const std::vector<Bytes>& inputs, std::size_t i, DType t,
                               ReduceOp op) {
  const int n = static_cast<int>(inputs.size());
  if (t == DType::F64) {
    double acc = inputs[0].get(i);
    for (int q = 1; q < n; ++q)
      acc = op == ReduceOp::Max ? std::max(acc, inputs[q].get(i)) : acc + inputs[q].get(i);
    return op == ReduceOp::Avg ? acc / n : acc;
  }
  float acc = static_cast<float>(inputs[0].get(i));
  for (int q = 1; q < n; ++q) {
    const auto x = static_cast<float>(inputs[q].get(i));
    acc = op == ReduceOp::Max ? std::max(acc, x) : acc + x;
  }
  return op == ReduceOp::Avg ? acc / static_cast<float>(n) : acc;
}

// Thread-safe tally of checks made inside rank threads (Catch2 assertions are not thread-safe,
// so rank threads record here and the test thread asserts on the totals).
class Tally {
 public:
  void check(bool ok, const std::string& what) {
    std::lock_guard lock(mu_);
    ++checks_;
    if (!ok && failures_.size() < 20) failures_.push_back(what);
    if (!ok) ++failed_;
  }
  void count(std::size_t n) {
    std::lock_guard lock(mu_);
    checks_ += n;
  }
  std::size_t checks() const { return checks_; }
  std::size_t failed() const { return failed_; }
  std::string report() const {
    std::string out = fmt::format("{} checks, {} failed", checks_, failed_);
    for (const auto& f : failures_) out += "\n  " + f;
    return out;
  }

 private:
  std::mutex mu_;
  std::size_t checks_ = 0;
  std::size_t failed_ = 0;
  std::vector<std::string> failures_;
};

struct Case {
  Collective kind;
  DType dtype;
  ReduceOp op;
  std::size_t elems;
  bool in_place;
  int root;
  std::uint64_t id;
  std::string name(int world) const {
    CollectiveArgs a{kind, nullptr, nullptr, elems, dtype, op, root, in_place};
    return describe(a, world);
  }
};

// Every collective × dtype × op × size × placement, in one fixed order.
inline std::vector<Case> all_cases(int world, const std::vector<std::size_t>& sizes) {
  std::vector<Case> out;
  std::uint64_t id = 0;
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    for (std::size_t n : sizes) {
      for (bool in_place : {false, true}) {
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
          out.push_back({Collective::ReduceScatter, t, op, n, in_place, 0, ++id});
          out.push_back({Collective::AllReduce, t, op, n, in_place, 0, ++id});
        }
        out.push_back({Collective::AllGather, t, ReduceOp::Sum, n, in_place, 0, ++id});
      }
      out.push_back({Collective::AllToAll, t, ReduceOp::Sum, n, false, 0, ++id});
      out.push_back({Collective::Broadcast, t, ReduceOp::Sum, n, true, world - 1, ++id});
      out.push_back({Collective::Broadcast, t, ReduceOp::Sum, n, true, 0, ++id});
    }
  }
  return out;
}

// Elements of a case's output buffer on one rank: world × elems for all_gather, all_to_all and
// an in-place reduce_scatter (the whole buffer), elems otherwise.
inline std::size_t output_elems(const Case& c, int world) {
  const bool whole = c.kind == Collective::AllGather || c.kind == Collective::AllToAll ||
                     (c.kind == Collective::ReduceScatter && c.in_place);
  return whole ? static_cast<std::size_t>(world) * c.elems : c.elems;
}

// Where perform_case runs a collective, when not on its own vectors: a buffer of `bytes`
// (e.g. in ShmComm's shared host arena), freed by the deleter.
using Place = std::function<std::shared_ptr<std::byte>(std::size_t bytes)>;

// Issues case `c` on `comm` with this rank's input (make_input) and waits: the output buffer
// (output_elems) as the collective left it, -99 where it wrote nothing. With `place`, the
// collective runs on copies of the input and output in the buffers it gives.
inline Bytes perform_case(Communicator& comm, const Case& c, const Place& place = {}) {
  const int world = comm.size();
  const int me = comm.rank();
  const std::size_t n = c.elems;
  const std::size_t in_elems =
      c.kind == Collective::ReduceScatter || c.kind == Collective::AllToAll
          ? static_cast<std::size_t>(world) * n
          : n;
  Bytes send = make_input(c.id, c.dtype, me, in_elems);
  Bytes out(c.dtype, output_elems(c, world));
  for (std::size_t i = 0; i < out.elems(); ++i) out.set(i, -99.0);  // sentinel
  // What an in-place call (and broadcast) starts from in the output buffer.
  if (c.kind == Collective::Broadcast ||
      (c.in_place && c.kind != Collective::AllGather && c.kind != Collective::Barrier)) {
    out = send;
  } else if (c.in_place && c.kind == Collective::AllGather) {
    for (std::size_t i = 0; i < n; ++i) out.set(static_cast<std::size_t>(me) * n + i, send.get(i));
  }
  std::shared_ptr<std::byte> placed_send, placed_out;
  void* in = send.data();
  void* result = out.data();
  if (place) {
    placed_send = place(send.size_bytes());
    placed_out = place(out.size_bytes());
    if (send.size_bytes() > 0) std::memcpy(placed_send.get(), send.data(), send.size_bytes());
    if (out.size_bytes() > 0) std::memcpy(placed_out.get(), out.data(), out.size_bytes());
    in = placed_send.get();
    result = placed_out.get();
  }
  Work work;
  switch (c.kind) {
    case Collective::ReduceScatter:
      work = c.in_place ? comm.reduce_scatter_in_place(result, n, c.dtype, c.op)
                        : comm.reduce_scatter(in, result, n, c.dtype, c.op);
      break;
    case Collective::AllGather:
      work = c.in_place ? comm.all_gather_in_place(result, n, c.dtype)
                        : comm.all_gather(in, result, n, c.dtype);
      break;
    case Collective::AllReduce:
      work = comm.all_reduce(c.in_place ? result : in, result, n, c.dtype, c.op);
      break;
    case Collective::Broadcast: work = comm.broadcast(result, n, c.dtype, c.root); break;
    case Collective::AllToAll: work = comm.all_to_all(in, result, n, c.dtype); break;
    case Collective::Barrier: work = comm.barrier(); break;
  }
  work.wait();
  if (place && out.size_bytes() > 0) std::memcpy(out.data(), result, out.size_bytes());
  return out;
}

// Runs one case on `comm` and checks the result against the reference. With `bitwise`, results
// must match bit for bit (InProcComm); otherwise within `rel_tol` of the reference magnitude
// (MpiComm: MPI's reduction order).
// `reduce` is the reference of a reduction's element (reference_reduce unless given).
using ReferenceReduce = std::function<double(const std::vector<Bytes>& inputs, std::size_t i,
                                             DType t, ReduceOp op)>;

inline void run_case(Communicator& comm, const Case& c, Tally& tally, bool bitwise,
                     double rel_tol, const ReferenceReduce& reduce = reference_reduce) {
  const int world = comm.size();
  const int me = comm.rank();
  const auto w = static_cast<std::size_t>(world);
  const std::size_t n = c.elems;
  const std::string name = fmt::format("rank {}: {}", me, c.name(world));
  const std::size_t in_elems =
      c.kind == Collective::ReduceScatter || c.kind == Collective::AllToAll ? w * n : n;

  std::vector<Bytes> inputs;
  for (int q = 0; q < world; ++q) inputs.push_back(make_input(c.id, c.dtype, q, in_elems));

  const Bytes out = perform_case(comm, c);

  auto compare = [&](std::size_t out_index, const Bytes& expected, std::size_t exp_index) {
    bool ok;
    if (bitwise) {
      ok = out.same_bits(out_index, expected, exp_index);
    } else {
      const double e = expected.get(exp_index);
      const double g = out.get(out_index);
      ok = std::abs(g - e) <= rel_tol * std::max(1.0, std::abs(e));
    }
    if (!ok) {
      tally.check(false, fmt::format("{}: element {} is {} expected {}", name, out_index,
                                     out.get(out_index), expected.get(exp_index)));
    }
    return ok;
  };

  std::size_t good = 0;
  switch (c.kind) {
    case Collective::ReduceScatter:
    case Collective::AllReduce: {
      Bytes expected(c.dtype, n);
      const std::size_t base =
          c.kind == Collective::ReduceScatter ? static_cast<std::size_t>(me) * n : 0;
      for (std::size_t i = 0; i < n; ++i)
        expected.set(i, reduce(inputs, base + i, c.dtype, c.op));
      const std::size_t out_base = c.kind == Collective::ReduceScatter && c.in_place ? base : 0;
      for (std::size_t i = 0; i < n; ++i) good += compare(out_base + i, expected, i);
      break;
    }
    case Collective::AllGather:
      for (std::size_t q = 0; q < w; ++q) {
        for (std::size_t i = 0; i < n; ++i) good += compare(q * n + i, inputs[q], i);
      }
      break;
    case Collective::Broadcast:
      for (std::size_t i = 0; i < n; ++i)
        good += compare(i, inputs[static_cast<std::size_t>(c.root)], i);
      break;
    case Collective::AllToAll:
      // Block q is block `me` of rank q's input.
      for (std::size_t q = 0; q < w; ++q) {
        for (std::size_t i = 0; i < n; ++i)
          good += compare(q * n + i, inputs[q], static_cast<std::size_t>(me) * n + i);
      }
      break;
    case Collective::Barrier: break;
  }
  tally.count(good);
}

}  // namespace zero::test
