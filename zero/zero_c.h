/* The C ABI of the zero engine (DESIGN.md §1.1): the same engine as zero/engine.h, reachable from
 * C, Python (ctypes, the `zero` package in python/) and other languages. Shipped as libzero.so
 * (soname libzero.so.<major>); only zero_* symbols are exported.
 *
 * Worlds: an engine runs over a zero_comm, one rank's endpoint of a data-parallel group:
 *   zero_comm_create_env        what the launcher says: torchrun's RANK / WORLD_SIZE / LOCAL_RANK /
 *                               LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT or mpirun's
 *                               OMPI_COMM_WORLD_*; shared memory within one host, MPI across
 *                               hosts; one rank when no launcher variable is set
 *   zero_comm_create_shm        the processes of one host over shared memory (/dev/shm)
 *   zero_comm_create_mpi        MPI_COMM_WORLD, one rank per process
 *   zero_comm_create_callbacks  a table of callbacks: the host framework's own process group
 *                               carries the collectives
 * A null comm passed to zero_engine_create means one rank in this process.
 *
 * Errors: no exception crosses this boundary. Every function returns an int status: ZERO_OK (0)
 * on success, else one of the ZERO_ERR_* codes below; zero_last_error() then returns the message
 * of the last failure on the calling thread (it is kept until the next failure on that thread).
 * Outputs are written only on success.
 *
 * Strings the library returns through char** (JSON documents) are allocated by it and freed with
 * zero_free().
 *
 * Thread safety: a zero_engine or zero_comm is used by one thread at a time. Distinct engines may
 * be used from different threads.
 *
 * One micro-step (see zero/engine.h for the full contract):
 *   for each unit u in forward order: zero_engine_gather(e, u); read zero_engine_param(e, i, ...)
 *   multiply the loss by zero_engine_backward_scale(e, &scale)
 *   for each parameter as its gradient is ready: write into zero_engine_grad(e, i, ...), then
 *     zero_engine_grad_ready(e, i); release units with zero_engine_release(e, u)
 *   zero_engine_step(e, &result)   (the optimizer runs at the accumulation boundary)
 * Collective calls (every rank, same order, same arguments): zero_engine_create, gather (stage 3),
 * grad_ready (stages 2/3), step, gather_master, save_checkpoint, load_checkpoint.
 */
#ifndef ZERO_ZERO_C_H_
#define ZERO_ZERO_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on every incompatible change of this header. zero_abi_version() returns the value the
 * library was built with; a binding compares it against the value it was written for. */
#define ZERO_ABI_VERSION 6

/* Status codes. */
enum {
  ZERO_OK = 0,
  ZERO_ERR_INVALID_ARGUMENT = 1, /* a null pointer, an unknown index, a size that does not match */
  ZERO_ERR_CONFIG = 2,           /* the ds_config is invalid or cannot run (every problem listed) */
  ZERO_ERR_IO = 3,               /* a file could not be read or written */
  ZERO_ERR_COMM = 4,             /* a collective failed (a peer died, timed out, disagreed) */
  ZERO_ERR_OUT_OF_MEMORY = 5,
  ZERO_ERR_CUDA = 6,
  ZERO_ERR_RUNTIME = 7,  /* any other failure the engine reports (a call out of order, ...) */
  ZERO_ERR_CALLBACK = 8, /* an init or communicator callback returned non-zero */
};

/* Element types: of the model copy (must be the config's training dtype) and of collectives. */
enum {
  ZERO_DTYPE_F32 = 0,
  ZERO_DTYPE_F16 = 1,
  ZERO_DTYPE_BF16 = 2,
  ZERO_DTYPE_F64 = 3, /* collectives only */
};

/* Reduction operators of collectives. Avg divides the sum by the world size. */
enum {
  ZERO_OP_SUM = 0,
  ZERO_OP_AVG = 1,
  ZERO_OP_MAX = 2,
};

/* ZERO_ABI_VERSION of the library. */
int zero_abi_version(void);
/* The library's version, "0.1.0". Static storage. */
const char* zero_version(void);

/* The message of the last failure on the calling thread; "" when none. The pointer stays valid
 * until the next failing call on this thread. */
const char* zero_last_error(void);

/* Frees a string the library returned through a char** (null is allowed). */
void zero_free(char* p);

/* ---------------------------------------------------------------------------------------------
 * Communicators
 */
typedef struct zero_comm zero_comm;

