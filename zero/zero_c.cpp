// The C ABI over zero::Engine: every entry point catches everything, turns it into a status and
// keeps the message for zero_last_error().
#include "zero/zero_c.h"

#include <fmt/format.h>

#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "config/ds_config.h"
#include "zero/base/error.h"
#include "zero/comm/inproc_comm.h"
#include "zero/device/device.h"
#include "zero/engine.h"

struct zero_engine {
  // Declaration order is destruction order reversed: the engine goes first, then what it uses.
  std::unique_ptr<zero::InProcWorld> world;
  std::unique_ptr<zero::Communicator> comm;
  std::unique_ptr<zero::Device> device;
  std::unique_ptr<zero::Engine> engine;
};

namespace {

thread_local std::string last_error;

// A failure of the caller's init callback; carries the status it maps to.
class CallbackError : public zero::Error {
 public:
  using zero::Error::Error;
};

// An argument the C caller got wrong before the engine was reached.
class ArgumentError : public zero::Error {
 public:
  using zero::Error::Error;
};

int fail(int status, std::string message) {
  try {
    last_error = std::move(message);
  } catch (...) {
    last_error.clear();  // out of memory while keeping the message: the status still says it
  }
  return status;
}

// Runs fn; maps what it throws onto a status. ConfigError lists every problem, one per line.
template <typename Fn>
int guarded(const char* function, Fn&& fn) noexcept {
  try {
    fn();
    return ZERO_OK;
  } catch (const CallbackError& e) {
    return fail(ZERO_ERR_CALLBACK, fmt::format("{}: {}", function, e.what()));
  } catch (const ArgumentError& e) {
    return fail(ZERO_ERR_INVALID_ARGUMENT, fmt::format("{}: {}", function, e.what()));
  } catch (const zero::ConfigError& e) {
    return fail(ZERO_ERR_CONFIG, fmt::format("{}: {}", function, e.what()));
  } catch (const zero::IoError& e) {
    return fail(ZERO_ERR_IO, fmt::format("{}: {}", function, e.what()));
  } catch (const zero::CommError& e) {
    return fail(ZERO_ERR_COMM, fmt::format("{}: {}", function, e.what()));
  } catch (const zero::OutOfMemory& e) {
    return fail(ZERO_ERR_OUT_OF_MEMORY, fmt::format("{}: {}", function, e.what()));
  } catch (const zero::CudaError& e) {
    return fail(ZERO_ERR_CUDA, fmt::format("{}: {}", function, e.what()));
  } catch (const std::bad_alloc&) {
    return fail(ZERO_ERR_OUT_OF_MEMORY, fmt::format("{}: out of host memory", function));
  } catch (const std::exception& e) {
    return fail(ZERO_ERR_RUNTIME, fmt::format("{}: {}", function, e.what()));
  } catch (...) {
    return fail(ZERO_ERR_RUNTIME, fmt::format("{}: unknown exception", function));
  }
}

#define ZERO_C_REQUIRE(cond, ...) ZERO_CHECK_AS(ArgumentError, cond, __VA_ARGS__)

zero::DType to_dtype(int dtype, std::size_t index) {
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

zero::Engine& checked(zero_engine* engine) {
  ZERO_C_REQUIRE(engine != nullptr && engine->engine != nullptr, "engine is null");
  return *engine->engine;
}

void check_param(zero::Engine& engine, std::size_t param) {
  ZERO_C_REQUIRE(param < engine.num_params(), "parameter {} does not exist (the engine has {})",
                 param, engine.num_params());
}

}  // namespace

extern "C" {

const char* zero_last_error(void) {
  return last_error.c_str();
}

int zero_engine_create(const char* config_json_path, int world_size_or_0,
                       const zero_param_spec* specs, size_t n, zero_init_fn init, void* user,
                       zero_engine** out) {
  return guarded("zero_engine_create", [&] {
    ZERO_C_REQUIRE(out != nullptr, "out is null");
    ZERO_C_REQUIRE(config_json_path != nullptr, "config_json_path is null");
    ZERO_C_REQUIRE(world_size_or_0 == 0 || world_size_or_0 == 1,
                   "world_size_or_0 is {}; this entry point builds a single-rank engine (0 or 1)",
                   world_size_or_0);
    ZERO_C_REQUIRE(specs != nullptr || n == 0, "specs is null but n is {}", n);
    ZERO_C_REQUIRE(init != nullptr, "init is null");

    std::vector<zero::ParamSpec> params;
    params.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const zero_param_spec& s = specs[i];
      ZERO_C_REQUIRE(s.name != nullptr, "specs[{}].name is null", i);
      ZERO_C_REQUIRE(s.shape != nullptr || s.ndim == 0,
                     "specs[{}] ('{}'): shape is null but ndim is {}", i, s.name, s.ndim);
      zero::ParamSpec p;
      p.name = s.name;
      p.shape.assign(s.shape, s.shape + s.ndim);
      p.dtype = to_dtype(s.dtype, i);
      p.group = s.group;
      p.unit = s.unit;
      p.trainable = s.trainable != 0;
      params.push_back(std::move(p));
    }

    auto handle = std::make_unique<zero_engine>();
    const zero::config::DsConfig config =
        zero::config::load_config_file(config_json_path, {.world_size = 1, .values = {}});
    handle->world = std::make_unique<zero::InProcWorld>(1);
    handle->comm = handle->world->comm(0);
    handle->device = zero::make_device("cpu", 0);
    const zero::InitFn init_fn = [&](std::size_t index, std::span<float> values) {
      const int rc = init(user, index, values.data(), values.size());
      if (rc != 0) {
        throw CallbackError(fmt::format("the init callback returned {} for parameter {} ('{}')", rc,
                                        index, params[index].name));
      }
    };
    handle->engine =
        zero::Engine::create(config, *handle->comm, *handle->device, params, init_fn, {});
    *out = handle.release();
  });
}

int zero_engine_destroy(zero_engine* engine) {
  // Engine and device destructors never throw (STYLE.md, Errors).
  delete engine;
  return ZERO_OK;
}

int zero_engine_gather(zero_engine* engine, int unit) {
  return guarded("zero_engine_gather", [&] { checked(engine).gather(unit); });
}

int zero_engine_release(zero_engine* engine, int unit) {
  return guarded("zero_engine_release", [&] { checked(engine).release(unit); });
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
    zero::Engine& e = checked(engine);
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
    std::memcpy(out, master.data(), numel * sizeof(float));
  });
}

}  // extern "C"
