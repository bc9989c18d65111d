/*
 * ot_bench.c -- `ot-bench`: runs every op of the public header on the best backend
 * present (CUDA when a device exists, else the CPU) at a few realistic shapes, checks
 * each result, times it, and prints a table.
 *
 *   ot-bench [--op NAME] [--shape AxBx..] [--dtype bf16|f16|f32] [--causal 0|1]
 *            [--threads N] [--reps N] [--json FILE] [--cpu] [--list]
 *
 * Checks: on the CPU every output is compared with a plain float64 reference written
 * here (for a sample of rows; reductions over rows, like dweight, in full). On CUDA the
 * reference is the CPU backend run on the same inputs, compared element by element.
 * Time: the median of several runs after a warm-up (CUDA: synchronized wall clock).
 * Exit status: 0 when every check passed ("unsupported" is not a failure), 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops_transformer.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef OT_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

/* ------------------------------------------------------------------------------ */
/* dtypes and storage conversion                                                    */

typedef enum { F32, F16, BF16, I32 } dtype;
static const char *dtype_name[] = {"f32", "f16", "bf16", "i32"};
static const size_t dtype_size[] = {4, 2, 2, 4};

static DLDataType dl_of(dtype t) {
  DLDataType d = {kDLFloat, 32, 1};
  if (t == F16) d.bits = 16;
  if (t == BF16) d = (DLDataType){kDLBfloat, 16, 1};
  if (t == I32) d = (DLDataType){kDLInt, 32, 1};
  return d;
}

static float bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}
static float bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) { /* zero or subnormal */
    float v = (float)man * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
  return bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}
static uint16_t f32_to_f16(float f) {
  uint32_t u = f32_to_bits(f), sign = (u >> 16) & 0x8000u;
  float a = fabsf(f);
  if (a != a) return (uint16_t)(sign | 0x7e00u);
  if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00u);
  if (a < 6.103515625e-05f) { /* subnormal: multiples of 2^-24, round to nearest even */
    float q = a * 16777216.0f;
    float r = nearbyintf(q);
    return (uint16_t)(sign | (uint16_t)r);
  }
  uint32_t au = f32_to_bits(a);
  au += 0xfffu + ((au >> 13) & 1u);
  return (uint16_t)(sign | (((au >> 23) - 112u) << 10) | ((au >> 13) & 0x3ffu));
}

/* ------------------------------------------------------------------------------ */
/* random numbers (splitmix64)                                                     */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_u64(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double rng_uniform(double lo, double hi) {
  return lo + (hi - lo) * ((double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0));
}

/* ------------------------------------------------------------------------------ */
/* buffers: a host copy always, a device copy on CUDA                               */

typedef struct buf {
  dtype dt;
  int ndim;
  int64_t shape[4];
  int64_t n;
  size_t bytes;
  void *host; /* inputs; on CUDA, after the check, the CPU backend's outputs */
  void *dev;  /* == host on the CPU */
  void *got;  /* outputs as the benchmarked backend computed them (== host on the CPU) */
  DLTensor t_host, t_dev;
  struct buf *next;
} buf;

typedef struct bench {
  ot_context *ctx; /* the benchmarked backend */
  ot_context *cpu; /* the CPU backend (== ctx on the CPU) */
  int cuda;
  int reps;        /* 0: adaptive */
  buf *bufs;       /* every buffer of the current case, freed after it */
} bench;

static bench B;

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ot-bench: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(2);
}

#ifdef OT_BENCH_CUDA
#define CUDA_CHECK(x)                                                             \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) die("%s: %s", #x, cudaGetErrorString(e_));             \
  } while (0)
#endif

static buf *buf_new(dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  buf *b = calloc(1, sizeof *b);
  if (!b) die("out of memory");
  int64_t d[4] = {d0, d1, d2, d3};
  b->dt = dt;
  b->ndim = ndim;
  b->n = 1;
  for (int i = 0; i < ndim; i++) {
    b->shape[i] = d[i];
    b->n *= d[i];
  }
  b->bytes = (size_t)b->n * dtype_size[dt];
  b->host = malloc(b->bytes ? b->bytes : 1);
  if (!b->host) die("out of memory (%zu bytes)", b->bytes);
  memset(b->host, 0xff, b->bytes); /* NaN in every float format */
  b->dev = b->host;
  b->got = b->host;
#ifdef OT_BENCH_CUDA
  if (B.cuda) {
    CUDA_CHECK(cudaMalloc(&b->dev, b->bytes ? b->bytes : 1));
    CUDA_CHECK(cudaMemset(b->dev, 0xff, b->bytes));
  }
#endif
  DLTensor t = {.data = b->host, .device = {kDLCPU, 0}, .ndim = ndim, .dtype = dl_of(dt),
                .shape = b->shape};
  b->t_host = t;
  b->t_dev = t;
  b->t_dev.data = b->dev;
  if (B.cuda) b->t_dev.device = (DLDevice){kDLCUDA, 0};
  b->next = B.bufs;
  B.bufs = b;
  return b;
}

static void bufs_free(void) {
  while (B.bufs) {
    buf *b = B.bufs;
    B.bufs = b->next;
    if (b->got != b->host) free(b->got);
#ifdef OT_BENCH_CUDA
    if (b->dev != b->host) cudaFree(b->dev);
#endif
    free(b->host);
    free(b);
  }
}

static double get(const buf *b, const void *p, int64_t i) {
  switch (b->dt) {
    case F32: return ((const float *)p)[i];
    case F16: return f16_to_f32(((const uint16_t *)p)[i]);
    case BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
    case I32: return ((const int32_t *)p)[i];
  }
  return 0;
}
static double in(const buf *b, int64_t i) { return get(b, b->host, i); }   /* an input */
static double out(const buf *b, int64_t i) { return get(b, b->got, i); }   /* an output */

static void set(buf *b, int64_t i, double v) {
  switch (b->dt) {
    case F32: ((float *)b->host)[i] = (float)v; break;
    case F16: ((uint16_t *)b->host)[i] = f32_to_f16((float)v); break;
    case BF16: ((uint16_t *)b->host)[i] = f32_to_bf16((float)v); break;
    case I32: ((int32_t *)b->host)[i] = (int32_t)v; break;
  }
}
/* Round v as storage of dtype dt would. */
static double round_to(dtype dt, double v) {
  switch (dt) {
    case F16: return f16_to_f32(f32_to_f16((float)v));
    case BF16: return bf16_to_f32(f32_to_bf16((float)v));
    case F32: return (float)v;
    default: return v;
  }
}

static void upload(buf *b) {
#ifdef OT_BENCH_CUDA
  if (B.cuda) CUDA_CHECK(cudaMemcpy(b->dev, b->host, b->bytes, cudaMemcpyHostToDevice));
#else
  (void)b;
#endif
}
/* Uniform in [lo, hi), never exactly zero; uploaded. */
static buf *rand_buf(dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3, double lo,
                     double hi) {
  buf *b = buf_new(dt, ndim, d0, d1, d2, d3);
  for (int64_t i = 0; i < b->n; i++) {
    double v = rng_uniform(lo, hi);
    set(b, i, v == 0 ? 1e-3 : v);
  }
  upload(b);
  return b;
}

static const DLTensor *T(buf *b, int dev) { return b ? (dev ? &b->t_dev : &b->t_host) : NULL; }

static void sync_device(void) {
#ifdef OT_BENCH_CUDA
  if (B.cuda) CUDA_CHECK(cudaDeviceSynchronize());
#endif
}
/* Copy a device output into its host copy (CUDA), so later ops' CPU reference runs see
 * exactly the inputs the device saw. */
