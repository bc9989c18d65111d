/*
 * cases_linear.c -- ot_linear_forward / ot_linear_backward against float64 references.
 *
 * Inputs are scaled like a real layer so that every output is O(1): x, dy in [-1, 1),
 * weight in [-1, 1) / sqrt(K), bias in [-1, 1). The reference is computed in float64
 * from the stored (rounded) inputs, so the only errors measured are the library's:
 * float32 accumulation over the reduction length R (K for y, N for dx, M for dweight
 * and dbias) and the final rounding to the storage dtype. Tolerance (tol_lin): the sum
 * of the two, tol_for(dtype, 1) for the one output rounding plus tol_for(float32, k)
 * with k = max(1, sqrt(R) / 8) for the accumulation -- the float32 rounding error of
 * a length-R sum grows like sqrt(R) eps (measured: 5e-7 at R = 1024, 6e-6 for
 * dweight at R = 600 whose values are ~sqrt(R) larger; the factor 1/8 leaves room for
 * other summation orders, e.g. the CUDA backend's).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static tol tol_lin(DLDataType dt, int64_t reduction) {
  double k = sqrt((double)reduction) / 8.0;
  tol a = tol_for(dt, 1), b = tol_for(DT_F32, k > 1.0 ? k : 1.0);
  if (dt.code == kDLFloat && dt.bits == 32) return b;
  a.atol += b.atol;
  a.rtol += b.rtol;
  return a;
}

/* A [d0, cols] (d1 == 0) or [d0, d1, cols] tensor whose rows are `pad` elements
 * apart beyond their length (pad 0: contiguous). */
static tbuf *rows_tensor(const backend *be, DLDataType dt, int64_t d0, int64_t d1, int64_t cols,
                         int64_t pad) {
  int64_t rs = cols + pad;
  if (d1 == 0) {
    int64_t shape[2] = {d0, cols}, strides[2] = {rs, 1};
    return tb_new_strided(be, dt, 2, shape, pad ? strides : NULL);
  }
  int64_t shape[3] = {d0, d1, cols}, strides[3] = {d1 * rs, rs, 1};
  return tb_new_strided(be, dt, 3, shape, pad ? strides : NULL);
}

/* The padding between rows of a rows_tensor kept its bytes (compared with a snapshot
 * taken before the op). */
static void check_gaps(test_run *tr, const char *what, tbuf *b, const void *snap, int64_t rows,
                       int64_t cols, int64_t pad) {
  if (!pad || rows < 2 || cols == 0) return; /* an empty tensor has no storage */
  tb_sync(b);
  size_t es = dt_size(b->t.dtype);
  for (int64_t r = 0; r + 1 < rows; r++) {
    size_t off = (size_t)(r * (cols + pad) + cols) * es;
    if (memcmp((const char *)b->host + off, (const char *)snap + off, (size_t)pad * es)) {
      tr_fail(tr, "%s: padding after row %lld was written", what, (long long)r);
      return;
    }
  }
}

/* ---- float64 references ------------------------------------------------------------ */

/* y [M, N] = x [M, K] w[N, K]^T + b (b may be NULL). */
static void ref_forward(const double *x, const double *w, const double *b, int64_t M, int64_t K,
                        int64_t N, double *y) {
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double s = b ? b[n] : 0.0;
      for (int64_t k = 0; k < K; k++) s += x[m * K + k] * w[n * K + k];
      y[m * N + n] = s;
    }
}

/* dx [M, K] = dy w; dw [N, K] = dy^T x; db [N] = column sums of dy. */
static void ref_backward(const double *dy, const double *x, const double *w, int64_t M, int64_t K,
                         int64_t N, double *dx, double *dw, double *db) {
  for (int64_t m = 0; m < M; m++)
    for (int64_t k = 0; k < K; k++) {
      double s = 0;
      for (int64_t n = 0; n < N; n++) s += dy[m * N + n] * w[n * K + k];
      dx[m * K + k] = s;
    }
  for (int64_t i = 0; i < N * K; i++) dw[i] = 0;
  for (int64_t n = 0; n < N; n++) db[n] = 0;
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double g = dy[m * N + n];
      db[n] += g;
      for (int64_t k = 0; k < K; k++) dw[n * K + k] += g * x[m * K + k];
    }
}

/* ---- the case table ------------------------------------------------------------------ */

typedef struct lin_case {
  int64_t d0, d1; /* leading shape: [d0] (d1 == 0) or [d0, d1] */
  int64_t K, N;
  int64_t x_pad, y_pad; /* row padding of x / y (dy and dx in the backward) */
} lin_case;