/* A communicator whose collectives the caller carries out. Each function returns 0 on success
 * and anything else on failure (the collective then fails with ZERO_ERR_CALLBACK). Semantics are
 * those of zero/comm/communicator.h, over host buffers, blocking:
 *   reduce_scatter: send holds size × recv_elems elements; rank r's recv gets the reduction of
 *                   send[r·recv_elems, (r+1)·recv_elems) over ranks
 *   all_gather:     recv (size × send_elems) gets rank q's send at [q·send_elems, ...)
 *   all_reduce:     recv gets the elementwise reduction of every rank's send (send may == recv)
 *   broadcast:      buffer on every rank gets root's buffer
 * dtype is a ZERO_DTYPE_*, op a ZERO_OP_*. Bitwise agreement between ranks is the callbacks'
 * responsibility (every rank must receive the same reduced bits). The engine calls them from its
 * communication thread, one collective at a time, in issue order. */
typedef struct zero_comm_callbacks {
  void* user;
  int rank;
  int size;
  int (*reduce_scatter)(void* user, const void* send, void* recv, size_t recv_elems, int dtype,
                        int op);
  int (*all_gather)(void* user, const void* send, void* recv, size_t send_elems, int dtype);
  int (*all_reduce)(void* user, const void* send, void* recv, size_t elems, int dtype, int op);
  int (*broadcast)(void* user, void* buffer, size_t elems, int dtype, int root);
  int (*barrier)(void* user);
  /* Called once when the communicator is destroyed; may be null. */
  void (*destroy)(void* user);
} zero_comm_callbacks;

/* timeout_ms: a collective not complete after this long fails naming the op and the ranks that
 * did not arrive; 0 means the default (300 s). */
int zero_comm_create_env(int timeout_ms, zero_comm** out);
/* Ranks [0, world_size) of one host, each calling this with its own rank and the same `name`
 * (a file name under /dev/shm, e.g. "zero-job42"; at most 200 characters). Rank 0 creates the
 * segment; the others wait for it up to timeout_ms. */
int zero_comm_create_shm(const char* name, int rank, int world_size, int timeout_ms,
                         zero_comm** out);
/* MPI_COMM_WORLD (initialises MPI when needed). ZERO_ERR_RUNTIME when built without MPI. */
int zero_comm_create_mpi(int timeout_ms, zero_comm** out);
/* The table is copied. REQUIRES: 0 <= rank < size, every function non-null but destroy. */
int zero_comm_create_callbacks(const zero_comm_callbacks* callbacks, zero_comm** out);
int zero_comm_rank(const zero_comm* comm, int* rank);
int zero_comm_size(const zero_comm* comm, int* size);
/* "shm", "mpi", "callbacks", "inproc". Static storage. */
int zero_comm_backend(const zero_comm* comm, const char** name);
/* Collectives of the communicator itself (blocking), e.g. for a trainer's own metrics. */
int zero_comm_all_reduce(zero_comm* comm, const void* send, void* recv, size_t elems, int dtype,
                         int op);
int zero_comm_broadcast(zero_comm* comm, void* buffer, size_t elems, int dtype, int root);
int zero_comm_barrier(zero_comm* comm);
/* REQUIRES: no engine created over it is alive. Null is allowed. */
int zero_comm_destroy(zero_comm* comm);

/* ---------------------------------------------------------------------------------------------
 * Engines
 */
typedef struct zero_engine zero_engine;

typedef struct zero_param_spec {
  const char* name;     /* unique; copied */
  const int64_t* shape; /* ndim extents; copied. May be null when ndim == 0 (a scalar) */
  size_t ndim;
  int dtype;     /* ZERO_DTYPE_F32 / F16 / BF16 */
  int group;     /* param group (own lr / weight decay); 0 unless options define more */
  int unit;      /* what stage 3 gathers together (a layer); units are 0..U-1 */
  int trainable; /* 0: frozen (no gradient, never updated) */
  /* Other names of this same tensor (tied weights); copied. May be null when n_tied == 0. */
  const char* const* tied_names;
  size_t n_tied;
} zero_param_spec;

/* Overrides of the config's optimizer values for one param group; NaN keeps the config's. */
typedef struct zero_group_options {
  double lr;
  double weight_decay;
} zero_group_options;