static void download_to_host(buf *b) {
#ifdef OT_BENCH_CUDA
  if (B.cuda) CUDA_CHECK(cudaMemcpy(b->host, b->dev, b->bytes, cudaMemcpyDeviceToHost));
#else
  (void)b;
#endif
}
static void download_got(buf *b) {
#ifdef OT_BENCH_CUDA
  if (B.cuda) {
    if (b->got == b->host) b->got = malloc(b->bytes ? b->bytes : 1);
    if (!b->got) die("out of memory");
    CUDA_CHECK(cudaMemcpy(b->got, b->dev, b->bytes, cudaMemcpyDeviceToHost));
  }
#else
  (void)b;
#endif
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------------------ */
/* comparison                                                                      */

/* Pairs (got, ref) of one output, judged together: |got - ref| <= rtol * (|ref| +
 * floor * max|ref|) + atol, with rtol by the output's dtype. The floor keeps values
 * near zero (cancellation in sums, averages of random signs) from demanding more
 * relative precision than the dtype has at the output's scale. */
typedef struct pairs {
  const char *what;
  dtype dt;
  double k;    /* tolerance multiplier (long reductions) */
  double atol; /* extra absolute slack (e.g. float32 angles in RoPE) */
  int64_t n, cap;
  double *got, *ref;
} pairs;

typedef struct verdict {
  double max_err;
  int fail;
  char note[200];
} verdict;

static void pairs_init(pairs *p, const char *what, dtype dt, double k) {
  memset(p, 0, sizeof *p);
  p->what = what;
  p->dt = dt;
  p->k = k;
}
static void pairs_add(pairs *p, double got, double ref) {
  if (p->n == p->cap) {
    p->cap = p->cap ? 2 * p->cap : 1024;
    p->got = realloc(p->got, (size_t)p->cap * sizeof(double));
    p->ref = realloc(p->ref, (size_t)p->cap * sizeof(double));
    if (!p->got || !p->ref) die("out of memory");
  }
  p->got[p->n] = got;
  p->ref[p->n] = ref;
  p->n++;
}
static double rtol_of(dtype dt) {
  return dt == BF16 ? 1.0 / 64 : dt == F16 ? 1.0 / 256 : 2e-4;
}
static void judge(verdict *v, pairs *p) {
  double max_ref = 0;
  for (int64_t i = 0; i < p->n; i++)
    if (fabs(p->ref[i]) > max_ref) max_ref = fabs(p->ref[i]);
  double rtol = rtol_of(p->dt) * p->k;
  for (int64_t i = 0; i < p->n; i++) {
    double err = fabs(p->got[i] - p->ref[i]);
    if (!(err == err)) err = INFINITY; /* NaN: unwritten or broken */
    if (err > v->max_err) v->max_err = err;
    double lim = rtol * (fabs(p->ref[i]) + 0.02 * max_ref) + p->atol;
    if (!(err <= lim) && !v->fail) {
      v->fail = 1;
      snprintf(v->note, sizeof v->note, "%s[%lld]: got %.6g, expected %.6g", p->what,
               (long long)i, p->got[i], p->ref[i]);
    }
  }
  if (p->n == 0 && !v->fail) {
    v->fail = 1;
    snprintf(v->note, sizeof v->note, "%s: nothing compared", p->what);
  }
  free(p->got);
  free(p->ref);
  p->got = p->ref = NULL;
  p->n = p->cap = 0;
}

/* Compare a whole output buffer (benchmarked backend vs the CPU backend). */
static void judge_buf(verdict *v, const char *what, buf *b, double k) {
  pairs p;
  pairs_init(&p, what, b->dt, 2 * k);
  for (int64_t i = 0; i < b->n; i++) pairs_add(&p, get(b, b->got, i), get(b, b->host, i));
  judge(v, &p);
}

/* A sample of row indices of [0, rows): first, last and evenly spread ones. */
static int sample_rows(int64_t rows, int64_t want, int64_t *idx) {
  if (rows <= want) {
    for (int64_t i = 0; i < rows; i++) idx[i] = i;
    return (int)rows;
  }
  for (int64_t i = 0; i < want; i++) idx[i] = i * (rows - 1) / (want - 1);
  return (int)want;
}

/* ------------------------------------------------------------------------------ */
/* cases                                                                           */

typedef struct op_case {
  const char *op;
  int64_t d[5];
  int nd;
  dtype dt;
  int causal;
} op_case;

typedef struct result {
  char op[32], shape[64];
  dtype dt;
  int status; /* 0 ran, 1 unsupported, 2 error */
  double ms;
  double rate;
  const char *metric;
  verdict v;
  char msg[300];
} result;

/* An op invocation: `dev` selects the device pointers (1) or the host copies (0, the
 * CPU backend). */
typedef ot_status (*invoke_fn)(void *st, ot_context *ctx, int dev);

/* Runs the op on the benchmarked backend: once to check status (and warm up), then
 * timed; then downloads `outs` into their got copies and, on CUDA, reruns on the CPU
 * backend into the host copies (the reference). Returns the status. */
static ot_status measure(result *r, invoke_fn f, void *st, buf **outs, int nouts) {
  ot_status s = f(st, B.ctx, 1);
  sync_device();
  if (s != OT_OK) return s;
  double times[64];
  int n = 0;
  double t_all = now_s();
  int max_reps = B.reps > 0 ? B.reps : 30;
  if (max_reps > 64) max_reps = 64;
  while (n < max_reps) {
    double t0 = now_s();
    s = f(st, B.ctx, 1);
    sync_device();
    times[n++] = now_s() - t0;
    if (s != OT_OK) return s;
    if (B.reps == 0 && n >= 3 && now_s() - t_all > 0.4) break;
  }
  for (int i = 1; i < n; i++) /* insertion sort for the median */
    for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
      double t = times[j];
      times[j] = times[j - 1];
      times[j - 1] = t;
    }
  r->ms = 1e3 * (n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]));
  for (int i = 0; i < nouts; i++) download_got(outs[i]);
  if (B.cuda) {
    s = f(st, B.cpu, 0);
    if (s != OT_OK) {
      snprintf(r->msg, sizeof r->msg, "CPU reference run failed: %s", ot_last_error());
      return OT_ERR_INTERNAL;
    }
  }
  return OT_OK;
}

/* Run once on the benchmarked backend (an input for a later op, e.g. the forward
 * before a backward) and bring the result to the host copies too. */
static void run_once(invoke_fn f, void *st, buf **outs, int nouts, result *r) {
  ot_status s = f(st, B.ctx, 1);
  sync_device();
  if (s != OT_OK) {
    snprintf(r->msg, sizeof r->msg, "setup forward failed: %s", ot_last_error());
    r->status = 2;
    return;
  }
  for (int i = 0; i < nouts; i++) download_to_host(outs[i]);
}

static int finish(result *r, ot_status s) {
  if (s == OT_ERR_UNSUPPORTED) {
    r->status = 1;
    snprintf(r->msg, sizeof r->msg, "%s", ot_last_error());
    return 0;
  }
  if (s != OT_OK) {
    r->status = 2;
    if (!r->msg[0]) snprintf(r->msg, sizeof r->msg, "%s: %s", ot_status_string(s), ot_last_error());
    return 0;
  }
  return 1;
}

static int64_t SAMPLE[256];

static double *to_f64(const buf *b) {
  double *a = malloc((size_t)b->n * sizeof(double));
  if (!a) die("out of memory");
  for (int64_t i = 0; i < b->n; i++) a[i] = in(b, i);
  return a;
}

/* ---- RMSNorm / LayerNorm ---------------------------------------------------------- */

typedef struct norm_st {
  int layer, bwd;
  buf *x, *res, *w, *b, *y, *res_out, *mean, *rstd;
  buf *dy, *dres, *dx, *dw, *db;
  float eps;
} norm_st;

