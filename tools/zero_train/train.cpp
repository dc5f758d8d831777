#include "tools/zero_train/train.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <span>

#include "models/mlp.h"
#include "models/mlp_cuda.h"
#include "zero/base/error.h"
#include "zero/base/timer.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/comm/communicator.h"
#include "zero/comm/hierarchical_comm.h"
#include "zero/comm/node_topology.h"
#include "zero/device/device.h"
#include "zero/engine.h"
#include "zero/estimate/from_config.h"
#include "zero/io/safetensors.h"

namespace zero::train {

using models::Batch;
using models::MlpParam;
using models::MlpShape;
using models::TeacherStudentData;

namespace {

using Clock = std::chrono::steady_clock;

// A MemorySnapshot as doubles (exact below 2^53 bytes), so ranks in other processes can send it.
constexpr std::size_t kPackedSnapshot = kNumMemoryKinds * kNumMemoryTags * 4 + kNumMemoryKinds * 4;

void pack_usage(const MemoryUsage& u, double*& out) {
  *out++ = static_cast<double>(u.current_bytes);
  *out++ = static_cast<double>(u.peak_bytes);
  *out++ = static_cast<double>(u.live_allocations);
  *out++ = static_cast<double>(u.total_allocations);
}

void unpack_usage(MemoryUsage& u, const double*& in) {
  u.current_bytes = static_cast<std::size_t>(*in++);
  u.peak_bytes = static_cast<std::size_t>(*in++);
  u.live_allocations = static_cast<std::size_t>(*in++);
  u.total_allocations = static_cast<std::size_t>(*in++);
}

// Collective: every rank's snapshot, in rank order (meaningful on every rank).
std::vector<MemorySnapshot> gather_snapshots(Communicator& comm, const MemorySnapshot& mine) {
  std::vector<double> send(kPackedSnapshot);
  double* out = send.data();
  for (const auto& kind : mine.by_kind_tag) {
    for (const MemoryUsage& u : kind) pack_usage(u, out);
  }
  for (const MemoryUsage& u : mine.by_kind) pack_usage(u, out);
  ZERO_ASSERT(out == send.data() + send.size());

  std::vector<double> all(send.size() * static_cast<std::size_t>(comm.size()));
  comm.all_gather(send.data(), all.data(), send.size(), DType::F64).wait();

  std::vector<MemorySnapshot> snapshots(static_cast<std::size_t>(comm.size()));
  for (std::size_t r = 0; r < snapshots.size(); ++r) {
    MemorySnapshot& s = snapshots[r];
    s.rank = static_cast<int>(r);
    const double* in = all.data() + r * send.size();
    for (auto& kind : s.by_kind_tag) {
      for (MemoryUsage& u : kind) unpack_usage(u, in);
    }
    for (MemoryUsage& u : s.by_kind) unpack_usage(u, in);
  }
  return snapshots;
}

std::vector<std::int64_t> to_int64(const std::vector<std::size_t>& shape) {
  return {shape.begin(), shape.end()};
}

}  // namespace

std::optional<EstimateInput> estimate_input_for(const config::DsConfig& config,
                                                std::uint64_t params, std::uint64_t largest_param,
                                                int world_size) {
  EstimateInput in;
  in.params = params;
  in.largest_param = largest_param;
  in.world_size = static_cast<std::uint64_t>(world_size);
  if (!apply_config_to_estimate(config, in)) return std::nullopt;
  return in;
}

MicroShare micro_share(std::int64_t global_batch, int world, int rank, std::int64_t accumulation,
                       std::int64_t k) {
  const auto B = static_cast<std::uint64_t>(global_batch);
  const auto W = static_cast<std::uint64_t>(world);
  const auto r = static_cast<std::uint64_t>(rank);
  const auto A = static_cast<std::uint64_t>(accumulation);
  const auto u = static_cast<std::uint64_t>(k);
  const std::uint64_t rank_first = r * B / W;
  const std::uint64_t rank_rows = (r + 1) * B / W - rank_first;
  MicroShare s;
  s.first = rank_first + u * rank_rows / A;
  s.rows = static_cast<std::size_t>((u + 1) * rank_rows / A - u * rank_rows / A);
  s.weight = static_cast<double>(s.rows) * static_cast<double>(W * A) / static_cast<double>(B);
  return s;
}

void train_rank(const TrainOptions& options, const config::DsConfig& config, int threads,
                Communicator& comm, TrainObserver* observer) {
  const MlpShape& shape = options.model;
  const std::vector<MlpParam> mlp = models::mlp_params(shape);
  const std::size_t num_params = mlp.size();
  const DType dtype = config.model_dtype;

  std::vector<ParamSpec> specs;
  std::uint64_t total_params = 0, largest_param = 0;
  for (std::size_t i = 0; i < num_params; ++i) {
    // Weight and bias of layer k form unit k: stage 3 gathers a layer at a time.
    specs.push_back({.name = mlp[i].name,
                     .shape = to_int64(mlp[i].shape),
                     .dtype = dtype,
                     .group = 0,
                     .unit = static_cast<int>(i / 2)});
    total_params += mlp[i].numel();
    largest_param = std::max<std::uint64_t>(largest_param, mlp[i].numel());
  }

  // The device outlives the engine (Engine::create's REQUIRES).
  DeviceOptions device_options;
  device_options.device_budget_bytes = options.memory_budget;
  // "auto": ZERO_DEVICE, else CUDA when a GPU is visible (make_device), now that the GPU tests
  // have passed on an H100 (docs/gpu-status.md).
  const std::unique_ptr<Device> device = make_device(options.device, comm.rank(), device_options);
  EngineOptions engine_options;
  engine_options.kernel_threads = threads;
  // On a GPU the engine's collectives go through NCCL, or, for in-process ranks that share one
  // GPU (which NCCL refuses), DeviceInProcComm; `comm` carries the host-side ones. Over those, two
  // levels where a simulated topology or qgZ asks for them (make_device_nodes), counted; otherwise
  // NCCL follows its own topology and nothing is counted.
  // On the CPU the engine's collectives go through a HierarchicalComm: two levels over several
  // nodes, on one level the world's own collectives, counted either way.
  const NodeTopology topology = resolve_node_topology(comm.size(), options.ranks_per_node);
  std::unique_ptr<Communicator> gpu_comm;
  std::unique_ptr<HierarchicalComm> nodes;
  if (device->gpu_ordinal() >= 0) {
    gpu_comm = make_gpu_communicator(comm, *device);
    engine_options.control_comm = &comm;
    const auto& z = config.zero_optimization;
    nodes = make_device_nodes(*gpu_comm, *device, comm, topology,
                              z.stage == 3 && z.zero_quantized_gradients);
  } else {
    nodes = HierarchicalComm::create(comm, topology);
  }
  Communicator& engine_comm = nodes ? static_cast<Communicator&>(*nodes) : *gpu_comm;
  const InitFn init = [&](std::size_t index, std::span<float> out) {
    models::init_param(shape, index, options.seed, /*stream=*/0, out);
  };
  const std::unique_ptr<Engine> engine =
      Engine::create(config, engine_comm, *device, specs, init, engine_options);

  const int rank = comm.rank();
  const int world = comm.size();
  ZERO_CHECK(config.train_micro_batch_size_per_gpu && config.gradient_accumulation_steps,
             "zero-train: the config's batch sizes are unresolved after Engine::create");
  const std::int64_t micro = *config.train_micro_batch_size_per_gpu;
  const std::int64_t accumulation = *config.gradient_accumulation_steps;
  ZERO_CHECK(engine->gradient_accumulation_steps() == accumulation,
             "zero-train: the engine accumulates {} micro-steps, the config says {}",
             engine->gradient_accumulation_steps(), accumulation);
  // The global batch of step t: micro × accumulation × world from the config, or, when resuming
  // a zero-train checkpoint, the batch the saving run used (below), so the data of every step
  // stays a function of (seed, t) at any world size.
  std::int64_t global_batch = micro * accumulation * world;

  // What a later --load reports about the run that saved (the engine does not need it).
  const nlohmann::json client_state = {{"zero_train",
                                        {{"model", shape.to_string()},
                                         {"seed", options.seed},
                                         {"world_size", world},
                                         {"stage", engine->stage()},
                                         {"global_batch", global_batch}}}};
  double checkpoint_seconds = 0;
  std::optional<CheckpointRecord> loaded;
  if (!options.load_dir.empty()) {
    const Clock::time_point load_start = Clock::now();
    const nlohmann::json saved_by = engine->load_checkpoint(options.load_dir);  // collective
    checkpoint_seconds += seconds_since(load_start);
    const std::int64_t configured_batch = global_batch;
    if (saved_by.is_object() && saved_by.contains("zero_train") &&
        saved_by["zero_train"].is_object() && saved_by["zero_train"].contains("global_batch") &&
        saved_by["zero_train"]["global_batch"].is_number_integer() &&
        saved_by["zero_train"]["global_batch"].get<std::int64_t>() > 0) {
      global_batch = saved_by["zero_train"]["global_batch"].get<std::int64_t>();
    }
    if (observer != nullptr) {
      loaded = CheckpointRecord{.saved = false,
                                .dir = options.load_dir,
                                .tag = ckpt::read_latest(options.load_dir),
                                .step = engine->global_steps(),
                                .seconds = checkpoint_seconds,
                                .global_batch = configured_batch};
      // Absent when another embedding saved the checkpoint.
      if (saved_by.is_object() && saved_by.contains("zero_train")) {
        const nlohmann::json& run = saved_by.at("zero_train");
        if (run.is_object() && run.contains("world_size") && run.contains("stage") &&
            run.at("world_size").is_number_integer() && run.at("stage").is_number_integer()) {
          loaded->saved_world_size = run.at("world_size").get<int>();
          loaded->saved_stage = run.at("stage").get<int>();
        }
        if (run.is_object() && run.contains("global_batch") &&
            run.at("global_batch").is_number_integer()) {
          loaded->saved_global_batch = run.at("global_batch").get<std::int64_t>();
        }
      }
    }
  }

  RunSummary summary;
  summary.steps = engine->global_steps();
  std::int64_t last_saved_step = -1;
  // Collective, like the engine's save.
  const auto save = [&]() {
    const std::int64_t step = engine->global_steps();
    const std::string tag = "global_step" + std::to_string(step);  // DeepSpeed's naming
    const Clock::time_point save_start = Clock::now();
    engine->save_checkpoint(options.save_dir, tag, client_state);
    const double seconds = seconds_since(save_start);
    checkpoint_seconds += seconds;
    last_saved_step = step;
    summary.checkpoint_path = (std::filesystem::path(options.save_dir) / tag).string();
    if (observer != nullptr) {
      observer->on_checkpoint(
          {.saved = true, .dir = options.save_dir, .tag = tag, .step = step, .seconds = seconds});
    }
  };

  if (observer != nullptr) {
    RunInfo info;
    info.model = shape.to_string();
    info.params = total_params;
    info.tensors = num_params;
    info.world_size = world;
    info.backend = engine_comm.backend_name();
    info.nodes = topology.nodes();
    info.ranks_per_node = topology.ranks_per_node;
    info.threads = threads;
    info.stage = engine->stage();
    info.dtype = std::string(dtype_name(dtype));
    info.optimizer = config.optimizer ? config.optimizer->type : "none";
    info.scheduler = config.scheduler ? config.scheduler->type : "";
    info.micro_batch = micro;
    info.accumulation = accumulation;
    info.global_batch = global_batch;
    info.steps = options.steps;
    info.start_step = engine->global_steps();
    info.seed = options.seed;
    info.steps_per_print = config.steps_per_print.value_or(10);
    observer->on_start(info);
    if (loaded) observer->on_checkpoint(*loaded);
  }

  const TeacherStudentData data(shape, options.seed, threads);
  const int units = static_cast<int>(shape.layers());
  const std::size_t element_bytes = dtype_size(dtype);

  // The model reads the engine's copy of the weights and writes gradients straight into the
  // engine's slots, in the model dtype: no copy of either on the trainer's side. On a GPU the
  // model runs there, on the engine's GPU memory (models::CudaMlp). A device whose memory host
  // code cannot reach and that is no GPU (the tests' stand-in for one) gets the CPU model with
  // copies: weights to host memory (staged_weights) before forward, gradients from host memory
  // (staged_grads) into the engine's slots as each layer hands them over.
  std::unique_ptr<models::CudaMlp> gpu_model;
  if (device->gpu_ordinal() >= 0) {
    gpu_model = std::make_unique<models::CudaMlp>(shape, device->gpu_ordinal());
  }
  const bool staged = !device->host_addressable() && !gpu_model;
  ZERO_CHECK(!options.regather || engine->stage() == 3,
             "zero-train: --regather releases and gathers stage 3's units, but the config's "
             "zero_optimization.stage is {}: set it to 3, or drop --regather",
             engine->stage());
  ZERO_CHECK(!options.regather || !gpu_model,
             "zero-train: --regather runs on the CPU model only, and this rank's model is on GPU "
             "{}: use --device cpu, or drop --regather",
             device->gpu_ordinal());
  std::vector<std::vector<std::byte>> staged_weights(staged ? num_params : 0);
  std::vector<std::vector<std::byte>> staged_grads(staged ? num_params : 0);
  std::vector<models::ParamView> weights(num_params);
  double handover_seconds = 0;
  auto engine_slot = [&](std::size_t i) {
    const std::span<std::byte> slot = engine->grad(i);
    ZERO_CHECK(slot.size() == mlp[i].numel() * element_bytes,
               "zero-train: engine->grad({}) has {} bytes, expected {}", i, slot.size(),
               mlp[i].numel() * element_bytes);
    return slot;
  };
  // Which units this rank holds gathered: all from the gather before forward until their
  // gradients are handed over, except under --regather between a layer's forward and its
  // backward (layer 0, whose weight backward never reads, is not gathered again).
  std::vector<bool> held(static_cast<std::size_t>(units), false);
  // Parameter i's current engine copy as the model reads it (through a host copy when staged).
  auto weight_view = [&](std::size_t i) -> models::ParamView {
    const std::span<const std::byte> p = engine->param(i);
    ZERO_CHECK(p.size() == mlp[i].numel() * element_bytes,
               "zero-train: engine->param({}) has {} bytes, expected {}", i, p.size(),
               mlp[i].numel() * element_bytes);
    if (!staged) return {p, dtype};
    staged_weights[i].resize(p.size());
    device->copy(staged_weights[i].data(), p.data(), p.size());
    return {staged_weights[i], dtype};
  };
  const models::GradSink sink{
      .slot = [&](std::size_t i) -> models::GradView {
        if (!staged) return {engine_slot(i), dtype};
        staged_grads[i].resize(mlp[i].numel() * element_bytes);
        return {staged_grads[i], dtype};
      },
      // Layer u's gradients are written (bias, then weight: the order backward produces them):
      // hand them to the engine and release the unit. Stage 2/3 may reduce a full bucket inside
      // grad_ready(), so this runs from backward as each layer finishes, while the layers below
      // are still to come.
      .on_layer_grads =
          [&](std::size_t u) {
            const Clock::time_point start = Clock::now();
            for (std::size_t i = 2 * u + 2; i-- > 2 * u;) {
              if (staged) {
                const std::span<std::byte> slot = engine_slot(i);
                device->copy(slot.data(), staged_grads[i].data(), slot.size());
              }
              engine->grad_ready(i);
            }
            if (held[u]) engine->release(static_cast<int>(u));
            held[u] = false;
            handover_seconds += seconds_since(start);
          },
      // --regather: a layer goes after its forward (the last one is backward's first, and
      // stays), and comes back when backward reaches it.
      .on_layer_forward = !options.regather ? std::function<void(std::size_t)>{} :
          [&](std::size_t u) {
            if (u + 1 == static_cast<std::size_t>(units)) return;
            const Clock::time_point start = Clock::now();
            engine->release(static_cast<int>(u));
            held[u] = false;
            handover_seconds += seconds_since(start);
          },
      .backward_weight = !options.regather ? std::function<models::ParamView(std::size_t)>{} :
          [&](std::size_t u) {
            const Clock::time_point start = Clock::now();
            engine->gather(static_cast<int>(u));
            held[u] = true;
            const models::ParamView w = weight_view(2 * u);
            handover_seconds += seconds_since(start);
            return w;
          }};

  const Clock::time_point train_start = Clock::now();
  const double seconds_before_training = checkpoint_seconds;
  auto traffic = [&] { return nodes ? nodes->traffic() : NodeTraffic{}; };
  const NodeTraffic traffic_before = traffic();
  engine->reset_timings();
  NodeTraffic save_traffic;  // what periodic saves sent, not training
  std::int64_t trained = 0;
  // The engine's count of optimizer steps: a resumed run continues from the restored one, and
  // the data of step t depends on (seed, t) only, so it sees what an uninterrupted run would.
  while (engine->global_steps() < options.steps) {
    const Clock::time_point step_start = Clock::now();
    const auto step_index = static_cast<std::uint64_t>(engine->global_steps());
    double loss_sum = 0, model_seconds = 0;
    StepResult result;
    for (std::int64_t k = 0; k < accumulation; ++k) {
      const MicroShare share = micro_share(global_batch, world, rank, accumulation, k);
      const Clock::time_point data_start = Clock::now();
      const Batch batch = data.batch(step_index, share.first, share.rows);
      model_seconds += seconds_since(data_start);

      // The MLP needs every layer's weights in backward too, so units stay gathered until their
      // gradients are handed over (with --regather they go after their forward, and backward
      // gathers them again).
      for (int u = 0; u < units; ++u) engine->gather(u);
      held.assign(held.size(), true);
      for (std::size_t i = 0; i < num_params; ++i) weights[i] = weight_view(i);
      if (share.rows > 0) {
        handover_seconds = 0;
        const Clock::time_point model_start = Clock::now();
        const auto loss_scale = static_cast<float>(engine->backward_scale() * share.weight);
        loss_sum += share.weight *
                    (gpu_model ? gpu_model->forward_backward(weights, batch, loss_scale, sink)
                               : models::forward_backward(shape, weights, batch, loss_scale, sink,
                                                          threads));
        model_seconds += seconds_since(model_start) - handover_seconds;
      } else {
        for (int u = units - 1; u >= 0; --u) {
          for (std::size_t i = 2 * static_cast<std::size_t>(u) + 2;
               i-- > 2 * static_cast<std::size_t>(u);) {
            const models::GradView slot = sink.slot(i);
            if (gpu_model) {  // a slot in GPU memory
              const std::vector<std::byte> zeros(slot.bytes.size());
              device->copy(slot.bytes.data(), zeros.data(), zeros.size());
            } else {
              std::fill(slot.bytes.begin(), slot.bytes.end(), std::byte{0});  // +0 in every dtype
            }
          }
          sink.on_layer_grads(static_cast<std::size_t>(u));
        }
      }
      result = engine->step();
      ZERO_CHECK(result.boundary == (k + 1 == accumulation),
                 "zero-train: micro-step {} of {} {} an accumulation boundary", k + 1, accumulation,
                 result.boundary ? "closed" : "did not close");
    }
    const double step_seconds = seconds_since(step_start);

    double loss = loss_sum / static_cast<double>(accumulation);
    comm.all_reduce(&loss, &loss, 1, DType::F64, ReduceOp::Avg).wait();

    if (trained++ == 0) summary.first_loss = loss;
    summary.final_loss = loss;
    summary.steps = result.global_steps;
    summary.skipped_steps = result.skipped_steps;
    if (observer != nullptr) {
      observer->on_step({.step = result.global_steps,
                         .loss = loss,
                         .lr = result.lr,
                         .grad_norm = result.skipped ? std::nan("") : result.grad_norm,
                         .loss_scale = result.loss_scale,
                         .skipped = result.skipped,
                         .step_time_s = step_seconds,
                         .model_time_s = model_seconds});
    }
    if (!options.save_dir.empty() && options.save_every > 0 &&
        result.global_steps % options.save_every == 0) {
      const NodeTraffic at_save = traffic();
      save();
      save_traffic.intra_bytes += traffic().intra_bytes - at_save.intra_bytes;
      save_traffic.inter_bytes += traffic().inter_bytes - at_save.inter_bytes;
    }
  }
  if (nodes) {
    const NodeTraffic after = traffic();
    const double steps_done = static_cast<double>(std::max<std::int64_t>(trained, 1));
    std::array<double, 2> per_step = {
        static_cast<double>(after.intra_bytes - traffic_before.intra_bytes -
                            save_traffic.intra_bytes) /
            steps_done,
        static_cast<double>(after.inter_bytes - traffic_before.inter_bytes -
                            save_traffic.inter_bytes) /
            steps_done};
    comm.all_reduce(per_step.data(), per_step.data(), per_step.size(), DType::F64, ReduceOp::Avg)
        .wait();
    summary.traffic = NodeTraffic{static_cast<std::uint64_t>(std::llround(per_step[0])),
                                  static_cast<std::uint64_t>(std::llround(per_step[1]))};
  }
  // Periodic saves are not training time.
  summary.timings = engine->timings();
  summary.notes = engine->notes();
  summary.train_seconds =
      seconds_since(train_start) - (checkpoint_seconds - seconds_before_training);
  summary.samples_per_s = summary.train_seconds > 0
                              ? static_cast<double>(trained * global_batch) / summary.train_seconds
                              : 0;

  summary.memory = gather_snapshots(comm, engine->memory());
  summary.estimate_input = estimate_input_for(config, total_params, largest_param, world);
  if (summary.estimate_input) summary.estimate = estimate_model_states(*summary.estimate_input);

  if (!options.save_dir.empty() && last_saved_step != engine->global_steps()) save();

  if (!options.dump_params.empty()) {
    io::SafetensorsWriter writer;
    writer.set_metadata("model", shape.to_string());
    writer.set_metadata("seed", std::to_string(options.seed));
    writer.set_metadata("steps", std::to_string(summary.steps));
    for (std::size_t i = 0; i < num_params; ++i) {
      std::vector<float> master = engine->gather_master(i);  // collective
      if (rank == 0) writer.add_f32(mlp[i].name, to_int64(mlp[i].shape), master);
    }
    if (rank == 0) writer.write(options.dump_params);
    summary.dump_path = options.dump_params;
  }

  if (observer != nullptr) observer->on_finish(summary);
}

}  // namespace zero::train