typedef struct zero_engine_options {
  const zero_group_options* groups; /* groups[g] overrides group g; may be null when n_groups 0 */
  size_t n_groups;
  int kernel_threads;     /* CPU kernel threads of this rank; 0 = every core it may use */
  const char* kernel_isa; /* null, "auto", "scalar", "avx2", "avx512" */
  /* Where the engine keeps and computes its model states: null or "cpu"; "cuda" (GPU rank %
   * visible GPUs) or "cuda:N" (GPU N). On a GPU, zero_engine_param and zero_engine_grad return
   * device pointers, the engine's kernels run on the legacy default stream (a caller computing on
   * another stream makes it wait for the gradient writes before zero_engine_grad_ready), every
   * call returns with the engine's device work complete, and the collectives go through NCCL
   * over `comm` (in-process ranks sharing one GPU: through its memory), `comm` keeping the
   * small host-side ones; values through host pointers
   * (init, gather_master, set_param, checkpoints) stay host memory. */
  const char* device;
} zero_engine_options;

/* Fills out[0..numel) with the initial fp32 value of parameter `index`. Called on rank 0 only
 * (the engine broadcasts the values). Returns 0 on success; any other value fails
 * zero_engine_create with ZERO_ERR_CALLBACK. */
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

/* What an engine is. */
typedef struct zero_engine_info {
  int stage;
  int rank;
  int world_size;
  int dtype; /* training dtype: ZERO_DTYPE_F32 / F16 / BF16 */
  int64_t train_batch_size;
  int64_t train_micro_batch_size_per_gpu;
  int64_t gradient_accumulation_steps;
  size_t num_params;
  size_t num_units;
  size_t num_groups;
  double gradient_clipping; /* 0: none */
} zero_engine_info;

/* Builds this rank's engine. Collective over `comm` (null: one rank in this process).
 * `config` is a path to a ds_config file, or the JSON text itself when its first non-blank
 * character is '{'. Registers the n parameters and initialises them through init (rank 0).
 * Errors before any collective: a config path that does not exist, a config that cannot run
 * (values left as "auto" are named), specs that are malformed. On success *out owns a new
 * engine; REQUIRES comm to outlive it. */
int zero_engine_create(const char* config, zero_comm* comm, const zero_param_spec* specs,
                       size_t n, const zero_engine_options* options, zero_init_fn init,
                       void* user, zero_engine** out);

/* Destroys the engine (null is allowed). Always returns ZERO_OK. With a shared model copy
 * (zero_engine_param), first a barrier over the engine's communicator. */
int zero_engine_destroy(zero_engine* engine);

int zero_engine_info_get(const zero_engine* engine, zero_engine_info* info);

/* Stage 3: makes the unit's parameters readable; other stages only check the unit id. */
int zero_engine_gather(zero_engine* engine, int unit);
/* zero_engine_gather for a framework whose forward reads the parameters on `stream` (a
 * cudaStream_t; null: the legacy default stream): on a GPU engine whose all-gathers run through
 * NCCL, `stream` waits for the all-gather on the GPU and the call returns without the host
 * waiting. Only work enqueued on `stream` after the call may read the parameters, and `stream` must
 * live until the unit is released (the release orders the engine after it). Elsewhere (a host
 * engine, in-process ranks on one GPU, hpZ, qwZ, parameters read from NVMe) it is
 * zero_engine_gather. */
int zero_engine_gather_on_stream(zero_engine* engine, int unit, void* stream);
/* Stage 3: the unit's gathered copy may be freed. */
int zero_engine_release(zero_engine* engine, int unit);
/* zero_engine_release, and *kept = 1 when the engine kept the unit gathered (its trace uses the
 * unit again within stage3_max_reuse_distance): zero_engine_param of its parameters then stays
 * valid, at the same addresses, until a later release of the unit reports 0 or the next
 * zero_engine_step or checkpoint load. A kept unit may be released again without a gather (to free
 * it when the trace no longer reuses it), or gathered again (nothing to all-gather). 1 at stages
 * 0–2 and for a persistent unit; kept may be null. */
int zero_engine_release_kept(zero_engine* engine, int unit, int* kept);
/* Stage 3: *persistent = 1 when the unit stays gathered for the engine's life (the persistence
 * thresholds; every unit where shared-memory processes share one model copy, as at stages 1/2):
 * gathering and releasing it do nothing, and zero_engine_param of its parameters keeps its
 * address (each optimizer step refreshes the values in place), so a framework may alias them
 * once. 0 at stages 0–2 (where every parameter keeps its address anyway). */
