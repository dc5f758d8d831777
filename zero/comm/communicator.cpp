#include "zero/comm/communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <vector>

#include "zero/base/error.h"

namespace zero {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllGather: return "all_gather";
    case Collective::AllReduce: return "all_reduce";
    case Collective::Broadcast: return "broadcast";
    case Collective::Barrier: return "barrier";
    case Collective::AllToAll: return "all_to_all";
  }
  return "?";
}

std::string describe(const CollectiveArgs& a, int world_size) {
  const std::size_t esz = dtype_size(a.dtype);
  const auto world = static_cast<std::size_t>(world_size);
  switch (a.kind) {
    case Collective::ReduceScatter:
    case Collective::AllGather:
    case Collective::AllToAll: {
      const std::string what =
          a.kind == Collective::ReduceScatter
              ? fmt::format("{}, {}", reduce_op_name(a.op), dtype_name(a.dtype))
              : std::string(dtype_name(a.dtype));
      return fmt::format("{}{} ({}) of {} x {} elements, {} bytes", collective_name(a.kind),
                         a.in_place ? " in place" : "", what, world, a.elems,
                         world * a.elems * esz);
    }
    case Collective::AllReduce:
      return fmt::format("all_reduce ({}, {}) of {} elements, {} bytes", reduce_op_name(a.op),
                         dtype_name(a.dtype), a.elems, a.elems * esz);
    case Collective::Broadcast:
      return fmt::format("broadcast ({}, root {}) of {} elements, {} bytes", dtype_name(a.dtype),
                         a.root, a.elems, a.elems * esz);
    case Collective::Barrier: return "barrier";
  }
  return "?";
}

Work Communicator::reduce_scatter(const void* send, void* recv, std::size_t recv_elems, DType dtype,
                                  ReduceOp op, int quantize_bits, QuantizationFeedback* feedback) {
  return start({Collective::ReduceScatter, send, recv, recv_elems, dtype, op, 0, false,
                quantize_bits, feedback});
}

Work Communicator::reduce_scatter_in_place(void* buffer, std::size_t chunk_elems, DType dtype,
                                           ReduceOp op, int quantize_bits,
                                           QuantizationFeedback* feedback) {
  return start({Collective::ReduceScatter, buffer, buffer, chunk_elems, dtype, op, 0, true,
                quantize_bits, feedback});
}

Work Communicator::all_gather(const void* send, void* recv, std::size_t send_elems, DType dtype) {
  return start({Collective::AllGather, send, recv, send_elems, dtype, ReduceOp::Sum, 0, false});
}

Work Communicator::all_gather_in_place(void* buffer, std::size_t chunk_elems, DType dtype) {
  return start({Collective::AllGather, buffer, buffer, chunk_elems, dtype, ReduceOp::Sum, 0, true});
}

Work Communicator::all_reduce(const void* send, void* recv, std::size_t elems, DType dtype,
                              ReduceOp op) {
  return start({Collective::AllReduce, send, recv, elems, dtype, op, 0, send == recv});
}

Work Communicator::broadcast(void* buffer, std::size_t elems, DType dtype, int root) {
  return start({Collective::Broadcast, buffer, buffer, elems, dtype, ReduceOp::Sum, root, true});
}

Work Communicator::all_to_all(const void* send, void* recv, std::size_t elems, DType dtype) {
  return start({Collective::AllToAll, send, recv, elems, dtype, ReduceOp::Sum, 0, false});
}

Work Communicator::barrier() {
  return start({});
}

void Communicator::barrier_now() {
  CollectiveArgs args;
  args.waited = true;
  start(args).wait();
}

void Communicator::all_reduce_now(const void* send, void* recv, std::size_t elems, DType dtype,
                                  ReduceOp op) {
  CollectiveArgs args{Collective::AllReduce, send, recv, elems, dtype, op, 0, send == recv};
  args.waited = true;
  start(args).wait();
}

void Communicator::all_gather_in_place_now(void* buffer, std::size_t chunk_elems, DType dtype) {
  CollectiveArgs args{Collective::AllGather, buffer, buffer, chunk_elems, dtype, ReduceOp::Sum, 0,
                      true};
  args.waited = true;
  start(args).wait();
}