static ot_status inv_norm_fwd(void *p, ot_context *c, int d) {
  norm_st *s = p;
  if (s->layer)
    return ot_layernorm_forward(c, T(s->x, d), T(s->res, d), T(s->w, d), T(s->b, d), s->eps,
                                T(s->y, d), T(s->res_out, d), T(s->mean, d), T(s->rstd, d));
  return ot_rmsnorm_forward(c, T(s->x, d), T(s->res, d), T(s->w, d), s->eps, T(s->y, d),
                            T(s->res_out, d), T(s->rstd, d));
}
static ot_status inv_norm_bwd(void *p, ot_context *c, int d) {
  norm_st *s = p;
  buf *h = s->res ? s->res_out : s->x;
  if (s->layer)
    return ot_layernorm_backward(c, T(s->dy, d), T(s->dres, d), T(h, d), T(s->w, d),
                                 T(s->mean, d), T(s->rstd, d), s->eps, T(s->dx, d), T(s->dw, d),
                                 T(s->db, d));
  return ot_rmsnorm_backward(c, T(s->dy, d), T(s->dres, d), T(h, d), T(s->w, d), T(s->rstd, d),
                             s->eps, T(s->dx, d), T(s->dw, d));
}

/* float64 statistics of row r of h (the rounded x + residual). */
static void norm_row_ref(norm_st *s, int64_t r, int64_t H, double *h, double *mean, double *rstd) {
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < H; i++) {
    double v = in(s->x, r * H + i);
    if (s->res) v = round_to(s->x->dt, v + in(s->res, r * H + i));
    h[i] = v;
    sum += v;
  }
  double mu = s->layer ? sum / (double)H : 0;
  for (int64_t i = 0; i < H; i++) sq += (h[i] - mu) * (h[i] - mu);
  *mean = mu;
  *rstd = 1.0 / sqrt(sq / (double)H + s->eps);
}

static void bench_norm(const op_case *c, result *r, int layer, int bwd) {
  int64_t R = c->d[0], H = c->d[1];
  dtype dt = c->dt;
  norm_st s = {.layer = layer, .bwd = bwd, .eps = 1e-5f};
  s.x = rand_buf(dt, 2, R, H, 0, 0, -2, 2);
  if (layer) s.res = rand_buf(dt, 2, R, H, 0, 0, -2, 2);
  s.w = rand_buf(dt, 1, H, 0, 0, 0, 0.5, 1.5);
  if (layer) s.b = rand_buf(dt, 1, H, 0, 0, 0, -0.5, 0.5);
  s.y = buf_new(dt, 2, R, H, 0, 0);
  if (layer) s.res_out = buf_new(dt, 2, R, H, 0, 0);
  if (layer) s.mean = buf_new(F32, 1, R, 0, 0, 0);
  s.rstd = buf_new(F32, 1, R, 0, 0, 0);
  double es = (double)dtype_size[dt];
  buf *fouts[4] = {s.y, s.rstd, s.res_out, s.mean};
  int nf = layer ? 4 : 2;
  ot_status st;
  if (!bwd) {
    r->metric = "GB/s";
    r->rate = (double)R * H * es * (layer ? 4 : 2) / 1e9;
    st = measure(r, inv_norm_fwd, &s, fouts, nf);
  } else {
    run_once(inv_norm_fwd, &s, fouts, nf, r);
    if (r->status) return;
    s.dy = rand_buf(dt, 2, R, H, 0, 0, -1, 1);
    if (layer) s.dres = rand_buf(dt, 2, R, H, 0, 0, -1, 1);
    s.dx = buf_new(dt, 2, R, H, 0, 0);
    s.dw = buf_new(dt, 1, H, 0, 0, 0);
    if (layer) s.db = buf_new(dt, 1, H, 0, 0, 0);
    buf *bouts[3] = {s.dx, s.dw, s.db};
    r->metric = "GB/s";
    r->rate = (double)R * H * es * (layer ? 4 : 3) / 1e9;
    st = measure(r, inv_norm_bwd, &s, bouts, layer ? 3 : 2);
  }
  if (!finish(r, st)) return;
  r->rate /= r->ms * 1e-3;

  if (B.cuda) {
    if (!bwd) {
      judge_buf(&r->v, "out", s.y, 1);
      judge_buf(&r->v, "rstd", s.rstd, 1);
      if (layer) judge_buf(&r->v, "residual_out", s.res_out, 1), judge_buf(&r->v, "mean", s.mean, 1);
    } else {
      judge_buf(&r->v, "dx", s.dx, 1);
      judge_buf(&r->v, "dweight", s.dw, 4);
      if (layer) judge_buf(&r->v, "dbias", s.db, 4);
    }
    return;
  }
  double *h = malloc((size_t)H * sizeof(double));
  if (!bwd) {
    pairs py, pr, pro, pm;
    pairs_init(&py, "out", dt, 1);
    pairs_init(&pr, "rstd", F32, 1);
    pairs_init(&pro, "residual_out", dt, 1);
    pairs_init(&pm, "mean", F32, 1);
    pm.atol = 1e-6;
    int ns = sample_rows(R, 64, SAMPLE);
    for (int k = 0; k < ns; k++) {
      int64_t row = SAMPLE[k];
      double mu, rs;
      norm_row_ref(&s, row, H, h, &mu, &rs);
      pairs_add(&pr, out(s.rstd, row), rs);
      if (layer) pairs_add(&pm, out(s.mean, row), mu);
      for (int64_t i = 0; i < H; i++) {
        double ref = (h[i] - mu) * rs * in(s.w, i) + (layer ? in(s.b, i) : 0);
        pairs_add(&py, out(s.y, row * H + i), ref);
        if (layer) pairs_add(&pro, out(s.res_out, row * H + i), h[i]);
      }
    }
    judge(&r->v, &py);
    judge(&r->v, &pr);
    if (layer) judge(&r->v, &pro), judge(&r->v, &pm);
  } else {
    /* dx for sampled rows; dweight / dbias over all rows. */
    pairs pdx, pdw, pdb;
    pairs_init(&pdx, "dx", dt, 1);
    pairs_init(&pdw, "dweight", dt, 2);
    pairs_init(&pdb, "dbias", dt, 2);
    double *dw = calloc((size_t)H, sizeof(double)), *db = calloc((size_t)H, sizeof(double));
    int ns = sample_rows(R, 64, SAMPLE), k = 0;
    for (int64_t row = 0; row < R; row++) {
      double mu, rs, mg = 0, mgx = 0;
      norm_row_ref(&s, row, H, h, &mu, &rs);
      for (int64_t i = 0; i < H; i++) {
        double dy = in(s.dy, row * H + i), xh = (h[i] - mu) * rs;
        dw[i] += dy * xh;
        db[i] += dy;
        double g = dy * in(s.w, i);
        mg += g;
        mgx += g * xh;
      }
      if (k < ns && SAMPLE[k] == row) {
        k++;
        mg /= (double)H;
        mgx /= (double)H;
        for (int64_t i = 0; i < H; i++) {
          double xh = (h[i] - mu) * rs, g = in(s.dy, row * H + i) * in(s.w, i);
          double ref = rs * (g - (layer ? mg : 0) - xh * mgx);
          if (layer) ref += in(s.dres, row * H + i);
          pairs_add(&pdx, out(s.dx, row * H + i), ref);
        }
      }
    }
    for (int64_t i = 0; i < H; i++) {
      pairs_add(&pdw, out(s.dw, i), dw[i]);
      if (layer) pairs_add(&pdb, out(s.db, i), db[i]);
    }
    judge(&r->v, &pdx);
    judge(&r->v, &pdw);
    if (layer) judge(&r->v, &pdb);
    free(dw);
    free(db);
  }
  free(h);
}

/* ---- RoPE ------------------------------------------------------------------------------ */

typedef struct rope_st {
  ot_rope_params p;
  buf *q, *k, *pos, *qo, *ko;
  int bwd;
} rope_st;

static ot_status inv_rope(void *p, ot_context *c, int d) {
  rope_st *s = p;
  if (s->bwd)
    return ot_rope_backward(c, &s->p, T(s->q, d), T(s->k, d), T(s->pos, d), NULL, T(s->qo, d),
                            T(s->ko, d));
  return ot_rope_forward(c, &s->p, T(s->q, d), T(s->k, d), T(s->pos, d), NULL, T(s->qo, d),
                         T(s->ko, d));
}

