// zero_engine_*: one rank's engine behind the C ABI (zero/zero_c.h).
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zero/base/shape.h"
#include "zero/c/handles.h"
#include "zero/c/status.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/comm/inproc_comm.h"

namespace {

using zero::c_abi::ArgumentError;
using zero::c_abi::CallbackError;
using zero::c_abi::copy_out;
using zero::c_abi::guarded;

zero::DType model_dtype_of(int dtype, std::size_t index) {
  switch (dtype) {
    case ZERO_DTYPE_F32: return zero::DType::F32;
    case ZERO_DTYPE_F16: return zero::DType::F16;
    case ZERO_DTYPE_BF16: return zero::DType::BF16;
    default: break;
  }
  throw ArgumentError(
      fmt::format("specs[{}].dtype is {}; expected ZERO_DTYPE_F32 (0), ZERO_DTYPE_F16 (1) or "
                  "ZERO_DTYPE_BF16 (2)",
                  index, dtype));
}

std::vector<zero::ParamSpec> specs_of(const zero_param_spec* specs, std::size_t n) {
  ZERO_C_REQUIRE(specs != nullptr || n == 0, "specs is null but n is {}", n);
  std::vector<zero::ParamSpec> params;
  params.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const zero_param_spec& s = specs[i];
    ZERO_C_REQUIRE(s.name != nullptr, "specs[{}].name is null", i);
    ZERO_C_REQUIRE(s.shape != nullptr || s.ndim == 0,
                   "specs[{}] ('{}'): shape is null but ndim is {}", i, s.name, s.ndim);
    ZERO_C_REQUIRE(s.tied_names != nullptr || s.n_tied == 0,
                   "specs[{}] ('{}'): tied_names is null but n_tied is {}", i, s.name, s.n_tied);
    zero::ParamSpec p;
    p.name = s.name;
    p.shape.assign(s.shape, s.shape + s.ndim);
    p.dtype = model_dtype_of(s.dtype, i);
    p.group = s.group;
    p.unit = s.unit;
    p.trainable = s.trainable != 0;
    for (std::size_t t = 0; t < s.n_tied; ++t) {
      ZERO_C_REQUIRE(s.tied_names[t] != nullptr, "specs[{}] ('{}'): tied_names[{}] is null", i,
                     s.name, t);
      p.tied_names.emplace_back(s.tied_names[t]);
    }
    params.push_back(std::move(p));
  }
  return params;
}

zero::EngineOptions options_of(const zero_engine_options* o) {
  zero::EngineOptions options;
  if (o == nullptr) return options;
  ZERO_C_REQUIRE(o->groups != nullptr || o->n_groups == 0,
                 "options->groups is null but n_groups is {}", o->n_groups);
  for (std::size_t g = 0; g < o->n_groups; ++g) {
    zero::ParamGroupOptions group;
    if (!std::isnan(o->groups[g].lr)) group.lr = o->groups[g].lr;
    if (!std::isnan(o->groups[g].weight_decay)) group.weight_decay = o->groups[g].weight_decay;
    options.groups.push_back(group);
  }
  ZERO_C_REQUIRE(o->kernel_threads >= 0,
                 "options->kernel_threads is {}; expected 0 (every core) "
                 "or more",
                 o->kernel_threads);
  options.kernel_threads = o->kernel_threads;
  if (o->kernel_isa != nullptr) options.kernel_isa = o->kernel_isa;
  return options;
}

struct DeviceRequest {
  std::string kind = "cpu";  // make_device's kind
  int ordinal = -1;          // DeviceOptions::cuda_ordinal
};

// options->device: null, "cpu", "cuda" or "cuda:N".
DeviceRequest device_of(const zero_engine_options* o) {
  DeviceRequest r;
  if (o == nullptr || o->device == nullptr) return r;
  const std::string_view d = o->device;
  if (d == "cpu" || d == "cuda") {
    r.kind = d;
    return r;
  }
  int ordinal = -1;
  bool ok = d.starts_with("cuda:") && d.size() > 5;
  if (ok) {
    const auto [end, ec] = std::from_chars(d.data() + 5, d.data() + d.size(), ordinal);
    ok = ec == std::errc() && end == d.data() + d.size() && ordinal >= 0;
  }
  ZERO_C_REQUIRE(ok, "options->device is '{}'; expected \"cpu\", \"cuda\" or \"cuda:N\" (N a GPU ordinal)",
                 d);
  r.kind = "cuda";
  r.ordinal = ordinal;
  return r;
}