Work Communicator::start(const CollectiveArgs& args) {
  const auto world = static_cast<std::size_t>(size());
  const std::size_t esz = dtype_size(args.dtype);
  const bool chunked = args.kind == Collective::ReduceScatter ||
                       args.kind == Collective::AllGather || args.kind == Collective::AllToAll;
  const std::size_t limit = std::numeric_limits<std::size_t>::max() / esz / (chunked ? world : 1);
  ZERO_CHECK_AS(CommError, args.elems <= limit, "{}: {} elements overflow the byte count",
                collective_name(args.kind), args.elems);
  if (args.kind == Collective::Barrier) return start_impl(args);
  if (args.elems > 0) {
    ZERO_CHECK_AS(CommError, args.send != nullptr && args.recv != nullptr,
                  "{} on rank {}: null buffer for {} elements", collective_name(args.kind), rank(),
                  args.elems);
  }
  if (args.in_place) {
    ZERO_CHECK_AS(CommError, args.send == args.recv, "{}: in place, but send != recv",
                  collective_name(args.kind));
  }
  ZERO_CHECK_AS(CommError, args.kind != Collective::AllToAll || !args.in_place,
                "all_to_all is out of place only");
  ZERO_CHECK_AS(CommError,
                args.quantize_bits == 0 ||
                    (args.kind == Collective::ReduceScatter &&
                     (args.quantize_bits == 4 || args.quantize_bits == 8)),
                "{}: quantize_bits {}: only a reduce_scatter may be quantized, to 4 or 8 bits",
                collective_name(args.kind), args.quantize_bits);
  if (args.feedback != nullptr) {
    ZERO_CHECK_AS(CommError, args.quantize_bits != 0,
                  "{}: error feedback without quantize_bits (nothing is quantized)",
                  collective_name(args.kind));
    ZERO_CHECK_AS(CommError, args.feedback->beta >= 0.0f && args.feedback->beta < 1.0f,
                  "{}: error feedback beta {} is outside [0, 1)", collective_name(args.kind),
                  args.feedback->beta);
  }
  if (args.kind == Collective::Broadcast) {
    ZERO_CHECK_AS(CommError, args.root >= 0 && args.root < size(),
                  "broadcast: root {} out of range for {} ranks", args.root, size());
  }
  return start_impl(args);
}

std::vector<void*> Communicator::exchange_addresses(std::span<void* const> local) {
  ZERO_CHECK_AS(CommError, shares_address_space(),
                "exchange_addresses: the {} backend's ranks do not share an address space",
                backend_name());
  // Addresses travel as 64-bit words; an all-gather copies them bit for bit.
  static_assert(sizeof(void*) == sizeof(double));
  const std::size_t n = local.size();
  std::vector<void*> all(n * static_cast<std::size_t>(size()));
  std::memcpy(all.data() + n * static_cast<std::size_t>(rank()), local.data(), n * sizeof(void*));
  all_gather_in_place(all.data(), n, DType::F64).wait();
  return all;
}

void* Communicator::peer_memory(int q, const void* remote, std::size_t bytes) const {
  (void)bytes;
  return q == rank() || shares_address_space() ? const_cast<void*>(remote) : nullptr;
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  return split_impl(color, key);
}

namespace {

// FNV-1a over the bytes, then a splitmix64 finaliser so that short inputs spread over all bits.
std::uint64_t hash_bytes(std::span<const std::byte> bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull ^ bytes.size();
  for (std::byte b : bytes) {
    h ^= static_cast<std::uint64_t>(b);
    h *= 0x100000001b3ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

// The collectives carry floats, so the hash travels as four 16-bit pieces, each exact in fp64.
constexpr int kPieces = 4;
constexpr double kPieceMax = 65535.0;

std::array<double, kPieces> to_pieces(std::uint64_t h) {
  std::array<double, kPieces> out{};
  for (int i = 0; i < kPieces; ++i) out[i] = static_cast<double>((h >> (16 * i)) & 0xffffu);
  return out;
}

std::uint64_t from_pieces(const double* pieces) {
  std::uint64_t h = 0;
  for (int i = 0; i < kPieces; ++i) h |= static_cast<std::uint64_t>(pieces[i]) << (16 * i);
  return h;
}

std::string format_ranks(const std::vector<int>& ranks) {
  return fmt::format("[{}]", fmt::join(ranks, ", "));
}

}  // namespace

void check_agreement(Communicator& comm, std::string_view what, std::span<const std::byte> value) {
  const std::uint64_t mine = hash_bytes(value);
  const auto pieces = to_pieces(mine);
  // max(p) and max(65535 - p) = 65535 - min(p): every piece agrees iff max + (65535 - min) = 65535.
  std::array<double, 2 * kPieces> extremes{};
  for (int i = 0; i < kPieces; ++i) {
    extremes[i] = pieces[i];
    extremes[kPieces + i] = kPieceMax - pieces[i];
  }
  comm.all_reduce(extremes.data(), extremes.data(), extremes.size(), DType::F64, ReduceOp::Max)
      .wait();
  bool agree = true;
  for (int i = 0; i < kPieces; ++i)
    agree = agree && extremes[i] + extremes[kPieces + i] == kPieceMax;
  if (agree) return;

  std::vector<double> all(static_cast<std::size_t>(comm.size()) * kPieces);
  comm.all_gather(pieces.data(), all.data(), kPieces, DType::F64).wait();
  std::map<std::uint64_t, std::vector<int>> ranks_by_hash;
  for (int r = 0; r < comm.size(); ++r) {
    ranks_by_hash[from_pieces(&all[static_cast<std::size_t>(r) * kPieces])].push_back(r);
  }
  const std::uint64_t reference = from_pieces(&all[0]);
  std::vector<int> differ;
  std::string groups;
  for (const auto& [hash, ranks] : ranks_by_hash) {
    if (hash != reference) differ.insert(differ.end(), ranks.begin(), ranks.end());
    groups += fmt::format("{}ranks {} hash {:016x}", groups.empty() ? "" : "; ",
                          format_ranks(ranks), hash);
  }
  std::sort(differ.begin(), differ.end());
  throw CommError(fmt::format(
      "ranks disagree on {}: ranks {} differ from rank 0 ({} distinct values over {} ranks: {})",
      what, format_ranks(differ), ranks_by_hash.size(), comm.size(), groups));
}

}  // namespace zero
