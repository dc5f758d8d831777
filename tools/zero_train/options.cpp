#include "tools/zero_train/options.h"

#include <fmt/format.h>

#include <charconv>
#include <limits>
#include <string_view>

#include "zero/base/error.h"

namespace zero::train {

const char* const kUsage = R"(usage: zero-train --config FILE [options]

Trains a teacher-student MLP with the ZeRO engine on N ranks, as the ds_config says (stage,
precision, optimizer, LR schedule, batch sizes), and prints loss, lr, gradient norm and loss
scale per optimizer step, then each rank's measured memory next to the ZeRO paper's formula.

options:
  --config FILE               DeepSpeed ds_config.json (required)
  --world-size N              data-parallel ranks (default 1); under --comm mpi it comes from
                              MPI, and a different N is an error
  --comm inproc|mpi           ranks as threads of this process (default), or MPI processes
                              (run under mpirun)
  --ranks-per-node N          ranks per node, as contiguous blocks (default: ZERO_RANKS_PER_NODE,
                              else the launcher's local world, else one node): with several
                              nodes the engine's collectives run in two levels, inside each
                              node and then across nodes, and the summary counts the bytes
                              each rank sends on each level per optimizer step
  --steps K                   optimizer steps, skipped ones included (default 20)
  --seed S                    seeds the initial weights, the teacher and the data (default 0)
  --model mlp:IN,H1,...,OUT   layer widths (default mlp:32,256,256,10)
  --threads T                 kernel threads per rank (default: cores / ranks on this host)
  --device cpu|cuda|auto      where each rank's engine and model run (default auto: ZERO_DEVICE
                              if set, else cuda when a GPU is visible, else cpu);
                              cuda: the engine and the MLP (cuBLAS) on GPU rank % visible,
                              NCCL between ranks (in-process ranks that share one GPU: the
                              device's own kernels); without a usable GPU an error before
                              training
  --memory-budget BYTES       per-rank cap on device memory (the ledger's "device" kind); an
                              allocation beyond it is an out-of-memory error naming the tag
  --dump-params FILE          after training, write every parameter's fp32 master value to one
                              safetensors file (names layers.<k>.weight / layers.<k>.bias)
  --save DIR                  after training, save a checkpoint to DIR/global_step<N> (N: the
                              optimizer steps done) and point DIR/latest at it; zero_to_fp32
                              turns it into whole safetensors weights
  --save-every K              with --save: also save every K optimizer steps
  --load DIR                  resume from the checkpoint DIR/latest names (any world size and
                              stage), then train until --steps optimizer steps are done in all
  --regather                  ZeRO stage 3 only: release each layer's unit after its forward
                              and gather it again when backward reaches it, as a module-wise
                              stage 3 does (DeepSpeed, zero.initialize): backward's gathers run
                              again, inside the node under hpZ; the same results bit for bit
                              (default: every unit stays gathered from forward through backward)
  --json                      one JSON object per step, then a summary object
  --quiet                     no per-step output; only the final summary
  --help                      this text

The global batch of optimizer step t (micro x accumulation x ranks rows) depends only on
(seed, t), so runs at different world sizes and stages see the same data, and a run resumed
with --load at step t trains on what an uninterrupted run would have from step t on.
Exit status: 0 trained, 1 runtime or config error, 2 bad usage.
)";

namespace {

template <typename Int>
std::optional<Int> parse_int(std::string_view text) {
  Int value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

}  // namespace

TrainOptions parse_options(std::span<const std::string> args) {
  TrainOptions o;
  bool have_config = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    cli::FlagArg arg(args, i);
    const std::string& flag = arg.name();
    auto positive = [&](std::string_view expected) -> std::int64_t {
      const std::string v = arg.value(expected);
      const auto n = parse_int<std::int64_t>(v);
      if (!n || *n <= 0) throw UsageError(fmt::format("{} {}: expected {}", flag, v, expected));
      return *n;
    };
    constexpr std::int64_t kMaxInt = std::numeric_limits<int>::max();

    if (flag == "--help" || flag == "-h") {
      o.help = true;
      return o;
    } else if (flag == "--config") {
      o.config_path = arg.value("a ds_config.json path");
      if (o.config_path.empty())
        throw UsageError("--config: expected a ds_config.json path, got ''");
      have_config = true;
    } else if (flag == "--world-size") {
      const std::int64_t n = positive("a positive number of ranks");
      if (n > kMaxInt) throw UsageError(fmt::format("--world-size {}: too many ranks", n));
      o.world_size = static_cast<int>(n);
    } else if (flag == "--comm") {
      o.comm = arg.value("inproc or mpi");
      if (o.comm != "inproc" && o.comm != "mpi") {
        throw UsageError(fmt::format("--comm {}: expected inproc or mpi", o.comm));
      }
    } else if (flag == "--ranks-per-node") {
      const std::int64_t n = positive("a positive number of ranks per node");
      if (n > kMaxInt) throw UsageError(fmt::format("--ranks-per-node {}: too many ranks", n));
      o.ranks_per_node = static_cast<int>(n);
    } else if (flag == "--steps") {
      o.steps = positive("a positive number of optimizer steps");
    } else if (flag == "--seed") {
      const std::string v = arg.value("a non-negative integer");
      const auto s = parse_int<std::uint64_t>(v);
      if (!s) throw UsageError(fmt::format("--seed {}: expected a non-negative integer", v));
      o.seed = *s;
    } else if (flag == "--model") {
      const std::string v = arg.value("mlp:IN,H1,...,OUT");
      try {
        o.model = models::MlpShape::parse(v);
      } catch (const Error& e) {
        throw UsageError(fmt::format("--model {}: {}", v, e.what()));
      }
    } else if (flag == "--threads") {
      const std::int64_t n = positive("a positive number of kernel threads per rank");
      if (n > kMaxInt) throw UsageError(fmt::format("--threads {}: too many threads", n));
      o.threads = static_cast<int>(n);
    } else if (flag == "--device") {
      o.device = arg.value("cpu, cuda or auto");
      if (o.device != "cpu" && o.device != "cuda" && o.device != "auto") {
        throw UsageError(fmt::format("--device {}: expected cpu, cuda or auto", o.device));
      }
    } else if (flag == "--memory-budget") {
      o.memory_budget = static_cast<std::size_t>(positive("a positive number of bytes"));
    } else if (flag == "--dump-params") {
      o.dump_params = arg.value("a .safetensors path");
      if (o.dump_params.empty()) {
        throw UsageError("--dump-params: expected a .safetensors path, got ''");
      }
    } else if (flag == "--save" || flag == "--load") {
      std::string& dir = flag == "--save" ? o.save_dir : o.load_dir;
      dir = arg.value("a checkpoint directory");
      if (dir.empty())
        throw UsageError(fmt::format("{}: expected a checkpoint directory, got ''", flag));
    } else if (flag == "--save-every") {
      o.save_every = positive("a positive number of optimizer steps");
    } else if (flag == "--regather") {
      arg.no_value();
      o.regather = true;
    } else if (flag == "--json") {
      arg.no_value();
      o.json = true;
    } else if (flag == "--quiet") {
      arg.no_value();
      o.quiet = true;
    } else if (flag.starts_with("-")) {
      throw UsageError(fmt::format("unknown option '{}' (see zero-train --help)", flag));
    } else {
      throw UsageError(fmt::format(
          "unexpected argument '{}': every option is a --flag (see zero-train --help)", flag));
    }
  }
  if (!have_config) throw UsageError("--config FILE is required (a DeepSpeed ds_config.json)");
  if (o.save_every > 0 && o.save_dir.empty()) {
    throw UsageError(
        fmt::format("--save-every {}: needs --save DIR (where to save)", o.save_every));
  }
  return o;
}

}  // namespace zero::train