int zero_engine_unit_persistent(const zero_engine* engine, int unit, int* persistent);

/* The model copy of `param`: *data points at *bytes bytes (numel elements of the param's dtype,
 * row-major). Stages 0–2: the same address for the engine's whole life (each step refreshes the
 * values in place), so a framework may alias it. Stage 3: valid until the release of its unit.
 * At stages 1–3 over shared-memory processes the ranks may share one model copy (rank 0's; off
 * with ZERO_SHARED_MODEL=0): zero_engine_destroy is then a barrier, and no rank may read the
 * copy after its own destroy. */
int zero_engine_param(zero_engine* engine, size_t param, const void** data, size_t* bytes);

/* The loss multiplier for backward: loss scale / gradient_accumulation_steps. */
int zero_engine_backward_scale(zero_engine* engine, double* scale);

/* The slot for this micro-step's gradient of `param` (its dtype, numel elements). The caller
 * overwrites it, then calls zero_engine_grad_ready. Valid until then. */
int zero_engine_grad(zero_engine* engine, size_t param, void** data, size_t* bytes);
int zero_engine_grad_ready(zero_engine* engine, size_t param);

/* zero_engine_grad, a copy of `bytes` bytes from `data` into the slot, and zero_engine_grad_ready
 * in one call: `data` is the parameter's whole gradient (its dtype, contiguous, row-major) in host
 * memory, and `bytes` must be the slot's size. Host engines only (device "cpu"): on a GPU, use
 * zero_engine_grad_copy_on_stream below. */
int zero_engine_grad_copy(zero_engine* engine, size_t param, const void* data, size_t bytes);

/* zero_engine_grad_copy without the copy where the engine can: when the parameter's unit is that
 * one parameter alone (unpadded, reduced without a bucket) and `data` is 64-byte aligned, the
 * engine reduces the gradient where it is and sets *lent = 1. It then reads and may overwrite those
 * `bytes` until zero_engine_step returns or the engine is destroyed: keep them alive and unused
 * until then. Otherwise it copies them as zero_engine_grad_copy does and sets *lent = 0. Either
 * way the gradient is ready. Host engines only, as zero_engine_grad_copy. */
int zero_engine_grad_lend(zero_engine* engine, size_t param, void* data, size_t bytes, int* lent);

/* zero_engine_grad_copy for a caller computing on a stream: on a GPU engine, `data` is the
 * gradient in memory of the engine's GPU (or memory CUDA can copy from), copied into the slot on
 * `stream` (a cudaStream_t; null: the legacy default stream) with the engine's kernels ordered
 * after the copy, and the call returns without waiting for it (keep `data` unwritten, and free it
 * only in that stream's order, as torch's caching allocator does). A host engine copies now and
 * takes a null stream only. Then zero_engine_grad_ready, as zero_engine_grad_copy does. */
int zero_engine_grad_copy_on_stream(zero_engine* engine, size_t param, const void* data,
                                    size_t bytes, void* stream);

/* Ends the micro-step; fills *result (may be null). */
int zero_engine_step(zero_engine* engine, zero_step_result* result);

/* Copies the full fp32 master value of `param` into out[0..numel). numel must equal the
 * parameter's element count. Collective at stages 1–3. */
int zero_engine_gather_master(zero_engine* engine, size_t param, float* out, size_t numel);

/* Replaces the value of `param` by values[0..numel) given on rank `root` (other ranks may pass
 * NULL and 0): master weights, model copy and any gathered copy, as an optimizer step leaves
 * them; optimizer states are kept. Collective: every rank, same parameters, same order. */
int zero_engine_set_param(zero_engine* engine, size_t param, const float* values, size_t numel,
                          int root);

/* The learning rate group `group` uses at the next optimizer step. */
int zero_engine_lr(const zero_engine* engine, int group, double* lr);
/* The lr group `group` uses from the next optimizer step on, as a client LR scheduler sets it:
 * the group's base lr (checkpoints keep it). ZERO_ERR_RUNTIME when the config has a "scheduler"
 * block, for an unknown group, and for an lr that is negative or not finite. */
int zero_engine_set_lr(zero_engine* engine, int group, double lr);
/* Whether the micro-steps zero_engine_step ends from now on close the accumulation window
 * (DeepSpeed's set_gradient_accumulation_boundary): 1, the next step runs the optimizer whatever
 * the count; 0, it does not; -1, the count of gradient_accumulation_steps decides again (the
 * default). The backward scale keeps its 1/gradient_accumulation_steps. */