static const lin_case cases[] = {
    {1, 0, 1, 1, 0, 0},       {3, 0, 5, 7, 0, 0},       {17, 0, 64, 33, 0, 0},
    {128, 0, 257, 96, 0, 0},  {64, 0, 1024, 1024, 0, 0}, {17, 0, 64, 33, 3, 5},
    {128, 0, 257, 96, 7, 1},  {2, 3, 40, 24, 0, 0},     {2, 3, 40, 24, 4, 2},
    {1, 0, 300, 5, 0, 0},     {8, 0, 100, 50, 2, 3},    {9, 0, 100, 50, 0, 0},
    {3, 0, 70, 130, 1, 1},     {300, 0, 3, 1, 0, 0},     {600, 0, 700, 1, 9, 0},
    /* zero sizes: no rows; K = 0 (y = bias or 0); N = 0 */
    {0, 0, 8, 5, 0, 0},       {4, 0, 0, 6, 0, 0},       {4, 0, 6, 0, 0, 0},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* Shapes that make the float16 / bfloat16 path split its operands into several panels
 * (the panels hold about 2^21-2^22 floats, so K = 140000 leaves 16-29 rows each): x
 * and weight panels both split; x in one panel reused across weight panels; weight in
 * one panel reused across row panels (dx). */
static const lin_case panel_cases[] = {
    {33, 0, 140000, 31, 0, 0}, {9, 0, 140000, 31, 1, 2}, {33, 0, 140000, 20, 0, 0}};
#define N_PANEL_CASES (sizeof panel_cases / sizeof panel_cases[0])

static const char *shape_name(const lin_case *c, char *buf, size_t n) {
  if (c->d1) snprintf(buf, n, "[%lld,%lld]", (long long)c->d0, (long long)c->d1);
  else snprintf(buf, n, "[%lld]", (long long)c->d0);
  return buf;
}

/* tag: "" or the implementation forced (small-M cases), part of the case's name */
static void forward_case_tag(test_run *tr, DLDataType dt, const lin_case *c, bool with_bias,
                             const char *tag) {
  char lead[48];
  if (!tr_begin(tr, "forward %s x%s K=%lld N=%lld%s pad=%lld/%lld%s", dt_name(dt),
                shape_name(c, lead, sizeof lead), (long long)c->K, (long long)c->N,
                with_bias ? " bias" : "", (long long)c->x_pad, (long long)c->y_pad, tag))
    return;
  const backend *be = tr->be;
  rng r = tr_rng(tr);
  const int64_t M = c->d0 * (c->d1 ? c->d1 : 1), K = c->K, N = c->N;
  tbuf *x = rows_tensor(be, dt, c->d0, c->d1, K, c->x_pad);
  int64_t wshape[2] = {N, K}, bshape[1] = {N};
  tbuf *w = tb_new(be, dt, 2, wshape);
  tbuf *b = with_bias ? tb_new(be, dt, 1, bshape) : NULL;
  tbuf *y = rows_tensor(be, dt, c->d0, c->d1, N, c->y_pad);
  double ws = 1.0 / sqrt((double)(K > 0 ? K : 1));
  tb_fill_uniform(x, &r, -1, 1);
  tb_fill_uniform(w, &r, -ws, ws);
  if (b) tb_fill_uniform(b, &r, -1, 1);
  void *snap = tb_snapshot(y);
  double t0 = now_s();
  ot_status st = ot_linear_forward(be->ctx, tb_dl(x), tb_dl(w), b ? tb_dl(b) : NULL, tb_dl(y));
  if (tr_ok(tr, st, "ot_linear_forward")) {
    tb_sync(y);
    double t1 = now_s();
    if (tr->verbose && M * N * K >= (1 << 24))
      printf("     %.2f ms, %.1f GFLOP/s\n", 1e3 * (t1 - t0), 2e-9 * (double)(M * N * K) / (t1 - t0));
    double *xd = tb_to_f64(x), *wd = tb_to_f64(w), *bd = b ? tb_to_f64(b) : NULL;
    double *ref = (double *)malloc((size_t)(M * N > 0 ? M * N : 1) * sizeof *ref);
    ref_forward(xd, wd, bd, M, K, N, ref);
    check_close(tr, "y", y, ref, tol_lin(dt, K));
    check_gaps(tr, "y", y, snap, M, N, c->y_pad);
    free(xd);
    free(wd);
    free(bd);
    free(ref);
  }
  free(snap);
  tb_free(x);
  tb_free(w);
  tb_free(b);
  tb_free(y);
  tr_end(tr);
}

static void forward_case(test_run *tr, DLDataType dt, const lin_case *c, bool with_bias) {
  forward_case_tag(tr, dt, c, with_bias, "");
}

/* Few rows (decode): the CUDA backend's matrix-vector kernel for M <= 16 (src/cuda/linear.cu)
 * -- 16-byte vector path (K a multiple of the vector, aligned rows), scalar path (odd K,
 * x rows padded off alignment), split-K (few columns, long K: float32 partials summed in a
 * second kernel), M = 1 .. 16 and a 3-D x, and N beyond one wave of blocks (two rows per
 * warp at M <= 4 within two waves). Run with the automatic dispatch, and on CUDA
 * forced on and off with OT_LINEAR_GEMV (at one row also launched without PDL). */
static const lin_case small_m_cases[] = {
    {1, 0, 4096, 256, 0, 0},  {1, 0, 4104, 40, 0, 0},  {1, 0, 8, 1, 0, 0},
    {1, 0, 12000, 7, 0, 0},   {2, 0, 1000, 96, 0, 0},  {3, 0, 77, 65, 0, 0},
    {4, 0, 1024, 1000, 8, 3}, {5, 0, 256, 129, 1, 0},  {7, 0, 640, 2050, 0, 1},
    {8, 0, 2048, 33, 0, 0},   {9, 0, 520, 300, 0, 2},  {2, 3, 128, 72, 0, 0},
    {13, 0, 999, 31, 5, 0},   {16, 0, 4096, 64, 0, 0}, {16, 0, 33, 17, 0, 0},
    {3, 0, 8200, 24, 0, 0},   {2, 0, 3001, 5, 0, 0},   {16, 0, 6000, 10, 0, 3},
    {12, 0, 512, 50, 0, 0},   {16, 0, 3200, 100, 8, 1}, {1, 0, 96, 17, 0, 0},
    /* N beyond one wave of resident blocks. At M <= 4 each warp takes two rows (n and
     * n + warps; linear.cu, gemv_balance) where one row per warp would take one to two
     * waves: 4 B S < N <= 8 B S, about, for B blocks per SM and S SMs. On the H200 (S 132;
     * sm_90a registers at M <= 4: B 7-10 for the vector kernels, 10-16 for the scalar ones)
     * N 6144 / 6001 / 9001 below take two rows per warp in every dtype: M = 1 / 2 / 3 / 4,
     * vector and scalar path, padded x / y, and odd N, whose last warps' second row is past
     * N (a skipped second row leaves y's poison: the case fails). Re-check B when the
     * kernel's registers change. N 20001 / 12289 are beyond two waves (one row per warp). */
    {1, 0, 4096, 6144, 0, 0}, {1, 0, 64, 20001, 0, 0}, {3, 0, 72, 12289, 2, 1},
    {1, 0, 128, 6001, 0, 0},  {2, 0, 128, 6001, 0, 2}, {4, 0, 64, 6001, 8, 1},
    {3, 0, 33, 9001, 1, 0},   {1, 0, 31, 9001, 0, 0},
};
#define N_SMALL_M_CASES (sizeof small_m_cases / sizeof small_m_cases[0])

static void small_m_forward(test_run *tr, DLDataType dt) {
  for (size_t i = 0; i < N_SMALL_M_CASES; i++) {
    const lin_case *c = &small_m_cases[i];
    forward_case(tr, dt, c, i % 2 == 0);
    if (!tr->be->is_cuda) continue;
    env_saved gemv = env_set("OT_LINEAR_GEMV", "1");
    forward_case_tag(tr, dt, c, true, " gemv");
    forward_case_tag(tr, dt, c, false, " gemv");
    if (c->d0 == 1 && !c->d1) { /* one row, launched without PDL */
      env_saved pdl = env_set("OT_LINEAR_PDL", "0");
      forward_case_tag(tr, dt, c, i % 4 != 0, " gemv no-pdl");
      env_restore(&pdl);
    }
    setenv("OT_LINEAR_GEMV", "0", 1);
    forward_case_tag(tr, dt, c, i % 2 != 0, " cublaslt");
    env_restore(&gemv);
  }
}

/* Two small-M linears back to back, the second reading the first's output (y1 = x W1^T,
 * y2 = y1 W2^T, y1 poisoned before): on sm_90 the second is a programmatic dependent
 * launch that starts streaming W2 before the first has finished, and must read y1 only
 * after it is complete. y2 is checked against the float64 product of the y1 the first
 * wrote (downloaded after both ran), so a y2 computed from stale or NaN y1 fails; N2 = 24
 * takes the split-K path (its sum kernel is a dependent launch too). Three times, each
 * from poisoned y1 / y2 and checked: a pair run after another would find the same y1
 * values left there, and a later pair would overwrite the y2 of an earlier one. */
static void small_m_chain(test_run *tr, DLDataType dt, int64_t M, int64_t K1, int64_t K2,
                          int64_t N2) {
  if (!tr_begin(tr, "forward %s chained small-M x[%lld] K=%lld -> %lld -> %lld", dt_name(dt),
                (long long)M, (long long)K1, (long long)K2, (long long)N2))
    return;
  const backend *be = tr->be;
  rng r = tr_rng(tr);
  int64_t xs[2] = {M, K1}, w1s[2] = {K2, K1}, y1s[2] = {M, K2}, w2s[2] = {N2, K2}, y2s[2] = {M, N2};
  tbuf *x = tb_new(be, dt, 2, xs), *w1 = tb_new(be, dt, 2, w1s), *y1 = tb_new(be, dt, 2, y1s);
  tbuf *w2 = tb_new(be, dt, 2, w2s), *y2 = tb_new(be, dt, 2, y2s);
  tb_fill_uniform(x, &r, -1, 1);
  tb_fill_uniform(w1, &r, -1.0 / sqrt((double)K1), 1.0 / sqrt((double)K1));
  tb_fill_uniform(w2, &r, -1.0 / sqrt((double)K2), 1.0 / sqrt((double)K2));
  tb_poison(y1);
  tb_poison(y2);
  env_saved gemv = env_set("OT_LINEAR_GEMV", "1");
  const DLTensor *dx = tb_dl(x), *dw1 = tb_dl(w1), *dw2 = tb_dl(w2);
  double *xd = tb_to_f64(x), *w1d = tb_to_f64(w1), *w2d = tb_to_f64(w2);
  double *ref1 = (double *)malloc((size_t)(M * K2) * sizeof *ref1);
  double *ref2 = (double *)malloc((size_t)(M * N2) * sizeof *ref2);
  ref_forward(xd, w1d, NULL, M, K1, K2, ref1);
  for (int rep = 0; rep < 3 && !tr->case_failed; rep++) {
    if (rep > 0) { /* after tb_sync waited for the previous pair */
      tb_poison(y1);
      tb_poison(y2);
    }
    const DLTensor *dy1 = tb_dl(y1), *dy2 = tb_dl(y2);
    ot_status st = ot_linear_forward(be->ctx, dx, dw1, NULL, dy1);
    if (st == OT_OK) st = ot_linear_forward(be->ctx, dy1, dw2, NULL, dy2);
    if (!tr_ok(tr, st, "ot_linear_forward")) break;
    tb_sync(y1);
    tb_sync(y2);
    double *y1d = tb_to_f64(y1);
    ref_forward(y1d, w2d, NULL, M, K2, N2, ref2);
    check_close(tr, "y1", y1, ref1, tol_lin(dt, K1));
    check_close(tr, "y2", y2, ref2, tol_lin(dt, K2));
    free(y1d);
  }
  env_restore(&gemv);
  free(xd);
  free(w1d);
  free(w2d);
  free(ref1);
  free(ref2);
  tb_free(x);
  tb_free(w1);
  tb_free(y1);
  tb_free(w2);
  tb_free(y2);
  tr_end(tr);
}

enum { OUT_DX = 1, OUT_DW = 2, OUT_DB = 4, OUT_ALL = 7 };

static void backward_case_tag(test_run *tr, DLDataType dt, const lin_case *c, int outs,
                              const char *tag) {
  char lead[48];
  if (!tr_begin(tr, "backward %s dy%s K=%lld N=%lld pad=%lld/%lld%s%s%s%s", dt_name(dt),
                shape_name(c, lead, sizeof lead), (long long)c->K, (long long)c->N,
                (long long)c->x_pad, (long long)c->y_pad, outs & OUT_DX ? " dx" : "",
                outs & OUT_DW ? " dweight" : "", outs & OUT_DB ? " dbias" : "", tag))
    return;
  const backend *be = tr->be;
  rng r = tr_rng(tr);
  const int64_t M = c->d0 * (c->d1 ? c->d1 : 1), K = c->K, N = c->N;
  /* x and dx share x_pad, dy y_pad */
  tbuf *dy = rows_tensor(be, dt, c->d0, c->d1, N, c->y_pad);
  tbuf *x = rows_tensor(be, dt, c->d0, c->d1, K, c->x_pad);
  int64_t wshape[2] = {N, K}, bshape[1] = {N};
  tbuf *w = tb_new(be, dt, 2, wshape);
  tbuf *dx = outs & OUT_DX ? rows_tensor(be, dt, c->d0, c->d1, K, c->x_pad + 1) : NULL;
  tbuf *dw = outs & OUT_DW ? tb_new(be, dt, 2, wshape) : NULL;
  tbuf *db = outs & OUT_DB ? tb_new(be, dt, 1, bshape) : NULL;
  double ws = 1.0 / sqrt((double)(K > 0 ? K : 1));
  tb_fill_uniform(dy, &r, -1, 1);
  tb_fill_uniform(x, &r, -1, 1);
  tb_fill_uniform(w, &r, -ws, ws);
  void *snap = dx ? tb_snapshot(dx) : NULL;
  double t0 = now_s();
  ot_status st = ot_linear_backward(be->ctx, tb_dl(dy), tb_dl(x), tb_dl(w), dx ? tb_dl(dx) : NULL,
                                    dw ? tb_dl(dw) : NULL, db ? tb_dl(db) : NULL);
  if (tr_ok(tr, st, "ot_linear_backward")) {
    if (dx) tb_sync(dx);
    if (dw) tb_sync(dw);
    if (db) tb_sync(db);
    double t1 = now_s();
    if (tr->verbose && M * N * K >= (1 << 24))
      printf("     %.2f ms\n", 1e3 * (t1 - t0));
    double *dyd = tb_to_f64(dy), *xd = tb_to_f64(x), *wd = tb_to_f64(w);
    double *rdx = (double *)malloc((size_t)(M * K > 0 ? M * K : 1) * sizeof(double));
    double *rdw = (double *)malloc((size_t)(N * K > 0 ? N * K : 1) * sizeof(double));
    double *rdb = (double *)malloc((size_t)(N > 0 ? N : 1) * sizeof(double));
    ref_backward(dyd, xd, wd, M, K, N, rdx, rdw, rdb);
    if (dx) {
      check_close(tr, "dx", dx, rdx, tol_lin(dt, N));
      check_gaps(tr, "dx", dx, snap, M, K, c->x_pad + 1);
    }
    if (dw) check_close(tr, "dweight", dw, rdw, tol_lin(dt, M));
    if (db) check_close(tr, "dbias", db, rdb, tol_lin(dt, M));
    free(dyd);
    free(xd);
    free(wd);
    free(rdx);
    free(rdw);
    free(rdb);
  }
  free(snap);
  tb_free(dy);
  tb_free(x);
  tb_free(w);
  tb_free(dx);
  tb_free(dw);
  tb_free(db);
  tr_end(tr);
}

static void backward_case(test_run *tr, DLDataType dt, const lin_case *c, int outs) {
  backward_case_tag(tr, dt, c, outs, "");
}

/* cuBLASLt's best algorithms timed on the first call of each GEMM description, the
 * fastest kept (OT_GEMM_AUTOTUNE, linear.cu): the timing runs write the outputs several
 * times (gaps of padded rows must stay as they were; dbias, the BGRADB epilogue's output,
 * is overwritten by each run, not summed) and whichever algorithm wins, the outputs are
 * the products. Each forward twice: the first call tunes, the second (fresh tensors, the
 * same description) runs the tuned entry found in the cache. The small-M kernel off, so
 * every case (one row too) goes through cuBLASLt. */
static void autotune_cases(test_run *tr, DLDataType dt) {
  env_saved tune = env_set("OT_GEMM_AUTOTUNE", "4");
  env_saved gemv = env_set("OT_LINEAR_GEMV", "0");
  const lin_case qkv = {1, 0, 4096, 6144, 0, 0}; /* the 8B decode's qkv, one row */
  for (size_t i = 0; i <= N_CASES; i++) {
    const lin_case *c = i < N_CASES ? &cases[i] : &qkv;
    const bool bias = i % 2 == 0 || i == N_CASES; /* qkv with a bias */
    forward_case_tag(tr, dt, c, bias, " autotune");
    forward_case_tag(tr, dt, c, bias, " autotune cached");
    if (i < N_CASES) backward_case_tag(tr, dt, c, OUT_ALL, " autotune");
  }
  env_restore(&gemv);
  env_restore(&tune);
}

/* ---- gradient mode: the backward against finite differences of ref_forward ---------- */

typedef struct fd_state {
  int64_t M, K, N;
} fd_state;

/* in = [x (M*K), w (N*K), b (N)] -> y (M*N). */
static void fd_forward(void *state, const double *in, double *out) {
  const fd_state *s = (const fd_state *)state;
  ref_forward(in, in + s->M * s->K, in + s->M * s->K + s->N * s->K, s->M, s->K, s->N, out);
}

static void grad_case(test_run *tr, int64_t d0, int64_t d1, int64_t K, int64_t N) {
  if (!tr_begin(tr, "grad float32 x[%lld%s%.0lld] K=%lld N=%lld", (long long)d0, d1 ? "," : "",
                (long long)d1, (long long)K, (long long)N))
    return;
  const backend *be = tr->be;
  rng r = tr_rng(tr);
  const DLDataType dt = DT_F32;
  const int64_t M = d0 * (d1 ? d1 : 1);
  tbuf *dy = rows_tensor(be, dt, d0, d1, N, 0);
  tbuf *x = rows_tensor(be, dt, d0, d1, K, 0);
  int64_t wshape[2] = {N, K}, bshape[1] = {N};
  tbuf *w = tb_new(be, dt, 2, wshape);
  tbuf *dx = rows_tensor(be, dt, d0, d1, K, 0);
  tbuf *dw = tb_new(be, dt, 2, wshape);
  tbuf *db = tb_new(be, dt, 1, bshape);
  tb_fill_uniform(dy, &r, -1, 1);
  tb_fill_uniform(x, &r, -1, 1);
  tb_fill_uniform(w, &r, -1, 1);
  ot_status st =
      ot_linear_backward(be->ctx, tb_dl(dy), tb_dl(x), tb_dl(w), tb_dl(dx), tb_dl(dw), tb_dl(db));
  if (tr_ok(tr, st, "ot_linear_backward")) {
    tb_sync(dx);
    tb_sync(dw);
    tb_sync(db);
    const int64_t n_in = M * K + N * K + N;
    double *in = (double *)malloc((size_t)n_in * sizeof(double));
    double *grad = (double *)malloc((size_t)n_in * sizeof(double));
    double *xd = tb_to_f64(x), *wd = tb_to_f64(w), *dyd = tb_to_f64(dy);
    memcpy(in, xd, (size_t)(M * K) * sizeof(double));
    memcpy(in + M * K, wd, (size_t)(N * K) * sizeof(double));
    for (int64_t n = 0; n < N; n++) in[M * K + N * K + n] = rng_uniform(&r, -1, 1);
    fd_state s = {M, K, N};
    fd_vjp(fd_forward, &s, in, n_in, M * N, dyd, grad, 1e-3);
    /* linear in every input: the differences are exact up to float64 rounding, so the
     * float32 results of the library set the error (sums of at most 6 terms). */
    check_close(tr, "dx", dx, grad, tol_for(dt, 2));
    check_close(tr, "dweight", dw, grad + M * K, tol_for(dt, 2));
    check_close(tr, "dbias", db, grad + M * K + N * K, tol_for(dt, 2));
    free(in);
    free(grad);
    free(xd);
    free(wd);
    free(dyd);
  }
  tb_free(dy);
  tb_free(x);
  tb_free(w);
  tb_free(dx);
  tb_free(dw);
  tb_free(db);
  tr_end(tr);
}

/* ---- bad inputs ------------------------------------------------------------------------ */

static bool is_f32(DLDataType t) { return t.code == kDLFloat && t.bits == 32; }

/* A mutable copy of a tensor's DLTensor, to break one property at a time. */
static DLTensor dl_copy(tbuf *b) { return *tb_dl(b); }

static void bad_forward(test_run *tr, DLDataType dt) {
  if (!tr_begin(tr, "forward bad inputs %s", dt_name(dt))) return;
  const backend *be = tr->be;
  ot_context *ctx = be->ctx;
  rng r = tr_rng(tr);
  const int64_t M = 4, K = 6, N = 5;
  int64_t xs[2] = {M, K}, ws[2] = {N, K}, bs[1] = {N}, ys[2] = {M, N};
  tbuf *x = tb_new(be, dt, 2, xs), *w = tb_new(be, dt, 2, ws), *b = tb_new(be, dt, 1, bs);
  tbuf *y = tb_new(be, dt, 2, ys);
  tb_fill_uniform(x, &r, -1, 1);
  tb_fill_uniform(w, &r, -1, 1);
  tb_fill_uniform(b, &r, -1, 1);
  void *snap = tb_snapshot(y);
  const DLDataType other = is_f32(dt) ? DT_F16 : DT_F32;
  const size_t es = dt_size(dt);
  const ot_status E = OT_ERR_INVALID_ARGUMENT;
  const char *op = "ot_linear_forward";
  DLTensor t;
  int64_t bad_shape[3], bad_strides[3];

  tr_expect_error(tr, ot_linear_forward(NULL, tb_dl(x), tb_dl(w), tb_dl(b), tb_dl(y)), E, op, "ctx");
  tr_expect_error(tr, ot_linear_forward(ctx, NULL, tb_dl(w), tb_dl(b), tb_dl(y)), E, op, "x:");
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), NULL, tb_dl(b), tb_dl(y)), E, op, "weight:");
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), tb_dl(w), tb_dl(b), NULL), E, op, "y:");
  t = dl_copy(x); t.data = NULL;
  tr_expect_error(tr, ot_linear_forward(ctx, &t, tb_dl(w), tb_dl(b), tb_dl(y)), E, op, "x: data is NULL");
  t = dl_copy(x); t.dtype = DT_I32;
  tr_expect_error(tr, ot_linear_forward(ctx, &t, tb_dl(w), tb_dl(b), tb_dl(y)), E, op, "x:");
  t = dl_copy(x); t.byte_offset = es == 4 ? 2 : 1;
  tr_expect_error(tr, ot_linear_forward(ctx, &t, tb_dl(w), tb_dl(b), tb_dl(y)), E, op, "x: data pointer");
  t = dl_copy(x); bad_strides[0] = 1; bad_strides[1] = M; t.strides = bad_strides;
  tr_expect_error(tr, ot_linear_forward(ctx, &t, tb_dl(w), tb_dl(b), tb_dl(y)), E, op, "x: the last dimension");
  t = dl_copy(w); t.dtype = other;
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), &t, tb_dl(b), tb_dl(y)), E, op, "weight: dtype");
  t = dl_copy(w); t.ndim = 1;
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), &t, tb_dl(b), tb_dl(y)), E, op, "weight: expected 2");
  t = dl_copy(w); bad_shape[0] = N - 1; bad_shape[1] = K - 1; t.shape = bad_shape; /* K mismatch */
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), &t, tb_dl(b), tb_dl(y)), E, op, "weight: shape");
  t = dl_copy(w); bad_shape[0] = N - 1; bad_shape[1] = K; t.shape = bad_shape;
  bad_strides[0] = K + 1; bad_strides[1] = 1; t.strides = bad_strides; /* non-contiguous */
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), &t, tb_dl(b), tb_dl(y)), E, op, "weight: must be contiguous");
  t = dl_copy(w); bad_shape[0] = N - 1; bad_shape[1] = K; t.shape = bad_shape; /* N mismatch vs y */
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), &t, NULL, tb_dl(y)), E, op, "y: shape");
  t = dl_copy(b); bad_shape[0] = N - 1; t.shape = bad_shape;
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), tb_dl(w), &t, tb_dl(y)), E, op, "bias: shape");
  t = dl_copy(b); t.dtype = other;
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), tb_dl(w), &t, tb_dl(y)), E, op, "bias: dtype");
  t = dl_copy(b); t.ndim = 2; bad_shape[0] = 1; bad_shape[1] = N; t.shape = bad_shape; t.strides = NULL;
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), tb_dl(w), &t, tb_dl(y)), E, op, "bias: expected 1");
  t = dl_copy(y); t.dtype = other;
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), tb_dl(w), tb_dl(b), &t), E, op, "y: dtype");
  t = dl_copy(y); bad_shape[0] = M - 1; bad_shape[1] = N; t.shape = bad_shape;
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), tb_dl(w), tb_dl(b), &t), E, op, "y: leading");
  t = dl_copy(y); bad_shape[0] = 1; bad_shape[1] = M; bad_shape[2] = N; t.shape = bad_shape;
  t.ndim = 3; t.strides = NULL;
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), tb_dl(w), tb_dl(b), &t), E, op, "y: leading");
  t = dl_copy(y); t.byte_offset = es == 4 ? 2 : 1;
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), tb_dl(w), tb_dl(b), &t), E, op, "y: data pointer");
  if (!be->is_cuda) {
    t = dl_copy(y); t.device.device_type = kDLCUDA;
    tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), tb_dl(w), tb_dl(b), &t), E, op, "y: tensor is on device");
  }
  /* y laid over x's storage ([M, N] fits in x's [M, K] since N < K): overlap */
  t = dl_copy(x); bad_shape[0] = M; bad_shape[1] = N; t.shape = bad_shape; t.strides = NULL;
  void *xsnap = tb_snapshot(x);
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), tb_dl(w), NULL, &t), E, op, "y: must not overlap x");
  if (!tb_unchanged(x, xsnap)) tr_fail(tr, "x was written by a rejected call");
  free(xsnap);
  t = dl_copy(w); bad_shape[0] = M; bad_shape[1] = N; t.shape = bad_shape; t.strides = NULL; /* M*N <= N*K */
  tr_expect_error(tr, ot_linear_forward(ctx, tb_dl(x), tb_dl(w), NULL, &t), E, op, "y: must not overlap weight");
  t = dl_copy(b); bad_shape[0] = 1; bad_shape[1] = N; t.shape = bad_shape; t.ndim = 2; t.strides = NULL;
  { /* one row, so y [1, N] lies exactly on bias */
    DLTensor x1 = dl_copy(x);
    int64_t x1s[2] = {1, K};
    x1.shape = x1s;
    x1.strides = NULL;
    tr_expect_error(tr, ot_linear_forward(ctx, &x1, tb_dl(w), tb_dl(b), &t), E, op, "y: must not overlap bias");
  }
  if (!tb_unchanged(y, snap)) tr_fail(tr, "y was written by a rejected call");
  free(snap);
  tb_free(x);
  tb_free(w);
  tb_free(b);
  tb_free(y);
  tr_end(tr);
}