static void bench_rope(const op_case *c, result *r, int bwd) {
  int64_t Tk = c->d[0], Hq = c->d[1], Hk = c->d[2], D = c->d[3];
  dtype dt = c->dt;
  rope_st s = {.p = ot_rope_default_params(), .bwd = bwd};
  s.q = rand_buf(dt, 3, Tk, Hq, D, 0, -2, 2);
  s.k = rand_buf(dt, 3, Tk, Hk, D, 0, -2, 2);
  s.pos = buf_new(I32, 1, Tk, 0, 0, 0);
  for (int64_t t = 0; t < Tk; t++) set(s.pos, t, (double)(rng_u64() % 8192));
  upload(s.pos);
  s.qo = buf_new(dt, 3, Tk, Hq, D, 0);
  s.ko = buf_new(dt, 3, Tk, Hk, D, 0);
  buf *outs[2] = {s.qo, s.ko};
  r->metric = "GB/s";
  r->rate = (double)Tk * (Hq + Hk) * D * (double)dtype_size[dt] * 2 / 1e9;
  if (!finish(r, measure(r, inv_rope, &s, outs, 2))) return;
  r->rate /= r->ms * 1e-3;
  if (B.cuda) {
    judge_buf(&r->v, "q_out", s.qo, 1);
    judge_buf(&r->v, "k_out", s.ko, 1);
    return;
  }
  pairs pq, pk;
  pairs_init(&pq, bwd ? "dq" : "q_out", dt, 1);
  pairs_init(&pk, bwd ? "dk" : "k_out", dt, 1);
  /* The library takes angles in float32: allow their rounding at positions < 8192. */
  pq.atol = pk.atol = 8192 * 1.2e-7 * 2 * 2;
  int64_t half = D / 2;
  double sgn = bwd ? -1 : 1;
  int ns = sample_rows(Tk, 64, SAMPLE);
  for (int k = 0; k < ns; k++) {
    int64_t t = SAMPLE[k];
    double pos = in(s.pos, t);
    for (int which = 0; which < 2; which++) {
      buf *x = which ? s.k : s.q, *o = which ? s.ko : s.qo;
      int64_t H = which ? Hk : Hq;
      for (int64_t h = 0; h < H; h++) {
        int64_t base = (t * H + h) * D;
        for (int64_t i = 0; i < half; i++) {
          double ang = pos * pow(10000.0, -2.0 * (double)i / (double)D);
          double cs = cos(ang), sn = sgn * sin(ang);
          double a = in(x, base + i), b = in(x, base + i + half);
          pairs_add(which ? &pk : &pq, out(o, base + i), a * cs - b * sn);
          pairs_add(which ? &pk : &pq, out(o, base + i + half), b * cs + a * sn);
        }
      }
    }
  }
  judge(&r->v, &pq);
  judge(&r->v, &pk);
}

/* ---- SwiGLU / GeGLU (fused gate|up layout) ----------------------------------------------- */

typedef struct glu_st {
  ot_glu_kind kind;
  buf *g, *y, *dy, *dg;
} glu_st;

static ot_status inv_glu_fwd(void *p, ot_context *c, int d) {
  glu_st *s = p;
  return ot_glu_forward(c, s->kind, T(s->g, d), NULL, T(s->y, d));
}
static ot_status inv_glu_bwd(void *p, ot_context *c, int d) {
  glu_st *s = p;
  return ot_glu_backward(c, s->kind, T(s->dy, d), T(s->g, d), NULL, T(s->dg, d), NULL);
}

static void act_ref(ot_glu_kind kind, double g, double *a, double *da) {
  if (kind == OT_GLU_SWIGLU) {
    double sg = 1.0 / (1.0 + exp(-g));
    *a = g * sg;
    *da = sg * (1.0 + g * (1.0 - sg));
  } else {
    double cdf = 0.5 * (1.0 + erf(g / sqrt(2.0)));
    *a = g * cdf;
    *da = cdf + g * exp(-0.5 * g * g) / sqrt(2.0 * 3.14159265358979323846);
  }
}

static void bench_glu(const op_case *c, result *r, ot_glu_kind kind, int bwd) {
  int64_t R = c->d[0], F = c->d[1];
  dtype dt = c->dt;
  glu_st s = {.kind = kind};
  s.g = rand_buf(dt, 2, R, 2 * F, 0, 0, -4, 4);
  s.y = buf_new(dt, 2, R, F, 0, 0);
  double es = (double)dtype_size[dt];
  r->metric = "GB/s";
  ot_status st;
  if (!bwd) {
    buf *outs[1] = {s.y};
    r->rate = (double)R * F * 3 * es / 1e9;
    st = measure(r, inv_glu_fwd, &s, outs, 1);
  } else {
    s.dy = rand_buf(dt, 2, R, F, 0, 0, -1, 1);
    s.dg = buf_new(dt, 2, R, 2 * F, 0, 0);
    buf *outs[1] = {s.dg};
    r->rate = (double)R * F * 5 * es / 1e9;
    st = measure(r, inv_glu_bwd, &s, outs, 1);
  }
  if (!finish(r, st)) return;
  r->rate /= r->ms * 1e-3;
  if (B.cuda) {
    judge_buf(&r->v, bwd ? "dgate" : "out", bwd ? s.dg : s.y, 1);
    return;
  }
  pairs p, pu;
  pairs_init(&p, bwd ? "dgate" : "out", dt, 1);
  pairs_init(&pu, "dup", dt, 1);
  int ns = sample_rows(R, 64, SAMPLE);
  for (int k = 0; k < ns; k++) {
    int64_t row = SAMPLE[k];
    for (int64_t i = 0; i < F; i++) {
      double g = in(s.g, row * 2 * F + i), u = in(s.g, row * 2 * F + F + i), a, da;
      act_ref(kind, g, &a, &da);
      if (!bwd) {
        pairs_add(&p, out(s.y, row * F + i), a * u);
      } else {
        double dy = in(s.dy, row * F + i);
        pairs_add(&p, out(s.dg, row * 2 * F + i), dy * u * da);
        pairs_add(&pu, out(s.dg, row * 2 * F + F + i), dy * a);
      }
    }
  }
  judge(&r->v, &p);
  if (bwd) judge(&r->v, &pu);
}

/* ---- softmax ------------------------------------------------------------------------------ */

typedef struct softmax_st {
  buf *x, *y, *dy, *dx;
} softmax_st;

static ot_status inv_softmax_fwd(void *p, ot_context *c, int d) {
  softmax_st *s = p;
  return ot_softmax_forward(c, T(s->x, d), T(s->y, d));
}
static ot_status inv_softmax_bwd(void *p, ot_context *c, int d) {
  softmax_st *s = p;
  return ot_softmax_backward(c, T(s->dy, d), T(s->y, d), T(s->dx, d));
}

static void bench_softmax(const op_case *c, result *r, int bwd) {
  int64_t R = c->d[0], N = c->d[1];
  dtype dt = c->dt;
  softmax_st s;
  s.x = rand_buf(dt, 2, R, N, 0, 0, -8, 8);
  s.y = buf_new(dt, 2, R, N, 0, 0);
  double es = (double)dtype_size[dt];
  r->metric = "GB/s";
  ot_status st;
  buf *fo[1] = {s.y};
  if (!bwd) {
    r->rate = (double)R * N * 2 * es / 1e9;
    st = measure(r, inv_softmax_fwd, &s, fo, 1);
  } else {
    run_once(inv_softmax_fwd, &s, fo, 1, r);
    if (r->status) return;
    s.dy = rand_buf(dt, 2, R, N, 0, 0, -1, 1);
    s.dx = buf_new(dt, 2, R, N, 0, 0);
    buf *bo[1] = {s.dx};
    r->rate = (double)R * N * 3 * es / 1e9;
    st = measure(r, inv_softmax_bwd, &s, bo, 1);
  }
  if (!finish(r, st)) return;
  r->rate /= r->ms * 1e-3;
  if (B.cuda) {
    judge_buf(&r->v, bwd ? "dx" : "out", bwd ? s.dx : s.y, 1);
    return;
  }
  pairs p;
  pairs_init(&p, bwd ? "dx" : "out", dt, 1);
  int ns = sample_rows(R, 64, SAMPLE);
  for (int k = 0; k < ns; k++) {
    int64_t row = SAMPLE[k], o = row * N;
    if (!bwd) {
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < N; j++) mx = fmax(mx, in(s.x, o + j));
      for (int64_t j = 0; j < N; j++) sum += exp(in(s.x, o + j) - mx);
      for (int64_t j = 0; j < N; j++) pairs_add(&p, out(s.y, o + j), exp(in(s.x, o + j) - mx) / sum);
    } else { /* from the y the backward was given */
      double dot = 0;
      for (int64_t j = 0; j < N; j++) dot += in(s.dy, o + j) * in(s.y, o + j);
      for (int64_t j = 0; j < N; j++)
        pairs_add(&p, out(s.dx, o + j), in(s.y, o + j) * (in(s.dy, o + j) - dot));
    }
  }
  judge(&r->v, &p);
}