int zero_engine_set_accumulation_boundary(zero_engine* engine, int boundary);
/* Whether a window's last micro-step may step the optimizer during backward, unit by unit as
 * every rank's gradients of a unit complete (1, the default unless ZERO_STEP_IN_BACKWARD=0; 0:
 * after backward, in zero_engine_step), from the next micro-step on; zero::Engine's
 * set_step_in_backward() says where it applies. `begun` (may be null) receives whether the
 * current micro-step's step has begun in backward already (its coefficients fixed when the first
 * unit of its backward is complete, the same answer on every rank after backward): its lr is
 * then the one it began with, whatever zero_engine_set_lr sets before zero_engine_step. Every
 * rank passes the same. */
int zero_engine_set_step_in_backward(zero_engine* engine, int on, int* begun);
int zero_engine_global_steps(const zero_engine* engine, int64_t* steps);
int zero_engine_loss_scale(const zero_engine* engine, double* scale);

/* Writes <dir>/<tag> (tag null: "global_step<N>"), crash-safe. client_state_json: any JSON text
 * (null: none), returned by load. Collective. */
int zero_engine_save_checkpoint(zero_engine* engine, const char* dir, const char* tag,
                                const char* client_state_json);
/* Loads <dir>/<tag> (tag null: the one <dir>/latest names), a zero or DeepSpeed checkpoint, at
 * this engine's world size and stage whatever they were at save. On success *client_state_json
 * (may be null) gets the saved client state as JSON text and *path (may be null) the tag folder
 * read; free both with zero_free. Collective. */
int zero_engine_load_checkpoint(zero_engine* engine, const char* dir, const char* tag,
                                char** client_state_json, char** path);

/* This rank's memory ledger, as JSON: {"rank":0,"kinds":{"host":{"bytes":..,"peak":..,
 * "tags":{"master_params":{"bytes":..,"peak":..},...}},...}}. Free with zero_free. */
/* The config's warnings (what `zero-config check` prints as warnings: unknown keys with their
 * did-you-mean, deprecated names, values ignored as DeepSpeed ignores them), then the engine's
 * notes (Engine::notes(): a setting without effect here and why, with an empty path), as a JSON
 * array of {"path": ..., "message": ...}; free with zero_free. */
int zero_engine_config_warnings_json(const zero_engine* engine, char** json);
int zero_engine_memory_json(const zero_engine* engine, char** json);
/* EngineTimings (zero/engine_timings.h) as JSON: {"pack_s":..,...,"buckets":..}. */
int zero_engine_timings_json(const zero_engine* engine, char** json);
int zero_engine_reset_timings(zero_engine* engine);

/* ---------------------------------------------------------------------------------------------
 * Checkpoint reading (what zero_to_fp32 does, without writing a file)
 */
typedef struct zero_checkpoint zero_checkpoint;

/* Opens <dir>/<tag> (tag null: <dir>/latest, or <dir>/latest_universal), zero or DeepSpeed
 * format (any kind: ZeRO 0-3, BF16_Optimizer, universal). */
int zero_checkpoint_open(const char* dir, const char* tag, zero_checkpoint** out);
int zero_checkpoint_close(zero_checkpoint* ckpt);
/* The tensors zero_to_fp32 would write, in its order (tied names are separate entries that read
 * the same values). */
int zero_checkpoint_num_tensors(const zero_checkpoint* ckpt, size_t* n);
/* Name (valid while ckpt is open) and shape of tensor i: *ndim extents into shape[0..max_ndim). */
int zero_checkpoint_tensor(const zero_checkpoint* ckpt, size_t i, const char** name,
                           int64_t* shape, size_t max_ndim, size_t* ndim);
/* Tensor i whole, as fp32, into out[0..numel). */
int zero_checkpoint_read_fp32(zero_checkpoint* ckpt, size_t i, float* out, size_t numel);
/* The dtype (ZERO_DTYPE_*) tensor i is stored in: F32 for trained parameters (their fp32 master
 * weights) and buffers, a frozen parameter's own (read_fp32 widened it exactly, so narrowing it
 * back gives the stored values). */
int zero_checkpoint_tensor_dtype(const zero_checkpoint* ckpt, size_t i, int* dtype);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZERO_ZERO_C_H_ */
