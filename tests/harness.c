/* harness.c -- see harness.h. */
#include "harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef OT_TEST_CUDA
#include <cuda_runtime.h>
#endif

/* ---- rng ------------------------------------------------------------------------ */

uint64_t rng_u64(rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
double rng_uniform(rng *r, double lo, double hi) {
  return lo + (hi - lo) * ((double)(rng_u64(r) >> 11) * (1.0 / 9007199254740992.0));
}
double rng_normal(rng *r) {
  double u1 = rng_uniform(r, 1e-300, 1.0), u2 = rng_uniform(r, 0.0, 1.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
int64_t rng_int(rng *r, int64_t lo, int64_t hi) {
  return lo + (int64_t)(rng_u64(r) % (uint64_t)(hi - lo + 1));
}

/* ---- dtypes ------------------------------------------------------------------------ */

const DLDataType DT_F32 = {kDLFloat, 32, 1}, DT_F16 = {kDLFloat, 16, 1},
                 DT_BF16 = {kDLBfloat, 16, 1}, DT_I32 = {kDLInt, 32, 1},
                 DT_I64 = {kDLInt, 64, 1};

static bool dt_eq(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}
const char *dt_name(DLDataType t) {
  if (dt_eq(t, DT_F32)) return "f32";
  if (dt_eq(t, DT_F16)) return "f16";
  if (dt_eq(t, DT_BF16)) return "bf16";
  if (dt_eq(t, DT_I32)) return "i32";
  if (dt_eq(t, DT_I64)) return "i64";
  return "?";
}
bool dt_is_float(DLDataType t) { return t.code == kDLFloat || t.code == kDLBfloat; }
size_t dt_size(DLDataType t) { return (size_t)t.bits / 8 * t.lanes; }

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float f16_to_f32(uint16_t h) {
  _Float16 x;
  memcpy(&x, &h, 2);
  return (float)x;
}
static uint16_t f32_to_f16(float f) {
  _Float16 x = (_Float16)f;
  uint16_t h;
  memcpy(&h, &x, 2);
  return h;
}

double dt_round(DLDataType t, double v) {
  if (dt_eq(t, DT_F32)) return (double)(float)v;
  if (dt_eq(t, DT_F16)) return (double)f16_to_f32(f32_to_f16((float)v));
  if (dt_eq(t, DT_BF16)) return (double)bf16_to_f32(f32_to_bf16((float)v));
  return v;
}

/* ---- tensors ------------------------------------------------------------------------ */

tbuf *tb_new_strided(const backend *be, DLDataType dt, int ndim, const int64_t *shape,
                     const int64_t *strides) {
  tbuf *b = (tbuf *)calloc(1, sizeof *b);
  b->be = be;
  b->numel = 1;
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    b->shape[i] = shape[i];
    b->strides[i] = strides ? strides[i] : s;
    s *= shape[i];
  }
  int64_t extent = 0;
  for (int i = 0; i < ndim; i++) {
    b->numel *= shape[i];
    extent += (shape[i] - 1) * b->strides[i];
  }
  extent = b->numel ? extent + 1 : 0;
  b->bytes = (size_t)extent * dt_size(dt);
  size_t alloc = b->bytes ? b->bytes : 16;
  b->host = malloc(alloc);
  if (be && be->is_cuda) {
#ifdef OT_TEST_CUDA
    if (cudaMalloc(&b->dev, alloc) != cudaSuccess) {
      fprintf(stderr, "cudaMalloc(%zu) failed\n", alloc);
      exit(2);
    }
#endif
  } else {
    b->dev = b->host;
  }
  b->t.data = b->dev;
  b->t.device.device_type = (be && be->is_cuda) ? kDLCUDA : kDLCPU;
  b->t.device.device_id = 0;
  b->t.ndim = ndim;
  b->t.dtype = dt;
  b->t.shape = b->shape;
  b->t.strides = b->strides;
  b->t.byte_offset = 0;
  tb_poison(b);
  return b;
}

tbuf *tb_new(const backend *be, DLDataType dt, int ndim, const int64_t *shape) {
  return tb_new_strided(be, dt, ndim, shape, NULL);
}

void tb_free(tbuf *b) {
  if (!b) return;
#ifdef OT_TEST_CUDA
  if (b->be && b->be->is_cuda) cudaFree(b->dev);
#endif
  free(b->host);
  free(b);
}

static int64_t tb_offset(const tbuf *b, int64_t i) {
  int64_t off = 0;
  for (int d = b->t.ndim - 1; d >= 0; d--) {
    int64_t n = b->shape[d];
    off += (i % n) * b->strides[d];
    i /= n;
  }
  return off;
}

double tb_get(const tbuf *b, int64_t i) {
  int64_t off = tb_offset(b, i);
  const char *p = (const char *)b->host + off * (int64_t)dt_size(b->t.dtype);
  DLDataType t = b->t.dtype;
  if (dt_eq(t, DT_F32)) return *(const float *)p;
  if (dt_eq(t, DT_F16)) return f16_to_f32(*(const uint16_t *)p);
  if (dt_eq(t, DT_BF16)) return bf16_to_f32(*(const uint16_t *)p);
  if (dt_eq(t, DT_I32)) return *(const int32_t *)p;
  if (dt_eq(t, DT_I64)) return (double)*(const int64_t *)p;
  return NAN;
}

void tb_set(tbuf *b, int64_t i, double v) {
  int64_t off = tb_offset(b, i);
  char *p = (char *)b->host + off * (int64_t)dt_size(b->t.dtype);
  DLDataType t = b->t.dtype;
  if (dt_eq(t, DT_F32)) *(float *)p = (float)v;
  else if (dt_eq(t, DT_F16)) *(uint16_t *)p = f32_to_f16((float)v);
  else if (dt_eq(t, DT_BF16)) *(uint16_t *)p = f32_to_bf16((float)v);
  else if (dt_eq(t, DT_I32)) *(int32_t *)p = (int32_t)v;
  else if (dt_eq(t, DT_I64)) *(int64_t *)p = (int64_t)v;
  b->host_dirty = true;
}

void tb_fill_uniform(tbuf *b, rng *r, double lo, double hi) {
  for (int64_t i = 0; i < b->numel; i++) {
    double v;
    do { v = dt_round(b->t.dtype, rng_uniform(r, lo, hi)); } while (v == 0.0);
    tb_set(b, i, v);
  }
}

void tb_poison(tbuf *b) {
  if (!b->bytes) return;
  if (dt_is_float(b->t.dtype)) {
    size_t es = dt_size(b->t.dtype), n = b->bytes / es;
    for (size_t i = 0; i < n; i++) {
      char *p = (char *)b->host + i * es;
      if (es == 4) { uint32_t q = 0x7fc00000u; memcpy(p, &q, 4); }
      else if (dt_eq(b->t.dtype, DT_BF16)) { uint16_t q = 0x7fc0u; memcpy(p, &q, 2); }
      else { uint16_t q = 0x7e00u; memcpy(p, &q, 2); }
    }
  } else {
    memset(b->host, 0x5a, b->bytes);
  }
  b->host_dirty = true;
}

const DLTensor *tb_dl(tbuf *b) {
#ifdef OT_TEST_CUDA
  if (b->be && b->be->is_cuda && b->host_dirty && b->bytes)
    cudaMemcpy(b->dev, b->host, b->bytes, cudaMemcpyHostToDevice);
#endif
  b->host_dirty = false;
  return &b->t;
}

void tb_sync(tbuf *b) {
#ifdef OT_TEST_CUDA
  if (b->be && b->be->is_cuda && b->bytes) {
    cudaDeviceSynchronize();
    cudaMemcpy(b->host, b->dev, b->bytes, cudaMemcpyDeviceToHost);
  }
#endif
  b->host_dirty = false;
}

double *tb_to_f64(const tbuf *b) {
  double *o = (double *)malloc((size_t)(b->numel ? b->numel : 1) * sizeof *o);
  for (int64_t i = 0; i < b->numel; i++) o[i] = tb_get(b, i);
  return o;
}

void *tb_snapshot(tbuf *b) {
  tb_sync(b);
  void *s = malloc(b->bytes ? b->bytes : 1);
  memcpy(s, b->host, b->bytes);
  return s;
}

bool tb_unchanged(tbuf *b, const void *snapshot) {
  tb_sync(b);
  return memcmp(b->host, snapshot, b->bytes) == 0;
}

/* ---- runs ------------------------------------------------------------------------------ */

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

bool tr_begin(test_run *tr, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(tr->case_name, sizeof tr->case_name, "[%s] ", tr->be->name);
  vsnprintf(tr->case_name + n, sizeof tr->case_name - (size_t)n, fmt, ap);
  va_end(ap);
  tr->case_failed = false;
  tr->case_skipped = false;
  if (tr->filter && !strstr(tr->case_name, tr->filter)) return false;
  return true;
}

void tr_end(test_run *tr) {
  if (tr->case_failed) {
    tr->failed++;
    printf("FAIL %s\n", tr->case_name);
  } else if (tr->case_skipped) {
    tr->skipped++;
    if (tr->verbose) printf("skip %s\n", tr->case_name);
  } else {
    tr->passed++;
    if (tr->verbose) printf("ok   %s\n", tr->case_name);
  }
  fflush(stdout);
}

void tr_fail(test_run *tr, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("     %s: ", tr->case_name);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  tr->case_failed = true;
}

rng tr_rng(const test_run *tr) {
  rng r = {tr->seed ^ hash_str(tr->case_name)};
  rng_u64(&r);
  return r;
}

bool tr_ok(test_run *tr, ot_status st, const char *what) {
  if (st == OT_OK) return true;
  if (st == OT_ERR_UNSUPPORTED && tr->be->is_cuda) {
    tr->case_skipped = true;
    return false;
  }
  tr_fail(tr, "%s returned %s: %s", what, ot_status_string(st), ot_last_error());
  return false;
}

env_saved env_set(const char *name, const char *value) {
  const char *prev = getenv(name);
  env_saved s = {name, prev ? strdup(prev) : NULL};
  if (value) setenv(name, value, 1);
  else unsetenv(name);
  return s;
}

void env_restore(env_saved *saved) {
  if (saved->value) setenv(saved->name, saved->value, 1);
  else unsetenv(saved->name);
  free(saved->value);
  saved->value = NULL;
}

bool tr_expect_error(test_run *tr, ot_status st, ot_status want, const char *contains1,
                     const char *contains2) {
  const char *msg = ot_last_error();
  /* An op without a kernel on this backend yet cannot check what its kernel would
   * check (values that live on the device, e.g. labels or cu_seqlens): skip, as tr_ok. */
  if (st == OT_ERR_UNSUPPORTED && want != OT_ERR_UNSUPPORTED && tr->be->is_cuda &&
      strstr(msg, "has no kernel for this op yet")) {
    tr->case_skipped = true;
    return false;
  }
  if (st != want) {
    tr_fail(tr, "expected status '%s', got '%s' (%s)", ot_status_string(want),
            ot_status_string(st), st == OT_OK ? "no error" : msg);
    return false;
  }
  if ((contains1 && !strstr(msg, contains1)) || (contains2 && !strstr(msg, contains2))) {
    tr_fail(tr, "error message \"%s\" lacks \"%s\"%s%s%s", msg, contains1 ? contains1 : "",
            contains2 ? " / \"" : "", contains2 ? contains2 : "", contains2 ? "\"" : "");
    return false;
  }
  if (tr->verbose) printf("     message: %s\n", msg);
  return true;
}

tol tol_for(DLDataType t, double k) {
  tol r;
  if (dt_eq(t, DT_BF16)) { r.atol = 1e-2; r.rtol = 1.6e-2; }
  else if (dt_eq(t, DT_F16)) { r.atol = 2e-3; r.rtol = 2e-3; }
  else { r.atol = 1e-5; r.rtol = 1e-5; }
  r.atol *= k;
  r.rtol *= k;
  return r;
}

double check_close_f64(test_run *tr, const char *what, const double *got, const double *ref,
                       int64_t n, tol t) {
  double max_abs = 0, worst_excess = 0;
  int64_t worst = -1, bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = got[i], r = ref[i];
    double err = fabs(g - r);
    bool ok;
    if (isnan(r)) ok = isnan(g);
    else if (isinf(r)) ok = g == r;
    else ok = isfinite(g) && err <= t.atol + t.rtol * fabs(r);
    if (isfinite(err) && err > max_abs) max_abs = err;
    if (!ok) {
      bad++;
      double excess = isfinite(err) ? err / (t.atol + t.rtol * fabs(r)) : INFINITY;
      if (worst < 0 || excess > worst_excess) { worst = i; worst_excess = excess; }
    }
  }
  if (bad)
    tr_fail(tr, "%s: %lld of %lld elements out of tolerance (atol %.2g, rtol %.2g); worst at "
            "%lld: got %.8g, expected %.8g; max abs err %.3g",
            what, (long long)bad, (long long)n, t.atol, t.rtol, (long long)worst, got[worst],
            ref[worst], max_abs);
  else if (tr->verbose)
    printf("     %s: max abs err %.3g over %lld elements\n", what, max_abs, (long long)n);
  return max_abs;
}

double check_close(test_run *tr, const char *what, const tbuf *got, const double *ref, tol t) {
  double *g = tb_to_f64(got);
  double r = check_close_f64(tr, what, g, ref, got->numel, t);
  free(g);
  return r;
}

void fd_vjp(ref_fn f, void *state, double *in, int64_t n_in, int64_t n_out, const double *dout,
            double *grad, double h) {
  double *op = (double *)malloc((size_t)(n_out ? n_out : 1) * sizeof *op);
  double *om = (double *)malloc((size_t)(n_out ? n_out : 1) * sizeof *om);
  for (int64_t i = 0; i < n_in; i++) {
    double x = in[i], step = h * (fabs(x) > 1 ? fabs(x) : 1);
    in[i] = x + step;
    f(state, in, op);
    in[i] = x - step;
    f(state, in, om);
    in[i] = x;
    double g = 0;
    for (int64_t j = 0; j < n_out; j++) g += dout[j] * (op[j] - om[j]);
    grad[i] = g / (2 * step);
  }
  free(op);
  free(om);
}