/* ---- cross-entropy ------------------------------------------------------------------------- */

typedef struct ce_st {
  ot_cross_entropy_params p;
  buf *logits, *labels, *loss, *lse, *dloss, *dlogits;
} ce_st;

static ot_status inv_ce_fwd(void *p, ot_context *c, int d) {
  ce_st *s = p;
  return ot_cross_entropy_forward(c, &s->p, T(s->logits, d), T(s->labels, d), T(s->loss, d),
                                  T(s->lse, d));
}
static ot_status inv_ce_bwd(void *p, ot_context *c, int d) {
  ce_st *s = p;
  return ot_cross_entropy_backward(c, &s->p, T(s->dloss, d), T(s->logits, d), T(s->labels, d),
                                   T(s->lse, d), T(s->dlogits, d));
}

static void bench_ce(const op_case *c, result *r, int bwd) {
  int64_t N = c->d[0], V = c->d[1];
  dtype dt = c->dt;
  ce_st s = {.p = ot_cross_entropy_default_params()};
  s.logits = rand_buf(dt, 2, N, V, 0, 0, -6, 6);
  s.labels = buf_new(I32, 1, N, 0, 0, 0);
  for (int64_t i = 0; i < N; i++)
    set(s.labels, i, rng_u64() % 20 == 0 ? -100.0 : (double)(rng_u64() % (uint64_t)V));
  upload(s.labels);
  s.loss = buf_new(F32, 1, 1, 0, 0, 0);
  s.lse = buf_new(F32, 1, N, 0, 0, 0);
  double es = (double)dtype_size[dt];
  r->metric = "GB/s";
  ot_status st;
  buf *fo[2] = {s.loss, s.lse};
  if (!bwd) {
    r->rate = (double)N * V * es / 1e9;
    st = measure(r, inv_ce_fwd, &s, fo, 2);
  } else {
    run_once(inv_ce_fwd, &s, fo, 2, r);
    if (r->status) return;
    s.dloss = buf_new(F32, 1, 1, 0, 0, 0);
    set(s.dloss, 0, 1.0);
    upload(s.dloss);
    s.dlogits = buf_new(dt, 2, N, V, 0, 0);
    buf *bo[1] = {s.dlogits};
    r->rate = (double)N * V * 2 * es / 1e9;
    st = measure(r, inv_ce_bwd, &s, bo, 1);
  }
  if (!finish(r, st)) return;
  r->rate /= r->ms * 1e-3;
  if (B.cuda) {
    if (!bwd) judge_buf(&r->v, "loss", s.loss, 1), judge_buf(&r->v, "lse", s.lse, 1);
    else judge_buf(&r->v, "dlogits", s.dlogits, 1);
    return;
  }
  /* float64 lse of every row (the mean loss needs them all). */
  double *lse = malloc((size_t)N * sizeof(double)), loss = 0;
  int64_t valid = 0;
  for (int64_t i = 0; i < N; i++) {
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < V; j++) mx = fmax(mx, in(s.logits, i * V + j));
    for (int64_t j = 0; j < V; j++) sum += exp(in(s.logits, i * V + j) - mx);
    lse[i] = mx + log(sum);
    int64_t lab = (int64_t)in(s.labels, i);
    if (lab != -100) {
      loss += lse[i] - in(s.logits, i * V + lab);
      valid++;
    }
  }
  loss /= (double)valid;
  int ns = sample_rows(N, 64, SAMPLE);
  if (!bwd) {
    pairs pl, pe;
    pairs_init(&pl, "loss", F32, 1);
    pairs_init(&pe, "lse", F32, 1);
    pl.atol = pe.atol = 1e-4;
    pairs_add(&pl, out(s.loss, 0), loss);
    for (int k = 0; k < ns; k++) pairs_add(&pe, out(s.lse, SAMPLE[k]), lse[SAMPLE[k]]);
    judge(&r->v, &pl);
    judge(&r->v, &pe);
  } else {
    pairs pd;
    pairs_init(&pd, "dlogits", dt, 1);
    for (int k = 0; k < ns; k++) {
      int64_t i = SAMPLE[k], lab = (int64_t)in(s.labels, i);
      for (int64_t j = 0; j < V; j++) {
        double ref = lab == -100 ? 0
                                 : (exp(in(s.logits, i * V + j) - lse[i]) - (j == lab)) / (double)valid;
        pairs_add(&pd, out(s.dlogits, i * V + j), ref);
      }
    }
    judge(&r->v, &pd);
  }
  free(lse);
}

/* ---- attention (dense BSHD) ------------------------------------------------------------------- */

typedef struct attn_st {
  ot_attention_params p;
  buf *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
  double *Q, *K, *V, *DO; /* float64 copies of the inputs, for the reference */
} attn_st;

static ot_status inv_attn_fwd(void *p, ot_context *c, int d) {
  attn_st *s = p;
  return ot_attention_forward(c, &s->p, T(s->q, d), T(s->k, d), T(s->v, d), NULL, NULL, T(s->o, d),
                              T(s->lse, d));
}
static ot_status inv_attn_bwd(void *p, ot_context *c, int d) {
  attn_st *s = p;
  return ot_attention_backward(c, &s->p, T(s->q, d), T(s->k, d), T(s->v, d), T(s->o, d),
                               T(s->dout, d), T(s->lse, d), NULL, NULL, T(s->dq, d), T(s->dk, d),
                               T(s->dv, d));
}

/* Probabilities of query row i of (b, h) against every key, float64. Returns lse. */
static double attn_row(attn_st *s, int64_t b, int64_t h, int64_t i, int64_t S, int64_t H,
                       int64_t D, double scale, int causal, double *p) {
  double mx = -INFINITY, sum = 0;
  int64_t kv = (i + 1 < S && causal) ? i + 1 : S;
  for (int64_t j = 0; j < kv; j++) {
    double dot = 0;
    for (int64_t d = 0; d < D; d++)
      dot += s->Q[((b * S + i) * H + h) * D + d] * s->K[((b * S + j) * H + h) * D + d];
    p[j] = dot * scale;
    mx = fmax(mx, p[j]);
  }
  for (int64_t j = 0; j < kv; j++) sum += exp(p[j] - mx);
  double lse = mx + log(sum);
  for (int64_t j = 0; j < kv; j++) p[j] = exp(p[j] - lse);
  for (int64_t j = kv; j < S; j++) p[j] = 0;
  return lse;
}

