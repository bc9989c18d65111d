/* cases_core.c -- context, version, status and error reporting. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Private row conversions of the library (src/core/dtype.c), reached through the
 * static library: they sit under every CPU kernel, with SIMD paths picked at run time. */
typedef enum { T_F32 = 1, T_F16 = 2, T_BF16 = 3 } t_dtype; /* mirrors ot_dtype */
void ot_load_f32(float *dst, const void *src, int d, int64_t n);
void ot_store_f32(void *dst, const float *src, int d, int64_t n);

/* Every 16-bit pattern loads as the harness's scalar conversion says, and random floats
 * (plus the special values) store rounded to nearest even, at lengths that exercise the
 * vector bodies and their tails. */
static void check_conversions(test_run *tr, DLDataType dt, int d) {
  enum { N = 65536 };
  uint16_t *bits = malloc(N * sizeof *bits);
  float *f = malloc(N * sizeof *f);
  for (int i = 0; i < N; i++) bits[i] = (uint16_t)i;
  ot_load_f32(f, bits, d, N);
  int64_t one[1] = {1};
  tbuf *probe = tb_new(NULL, dt, 1, one);
  for (int i = 0; i < N; i++) {
    memcpy(probe->host, &bits[i], 2);
    double want = tb_get(probe, 0);
    if (!(want == f[i] || (want != want && f[i] != f[i]))) {
      tr_fail(tr, "%s load of 0x%04x: got %.9g, expected %.9g", dt_name(dt), i, f[i], want);
      break;
    }
  }
  rng r = tr_rng(tr);
  float specials[] = {0.0f, -0.0f, 1e-8f, -3e-6f, 65504.0f, 70000.0f, 1e30f, -1e-40f};
  for (int i = 0; i < N; i++) {
    float v = (float)(rng_normal(&r) * (i % 7 == 0 ? 1e4 : 3.0));
    if (i < (int)(sizeof specials / sizeof specials[0])) v = specials[i];
    f[i] = v;
  }
  for (int len = 1; len <= 37; len += 9) {
    ot_store_f32(bits, f, d, len);
    for (int i = 0; i < len; i++) {
      memcpy(probe->host, &bits[i], 2);
      double got = tb_get(probe, 0), want = dt_round(dt, f[i]);
      if (!(got == want || (got != got && want != want))) {
        tr_fail(tr, "%s store of %.9g (len %d): got %.9g, expected %.9g", dt_name(dt), f[i], len, got, want);
        break;
      }
    }
  }
  ot_store_f32(bits, f, d, N);
  for (int i = 0; i < N; i++) {
    memcpy(probe->host, &bits[i], 2);
    double got = tb_get(probe, 0), want = dt_round(dt, f[i]);
    if (!(got == want || (got != got && want != want))) {
      tr_fail(tr, "%s store of %.9g: got %.9g, expected %.9g", dt_name(dt), f[i], got, want);
      break;
    }
  }
  tb_free(probe);
  free(bits);
  free(f);
}

static void *other_thread(void *arg) {
  (void)arg;
  /* A failure on this thread must not change the main thread's message. */
  ot_context *c = NULL;
  ot_context_options o = ot_context_default_options();
  o.num_threads = -3;
  ot_context_create(&o, &c);
  return NULL;
}