static void bad_backward(test_run *tr, DLDataType dt) {
  if (!tr_begin(tr, "backward bad inputs %s", dt_name(dt))) return;
  const backend *be = tr->be;
  ot_context *ctx = be->ctx;
  rng r = tr_rng(tr);
  const int64_t M = 4, K = 6, N = 5;
  int64_t xs[2] = {M, K}, ws[2] = {N, K}, bs[1] = {N}, ys[2] = {M, N};
  tbuf *dy = tb_new(be, dt, 2, ys), *x = tb_new(be, dt, 2, xs), *w = tb_new(be, dt, 2, ws);
  tbuf *dx = tb_new(be, dt, 2, xs), *dw = tb_new(be, dt, 2, ws), *db = tb_new(be, dt, 1, bs);
  tb_fill_uniform(dy, &r, -1, 1);
  tb_fill_uniform(x, &r, -1, 1);
  tb_fill_uniform(w, &r, -1, 1);
  void *s_dx = tb_snapshot(dx), *s_dw = tb_snapshot(dw), *s_db = tb_snapshot(db);
  void *s_dy = tb_snapshot(dy), *s_x = tb_snapshot(x), *s_w = tb_snapshot(w);
  const DLDataType other = is_f32(dt) ? DT_BF16 : DT_F32;
  const size_t es = dt_size(dt);
  const ot_status E = OT_ERR_INVALID_ARGUMENT;
  const char *op = "ot_linear_backward";
  DLTensor t;
  int64_t bad_shape[3], bad_strides[3];
#define BWD(DY, X, W, DX, DW, DB) ot_linear_backward(ctx, DY, X, W, DX, DW, DB)
  const DLTensor *Ddy = tb_dl(dy), *Dx = tb_dl(x), *Dw = tb_dl(w), *Ddx = tb_dl(dx),
                 *Ddw = tb_dl(dw), *Ddb = tb_dl(db);

  tr_expect_error(tr, BWD(Ddy, Dx, Dw, NULL, NULL, NULL), E, op, "at least one output");
  tr_expect_error(tr, ot_linear_backward(NULL, Ddy, Dx, Dw, Ddx, Ddw, Ddb), E, op, "ctx");
  tr_expect_error(tr, BWD(NULL, Dx, Dw, Ddx, Ddw, Ddb), E, op, "dy:");
  tr_expect_error(tr, BWD(Ddy, NULL, Dw, Ddx, Ddw, Ddb), E, op, "x:");
  tr_expect_error(tr, BWD(Ddy, Dx, NULL, Ddx, Ddw, Ddb), E, op, "weight:");
  t = dl_copy(dy); t.data = NULL;
  tr_expect_error(tr, BWD(&t, Dx, Dw, Ddx, Ddw, Ddb), E, op, "dy: data is NULL");
  t = dl_copy(dy); t.dtype = DT_I64;
  tr_expect_error(tr, BWD(&t, Dx, Dw, Ddx, Ddw, Ddb), E, op, "dy:");
  t = dl_copy(x); t.dtype = other;
  tr_expect_error(tr, BWD(Ddy, &t, Dw, Ddx, Ddw, Ddb), E, op, "x: dtype");
  t = dl_copy(x); bad_shape[0] = M + 1; bad_shape[1] = K; t.shape = bad_shape;
  tr_expect_error(tr, BWD(Ddy, &t, Dw, NULL, Ddw, NULL), E, op, "x: leading");
  t = dl_copy(w); bad_shape[0] = N + 1; bad_shape[1] = K; t.shape = bad_shape; t.strides = NULL;
  tr_expect_error(tr, BWD(Ddy, Dx, &t, Ddx, NULL, NULL), E, op, "weight: shape");
  t = dl_copy(w); bad_shape[0] = N; bad_shape[1] = K - 1; t.shape = bad_shape; t.strides = NULL;
  tr_expect_error(tr, BWD(Ddy, Dx, &t, Ddx, NULL, NULL), E, op, "weight: shape");
  t = dl_copy(w); t.ndim = 3; bad_shape[0] = 1; bad_shape[1] = N; bad_shape[2] = K;
  t.shape = bad_shape; t.strides = NULL;
  tr_expect_error(tr, BWD(Ddy, Dx, &t, Ddx, NULL, NULL), E, op, "weight: expected 2");
  t = dl_copy(dx); bad_shape[0] = M; bad_shape[1] = K + 1; t.shape = bad_shape; t.strides = NULL;
  tr_expect_error(tr, BWD(Ddy, Dx, Dw, &t, Ddw, Ddb), E, op, "dx: shape");
  t = dl_copy(dx); bad_strides[0] = 1; bad_strides[1] = M; t.strides = bad_strides;
  tr_expect_error(tr, BWD(Ddy, Dx, Dw, &t, Ddw, Ddb), E, op, "dx: the last dimension");
  t = dl_copy(dx); t.dtype = other;
  tr_expect_error(tr, BWD(Ddy, Dx, Dw, &t, Ddw, Ddb), E, op, "dx: dtype");
  t = dl_copy(dw); bad_shape[0] = N; bad_shape[1] = K - 1; t.shape = bad_shape; t.strides = NULL;
  tr_expect_error(tr, BWD(Ddy, Dx, Dw, Ddx, &t, Ddb), E, op, "dweight: shape");
  t = dl_copy(dw); t.byte_offset = es == 4 ? 2 : 1;
  tr_expect_error(tr, BWD(Ddy, Dx, Dw, Ddx, &t, Ddb), E, op, "dweight: data pointer");
  t = dl_copy(dw); bad_strides[0] = K + 1; bad_strides[1] = 1; t.strides = bad_strides;
  tr_expect_error(tr, BWD(Ddy, Dx, Dw, Ddx, &t, Ddb), E, op, "dweight: must be contiguous");
  t = dl_copy(db); bad_shape[0] = N + 1; t.shape = bad_shape;
  tr_expect_error(tr, BWD(Ddy, Dx, Dw, Ddx, Ddw, &t), E, op, "dbias: shape");
  t = dl_copy(db); t.dtype = other;
  tr_expect_error(tr, BWD(Ddy, Dx, Dw, Ddx, Ddw, &t), E, op, "dbias: dtype");
  if (!be->is_cuda) {
    t = dl_copy(db); t.device.device_type = kDLCUDA;
    tr_expect_error(tr, BWD(Ddy, Dx, Dw, Ddx, Ddw, &t), E, op, "dbias: tensor is on device");
  }
  /* overlaps: outputs on inputs and on each other (no in-place aliasing for linear) */
  {
    DLTensor o = dl_copy(w);
    tr_expect_error(tr, BWD(Ddy, Dx, Dw, Ddx, &o, Ddb), E, op, "dweight: must not overlap weight");
    o = dl_copy(dy); o.ndim = 1; bad_shape[0] = N; o.shape = bad_shape; o.strides = NULL;
    tr_expect_error(tr, BWD(Ddy, Dx, Dw, Ddx, Ddw, &o), E, op, "dbias: must not overlap dy");
    o = dl_copy(x); /* dx exactly on x: no in-place for linear */
    tr_expect_error(tr, BWD(Ddy, Dx, Dw, &o, Ddw, Ddb), E, op, "dx: must not overlap x");
    o = dl_copy(dw); o.ndim = 1; bad_shape[0] = N; o.shape = bad_shape; o.strides = NULL;
    tr_expect_error(tr, BWD(Ddy, Dx, Dw, Ddx, Ddw, &o), E, op, "dbias: must not overlap dweight");
    o = dl_copy(dw); bad_shape[0] = M; bad_shape[1] = K; o.shape = bad_shape; o.strides = NULL;
    tr_expect_error(tr, BWD(Ddy, Dx, Dw, &o, Ddw, Ddb), E, op, "dweight: must not overlap dx");
  }
#undef BWD
  if (!tb_unchanged(dx, s_dx) || !tb_unchanged(dw, s_dw) || !tb_unchanged(db, s_db))
    tr_fail(tr, "an output was written by a rejected call");
  if (!tb_unchanged(dy, s_dy) || !tb_unchanged(x, s_x) || !tb_unchanged(w, s_w))
    tr_fail(tr, "an input was written by a rejected call");
  free(s_dx);
  free(s_dw);
  free(s_db);
  free(s_dy);
  free(s_x);
  free(s_w);
  tb_free(dy);
  tb_free(x);
  tb_free(w);
  tb_free(dx);
  tb_free(dw);
  tb_free(db);
  tr_end(tr);
}