// `config` is JSON text when its first non-blank character is '{', else a path.
zero::config::DsConfig load_config(const char* config, int world_size) {
  const zero::config::Supplied supplied{.world_size = world_size, .values = {}};
  const char* p = config;
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') ++p;
  if (*p == '{') return zero::config::load_config_string(config, supplied);
  return zero::config::load_config_file(config, supplied);
}

zero::Engine& checked(zero_engine* engine) {
  ZERO_C_REQUIRE(engine != nullptr && engine->engine != nullptr, "engine is null");
  return *engine->engine;
}

const zero::Engine& checked(const zero_engine* engine) {
  ZERO_C_REQUIRE(engine != nullptr && engine->engine != nullptr, "engine is null");
  return *engine->engine;
}

void check_param(const zero::Engine& engine, std::size_t param) {
  ZERO_C_REQUIRE(param < engine.num_params(), "parameter {} does not exist (the engine has {})",
                 param, engine.num_params());
}

// The folder load_checkpoint(dir, tag) read: <dir>/<tag>, tag defaulting to what <dir>/latest
// names; <dir> itself when it is a tag folder (no `latest`).
std::string tag_folder(const char* dir, const char* tag) {
  const std::filesystem::path d(dir);
  if (tag != nullptr && *tag != '\0') return (d / tag).string();
  if (!std::filesystem::exists(d / "latest")) return d.string();
  return (d / zero::ckpt::read_latest(dir)).string();
}

}  // namespace