static void bench_attention(const op_case *c, result *r, int bwd) {
  int64_t Bn = c->d[0], H = c->d[1], S = c->d[2], D = c->d[3];
  dtype dt = c->dt;
  attn_st s = {.p = ot_attention_default_params()};
  s.p.causal = c->causal;
  s.q = rand_buf(dt, 4, Bn, S, H, D, -2, 2);
  s.k = rand_buf(dt, 4, Bn, S, H, D, -2, 2);
  s.v = rand_buf(dt, 4, Bn, S, H, D, -1, 1);
  s.o = buf_new(dt, 4, Bn, S, H, D);
  s.lse = buf_new(F32, 3, Bn, H, S, 0);
  double flops = 4.0 * Bn * H * (double)S * S * D * (c->causal ? 0.5 : 1.0);
  r->metric = "GFLOP/s";
  ot_status st;
  buf *fo[2] = {s.o, s.lse};
  if (!bwd) {
    r->rate = flops / 1e9;
    st = measure(r, inv_attn_fwd, &s, fo, 2);
  } else {
    run_once(inv_attn_fwd, &s, fo, 2, r);
    if (r->status) return;
    s.dout = rand_buf(dt, 4, Bn, S, H, D, -1, 1);
    s.dq = buf_new(dt, 4, Bn, S, H, D);
    s.dk = buf_new(dt, 4, Bn, S, H, D);
    s.dv = buf_new(dt, 4, Bn, S, H, D);
    buf *bo[3] = {s.dq, s.dk, s.dv};
    r->rate = 2.5 * flops / 1e9;
    st = measure(r, inv_attn_bwd, &s, bo, 3);
  }
  if (!finish(r, st)) return;
  r->rate /= r->ms * 1e-3;
  if (B.cuda) {
    if (!bwd) judge_buf(&r->v, "out", s.o, 1), judge_buf(&r->v, "lse", s.lse, 1);
    else judge_buf(&r->v, "dq", s.dq, 2), judge_buf(&r->v, "dk", s.dk, 2), judge_buf(&r->v, "dv", s.dv, 2);
    return;
  }
  double scale = 1.0 / sqrt((double)D);
  double *p = malloc((size_t)S * sizeof(double));
  s.Q = to_f64(s.q);
  s.K = to_f64(s.k);
  s.V = to_f64(s.v);
  if (bwd) s.DO = to_f64(s.dout);
  /* Sampled (b, h, i) rows: a few heads, rows spread over the sequence. */
  int64_t heads[3] = {0, H / 2, H - 1};
  int ns = sample_rows(S, 24, SAMPLE);
  if (!bwd) {
    pairs po, pl;
    pairs_init(&po, "out", dt, 1);
    pairs_init(&pl, "lse", F32, 1);
    pl.atol = 1e-4;
    for (int64_t b = 0; b < Bn; b++)
      for (int hh = 0; hh < 3; hh++)
        for (int k = 0; k < ns; k++) {
          int64_t h = heads[hh], i = SAMPLE[k];
          double l = attn_row(&s, b, h, i, S, H, D, scale, c->causal, p);
          pairs_add(&pl, out(s.lse, (b * H + h) * S + i), l);
          for (int64_t d = 0; d < D; d++) {
            double acc = 0;
            for (int64_t j = 0; j < S; j++) acc += p[j] * s.V[((b * S + j) * H + h) * D + d];
            pairs_add(&po, out(s.o, ((b * S + i) * H + h) * D + d), acc);
          }
        }
    judge(&r->v, &po);
    judge(&r->v, &pl);
  } else {
    /* dq for sampled query rows; dk, dv for sampled key rows (needs every row's P). */
    pairs pq, pk, pv;
    pairs_init(&pq, "dq", dt, 2);
    pairs_init(&pk, "dk", dt, 2);
    pairs_init(&pv, "dv", dt, 2);
    double *P = malloc((size_t)S * S * sizeof(double)), *Dr = malloc((size_t)S * sizeof(double));
    double *dP = malloc((size_t)S * sizeof(double));
    int64_t b = Bn - 1;
    for (int hh = 0; hh < 2; hh++) {
      int64_t h = heads[hh * 2];
      /* float64 forward of the whole head: P, and D_i = dout_i . out_i. */
      for (int64_t i = 0; i < S; i++) {
        attn_row(&s, b, h, i, S, H, D, scale, c->causal, P + i * S);
        double dr = 0;
        for (int64_t d = 0; d < D; d++) {
          double o = 0;
          for (int64_t j = 0; j < S; j++) o += P[i * S + j] * s.V[((b * S + j) * H + h) * D + d];
          dr += o * s.DO[((b * S + i) * H + h) * D + d];
        }
        Dr[i] = dr;
      }
      /* dP_ij = dout_i . v_j; dS_ij = P_ij (dP_ij - D_i). */
      for (int k = 0; k < ns; k++) {
        int64_t i = SAMPLE[k];
        for (int64_t j = 0; j < S; j++) {
          double dot = 0;
          for (int64_t d = 0; d < D; d++)
            dot += s.DO[((b * S + i) * H + h) * D + d] * s.V[((b * S + j) * H + h) * D + d];
          dP[j] = P[i * S + j] * (dot - Dr[i]);
        }
        for (int64_t d = 0; d < D; d++) {
          double acc = 0;
          for (int64_t j = 0; j < S; j++) acc += dP[j] * s.K[((b * S + j) * H + h) * D + d];
          pairs_add(&pq, out(s.dq, ((b * S + i) * H + h) * D + d), acc * scale);
        }
      }
      for (int k = 0; k < ns; k++) {
        int64_t j = SAMPLE[k];
        double dk[512] = {0}, dv[512] = {0};
        if (D > 512) break;
        for (int64_t i = 0; i < S; i++) {
          double pij = P[i * S + j];
          if (pij == 0) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; d++)
            dot += s.DO[((b * S + i) * H + h) * D + d] * s.V[((b * S + j) * H + h) * D + d];
          double ds = pij * (dot - Dr[i]);
          for (int64_t d = 0; d < D; d++) {
            dv[d] += pij * s.DO[((b * S + i) * H + h) * D + d];
            dk[d] += ds * s.Q[((b * S + i) * H + h) * D + d];
          }
        }
        for (int64_t d = 0; d < D; d++) {
          pairs_add(&pk, out(s.dk, ((b * S + j) * H + h) * D + d), dk[d] * scale);
          pairs_add(&pv, out(s.dv, ((b * S + j) * H + h) * D + d), dv[d]);
        }
      }
    }
    judge(&r->v, &pq);
    judge(&r->v, &pk);
    judge(&r->v, &pv);
    free(P);
    free(Dr);
    free(dP);
  }
  free(p);
  free(s.Q);
  free(s.K);
  free(s.V);
  free(s.DO);
}

/* ---- linear ----------------------------------------------------------------------------------- */

typedef struct linear_st {
  buf *x, *w, *b, *y, *dy, *dx, *dw, *db;
} linear_st;

static ot_status inv_linear_fwd(void *p, ot_context *c, int d) {
  linear_st *s = p;
  return ot_linear_forward(c, T(s->x, d), T(s->w, d), T(s->b, d), T(s->y, d));
}
static ot_status inv_linear_bwd(void *p, ot_context *c, int d) {
  linear_st *s = p;
  return ot_linear_backward(c, T(s->dy, d), T(s->x, d), T(s->w, d), T(s->dx, d), T(s->dw, d),
                            T(s->db, d));
}

