/* The C ABI of the zero engine (DESIGN.md §1.1): the same engine as zero/engine.h, reachable from
 * C, Python (ctypes) and other languages.
 *
 * Scope: one single-rank engine (world size 1) per handle, with its own in-process communicator
 * and CPU device. Multi-rank worlds are not exposed here yet.
 *
 * Errors: no exception crosses this boundary. Every function returns an int status: ZERO_OK (0)
 * on success, else one of the ZERO_ERR_* codes below; zero_last_error() then returns the message
 * of the last failure on the calling thread (it is kept until the next failure on that thread).
 * Outputs are written only on success.
 *
 * Thread safety: a zero_engine is used by one thread at a time. Distinct engines may be used from
 * different threads.
 *
 * One micro-step (see zero/engine.h for the full contract):
 *   for each unit u in forward order: zero_engine_gather(e, u); read zero_engine_param(e, i, ...)
 *   multiply the loss by zero_engine_backward_scale(e, &scale)
 *   for each parameter as its gradient is ready: write into zero_engine_grad(e, i, ...), then
 *     zero_engine_grad_ready(e, i); release units with zero_engine_release(e, u)
 *   zero_engine_step(e, &result)   (the optimizer runs at the accumulation boundary)
 */
#ifndef ZERO_ZERO_C_H_
#define ZERO_ZERO_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
enum {
  ZERO_OK = 0,
  ZERO_ERR_INVALID_ARGUMENT = 1, /* a null pointer, an unknown index, a size that does not match */
  ZERO_ERR_CONFIG = 2,           /* the ds_config is invalid or cannot run (every problem listed) */
  ZERO_ERR_IO = 3,               /* a file could not be read or written */
  ZERO_ERR_COMM = 4,             /* a collective failed */
  ZERO_ERR_OUT_OF_MEMORY = 5,
  ZERO_ERR_CUDA = 6,
  ZERO_ERR_RUNTIME = 7,  /* any other failure the engine reports (a call out of order, ...) */
  ZERO_ERR_CALLBACK = 8, /* the init callback returned non-zero */
};

/* Element types of the model copy. Must be the config's training dtype. */
enum {
  ZERO_DTYPE_F32 = 0,
  ZERO_DTYPE_F16 = 1,
  ZERO_DTYPE_BF16 = 2,
};

typedef struct zero_engine zero_engine;

typedef struct zero_param_spec {
  const char* name;     /* unique; copied */
  const int64_t* shape; /* ndim extents; copied. May be null when ndim == 0 (a scalar) */
  size_t ndim;
  int dtype;     /* ZERO_DTYPE_* */
  int group;     /* param group (own lr / weight decay); 0 unless the config defines more */
  int unit;      /* what stage 3 gathers together (a layer); units are 0..U-1 */
  int trainable; /* 0: frozen (no gradient, never updated) */
} zero_param_spec;

/* Fills out[0..numel) with the initial fp32 value of parameter `index`. Returns 0 on success;
 * any other value fails zero_engine_create with ZERO_ERR_CALLBACK. */
typedef int (*zero_init_fn)(void* user, size_t index, float* out, size_t numel);

typedef struct zero_step_result {
  int boundary;          /* 1: this micro-step closed an accumulation window; the optimizer ran */
  int skipped;           /* 1: ... and was skipped on gradient overflow */
  int64_t global_steps;  /* optimizer steps so far, skipped ones included */
  int64_t skipped_steps; /* of those, skipped */
  double lr;             /* lr of group 0 used by this optimizer step */
  double grad_norm;      /* global L2 norm of the unscaled gradients; NaN when skipped or not a
                            boundary */
  double loss_scale;     /* the scale this window's gradients were produced with */
} zero_step_result;

/* The message of the last failure on the calling thread; "" when none. The pointer stays valid
 * until the next failing call on this thread. */
const char* zero_last_error(void);

/* Loads the ds_config at config_json_path (world size 1; world_size_or_0 must be 0 or 1), checks
 * it can run, registers the n parameters and initialises them through init(user, i, out, numel)
 * (called during this function, in order). On success *out owns a new engine. */
int zero_engine_create(const char* config_json_path, int world_size_or_0,
                       const zero_param_spec* specs, size_t n, zero_init_fn init, void* user,
                       zero_engine** out);

/* Destroys the engine (null is allowed). Always returns ZERO_OK. */
int zero_engine_destroy(zero_engine* engine);

/* Stage 3: makes the unit's parameters readable; other stages only check the unit id. */
int zero_engine_gather(zero_engine* engine, int unit);
/* Stage 3: the unit's gathered copy may be freed. */
int zero_engine_release(zero_engine* engine, int unit);

/* The model copy of `param`: *data points at *bytes bytes (numel elements of the param's dtype,
 * row-major), valid until the next step or release of its unit. */
int zero_engine_param(zero_engine* engine, size_t param, const void** data, size_t* bytes);

/* The loss multiplier for backward: loss scale / gradient_accumulation_steps. */
int zero_engine_backward_scale(zero_engine* engine, double* scale);

/* The slot for this micro-step's gradient of `param` (its dtype, numel elements). The caller
 * overwrites it, then calls zero_engine_grad_ready. Valid until then. */
int zero_engine_grad(zero_engine* engine, size_t param, void** data, size_t* bytes);
int zero_engine_grad_ready(zero_engine* engine, size_t param);

/* Ends the micro-step; fills *result (may be null). */
int zero_engine_step(zero_engine* engine, zero_step_result* result);

/* Copies the full fp32 master value of `param` into out[0..numel). numel must equal the
 * parameter's element count. */
int zero_engine_gather_master(zero_engine* engine, size_t param, float* out, size_t numel);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZERO_ZERO_C_H_ */