static void run(test_run *tr) {
  if (tr->grad) return;
  if (tr_begin(tr, "version")) {
    if (ot_version() != OT_VERSION_NUMBER) tr_fail(tr, "ot_version() %d != header %d", ot_version(), OT_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", OT_VERSION_MAJOR, OT_VERSION_MINOR, OT_VERSION_PATCH);
    if (strcmp(ot_version_string(), want)) tr_fail(tr, "ot_version_string() %s != %s", ot_version_string(), want);
    tr_end(tr);
  }
  if (tr_begin(tr, "row conversions float16")) {
    check_conversions(tr, DT_F16, T_F16);
    tr_end(tr);
  }
  if (tr_begin(tr, "row conversions bfloat16")) {
    check_conversions(tr, DT_BF16, T_BF16);
    tr_end(tr);
  }
  if (tr_begin(tr, "status strings")) {
    ot_status all[] = {OT_OK, OT_ERR_INVALID_ARGUMENT, OT_ERR_UNSUPPORTED, OT_ERR_OOM,
                       OT_ERR_NO_DEVICE, OT_ERR_BACKEND, OT_ERR_INTERNAL};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
      for (size_t j = 0; j < i; j++)
        if (!strcmp(ot_status_string(all[i]), ot_status_string(all[j])))
          tr_fail(tr, "statuses %d and %d share the name %s", (int)all[i], (int)all[j], ot_status_string(all[i]));
    if (!ot_status_string((ot_status)999)) tr_fail(tr, "unknown status gives NULL");
    tr_end(tr);
  }
  if (tr_begin(tr, "context create/destroy")) {
    ot_context_destroy(NULL); /* must be harmless */
    ot_context *c = NULL;
    if (!tr_ok(tr, ot_context_create(NULL, &c), "ot_context_create")) { tr_end(tr); return; }
    DLDevice d = ot_context_device(c);
    if (d.device_type != kDLCPU) tr_fail(tr, "default context is not on the CPU");
    ot_context_destroy(c);
    tr_expect_error(tr, ot_context_create(NULL, NULL), OT_ERR_INVALID_ARGUMENT, "ot_context_create", "out");
    ot_context_options o = ot_context_default_options();
    o.num_threads = -1;
    c = (ot_context *)0x1;
    tr_expect_error(tr, ot_context_create(&o, &c), OT_ERR_INVALID_ARGUMENT, "ot_context_create", "num_threads");
    if (c != NULL) tr_fail(tr, "out not cleared on failure");
    o = ot_context_default_options();
    o.device_type = kDLVulkan;
    tr_expect_error(tr, ot_context_create(&o, &c), OT_ERR_UNSUPPORTED, "device_type", NULL);
    o = ot_context_default_options();
    o.device_id = 3;
    tr_expect_error(tr, ot_context_create(&o, &c), OT_ERR_INVALID_ARGUMENT, "device_id", NULL);
    tr_expect_error(tr, ot_context_set_stream(NULL, NULL), OT_ERR_INVALID_ARGUMENT, "ctx", NULL);
    tr_end(tr);
  }
  if (tr_begin(tr, "cuda context without device or without cuda build")) {
    ot_context_options o = ot_context_default_options();
    o.device_type = kDLCUDA;
    o.device_id = 4096; /* never present */
    ot_context *c = NULL;
    tr_expect_error(tr, ot_context_create(&o, &c), OT_ERR_NO_DEVICE, "ot_context_create", NULL);
    tr_end(tr);
  }
  if (tr_begin(tr, "last error is thread-local")) {
    ot_context *c = NULL;
    ot_context_options o = ot_context_default_options();
    o.device_id = 7;
    ot_context_create(&o, &c);
    char before[512];
    snprintf(before, sizeof before, "%s", ot_last_error());
    pthread_t th;
    pthread_create(&th, NULL, other_thread, NULL);
    pthread_join(th, NULL);
    if (strcmp(before, ot_last_error())) tr_fail(tr, "message changed by another thread: \"%s\" -> \"%s\"", before, ot_last_error());
    tr_end(tr);
  }
  if (tr_begin(tr, "an error message may quote the previous one")) {
    /* ot_kv_cache_create reports an arena failure as "... (<the arena's message>)", passing
     * ot_last_error() into the formatting of the new message: the same buffer */
    ot_context *c = NULL;
    ot_arena *a = NULL;
    if (!tr_ok(tr, ot_context_create(NULL, &c), "ot_context_create")) { tr_end(tr); return; }
    if (tr_ok(tr, ot_arena_create(c, 4096, &a), "ot_arena_create")) {
      ot_kv_cache_params kp = {1, 64, 16, 4, 64, {kDLFloat, 32, 1}}; /* 512 KiB > 4 KiB */
      ot_kv_cache *kc = NULL;
      tr_expect_error(tr, ot_kv_cache_create(c, &kp, a, &kc), OT_ERR_OOM, "ot_kv_cache_create",
                      "arena: cannot hold the pool");
      if (!strstr(ot_last_error(), "(ot_arena_alloc_tagged: "))
        tr_fail(tr, "the arena's own message is not quoted intact: \"%s\"", ot_last_error());
      ot_arena_destroy(a);
    }
    ot_context_destroy(c);
    tr_end(tr);
  }
  if (tr_begin(tr, "shapes whose size overflows int64")) {
    /* [2^33, 2^33] (2^66 elements: the product wrapped to 0, so the op "succeeded") and a
     * strided view reaching past 2^63 bytes: refused before any kernel sees them */
    ot_context *c = NULL;
    if (!tr_ok(tr, ot_context_create(NULL, &c), "ot_context_create")) { tr_end(tr); return; }
    float buf[4] = {1, 2, 3, 4}, out[4] = {0, 0, 0, 0};
    int64_t big[2] = {(int64_t)1 << 33, (int64_t)1 << 33}, two[2] = {2, 2};
    int64_t wide[2] = {(int64_t)1 << 62, 1};
    DLTensor x = {buf, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, big, NULL, 0};
    DLTensor y = {out, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, big, NULL, 0};
    tr_expect_error(tr, ot_softmax_forward(c, &x, &y), OT_ERR_INVALID_ARGUMENT, "ot_softmax_forward", "x");
    DLTensor xs = {buf, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, two, wide, 0};
    DLTensor ys = {out, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, two, NULL, 0};
    tr_expect_error(tr, ot_softmax_forward(c, &xs, &ys), OT_ERR_INVALID_ARGUMENT, "ot_softmax_forward", "x");
    for (int i = 0; i < 4; i++)
      if (out[i] != 0) tr_fail(tr, "out[%d] was written", i);
    ot_context_destroy(c);
    tr_end(tr);
  }
}

const test_suite suite_core = {"core", run};