static void bench_linear(const op_case *c, result *r, int bwd) {
  int64_t M = c->d[0], K = c->d[1], N = c->d[2];
  dtype dt = c->dt;
  linear_st s = {0};
  s.x = rand_buf(dt, 2, M, K, 0, 0, -1, 1);
  s.w = rand_buf(dt, 2, N, K, 0, 0, -1, 1);
  s.b = rand_buf(dt, 1, N, 0, 0, 0, -1, 1);
  r->metric = "GFLOP/s";
  ot_status st;
  if (!bwd) {
    s.y = buf_new(dt, 2, M, N, 0, 0);
    buf *o[1] = {s.y};
    r->rate = 2.0 * M * K * N / 1e9;
    st = measure(r, inv_linear_fwd, &s, o, 1);
  } else {
    s.dy = rand_buf(dt, 2, M, N, 0, 0, -1, 1);
    s.dx = buf_new(dt, 2, M, K, 0, 0);
    s.dw = buf_new(dt, 2, N, K, 0, 0);
    s.db = buf_new(dt, 1, N, 0, 0, 0);
    buf *o[3] = {s.dx, s.dw, s.db};
    r->rate = 4.0 * M * K * N / 1e9;
    st = measure(r, inv_linear_bwd, &s, o, 3);
  }
  if (!finish(r, st)) return;
  r->rate /= r->ms * 1e-3;
  if (B.cuda) {
    if (!bwd) judge_buf(&r->v, "y", s.y, 2);
    else judge_buf(&r->v, "dx", s.dx, 2), judge_buf(&r->v, "dweight", s.dw, 2),
         judge_buf(&r->v, "dbias", s.db, 2);
    return;
  }
  pairs p1, p2, p3;
  int ns = sample_rows(M, 16, SAMPLE);
  if (!bwd) {
    pairs_init(&p1, "y", dt, 1);
    for (int k = 0; k < ns; k++) {
      int64_t m = SAMPLE[k];
      for (int64_t n = 0; n < N; n++) {
        double acc = in(s.b, n);
        for (int64_t kk = 0; kk < K; kk++) acc += in(s.x, m * K + kk) * in(s.w, n * K + kk);
        pairs_add(&p1, out(s.y, m * N + n), acc);
      }
    }
    judge(&r->v, &p1);
    return;
  }
  pairs_init(&p1, "dx", dt, 1);
  pairs_init(&p2, "dweight", dt, 1);
  pairs_init(&p3, "dbias", dt, 1);
  for (int k = 0; k < ns; k++) { /* dx rows m: dy[m,:] W */
    int64_t m = SAMPLE[k];
    for (int64_t kk = 0; kk < K; kk++) {
      double acc = 0;
      for (int64_t n = 0; n < N; n++) acc += in(s.dy, m * N + n) * in(s.w, n * K + kk);
      pairs_add(&p1, out(s.dx, m * K + kk), acc);
    }
  }
  ns = sample_rows(N, 16, SAMPLE);
  for (int k = 0; k < ns; k++) { /* dweight rows n: sum_m dy[m,n] x[m,:] */
    int64_t n = SAMPLE[k];
    for (int64_t kk = 0; kk < K; kk++) {
      double acc = 0;
      for (int64_t m = 0; m < M; m++) acc += in(s.dy, m * N + n) * in(s.x, m * K + kk);
      pairs_add(&p2, out(s.dw, n * K + kk), acc);
    }
  }
  for (int64_t n = 0; n < N; n++) {
    double acc = 0;
    for (int64_t m = 0; m < M; m++) acc += in(s.dy, m * N + n);
    pairs_add(&p3, out(s.db, n), acc);
  }
  judge(&r->v, &p1);
  judge(&r->v, &p2);
  judge(&r->v, &p3);
}

/* ------------------------------------------------------------------------------ */
/* the op table                                                                    */

typedef struct op_def {
  const char *name;
  const char *shape_doc;
  int nd;
  int64_t d[5];
  int causal;
  void (*run)(const op_case *c, result *r);
} op_def;

#define WRAP(fn, call) \
  static void fn(const op_case *c, result *r) { call; }
WRAP(run_rmsnorm_fwd, bench_norm(c, r, 0, 0))
WRAP(run_rmsnorm_bwd, bench_norm(c, r, 0, 1))
WRAP(run_layernorm_fwd, bench_norm(c, r, 1, 0))
WRAP(run_layernorm_bwd, bench_norm(c, r, 1, 1))
WRAP(run_rope_fwd, bench_rope(c, r, 0))
WRAP(run_rope_bwd, bench_rope(c, r, 1))
WRAP(run_swiglu_fwd, bench_glu(c, r, OT_GLU_SWIGLU, 0))
WRAP(run_swiglu_bwd, bench_glu(c, r, OT_GLU_SWIGLU, 1))
WRAP(run_geglu_fwd, bench_glu(c, r, OT_GLU_GEGLU, 0))
WRAP(run_geglu_bwd, bench_glu(c, r, OT_GLU_GEGLU, 1))
WRAP(run_softmax_fwd, bench_softmax(c, r, 0))
WRAP(run_softmax_bwd, bench_softmax(c, r, 1))
WRAP(run_ce_fwd, bench_ce(c, r, 0))
WRAP(run_ce_bwd, bench_ce(c, r, 1))
WRAP(run_attention_fwd, bench_attention(c, r, 0))
WRAP(run_attention_bwd, bench_attention(c, r, 1))
WRAP(run_linear_fwd, bench_linear(c, r, 0))
WRAP(run_linear_bwd, bench_linear(c, r, 1))

/* Default shapes: realistic, and small enough that the whole table runs in well under
 * a minute on a 2-core CPU. */
static const op_def OPS[] = {
    {"rmsnorm_fwd", "ROWSxH", 2, {4096, 4096}, 0, run_rmsnorm_fwd},
    {"rmsnorm_bwd", "ROWSxH", 2, {4096, 4096}, 0, run_rmsnorm_bwd},
    {"layernorm_fwd", "ROWSxH (with residual)", 2, {4096, 4096}, 0, run_layernorm_fwd},
    {"layernorm_bwd", "ROWSxH (with residual)", 2, {4096, 4096}, 0, run_layernorm_bwd},
    {"rope_fwd", "TOKENSxHQxHKVxD", 4, {4096, 32, 8, 128}, 0, run_rope_fwd},
    {"rope_bwd", "TOKENSxHQxHKVxD", 4, {4096, 32, 8, 128}, 0, run_rope_bwd},
    {"swiglu_fwd", "ROWSxF (gate|up fused)", 2, {2048, 8192}, 0, run_swiglu_fwd},
    {"swiglu_bwd", "ROWSxF (gate|up fused)", 2, {2048, 8192}, 0, run_swiglu_bwd},
    {"geglu_fwd", "ROWSxF (gate|up fused)", 2, {2048, 8192}, 0, run_geglu_fwd},
    {"geglu_bwd", "ROWSxF (gate|up fused)", 2, {2048, 8192}, 0, run_geglu_bwd},
    {"softmax_fwd", "ROWSxN", 2, {4096, 4096}, 0, run_softmax_fwd},
    {"softmax_bwd", "ROWSxN", 2, {4096, 4096}, 0, run_softmax_bwd},
    {"cross_entropy_fwd", "NxV", 2, {1024, 32000}, 0, run_ce_fwd},
    {"cross_entropy_bwd", "NxV", 2, {1024, 32000}, 0, run_ce_bwd},
    {"attention_fwd", "BxHxSxD", 4, {1, 8, 1024, 64}, 1, run_attention_fwd},
    {"attention_bwd", "BxHxSxD", 4, {1, 8, 1024, 64}, 1, run_attention_bwd},
    {"linear_fwd", "MxKxN", 3, {512, 2048, 2048}, 0, run_linear_fwd},
    {"linear_bwd", "MxKxN", 3, {512, 2048, 2048}, 0, run_linear_bwd},
};
#define NOPS ((int)(sizeof OPS / sizeof OPS[0]))

/* ------------------------------------------------------------------------------ */
/* output                                                                          */

static void cpu_model(char *buf_, size_t n) {
  snprintf(buf_, n, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "model name", 10)) {
      char *p = strchr(line, ':');
      if (p) {
        p++;
        while (*p == ' ' || *p == '\t') p++;
        p[strcspn(p, "\n")] = 0;
        snprintf(buf_, n, "%s", p);
      }
      break;
    }
  }
  fclose(f);
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f), fputc(*s, f);
    else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
    else fputc(*s, f);
  }
  fputc('"', f);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: ot-bench [--op NAME] [--shape AxBx..] [--dtype bf16|f16|f32] [--causal 0|1]\n"
          "                [--threads N] [--reps N] [--json FILE] [--cpu] [--list]\n"
          "ops and their default shapes:\n");
  for (int i = 0; i < NOPS; i++) {
    fprintf(f, "  %-18s %-24s ", OPS[i].name, OPS[i].shape_doc);
    for (int k = 0; k < OPS[i].nd; k++) fprintf(f, "%s%lld", k ? "x" : "", (long long)OPS[i].d[k]);
    fprintf(f, "%s\n", OPS[i].causal ? " causal" : "");
  }
}

