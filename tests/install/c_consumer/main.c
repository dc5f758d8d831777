/* An installed libzero.so used from C: prints the versions, trains two parameters for two steps
 * on one rank (null comm) and checks that every element moved. Exits 0 on success. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "zero/zero_c.h"

#define NUM_PARAMS 2
#define MAX_NUMEL 6
#define STEPS 2

static const char kConfig[] =
    "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1,"
    " \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.1}},"
    " \"zero_optimization\": {\"stage\": 1}}";

static const int64_t kShape0[] = {2, 3};
static const int64_t kShape1[] = {3};
static const size_t kNumel[NUM_PARAMS] = {6, 3};

static int init_weights(void* user, size_t index, float* out, size_t numel) {
  size_t i;
  (void)user;
  for (i = 0; i < numel; ++i) out[i] = 1.0f + 0.25f * (float)(i + index);
  return 0;
}

#define CHECK(call)                                                                       \
  do {                                                                                    \
    int rc_ = (call);                                                                     \
    if (rc_ != ZERO_OK) {                                                                 \
      fprintf(stderr, "c_consumer: %s returned %d: %s\n", #call, rc_, zero_last_error()); \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

/* Copies parameter p's values (fp32) into out. */
static int read_param(zero_engine* e, size_t p, float* out) {
  const void* data = NULL;
  size_t bytes = 0;
  CHECK(zero_engine_param(e, p, &data, &bytes));
  if (bytes != kNumel[p] * sizeof(float)) {
    fprintf(stderr, "c_consumer: parameter %zu has %zu bytes, expected %zu\n", p, bytes,
            kNumel[p] * sizeof(float));
    return 1;
  }
  memcpy(out, data, bytes);
  return 0;
}

int main(void) {
  zero_param_spec specs[NUM_PARAMS];
  float before[NUM_PARAMS][MAX_NUMEL], after[NUM_PARAMS][MAX_NUMEL];
  zero_engine* e = NULL;
  zero_step_result result;
  size_t p, i;
  int step;

  printf("zero %s, ABI %d (header %d)\n", zero_version(), zero_abi_version(), ZERO_ABI_VERSION);
  if (zero_abi_version() != ZERO_ABI_VERSION) {
    fprintf(stderr, "c_consumer: library ABI %d, header ABI %d\n", zero_abi_version(),
            ZERO_ABI_VERSION);
    return 1;
  }

  memset(specs, 0, sizeof specs);
  specs[0].name = "layer.weight";
  specs[0].shape = kShape0;
  specs[0].ndim = 2;
  specs[1].name = "layer.bias";
  specs[1].shape = kShape1;
  specs[1].ndim = 1;
  specs[1].unit = 1;
  for (p = 0; p < NUM_PARAMS; ++p) {
    specs[p].dtype = ZERO_DTYPE_F32;
    specs[p].trainable = 1;
  }

  CHECK(zero_engine_create(kConfig, NULL, specs, NUM_PARAMS, NULL, init_weights, NULL, &e));
  for (p = 0; p < NUM_PARAMS; ++p) {
    if (read_param(e, p, before[p]) != 0) return 1;
  }

  for (step = 0; step < STEPS; ++step) {
    double scale = 0;
    for (p = 0; p < NUM_PARAMS; ++p) CHECK(zero_engine_gather(e, (int)p));
    CHECK(zero_engine_backward_scale(e, &scale));
    for (p = 0; p < NUM_PARAMS; ++p) {
      void* slot = NULL;
      size_t bytes = 0;
      float* grad;
      CHECK(zero_engine_grad(e, p, &slot, &bytes));
      grad = (float*)slot;
      /* d/dw of 0.5 * w^2, times the loss scale */
      for (i = 0; i < bytes / sizeof(float); ++i) grad[i] = (float)(before[p][i] * scale);
      CHECK(zero_engine_grad_ready(e, p));
      CHECK(zero_engine_release(e, (int)p));
    }
    CHECK(zero_engine_step(e, &result));
    printf("step %d: boundary %d, global_steps %lld, lr %g, grad_norm %g\n", step, result.boundary,
           (long long)result.global_steps, result.lr, result.grad_norm);
    if (!result.boundary) {
      fprintf(stderr, "c_consumer: step %d was not an optimizer step\n", step);
      return 1;
    }
  }

  for (p = 0; p < NUM_PARAMS; ++p) {
    if (read_param(e, p, after[p]) != 0) return 1;
    for (i = 0; i < kNumel[p]; ++i) {
      const float change = after[p][i] - before[p][i];
      if (!(fabsf(change) > 0.0f) || !isfinite(after[p][i])) {
        fprintf(stderr, "c_consumer: %s[%zu] did not move: %g -> %g\n", specs[p].name, i,
                before[p][i], after[p][i]);
        return 1;
      }
    }
  }
  printf("%s[0]: %g -> %g\n", specs[0].name, before[0][0], after[0][0]);
  CHECK(zero_engine_destroy(e));
  printf("c_consumer: ok\n");
  return 0;
}