static void run(test_run *tr) {
  if (tr->grad) {
    grad_case(tr, 1, 0, 1, 1);
    grad_case(tr, 3, 0, 5, 7);
    grad_case(tr, 2, 2, 3, 2);
    grad_case(tr, 4, 0, 6, 5);
    return;
  }
  const DLDataType dts[3] = {DT_F32, DT_BF16, DT_F16};
  for (int d = 0; d < 3; d++) {
    for (size_t i = 0; i < N_CASES; i++) {
      forward_case(tr, dts[d], &cases[i], true);
      forward_case(tr, dts[d], &cases[i], false);
    }
    small_m_forward(tr, dts[d]);
    if (tr->be->is_cuda && d > 0) {
      small_m_chain(tr, dts[d], 1, 4096, 4096, 4096);
      small_m_chain(tr, dts[d], 1, 2048, 8192, 24);
      small_m_chain(tr, dts[d], 3, 1024, 2048, 40);
      autotune_cases(tr, dts[d]);
    }
    for (size_t i = 0; i < N_CASES; i++) {
      backward_case(tr, dts[d], &cases[i], OUT_ALL);
      /* the subsets on the small and the strided shapes */
      if (cases[i].K * cases[i].N <= 64 * 64 || cases[i].x_pad) {
        backward_case(tr, dts[d], &cases[i], OUT_DX);
        backward_case(tr, dts[d], &cases[i], OUT_DW);
        backward_case(tr, dts[d], &cases[i], OUT_DB);
        backward_case(tr, dts[d], &cases[i], OUT_DX | OUT_DB);
        backward_case(tr, dts[d], &cases[i], OUT_DW | OUT_DB);
      }
    }
    if (d > 0)
      for (size_t i = 0; i < N_PANEL_CASES; i++) {
        forward_case(tr, dts[d], &panel_cases[i], true);
        backward_case(tr, dts[d], &panel_cases[i], OUT_ALL);
      }
    bad_forward(tr, dts[d]);
    bad_backward(tr, dts[d]);
  }
}

const test_suite suite_linear = {"linear", run};