int main(int argc, char **argv) {
  const char *only = NULL, *json = NULL, *shape = NULL;
  int threads = 0, force_cpu = 0, causal = -1;
  dtype dt = BF16;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--op") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(a, "--json") && i + 1 < argc) json = argv[++i];
    else if (!strcmp(a, "--shape") && i + 1 < argc) shape = argv[++i];
    else if (!strcmp(a, "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(a, "--reps") && i + 1 < argc) B.reps = atoi(argv[++i]);
    else if (!strcmp(a, "--causal") && i + 1 < argc) causal = atoi(argv[++i]);
    else if (!strcmp(a, "--cpu")) force_cpu = 1;
    else if (!strcmp(a, "--dtype") && i + 1 < argc) {
      const char *d = argv[++i];
      if (!strcmp(d, "bf16") || !strcmp(d, "bfloat16")) dt = BF16;
      else if (!strcmp(d, "f16") || !strcmp(d, "float16")) dt = F16;
      else if (!strcmp(d, "f32") || !strcmp(d, "float32")) dt = F32;
      else die("--dtype: %s is not bf16, f16 or f32", d);
    } else if (!strcmp(a, "--list") || !strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (shape && !only) die("--shape needs --op");

  /* Backend: CUDA when built and a device exists, else the CPU. */
  ot_context_options o = ot_context_default_options();
  o.num_threads = threads;
  if (ot_context_create(&o, &B.cpu) != OT_OK) die("CPU context: %s", ot_last_error());
  B.ctx = B.cpu;
  char device[300];
#ifdef OT_BENCH_CUDA
  if (!force_cpu) {
    ot_context_options oc = ot_context_default_options();
    oc.device_type = kDLCUDA;
    ot_context *cctx = NULL;
    if (ot_context_create(&oc, &cctx) == OT_OK) {
      B.ctx = cctx;
      B.cuda = 1;
      struct cudaDeviceProp prop;
      CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
      snprintf(device, sizeof device, "%s", prop.name);
    } else {
      printf("CUDA backend not used: %s\n", ot_last_error());
    }
  }
#else
  (void)force_cpu;
#endif
  if (!B.cuda) {
    char model[256];
    cpu_model(model, sizeof model);
    snprintf(device, sizeof device, "cpu: %s", model);
  }
  int nthreads = threads;
#ifdef _OPENMP
  if (!nthreads) nthreads = omp_get_max_threads();
#endif
  printf("ot-bench: ops_transformer %s on %s", ot_version_string(), device);
  if (!B.cuda) printf(" (%d threads)", nthreads > 0 ? nthreads : 0);
  printf("; check against %s\n", B.cuda ? "the CPU backend" : "a float64 reference");

  result results[NOPS];
  int nres = 0, failed = 0, unsupported = 0;
  printf("\n%-18s %-22s %-5s %10s %16s %10s  %s\n", "op", "shape", "dtype", "time_ms", "rate",
         "max_err", "check");
  double t_start = now_s();
  int matched = 0;
  for (int i = 0; i < NOPS; i++) {
    const op_def *od = &OPS[i];
    if (only && strcmp(only, od->name)) continue;
    matched = 1;
    op_case c = {.op = od->name, .nd = od->nd, .dt = dt, .causal = od->causal};
    memcpy(c.d, od->d, sizeof c.d);
    if (causal >= 0) c.causal = causal;
    if (shape) {
      const char *p = shape;
      int k = 0;
      while (*p && k < 5) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v <= 0) die("--shape %s: expected %s", shape, od->shape_doc);
        c.d[k++] = v;
        p = *end ? end + 1 : end;
      }
      if (k != od->nd) die("--shape %s: %s takes %s", shape, od->name, od->shape_doc);
    }
    result *r = &results[nres++];
    memset(r, 0, sizeof *r);
    snprintf(r->op, sizeof r->op, "%s", od->name);
    int len = 0;
    for (int k = 0; k < c.nd; k++)
      len += snprintf(r->shape + len, sizeof r->shape - (size_t)len, "%s%lld", k ? "x" : "",
                      (long long)c.d[k]);
    if (c.causal) snprintf(r->shape + len, sizeof r->shape - (size_t)len, " causal");
    r->dt = dt;
    rng_state = 0x1234567ull + (uint64_t)i * 7919u;
    od->run(&c, r);
    bufs_free();
    if (r->status == 1) {
      unsupported++;
      printf("%-18s %-22s %-5s %10s %16s %10s  unsupported (%s)\n", r->op, r->shape,
             dtype_name[dt], "-", "-", "-", r->msg);
    } else if (r->status == 2) {
      failed++;
      printf("%-18s %-22s %-5s %10s %16s %10s  FAIL: %s\n", r->op, r->shape, dtype_name[dt], "-",
             "-", "-", r->msg);
    } else {
      char rate[32];
      snprintf(rate, sizeof rate, "%.1f %s", r->rate, r->metric);
      if (r->v.fail) failed++;
      printf("%-18s %-22s %-5s %10.3f %16s %10.2e  %s%s%s\n", r->op, r->shape, dtype_name[dt],
             r->ms, rate, r->v.max_err, r->v.fail ? "FAIL" : "pass", r->v.fail ? ": " : "",
             r->v.fail ? r->v.note : "");
    }
    fflush(stdout);
  }
  if (!matched) die("--op %s: no such op (see --list)", only);
  printf("\n%d ops: %d passed, %d failed, %d unsupported (%.1f s)\n", nres,
         nres - failed - unsupported, failed, unsupported, now_s() - t_start);

  if (json) {
    FILE *f = fopen(json, "w");
    if (!f) die("cannot write %s", json);
    time_t tt = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&tt));
    char cmd[2048] = "";
    size_t cl = 0;
    for (int i = 0; i < argc && cl < sizeof cmd - 1; i++)
      cl += (size_t)snprintf(cmd + cl, sizeof cmd - cl, "%s%s", i ? " " : "", i ? argv[i] : "ot-bench");
    const char *commit = getenv("OT_BENCH_COMMIT");
    fprintf(f, "{\n  \"bench\": \"ot-bench\",\n  \"device\": ");
    json_str(f, device);
    fprintf(f, ",\n  \"date\": \"%s\",\n  \"commit\": ", date);
    json_str(f, commit ? commit : "unknown");
    fprintf(f, ",\n  \"command\": ");
    json_str(f, cmd);
    fprintf(f, ",\n  \"threads\": %d,\n  \"ceilings\": {},\n  \"rows\": [", B.cuda ? 0 : nthreads);
    for (int i = 0; i < nres; i++) {
      result *r = &results[i];
      fprintf(f, "%s\n    {\"op\": \"%s\", \"case\": \"%s %s\", ", i ? "," : "", r->op, r->shape,
              dtype_name[r->dt]);
      if (r->status == 0)
        fprintf(f,
                "\"metric\": \"%s\", \"ours\": %.4g, \"time_ms\": %.4f, \"max_err\": %.3g, "
                "\"check\": \"%s\", ",
                r->metric, r->rate, r->ms, r->v.max_err, r->v.fail ? "fail" : "pass");
      else
        fprintf(f, "\"metric\": null, \"ours\": null, \"check\": \"%s\", ",
                r->status == 1 ? "unsupported" : "error");
      fprintf(f, "\"peers\": {}, \"ratio_best_peer\": null, \"fraction_of_ceiling\": null}");
    }
    fprintf(f, "\n  ]\n}\n");
    fclose(f);
  }
  if (B.ctx != B.cpu) ot_context_destroy(B.ctx);
  ot_context_destroy(B.cpu);
  return failed ? 1 : 0;
}