extern "C" {

int zero_engine_create(const char* config, zero_comm* comm, const zero_param_spec* specs, size_t n,
                       const zero_engine_options* options, zero_init_fn init, void* user,
                       zero_engine** out) {
  return guarded("zero_engine_create", [&] {
    ZERO_C_REQUIRE(out != nullptr, "out is null");
    ZERO_C_REQUIRE(config != nullptr, "config is null");
    ZERO_C_REQUIRE(init != nullptr, "init is null");
    ZERO_C_REQUIRE(comm == nullptr || comm->comm != nullptr, "comm was destroyed");
    const std::vector<zero::ParamSpec> params = specs_of(specs, n);
    const zero::EngineOptions engine_options = options_of(options);

    auto handle = std::make_unique<zero_engine>();
    zero::Communicator* c = comm != nullptr ? comm->comm.get() : nullptr;
    if (c == nullptr) {
      zero::InProcWorld world(1);
      handle->own_comm = world.comm(0);
      c = handle->own_comm.get();
    }
    handle->config = std::make_unique<zero::config::DsConfig>(load_config(config, c->size()));
    const DeviceRequest where = device_of(options);
    zero::DeviceOptions device_options;
    device_options.cuda_ordinal = where.ordinal;
    handle->device = zero::make_device(where.kind, c->rank(), device_options);
    zero::EngineOptions placed_options = engine_options;
    zero::Communicator* engine_comm = c;
    if (handle->device->gpu_ordinal() >= 0) {
      handle->device_comm = zero::make_gpu_communicator(*c, *handle->device);
      placed_options.control_comm = c;
      engine_comm = handle->device_comm.get();
      // The topology only where it can matter (make_device_nodes): a launcher's local world that
      // zero cannot use must not stop a run that NCCL alone serves.
      const auto& z = handle->config->zero_optimization;
      const bool qgz = z.stage == 3 && z.zero_quantized_gradients;
      if (qgz || zero::simulated_nodes_requested()) {
        handle->nodes = zero::make_device_nodes(
            *handle->device_comm, *handle->device, *c,
            zero::resolve_node_topology(c->size(), std::nullopt), qgz);
      }
      if (handle->nodes) engine_comm = handle->nodes.get();
    } else {
      handle->nodes = zero::HierarchicalComm::create(
          *c, zero::resolve_node_topology(c->size(), std::nullopt));
      engine_comm = handle->nodes.get();
    }
    const zero::InitFn init_fn = [&](std::size_t index, std::span<float> values) {
      const int rc = init(user, index, values.data(), values.size());
      if (rc != 0) {
        throw CallbackError(fmt::format("the init callback returned {} for parameter {} ('{}')", rc,
                                        index, params[index].name));
      }
    };
    handle->engine =
        zero::Engine::create(*handle->config, *engine_comm, *handle->device, params, init_fn,
                             placed_options);
    handle->num_groups = std::max<std::size_t>(engine_options.groups.size(), 1);
    for (const zero::ParamSpec& p : params)
      handle->num_groups = std::max(handle->num_groups, static_cast<std::size_t>(p.group) + 1);
    *out = handle.release();
  });
}

int zero_engine_destroy(zero_engine* engine) {
  delete engine;  // engine and device destructors never throw (STYLE.md, Errors)
  return ZERO_OK;
}

int zero_engine_info_get(const zero_engine* engine, zero_engine_info* info) {
  return guarded("zero_engine_info_get", [&] {
    const zero::Engine& e = checked(engine);
    ZERO_C_REQUIRE(info != nullptr, "info is null");
    const zero::config::DsConfig& config = *engine->config;
    zero_engine_info i{};
    i.stage = e.stage();
    i.rank = e.rank();
    i.world_size = e.world_size();
    i.dtype = zero::c_abi::c_dtype_of(config.model_dtype);
    i.train_batch_size = config.train_batch_size.value_or(0);
    i.train_micro_batch_size_per_gpu = config.train_micro_batch_size_per_gpu.value_or(0);
    i.gradient_accumulation_steps = e.gradient_accumulation_steps();
    i.num_params = e.num_params();
    i.num_units = e.num_units();
    i.num_groups = engine->num_groups;
    i.gradient_clipping = config.gradient_clipping > 0 ? config.gradient_clipping : 0;
    *info = i;
  });
}

int zero_engine_gather(zero_engine* engine, int unit) {
  return guarded("zero_engine_gather", [&] { checked(engine).gather(unit); });
}

int zero_engine_gather_on_stream(zero_engine* engine, int unit, void* stream) {
  return guarded("zero_engine_gather_on_stream",
                 [&] { checked(engine).gather_on_stream(unit, stream); });
}

int zero_engine_release(zero_engine* engine, int unit) {
  return guarded("zero_engine_release", [&] { checked(engine).release(unit); });
}

int zero_engine_release_kept(zero_engine* engine, int unit, int* kept) {
  return guarded("zero_engine_release_kept", [&] {
    const bool still = checked(engine).release(unit);
    if (kept != nullptr) *kept = still ? 1 : 0;
  });
}

int zero_engine_unit_persistent(const zero_engine* engine, int unit, int* persistent) {
  return guarded("zero_engine_unit_persistent", [&] {
    ZERO_C_REQUIRE(persistent != nullptr, "persistent must not be null");
    *persistent = checked(engine).unit_persistent(unit) ? 1 : 0;
  });
}

int zero_engine_param(zero_engine* engine, size_t param, const void** data, size_t* bytes) {
  return guarded("zero_engine_param", [&] {
    zero::Engine& e = checked(engine);
    ZERO_C_REQUIRE(data != nullptr && bytes != nullptr, "data and bytes must not be null");
    check_param(e, param);
    const std::span<const std::byte> p = e.param(param);
    *data = p.data();
    *bytes = p.size();
  });
}

int zero_engine_backward_scale(zero_engine* engine, double* scale) {
  return guarded("zero_engine_backward_scale", [&] {
    const zero::Engine& e = checked(engine);
    ZERO_C_REQUIRE(scale != nullptr, "scale is null");
    *scale = e.backward_scale();
  });
}

int zero_engine_grad(zero_engine* engine, size_t param, void** data, size_t* bytes) {
  return guarded("zero_engine_grad", [&] {
    zero::Engine& e = checked(engine);
    ZERO_C_REQUIRE(data != nullptr && bytes != nullptr, "data and bytes must not be null");
    check_param(e, param);
    const std::span<std::byte> g = e.grad(param);
    *data = g.data();
    *bytes = g.size();
  });
}

int zero_engine_grad_ready(zero_engine* engine, size_t param) {
  return guarded("zero_engine_grad_ready", [&] {
    zero::Engine& e = checked(engine);
    check_param(e, param);
    e.grad_ready(param);
  });
}

namespace {

// zero_engine_grad, the caller's gradient copied into the slot (on `stream`, through the device),
// and zero_engine_grad_ready: the body of both one-call copies.
void copy_into_slot(zero_engine* engine, zero::Engine& e, size_t param, const void* data,
                    size_t bytes, void* stream) {
  ZERO_C_REQUIRE(data != nullptr || bytes == 0, "data is null");
  const std::span<std::byte> slot = e.grad(param);
  ZERO_C_REQUIRE(bytes == slot.size(), "parameter {} ('{}'): {} bytes given, its slot holds {}",
                 param, e.spec(param).name, bytes, slot.size());
  engine->device->copy_on_native_stream(slot.data(), data, bytes, stream);
  e.grad_ready(param);
}

}  // namespace

int zero_engine_grad_copy(zero_engine* engine, size_t param, const void* data, size_t bytes) {
  return guarded("zero_engine_grad_copy", [&] {
    zero::Engine& e = checked(engine);
    check_param(e, param);
    ZERO_C_REQUIRE(engine->device->gpu_ordinal() < 0,
                   "zero_engine_grad_copy takes host memory, but this engine is on GPU {}: use "
                   "zero_engine_grad_copy_on_stream, or zero_engine_grad and zero_engine_grad_ready",
                   engine->device->gpu_ordinal());
    copy_into_slot(engine, e, param, data, bytes, nullptr);
  });
}

int zero_engine_grad_lend(zero_engine* engine, size_t param, void* data, size_t bytes, int* lent) {
  return guarded("zero_engine_grad_lend", [&] {
    zero::Engine& e = checked(engine);
    check_param(e, param);
    ZERO_C_REQUIRE(lent != nullptr, "lent must not be null");
    ZERO_C_REQUIRE(engine->device->gpu_ordinal() < 0,
                   "zero_engine_grad_lend takes host memory, but this engine is on GPU {}: use "
                   "zero_engine_grad_copy_on_stream",
                   engine->device->gpu_ordinal());
    const zero::ParamSpec& spec = e.spec(param);
    const std::size_t want = zero::numel_of(spec.shape) * zero::dtype_size(spec.dtype);
    ZERO_C_REQUIRE(bytes == want, "parameter {} ('{}'): {} bytes given, its gradient holds {}",
                   param, spec.name, bytes, want);
    ZERO_C_REQUIRE(data != nullptr || bytes == 0, "data is null");
    *lent = 0;
    if (bytes > 0 && e.grad_in_place(param, static_cast<std::byte*>(data))) {
      *lent = 1;
      return;
    }
    copy_into_slot(engine, e, param, data, bytes, nullptr);
  });
}

int zero_engine_grad_copy_on_stream(zero_engine* engine, size_t param, const void* data,
                                    size_t bytes, void* stream) {
  return guarded("zero_engine_grad_copy_on_stream", [&] {
    zero::Engine& e = checked(engine);
    check_param(e, param);
    copy_into_slot(engine, e, param, data, bytes, stream);
  });
}

int zero_engine_step(zero_engine* engine, zero_step_result* result) {
  return guarded("zero_engine_step", [&] {
    const zero::StepResult r = checked(engine).step();
    if (result == nullptr) return;
    result->boundary = r.boundary ? 1 : 0;
    result->skipped = r.skipped ? 1 : 0;
    result->global_steps = r.global_steps;
    result->skipped_steps = r.skipped_steps;
    result->lr = r.lr;
    result->grad_norm = r.grad_norm;
    result->loss_scale = r.loss_scale;
  });
}

int zero_engine_gather_master(zero_engine* engine, size_t param, float* out, size_t numel) {
  return guarded("zero_engine_gather_master", [&] {
    zero::Engine& e = checked(engine);
    ZERO_C_REQUIRE(out != nullptr || numel == 0, "out is null");
    check_param(e, param);
    const std::vector<float> master = e.gather_master(param);
    ZERO_C_REQUIRE(master.size() == numel, "parameter {} ('{}') has {} elements, but numel is {}",
                   param, e.spec(param).name, master.size(), numel);
    if (numel > 0) std::memcpy(out, master.data(), numel * sizeof(float));
  });
}

int zero_engine_set_param(zero_engine* engine, size_t param, const float* values, size_t numel,
                          int root) {
  return guarded("zero_engine_set_param", [&] {
    zero::Engine& e = checked(engine);
    check_param(e, param);
    ZERO_C_REQUIRE(root >= 0 && root < e.world_size(), "root {} is not a rank (the world has {})",
                   root, e.world_size());
    if (e.rank() == root) {
      ZERO_C_REQUIRE(values != nullptr || numel == 0, "values is null on the root rank {}", root);
      const std::uint64_t want = zero::numel_of(e.spec(param).shape);
      ZERO_C_REQUIRE(numel == want, "parameter {} ('{}') has {} elements, but numel is {}", param,
                     e.spec(param).name, want, numel);
    }
    e.set_param(param, std::span<const float>(values, e.rank() == root ? numel : 0), root);
  });
}

int zero_engine_lr(const zero_engine* engine, int group, double* lr) {
  return guarded("zero_engine_lr", [&] {
    ZERO_C_REQUIRE(lr != nullptr, "lr is null");
    *lr = checked(engine).current_lr(group);
  });
}

int zero_engine_set_lr(zero_engine* engine, int group, double lr) {
  return guarded("zero_engine_set_lr", [&] { checked(engine).set_lr(group, lr); });
}

int zero_engine_set_accumulation_boundary(zero_engine* engine, int boundary) {
  return guarded("zero_engine_set_accumulation_boundary", [&] {
    ZERO_CHECK(boundary >= -1 && boundary <= 1,
               "zero_engine_set_accumulation_boundary: boundary {} is not -1, 0 or 1", boundary);
    if (boundary < 0) {
      checked(engine).clear_accumulation_boundary();
    } else {
      checked(engine).set_accumulation_boundary(boundary == 1);
    }
  });
}

int zero_engine_set_step_in_backward(zero_engine* engine, int on, int* begun) {
  return guarded("zero_engine_set_step_in_backward", [&] {
    ZERO_CHECK(on == 0 || on == 1, "zero_engine_set_step_in_backward: on {} is not 0 or 1", on);
    zero::Engine& e = checked(engine);
    if (begun != nullptr) *begun = e.step_begun_in_backward() ? 1 : 0;
    e.set_step_in_backward(on == 1);
  });
}

int zero_engine_global_steps(const zero_engine* engine, int64_t* steps) {
  return guarded("zero_engine_global_steps", [&] {
    ZERO_C_REQUIRE(steps != nullptr, "steps is null");
    *steps = checked(engine).global_steps();
  });
}

int zero_engine_loss_scale(const zero_engine* engine, double* scale) {
  return guarded("zero_engine_loss_scale", [&] {
    ZERO_C_REQUIRE(scale != nullptr, "scale is null");
    *scale = checked(engine).loss_scale();
  });
}

int zero_engine_save_checkpoint(zero_engine* engine, const char* dir, const char* tag,
                                const char* client_state_json) {
  return guarded("zero_engine_save_checkpoint", [&] {
    zero::Engine& e = checked(engine);
    ZERO_C_REQUIRE(dir != nullptr, "dir is null");
    nlohmann::json client_state;
    if (client_state_json != nullptr) {
      client_state = nlohmann::json::parse(client_state_json, nullptr, /*allow_exceptions=*/false);
      ZERO_C_REQUIRE(!client_state.is_discarded(), "client_state_json is not valid JSON: {:.80}",
                     client_state_json);
    }
    const std::string t =
        tag != nullptr ? std::string(tag) : fmt::format("global_step{}", e.global_steps());
    e.save_checkpoint(dir, t, client_state);
  });
}

int zero_engine_load_checkpoint(zero_engine* engine, const char* dir, const char* tag,
                                char** client_state_json, char** path) {
  return guarded("zero_engine_load_checkpoint", [&] {
    zero::Engine& e = checked(engine);
    ZERO_C_REQUIRE(dir != nullptr, "dir is null");
    const nlohmann::json client_state = e.load_checkpoint(dir, tag != nullptr ? tag : "");
    std::unique_ptr<char, decltype(&zero_free)> state(nullptr, &zero_free);
    if (client_state_json != nullptr) state.reset(copy_out(client_state.dump()));
    if (path != nullptr) *path = copy_out(tag_folder(dir, tag));
    if (client_state_json != nullptr) *client_state_json = state.release();
  });
}

int zero_engine_config_warnings_json(const zero_engine* engine, char** json) {
  return guarded("zero_engine_config_warnings_json", [&] {
    ZERO_C_REQUIRE(json != nullptr, "json is null");
    ZERO_C_REQUIRE(engine != nullptr && engine->config != nullptr, "engine is null");
    nlohmann::json out = nlohmann::json::array();
    for (const zero::config::Finding& f : engine->config->findings) {
      if (f.severity != zero::config::Severity::Warning) continue;
      out.push_back({{"path", f.path}, {"message", f.message}});
    }
    if (engine->engine != nullptr) {
      for (const std::string& note : engine->engine->notes()) {
        out.push_back({{"path", ""}, {"message", note}});
      }
    }
    *json = copy_out(out.dump());
  });
}

int zero_engine_memory_json(const zero_engine* engine, char** json) {
  return guarded("zero_engine_memory_json", [&] {
    ZERO_C_REQUIRE(json != nullptr, "json is null");
    const zero::MemorySnapshot m = checked(engine).memory();
    nlohmann::json kinds = nlohmann::json::object();
    for (std::size_t k = 0; k < zero::kNumMemoryKinds; ++k) {
      const auto kind = static_cast<zero::MemoryKind>(k);
      const zero::MemoryUsage& total = m.total(kind);
      nlohmann::json tags = nlohmann::json::object();
      for (std::size_t t = 0; t < zero::kNumMemoryTags; ++t) {
        const auto tag = static_cast<zero::MemoryTag>(t);
        const zero::MemoryUsage& u = m.at(kind, tag);
        if (u.peak_bytes == 0) continue;
        tags[std::string(zero::memory_tag_name(tag))] = {{"bytes", u.current_bytes},
                                                         {"peak", u.peak_bytes}};
      }
      kinds[std::string(zero::memory_kind_name(kind))] = {
          {"bytes", total.current_bytes}, {"peak", total.peak_bytes}, {"tags", std::move(tags)}};
    }
    *json = copy_out(nlohmann::json{{"rank", m.rank}, {"kinds", std::move(kinds)}}.dump());
  });
}

int zero_engine_timings_json(const zero_engine* engine, char** json) {
  return guarded("zero_engine_timings_json", [&] {
    ZERO_C_REQUIRE(json != nullptr, "json is null");
    const zero::EngineTimings t = checked(engine).timings();
    nlohmann::json j = {{"pack_s", t.pack_s},
                        {"reduce_wait_s", t.reduce_wait_s},
                        {"unpack_s", t.unpack_s},
                        {"norm_s", t.norm_s},
                        {"optimizer_s", t.optimizer_s},
                        {"all_gather_s", t.all_gather_s},
                        {"gather_s", t.gather_s},
                        {"gather_wait_s", t.gather_wait_s},
                        {"buckets", t.buckets},
                        {"units_alone", t.units_alone},
                        {"units_fused", t.units_fused},
                        {"units_stepped_in_backward", t.units_stepped_in_backward},
                        {"step_in_backward_s", t.step_in_backward_s},
                        {"gathers", t.gathers},
                        {"prefetches", t.prefetches},
                        {"gathered_elems", t.gathered_elems},
                        {"secondary_gathers", t.secondary_gathers},
                        {"pushed_bytes", t.pushed_bytes},
                        {"shared_model_bytes", t.shared_model_bytes},
                        {"landings", t.landings},
                        {"landed_bytes", t.landed_bytes},
                        {"land_s", t.land_s},
                        {"uploads", t.uploads},
                        {"uploaded_bytes", t.uploaded_bytes},
                        {"upload_wait_s", t.upload_wait_s}};
    if (engine->nodes) {
      const zero::NodeTraffic now = engine->nodes->traffic();
      j["intra_node_bytes"] = now.intra_bytes - engine->traffic_base.intra_bytes;
      j["inter_node_bytes"] = now.inter_bytes - engine->traffic_base.inter_bytes;
    }
    *json = copy_out(j.dump());
  });
}

int zero_engine_reset_timings(zero_engine* engine) {
  return guarded("zero_engine_reset_timings", [&] {
    checked(engine).reset_timings();
    if (engine->nodes) engine->traffic_base = engine->nodes->traffic();
  });
}

}  // extern "C"
