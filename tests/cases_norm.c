/*
 * cases_norm.c -- RMSNorm and LayerNorm, forward and backward, with the fused residual.
 *
 * Normal mode: every (op, dtype, hidden size, row count, variant) against a float64
 * reference computed from the exact stored inputs; the variants cover fused / unfused,
 * weight and bias NULL, saved or recomputed statistics, strided rows, 1-D and 3-D
 * shapes and each allowed in-place aliasing. Then consistency checks (fused forward ==
 * unfused forward on residual_out, bit for bit; backward with saved stats == with
 * recomputed stats; determinism) and bad-input cases.
 * Gradient mode: the backward ops (float32, small shapes) against central finite
 * differences of the float64 forward.
 *
 * Tolerances (tol_for(dtype, k)):
 *  - out (forward): k = 1. One rounding to the storage dtype after a float32 row
 *    reduction that is far below that rounding for bf16 / fp16, and ~1e-7 * sqrt(H)
 *    relative for float32.
 *  - residual_out: exact (x + residual is computed in float32 and rounded once, as the
 *    reference does).
 *  - mean / rstd (float32): k = 1.
 *  - dx (backward): k = 1: a difference of terms of the size of g * rstd (some
 *    cancellation, float32 row sums), then one rounding to storage.
 *  - dweight / dbias: k = 2: sums over up to 33 rows in float32 (per-thread partials),
 *    then one rounding; the factor leaves room for other reduction orders (CUDA).
 *  All of these pass with k = 0.5 on the CPU (checked over several seeds), so the
 *  margin is about 2x (4x for dweight / dbias).
 *  - gradient mode: tol_for(float32, 10) against finite differences (step 1e-5).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const double EPS = 1e-5;

/* ---- float64 references -------------------------------------------------------------- */

/* h [rows, H] -> out [rows, H], mean / rstd [rows] (either may be NULL). w, b NULL mean
 * 1 and 0. */
static void ref_forward(bool ln, const double *h, const double *w, const double *b, double eps,
                        int64_t rows, int64_t H, double *out, double *mean, double *rstd) {
  for (int64_t r = 0; r < rows; r++) {
    const double *hr = h + r * H;
    double mu = 0, ss = 0;
    if (ln) {
      for (int64_t i = 0; i < H; i++) mu += hr[i];
      mu /= (double)H;
    }
    for (int64_t i = 0; i < H; i++) ss += (hr[i] - mu) * (hr[i] - mu);
    double rs = 1.0 / sqrt(ss / (double)H + eps);
    if (mean) mean[r] = mu;
    if (rstd) rstd[r] = rs;
    for (int64_t i = 0; i < H; i++) {
      double y = (hr[i] - mu) * rs;
      if (w) y *= w[i];
      if (b && ln) y += b[i];
      out[r * H + i] = y;
    }
  }
}

/* Analytic backward. dx [rows, H] (+ dres when given); dw, db [H] (may be NULL). */
static void ref_backward(bool ln, const double *h, const double *w, const double *dy,
                         const double *dres, double eps, int64_t rows, int64_t H, double *dx,
                         double *dw, double *db) {
  if (dw) memset(dw, 0, (size_t)H * sizeof *dw);
  if (db) memset(db, 0, (size_t)H * sizeof *db);
  for (int64_t r = 0; r < rows; r++) {
    const double *hr = h + r * H, *dyr = dy + r * H;
    double mu = 0, ss = 0;
    if (ln) {
      for (int64_t i = 0; i < H; i++) mu += hr[i];
      mu /= (double)H;
    }
    for (int64_t i = 0; i < H; i++) ss += (hr[i] - mu) * (hr[i] - mu);
    double rs = 1.0 / sqrt(ss / (double)H + eps);
    double sum_g = 0, sum_gx = 0;
    for (int64_t i = 0; i < H; i++) {
      double g = dyr[i] * (w ? w[i] : 1.0), xh = (hr[i] - mu) * rs;
      sum_g += g;
      sum_gx += g * xh;
      if (dw) dw[i] += dyr[i] * xh;
      if (db) db[i] += dyr[i];
    }
    for (int64_t i = 0; i < H; i++) {
      double g = dyr[i] * (w ? w[i] : 1.0), xh = (hr[i] - mu) * rs;
      /* RMSNorm: d/dh of h*rs*w is rs*g - h*rs^3*sum(g*h)/H = rs*(g - xh*mean(g*xh)). */
      double v = ln ? rs * (g - sum_g / (double)H - xh * sum_gx / (double)H)
                    : rs * (g - xh * sum_gx / (double)H);
      dx[r * H + i] = v + (dres ? dres[r * H + i] : 0.0);
    }
  }
}

/* ---- helpers -------------------------------------------------------------------------- */

static const char *op_name(bool ln, bool bwd) {
  return ln ? (bwd ? "ot_layernorm_backward" : "ot_layernorm_forward")
            : (bwd ? "ot_rmsnorm_backward" : "ot_rmsnorm_forward");
}

static const DLTensor *dl_or_null(tbuf *b) { return b ? tb_dl(b) : NULL; }

/* A [rows, H] tensor (shape given by ndim / shape) with an optional row padding (2-D
 * only), filled uniformly in [lo, hi). */
static tbuf *new_act(const backend *be, DLDataType dt, int ndim, const int64_t *shape,
                     int64_t pad, rng *r, double lo, double hi) {
  tbuf *b;
  if (pad > 0 && ndim == 2) {
    int64_t st[2] = {shape[1] + pad, 1};
    b = tb_new_strided(be, dt, ndim, shape, st);
  } else {
    b = tb_new(be, dt, ndim, shape);
  }
  if (r) tb_fill_uniform(b, r, lo, hi);
  return b;
}

/* The per-row statistic tensor: x's leading shape, or [1] / 0-d for 1-D x. */
static tbuf *new_stat(const backend *be, int ndim, const int64_t *shape, bool as_0d) {
  if (ndim == 1) return as_0d ? tb_new(be, DT_F32, 0, shape) : tb_new(be, DT_F32, 1, (int64_t[]){1});
  return tb_new(be, DT_F32, ndim - 1, shape);
}

/* Elements between rows of a strided 2-D output must keep their poison. */
static void check_gaps(test_run *tr, const char *what, tbuf *b, const void *before) {
  if (b->t.ndim != 2 || b->strides[0] == b->shape[1]) return;
  size_t es = dt_size(b->t.dtype);
  for (int64_t r = 0; r + 1 < b->shape[0]; r++) {
    size_t lo = (size_t)(r * b->strides[0] + b->shape[1]) * es;
    size_t hi = (size_t)((r + 1) * b->strides[0]) * es;
    if (memcmp((const char *)b->host + lo, (const char *)before + lo, hi - lo)) {
      tr_fail(tr, "%s: padding after row %lld was written", what, (long long)r);
      return;
    }
  }
}

/* ---- forward cases ------------------------------------------------------------------- */

typedef struct fwd_case {
  bool ln;
  DLDataType dt;
  int ndim;
  int64_t shape[3];
  bool fused, weight, bias, save_mean, save_rstd, stat_0d;
  int alias; /* 0 none, 1 out = x, 2 residual_out = x, 3 residual_out = residual */
  int64_t xpad, rpad, opad, ropad;
  const char *variant;
  double xoff;    /* added to every x (contiguous x only) */
  double outlier; /* x[r, 0] of every row when not 0 (contiguous x only) */
} fwd_case;

static void run_forward(test_run *tr, const fwd_case *c) {
  int64_t H = c->shape[c->ndim - 1], rows = 1;
  for (int i = 0; i < c->ndim - 1; i++) rows *= c->shape[i];
  if (!tr_begin(tr, "%s %s %s rows=%lld H=%lld", c->ln ? "layernorm" : "rmsnorm",
                dt_name(c->dt), c->variant, (long long)rows, (long long)H))
    return;
  const backend *be = tr->be;
  rng r = tr_rng(tr);
  tbuf *x = new_act(be, c->dt, c->ndim, c->shape, c->xpad, &r, -2 + c->xoff, 2 + c->xoff);
  if (c->outlier != 0)
    for (int64_t i = 0; i < rows; i++) tb_set(x, i * H, c->outlier);
  tbuf *res = c->fused ? new_act(be, c->dt, c->ndim, c->shape, c->rpad, &r, -2, 2) : NULL;
  tbuf *w = NULL, *b = NULL;
  if (c->weight) {
    w = tb_new(be, c->dt, 1, &H);
    tb_fill_uniform(w, &r, -1.5, 1.5);
  }
  if (c->ln && c->bias) {
    b = tb_new(be, c->dt, 1, &H);
    tb_fill_uniform(b, &r, -1, 1);
  }
  tbuf *out = c->alias == 1 ? x : new_act(be, c->dt, c->ndim, c->shape, c->opad, NULL, 0, 0);
  tbuf *rout = NULL;
  if (c->fused)
    rout = c->alias == 2 ? x : c->alias == 3 ? res
                             : new_act(be, c->dt, c->ndim, c->shape, c->ropad, NULL, 0, 0);
  tbuf *mean = c->ln && c->save_mean ? new_stat(be, c->ndim, c->shape, c->stat_0d) : NULL;
  tbuf *rstd = c->save_rstd ? new_stat(be, c->ndim, c->shape, c->stat_0d) : NULL;

  int64_t n = rows * H;
  double *x64 = tb_to_f64(x), *h64 = (double *)malloc((size_t)n * sizeof(double));
  double *res64 = res ? tb_to_f64(res) : NULL;
  for (int64_t i = 0; i < n; i++) h64[i] = res ? dt_round(c->dt, x64[i] + res64[i]) : x64[i];
  double *w64 = w ? tb_to_f64(w) : NULL, *b64 = b ? tb_to_f64(b) : NULL;
  double *ref = (double *)malloc((size_t)n * sizeof(double));
  double *ref_mean = (double *)malloc((size_t)rows * sizeof(double));
  double *ref_rstd = (double *)malloc((size_t)rows * sizeof(double));
  ref_forward(c->ln, h64, w64, b64, EPS, rows, H, ref, ref_mean, ref_rstd);
  void *out_before = c->alias == 1 ? NULL : tb_snapshot(out);

  ot_status st = c->ln ? ot_layernorm_forward(be->ctx, tb_dl(x), dl_or_null(res), dl_or_null(w),
                                              dl_or_null(b), (float)EPS, tb_dl(out),
                                              dl_or_null(rout), dl_or_null(mean), dl_or_null(rstd))
                       : ot_rmsnorm_forward(be->ctx, tb_dl(x), dl_or_null(res), dl_or_null(w),
                                            (float)EPS, tb_dl(out), dl_or_null(rout),
                                            dl_or_null(rstd));
  if (tr_ok(tr, st, op_name(c->ln, false))) {
    tb_sync(out);
    check_close(tr, "out", out, ref, tol_for(c->dt, 1));
    if (out_before) check_gaps(tr, "out", out, out_before);
    if (rout) {
      tb_sync(rout);
      check_close(tr, "residual_out", rout, h64, (tol){0, 0});
    }
    if (mean) {
      tb_sync(mean);
      check_close(tr, "mean", mean, ref_mean, tol_for(DT_F32, 1));
    }
    if (rstd) {
      tb_sync(rstd);
      check_close(tr, "rstd", rstd, ref_rstd, tol_for(DT_F32, 1));
    }
  }
  tr_end(tr);
  free(out_before);
  free(x64), free(h64), free(res64), free(w64), free(b64), free(ref), free(ref_mean),
      free(ref_rstd);
  if (out != x) tb_free(out);
  if (rout && rout != x && rout != res) tb_free(rout);
  tb_free(x), tb_free(res), tb_free(w), tb_free(b), tb_free(mean), tb_free(rstd);
}

/* ---- backward cases -------------------------------------------------------------------- */

typedef struct bwd_case {
  bool ln;
  DLDataType dt;
  int ndim;
  int64_t shape[3];
  bool dres, weight, stats, dweight, dbias, stat_0d;
  int alias; /* 0 none, 1 dx = dy, 2 dx = dresidual_out */
  int64_t pad; /* row padding of dy and h (2-D only) */
  const char *variant;
  const char *tag; /* appended to the case name, or NULL */
} bwd_case;

/* Runs the backward; fills the reference and compares. */
static void run_backward(test_run *tr, const bwd_case *c) {
  int64_t H = c->shape[c->ndim - 1], rows = 1;
  for (int i = 0; i < c->ndim - 1; i++) rows *= c->shape[i];
  if (!tr_begin(tr, "%s backward %s %s rows=%lld H=%lld%s", c->ln ? "layernorm" : "rmsnorm",
                dt_name(c->dt), c->variant, (long long)rows, (long long)H, c->tag ? c->tag : ""))
    return;
  const backend *be = tr->be;
  rng r = tr_rng(tr);
  tbuf *dy = new_act(be, c->dt, c->ndim, c->shape, c->pad, &r, -1, 1);
  /* An offset on h so that LayerNorm's mean matters. */
  tbuf *h = new_act(be, c->dt, c->ndim, c->shape, c->pad + 1, &r, -1.5, 2.5);
  tbuf *dres = c->dres ? new_act(be, c->dt, c->ndim, c->shape, 0, &r, -1, 1) : NULL;
  tbuf *w = NULL;
  if (c->weight) {
    w = tb_new(be, c->dt, 1, &H);
    tb_fill_uniform(w, &r, -1.5, 1.5);
  }
  int64_t n = rows * H;
  double *dy64 = tb_to_f64(dy), *h64 = tb_to_f64(h), *dres64 = dres ? tb_to_f64(dres) : NULL;
  double *w64 = w ? tb_to_f64(w) : NULL;
  tbuf *mean = NULL, *rstd = NULL;
  if (c->stats) {
    double *m = (double *)malloc((size_t)rows * sizeof(double));
    double *rs = (double *)malloc((size_t)rows * sizeof(double));
    double *tmp = (double *)malloc((size_t)n * sizeof(double));
    ref_forward(c->ln, h64, NULL, NULL, EPS, rows, H, tmp, m, rs);
    rstd = new_stat(be, c->ndim, c->shape, c->stat_0d);
    for (int64_t i = 0; i < rows; i++) tb_set(rstd, i, rs[i]);
    if (c->ln) {
      mean = new_stat(be, c->ndim, c->shape, c->stat_0d);
      for (int64_t i = 0; i < rows; i++) tb_set(mean, i, m[i]);
    }
    free(m), free(rs), free(tmp);
  }
  tbuf *dx = c->alias == 1 ? dy : c->alias == 2 ? dres
                                : new_act(be, c->dt, c->ndim, c->shape, 2, NULL, 0, 0);
  tbuf *dw = c->weight && c->dweight ? tb_new(be, c->dt, 1, &H) : NULL;
  tbuf *db = c->ln && c->dbias ? tb_new(be, c->dt, 1, &H) : NULL;

  double *ref_dx = (double *)malloc((size_t)n * sizeof(double));
  double *ref_dw = (double *)malloc((size_t)H * sizeof(double));
  double *ref_db = (double *)malloc((size_t)H * sizeof(double));
  ref_backward(c->ln, h64, w64, dy64, dres64, EPS, rows, H, ref_dx, ref_dw, ref_db);
  void *dx_before = c->alias ? NULL : tb_snapshot(dx);

  ot_status st =
      c->ln ? ot_layernorm_backward(be->ctx, tb_dl(dy), dl_or_null(dres), tb_dl(h), dl_or_null(w),
                                    dl_or_null(mean), dl_or_null(rstd), (float)EPS, tb_dl(dx),
                                    dl_or_null(dw), dl_or_null(db))
            : ot_rmsnorm_backward(be->ctx, tb_dl(dy), dl_or_null(dres), tb_dl(h), dl_or_null(w),
                                  dl_or_null(rstd), (float)EPS, tb_dl(dx), dl_or_null(dw));
  if (tr_ok(tr, st, op_name(c->ln, true))) {
    tb_sync(dx);
    check_close(tr, "dx", dx, ref_dx, tol_for(c->dt, 1));
    if (dx_before) check_gaps(tr, "dx", dx, dx_before);
    if (dw) {
      tb_sync(dw);
      check_close(tr, "dweight", dw, ref_dw, tol_for(c->dt, 2));
    }
    if (db) {
      tb_sync(db);
      check_close(tr, "dbias", db, ref_db, tol_for(c->dt, 2));
    }
  }
  tr_end(tr);
  free(dx_before);
  free(dy64), free(h64), free(dres64), free(w64), free(ref_dx), free(ref_dw), free(ref_db);
  if (dx != dy && dx != dres) tb_free(dx);
  tb_free(dy), tb_free(h), tb_free(dres), tb_free(w), tb_free(mean), tb_free(rstd),
      tb_free(dw), tb_free(db);
}

/* ---- shapes ---------------------------------------------------------------------------- */

static const DLDataType *const DTYPES[] = {&DT_F32, &DT_F16, &DT_BF16};
static const int64_t HIDDEN[] = {1, 7, 64, 257, 4096, 8192};
static const int64_t ROWS[] = {1, 3, 33};

/* 2-D [rows, H]; or, for the "3-D" variants, [3, rows / 3, H] (1-D [H] for one row). */
static void set_shape(int *ndim, int64_t *shape, int64_t rows, int64_t H, bool other_rank) {
  if (!other_rank) {
    *ndim = 2, shape[0] = rows, shape[1] = H;
  } else if (rows == 1) {
    *ndim = 1, shape[0] = H;
  } else {
    *ndim = 3, shape[0] = 3, shape[1] = rows / 3, shape[2] = H;
  }
}

/* A forward case with weight, bias and both statistics, the rest zero. */
static fwd_case fwd_defaults(bool ln, DLDataType dt) {
  fwd_case c;
  memset(&c, 0, sizeof c);
  c.ln = ln;
  c.dt = dt;
  c.weight = c.bias = c.save_mean = c.save_rstd = true;
  return c;
}

/* Forward variant v (0..5) of the table for hidden size H: sets the flags and the name. */
static void set_fwd_variant(fwd_case *c, int v, int64_t H) {
  switch (v) {
    case 0: c->variant = "plain"; break;
    case 1: c->variant = "fused"; c->fused = true; break;
    case 2:
      c->variant = "fused no-weight residual_out=residual";
      c->fused = true, c->weight = c->bias = c->save_mean = false, c->alias = 3;
      break;
    case 3:
      c->variant = "in-place out=x no-stats";
      c->alias = 1, c->bias = false, c->save_mean = c->save_rstd = false;
      break;
    case 4:
      c->variant = "fused strided residual_out=x";
      c->fused = true, c->alias = 2, c->xpad = 3, c->rpad = 5, c->opad = 1;
      break;
    case 5:
      c->variant = "fused other-rank out=x";
      c->fused = true, c->alias = 1, c->weight = false, c->stat_0d = (H % 2) == 1;
      break;
  }
}

/* Backward variant v (0..3) of the table for hidden size H: sets the flags and the name. */
static void set_bwd_variant(bwd_case *c, int v, int64_t H) {
  switch (v) {
    case 0:
      c->variant = "dres saved-stats";
      c->dres = c->weight = c->stats = c->dweight = c->dbias = true;
      break;
    case 1:
      c->variant = "no-weight recompute dx=dy";
      c->dbias = true, c->alias = 1;
      break;
    case 2:
      c->variant = "dres recompute strided dx=dres";
      c->dres = c->weight = c->dweight = true, c->alias = 2, c->pad = 3;
      break;
    case 3:
      c->variant = "other-rank saved-stats";
      c->weight = c->stats = c->dweight = true, c->stat_0d = (H % 2) == 0;
      break;
  }
}

static void forward_table(test_run *tr) {
  for (int ln = 0; ln < 2; ln++)
    for (size_t d = 0; d < 3; d++)
      for (size_t hi = 0; hi < sizeof HIDDEN / sizeof HIDDEN[0]; hi++)
        for (size_t ri = 0; ri < sizeof ROWS / sizeof ROWS[0]; ri++)
          for (int v = 0; v < 6; v++) {
            int64_t H = HIDDEN[hi], R = ROWS[ri];
            if (H == 8192 && v > 1) continue; /* the large row: plain and fused only */
            fwd_case c = fwd_defaults(ln, *DTYPES[d]);
            set_fwd_variant(&c, v, H);
            set_shape(&c.ndim, c.shape, R, H, v == 5);
            run_forward(tr, &c);
          }
}

/* LayerNorm rows far from a zero mean (x in off +- 2, off 16 for float32 and 1000 for the
 * 16-bit types: E[x^2] - mean^2 in float32 would lose the variance's digits and fails the
 * float32 and float16 rows; float32 output itself is only as exact as the mean, ~|off| *
 * eps: 16, not more. bfloat16's spacing at 1000 is 4, so its rows round to 1000 throughout:
 * a zero-variance row at a large mean; at bfloat16's tolerance a one-pass variance passed
 * every offset with a spread, 64-250 +- 2, in a float32 simulation) and rows whose first
 * element is an outlier (x[r, 0] = 500, the rest in +- 2: one-pass sums shifted by each
 * thread's first element, tried in the run for aa39fb0 and not kept, would take it as the
 * shift; the CPU and CUDA forwards are two-pass). */
static void ln_offset_cases(test_run *tr) {
  static const int64_t Hs[] = {257, 4096, 8192};
  for (size_t d = 0; d < 3; d++)
    for (size_t hi = 0; hi < sizeof Hs / sizeof Hs[0]; hi++)
      for (int v = 0; v < 2; v++) {
        fwd_case c = fwd_defaults(true, *DTYPES[d]);
        c.variant = v ? "outlier x[r,0]=500" : "offset mean";
        if (v) c.outlier = 500;
        else c.xoff = d == 0 ? 16 : 1000; /* DTYPES[0] is float32 */
        set_shape(&c.ndim, c.shape, 33, Hs[hi], false);
        run_forward(tr, &c);
      }
}

static void backward_table(test_run *tr) {
  for (int ln = 0; ln < 2; ln++)
    for (size_t d = 0; d < 3; d++)
      for (size_t hi = 0; hi < sizeof HIDDEN / sizeof HIDDEN[0]; hi++)
        for (size_t ri = 0; ri < sizeof ROWS / sizeof ROWS[0]; ri++)
          for (int v = 0; v < 4; v++) {
            int64_t H = HIDDEN[hi], R = ROWS[ri];
            if (H == 8192 && v > 1) continue;
            bwd_case c;
            memset(&c, 0, sizeof c);
            c.ln = ln;
            c.dt = *DTYPES[d];
            set_bwd_variant(&c, v, H);
            set_shape(&c.ndim, c.shape, R, H, v == 3);
            run_backward(tr, &c);
          }
}

/* ---- consistency ------------------------------------------------------------------------ */

static bool same_bytes(tbuf *a, tbuf *b) {
  tb_sync(a);
  tb_sync(b);
  return a->bytes == b->bytes && memcmp(a->host, b->host, a->bytes) == 0;
}

/* The fused forward equals the unfused forward applied to residual_out, bit for bit;
 * the backward with saved statistics equals the backward that recomputes them; two
 * backward runs give the same dweight / dbias. */
static void consistency(test_run *tr) {
  /* H = 2056: rows of 4-16 KB, which the CUDA backend's bulk-copy LayerNorm backward takes */
  static const int64_t CH[] = {1000, 2056};
  for (int ln = 0; ln < 2; ln++)
    for (size_t d = 0; d < 3; d++)
      for (size_t hi = 0; hi < 2; hi++) {
        DLDataType dt = *DTYPES[d];
        const int64_t R = 33, H = CH[hi], shape[2] = {R, H}; /* > 16K elements: 2+ threads */
        if (!tr_begin(tr, "%s %s H=%lld fused == unfused, saved == recomputed stats, deterministic",
                      ln ? "layernorm" : "rmsnorm", dt_name(dt), (long long)H))
          continue;
        const backend *be = tr->be;
        ot_context *ctx = be->ctx;
        rng r = tr_rng(tr);
        tbuf *x = new_act(be, dt, 2, shape, 0, &r, -2, 2), *res = new_act(be, dt, 2, shape, 0, &r, -2, 2);
        tbuf *w = tb_new(be, dt, 1, &H), *b = tb_new(be, dt, 1, &H);
        tb_fill_uniform(w, &r, -1.5, 1.5);
        tb_fill_uniform(b, &r, -1, 1);
        tbuf *out1 = tb_new(be, dt, 2, shape), *out2 = tb_new(be, dt, 2, shape);
        tbuf *rout = tb_new(be, dt, 2, shape);
        tbuf *mean = tb_new(be, DT_F32, 1, &R), *rstd = tb_new(be, DT_F32, 1, &R);
        tbuf *dy = new_act(be, dt, 2, shape, 0, &r, -1, 1);
        tbuf *dx1 = tb_new(be, dt, 2, shape), *dx2 = tb_new(be, dt, 2, shape);
        tbuf *dw1 = tb_new(be, dt, 1, &H), *dw2 = tb_new(be, dt, 1, &H);
        tbuf *db1 = tb_new(be, dt, 1, &H), *db2 = tb_new(be, dt, 1, &H);
        const float eps = 1e-5f;
        bool ok;
        if (ln) {
          ok = tr_ok(tr, ot_layernorm_forward(ctx, tb_dl(x), tb_dl(res), tb_dl(w), tb_dl(b), eps,
                                              tb_dl(out1), tb_dl(rout), tb_dl(mean), tb_dl(rstd)),
                     "fused forward") &&
               tr_ok(tr, ot_layernorm_forward(ctx, tb_dl(rout), NULL, tb_dl(w), tb_dl(b), eps,
                                              tb_dl(out2), NULL, NULL, NULL),
                     "unfused forward") &&
               tr_ok(tr, ot_layernorm_backward(ctx, tb_dl(dy), NULL, tb_dl(rout), tb_dl(w),
                                               tb_dl(mean), tb_dl(rstd), eps, tb_dl(dx1),
                                               tb_dl(dw1), tb_dl(db1)),
                     "backward saved") &&
               tr_ok(tr, ot_layernorm_backward(ctx, tb_dl(dy), NULL, tb_dl(rout), tb_dl(w), NULL,
                                               NULL, eps, tb_dl(dx2), tb_dl(dw2), tb_dl(db2)),
                     "backward recomputed");
        } else {
          ok = tr_ok(tr, ot_rmsnorm_forward(ctx, tb_dl(x), tb_dl(res), tb_dl(w), eps, tb_dl(out1),
                                            tb_dl(rout), tb_dl(rstd)),
                     "fused forward") &&
               tr_ok(tr, ot_rmsnorm_forward(ctx, tb_dl(rout), NULL, tb_dl(w), eps, tb_dl(out2),
                                            NULL, NULL),
                     "unfused forward") &&
               tr_ok(tr, ot_rmsnorm_backward(ctx, tb_dl(dy), NULL, tb_dl(rout), tb_dl(w),
                                             tb_dl(rstd), eps, tb_dl(dx1), tb_dl(dw1)),
                     "backward saved") &&
               tr_ok(tr, ot_rmsnorm_backward(ctx, tb_dl(dy), NULL, tb_dl(rout), tb_dl(w), NULL,
                                             eps, tb_dl(dx2), tb_dl(dw2)),
                     "backward recomputed");
        }
        if (ok) {
          if (!same_bytes(out1, out2)) tr_fail(tr, "fused out != unfused out on residual_out");
          if (!same_bytes(dx1, dx2)) tr_fail(tr, "dx with saved stats != dx recomputed");
          if (!same_bytes(dw1, dw2)) tr_fail(tr, "dweight with saved stats != recomputed");
          if (ln && !same_bytes(db1, db2)) tr_fail(tr, "dbias differs between two runs");
        }
        tr_end(tr);
        tb_free(x), tb_free(res), tb_free(w), tb_free(b), tb_free(out1), tb_free(out2);
        tb_free(rout), tb_free(mean), tb_free(rstd), tb_free(dy), tb_free(dx1), tb_free(dx2);
        tb_free(dw1), tb_free(dw2), tb_free(db1), tb_free(db2);
      }

  /* Zero rows: a no-op forward; the backward writes zeros to dweight / dbias. */
  for (int ln = 0; ln < 2; ln++) {
    if (!tr_begin(tr, "%s zero rows", ln ? "layernorm" : "rmsnorm")) continue;
    const backend *be = tr->be;
    const int64_t shape[2] = {0, 7}, H = 7;
    tbuf *x = tb_new(be, DT_F32, 2, shape), *out = tb_new(be, DT_F32, 2, shape);
    tbuf *w = tb_new(be, DT_F32, 1, &H), *dw = tb_new(be, DT_F32, 1, &H);
    tbuf *db = tb_new(be, DT_F32, 1, &H);
    rng r = tr_rng(tr);
    tb_fill_uniform(w, &r, 0.5, 1.5);
    ot_status s1 = ln ? ot_layernorm_forward(be->ctx, tb_dl(x), NULL, tb_dl(w), NULL, 1e-5f,
                                             tb_dl(out), NULL, NULL, NULL)
                      : ot_rmsnorm_forward(be->ctx, tb_dl(x), NULL, tb_dl(w), 1e-5f, tb_dl(out),
                                           NULL, NULL);
    ot_status s2 = ln ? ot_layernorm_backward(be->ctx, tb_dl(x), NULL, tb_dl(x), tb_dl(w), NULL,
                                              NULL, 1e-5f, tb_dl(out), tb_dl(dw), tb_dl(db))
                      : ot_rmsnorm_backward(be->ctx, tb_dl(x), NULL, tb_dl(x), tb_dl(w), NULL,
                                            1e-5f, tb_dl(out), tb_dl(dw));
    if (tr_ok(tr, s1, "forward") && tr_ok(tr, s2, "backward")) {
      double zeros[7] = {0};
      tb_sync(dw);
      check_close(tr, "dweight", dw, zeros, (tol){0, 0});
      if (ln) {
        tb_sync(db);
        check_close(tr, "dbias", db, zeros, (tol){0, 0});
      }
    }
    tr_end(tr);
    tb_free(x), tb_free(out), tb_free(w), tb_free(dw), tb_free(db);
  }
}

/* The backward table's multi-row 2-D cases give h a row one element wider than H, so the
 * CUDA backend takes its any-alignment kernel for them; these run the aligned kernels on
 * contiguous [3, n, H] rows of 4-16 KB (RMSNorm: v3; LayerNorm: the bulk-copy kernel on
 * sm_90, and again under OT_NORM_BWD_IMPL=v3, what runs without sm_90 code) -- with dres,
 * dweight and dbias, or with recomputed statistics and dx = dy -- and LayerNorm on 600
 * rows with 2 ring slots per block (OT_NORM_BWD_TMA_STAGES=2), on 1200 with the default 3
 * and on 1200 at the automatic depth (OT_NORM_BWD_TMA_STAGES=0: 4 slots at 4096, the default
 * until 95016a7), so that the blocks' rings wrap (mbarrier phases flip; 264 blocks on an
 * H200, 4-5 rows each); those in 16-bit types only (float32's tolerance is too tight for
 * 600-row dbias sums, and the ring does not depend on the type). */
static void contiguous_backward_cases(test_run *tr) {
  if (!tr->be->is_cuda) return;
  static const int64_t BH[] = {2056, 4096};
  for (int ln = 0; ln < 2; ln++)
    for (int v3 = 0; v3 < (ln ? 2 : 1); v3++)
      for (size_t d = 0; d < 3; d++)
        for (size_t hi = 0; hi < 3; hi++)
          for (int v = 0; v < 2; v++) { /* dres saved-stats, no-weight recompute dx=dy */
            const bool wrap = hi == 2;
            if (wrap && (v || !ln || v3 || d == 0)) continue; /* DTYPES[0]: float32 */
            const int64_t H = wrap ? 4096 : BH[hi];
            bwd_case b;
            memset(&b, 0, sizeof b);
            b.ln = ln;
            b.dt = *DTYPES[d];
            b.tag = wrap ? " contiguous (2 slots)" : v3 ? " contiguous (v3)" : " contiguous";
            set_bwd_variant(&b, v, H);
            set_shape(&b.ndim, b.shape, wrap ? 600 : 33, H, true);
            const char *var = wrap ? "OT_NORM_BWD_TMA_STAGES" : v3 ? "OT_NORM_BWD_IMPL" : NULL;
            if (var) {
              env_saved st = env_set(var, wrap ? "2" : "v3");
              run_backward(tr, &b);
              env_restore(&st);
            } else {
              run_backward(tr, &b);
            }
            if (wrap) { /* the default depth, 3 slots: 1200 rows, 4-5 a block on an H200 */
              b.tag = " contiguous (3 slots)";
              set_shape(&b.ndim, b.shape, 1200, H, true);
              run_backward(tr, &b);
              /* the automatic depth, 4 slots: the blocks of 5 rows wrap */
              b.tag = " contiguous (automatic slots)";
              env_saved st = env_set("OT_NORM_BWD_TMA_STAGES", "0");
              run_backward(tr, &b);
              env_restore(&st);
            }
          }
}

/* The CUDA backward's sum of dweight / dbias partials with many partial rows: 3000
 * contiguous rows of H = 64 and 72 (16-bit types: the aligned v3 kernel, narrow blocks,
 * one partial row per block: about 3000 partials, so norm_reduce_partials_v2_kernel's
 * lanes loop over more than one batch; H = 72: its last block of 16 columns half out of
 * range), and the same under OT_NORM_REDUCE=old (the 32 x 32 kernel). Variant 0: dweight
 * (and LayerNorm's dbias: the two-sum instance); LayerNorm's variant 1: dbias alone (the
 * one-sum instance given the dbias partials), statistics recomputed. */
static void many_partials_cases(test_run *tr) {
  if (!tr->be->is_cuda) return;
  static const int64_t MH[] = {64, 72};
  for (int ln = 0; ln < 2; ln++)
    for (int v = 0; v <= ln; v++) /* set_bwd_variant: 0 dres saved-stats, 1 no-weight recompute */
      for (size_t d = 1; d < 3; d++) /* DTYPES[1..2]: float16, bfloat16 */
        for (size_t hi = 0; hi < 2; hi++)
          for (int old = 0; old < 2; old++) {
            bwd_case b;
            memset(&b, 0, sizeof b);
            b.ln = ln;
            b.dt = *DTYPES[d];
            b.tag = old ? " many partials (reduce old)" : " many partials";
            set_bwd_variant(&b, v, MH[hi]);
            set_shape(&b.ndim, b.shape, 3000, MH[hi], true);
            if (old) {
              env_saved st = env_set("OT_NORM_REDUCE", "old");
              run_backward(tr, &b);
              env_restore(&st);
            } else {
              run_backward(tr, &b);
            }
          }
}

/* The backward with the context's arena attached (ot_context_set_arena): its temporaries
 * -- the dweight / dbias partials, and on CUDA the statistics it recomputes with the
 * forward kernel when none are given -- come from the arena and are all back when the op
 * returns (in_use as before), and dx / dweight / dbias equal, bit for bit, those of the
 * same call without the arena. On CUDA also: the aligned 16-bit rows of 4096 take two
 * blocks (statistics, partials; the bulk-copy or v3 kernel), and an arena with no room for
 * the partials fails with OT_ERR_OOM naming them after the statistics were taken (that
 * block given back, dx unwritten). H = 257 float32: the any-alignment kernel, partials
 * only. */
static void arena_backward_cases(test_run *tr) {
  static const struct {
    int ln;
    const DLDataType *dt;
    int64_t H;
  } AC[] = {{1, &DT_BF16, 4096}, {0, &DT_BF16, 4096}, {1, &DT_F32, 257}, {0, &DT_F16, 4096}};
  const size_t lt = (size_t)32 << 20; /* the cuBLASLt workspace a CUDA context takes */
  for (size_t ci = 0; ci < sizeof AC / sizeof AC[0]; ci++) {
    const bool ln = AC[ci].ln != 0;
    const DLDataType dt = *AC[ci].dt;
    const int64_t R = 33, H = AC[ci].H, shape[2] = {R, H};
    if (!tr_begin(tr, "%s backward %s rows=%lld H=%lld with the context's arena",
                  ln ? "layernorm" : "rmsnorm", dt_name(dt), (long long)R, (long long)H))
      continue;
    const backend *be = tr->be;
    ot_context *ctx = be->ctx;
    const char *op = op_name(ln, true);
    rng r = tr_rng(tr);
    ot_arena *a = NULL, *small = NULL;
    tbuf *dy = new_act(be, dt, 2, shape, 0, &r, -1, 1), *h = new_act(be, dt, 2, shape, 0, &r, -1.5, 2.5);
    tbuf *w = tb_new(be, dt, 1, &H);
    tb_fill_uniform(w, &r, -1.5, 1.5);
    tbuf *dx[3], *dw[3], *db[3]; /* without the arena, with it, with the small one */
    for (int i = 0; i < 3; i++) {
      dx[i] = tb_new(be, dt, 2, shape), dw[i] = tb_new(be, dt, 1, &H), db[i] = tb_new(be, dt, 1, &H);
      tb_poison(dx[i]), tb_poison(dw[i]), tb_poison(db[i]);
    }
    void *dx_before = NULL;
#define OT_NORM_ARENA_BWD(i)                                                                   \
  (ln ? ot_layernorm_backward(ctx, tb_dl(dy), NULL, tb_dl(h), tb_dl(w), NULL, NULL, (float)EPS, \
                              tb_dl(dx[i]), tb_dl(dw[i]), tb_dl(db[i]))                         \
      : ot_rmsnorm_backward(ctx, tb_dl(dy), NULL, tb_dl(h), tb_dl(w), NULL, (float)EPS,         \
                            tb_dl(dx[i]), tb_dl(dw[i])))
    if (!tr_ok(tr, OT_NORM_ARENA_BWD(0), "backward without the arena")) goto out;
    if (!tr_ok(tr, ot_arena_create(ctx, lt + ((size_t)64 << 20), &a), "arena") ||
        !tr_ok(tr, ot_context_set_arena(ctx, a), "attach"))
      goto out;
    ot_arena_stats s0, s1;
    ot_arena_get_stats(a, &s0);
    if (tr_ok(tr, OT_NORM_ARENA_BWD(1), "backward with the arena")) {
      ot_arena_get_stats(a, &s1);
      if (s1.in_use != s0.in_use || s1.live_blocks != s0.live_blocks)
        tr_fail(tr, "temporaries not given back: in_use %zu -> %zu, live blocks %llu -> %llu",
                s0.in_use, s1.in_use, (unsigned long long)s0.live_blocks,
                (unsigned long long)s1.live_blocks);
      /* (one where OT_NORM_FWD_IMPL=old takes the statistics' recomputation into the
       * backward kernel) */
      const uint64_t want = be->is_cuda && dt_size(dt) == 2 && !getenv("OT_NORM_FWD_IMPL") ? 2 : 1;
      if (s1.num_allocs < s0.num_allocs + want)
        tr_fail(tr, "%llu blocks taken from the arena, expected >= %llu",
                (unsigned long long)(s1.num_allocs - s0.num_allocs), (unsigned long long)want);
      if (!same_bytes(dx[0], dx[1])) tr_fail(tr, "dx with the arena != without");
      if (!same_bytes(dw[0], dw[1])) tr_fail(tr, "dweight with the arena != without");
      if (ln && !same_bytes(db[0], db[1])) tr_fail(tr, "dbias with the arena != without");
    }
    if (be->is_cuda && H == 4096) {
      /* room for the statistics (33 x 8 bytes) but not for the partials (>= 16 KB) */
      if (!tr_ok(tr, ot_arena_create(ctx, lt + 8192, &small), "small arena") ||
          !tr_ok(tr, ot_context_set_arena(ctx, small), "attach small"))
        goto detach;
      (void)tb_dl(dx[2]); /* the poison uploaded, then its snapshot */
      dx_before = tb_snapshot(dx[2]);
      tr_expect_error(tr, OT_NORM_ARENA_BWD(2), OT_ERR_OOM, op,
                      "the dweight / dbias partials: cannot allocate");
      ot_arena_stats ss;
      ot_arena_get_stats(small, &ss);
      if (ss.in_use != lt || ss.live_blocks != 1)
        tr_fail(tr, "after the OOM: in_use %zu, %llu live blocks (the workspace only expected)",
                ss.in_use, (unsigned long long)ss.live_blocks);
      if (!tb_unchanged(dx[2], dx_before)) tr_fail(tr, "dx written by a failing backward");
    }
#undef OT_NORM_ARENA_BWD
  detach:
    tr_ok(tr, ot_context_set_arena(ctx, NULL), "detach");
  out:
    tr_end(tr);
    ot_arena_destroy(a), ot_arena_destroy(small);
    free(dx_before);
    tb_free(dy), tb_free(h), tb_free(w);
    for (int i = 0; i < 3; i++) tb_free(dx[i]), tb_free(dw[i]), tb_free(db[i]);
  }
}

/* The CUDA forward's plain launches (OT_NORM_PDL=0: not as programmatic dependents) on
 * rows of row groups of several warps at 8 vectors a thread (every H here in every dtype
 * -- 64, 64, 128 threads in 16-bit types, 128, 128, 256 in float32; 2056 with many threads
 * past the row's end; LayerNorm's instances without the residual are held to 64
 * registers), plain and fused, then the consistency checks under it (fused == unfused,
 * saved == recomputed statistics). */
static void forward_option_cases(test_run *tr) {
  if (!tr->be->is_cuda) return;
  static const int64_t OH[] = {2056, 4096, 8192};
  static const char *const NAMES[2] = {"plain (pdl=0)", "fused (pdl=0)"};
  env_saved e = env_set("OT_NORM_PDL", "0");
  for (int ln = 0; ln < 2; ln++)
    for (size_t d = 0; d < 3; d++)
      for (size_t hi = 0; hi < sizeof OH / sizeof OH[0]; hi++)
        for (int v = 0; v < 2; v++) {
          fwd_case c = fwd_defaults(ln, *DTYPES[d]);
          set_fwd_variant(&c, v, OH[hi]);
          c.variant = NAMES[v];
          set_shape(&c.ndim, c.shape, 33, OH[hi], false);
          run_forward(tr, &c);
        }
  consistency(tr);
  env_restore(&e);
}

/* The CUDA forward's opt-in shapes, which no default call takes: v3 (OT_NORM_FWD_IMPL=v3,
 * the cp.async ring; 2056 in 16-bit types at 64 threads x 8 vectors) and forward v2 at 16
 * vectors a thread (OT_NORM_FWD_MAXNV=16; 2056 / 4096 at 32 threads in 16-bit types),
 * through every weight / bias presence of LayerNorm's out pass (b3239ea: one pass per
 * combination; variants 0 / 1 weight + bias, 2 neither, 3 weight only, 5 bias only), rows
 * ending inside a thread's vectors (2056), before some threads' first (64) or neither (4096). */
static void forward_impl_cases(test_run *tr) {
  if (!tr->be->is_cuda) return;
  static const char *const ENV[2][2] = {{"OT_NORM_FWD_IMPL", "v3"}, {"OT_NORM_FWD_MAXNV", "16"}};
  static const char *const NAMES[2][5] = {  /* set_fwd_variant's, with the setting */
      {"plain (v3)", "fused (v3)", "fused no-weight residual_out=residual (v3)",
       "in-place out=x no-stats (v3)", "fused other-rank out=x (v3)"},
      {"plain (maxnv=16)", "fused (maxnv=16)", "fused no-weight residual_out=residual (maxnv=16)",
       "in-place out=x no-stats (maxnv=16)", "fused other-rank out=x (maxnv=16)"}};
  static const int VARIANTS[5] = {0, 1, 2, 3, 5};
  static const int64_t OH[] = {64, 2056, 4096};
  for (int k = 0; k < 2; k++) {
    env_saved e = env_set(ENV[k][0], ENV[k][1]);
    for (int ln = 0; ln < 2; ln++)
      for (size_t d = 0; d < 3; d++)
        for (size_t hi = 0; hi < sizeof OH / sizeof OH[0]; hi++)
          for (int v = 0; v < 5; v++) {
            fwd_case c = fwd_defaults(ln, *DTYPES[d]);
            set_fwd_variant(&c, VARIANTS[v], OH[hi]);
            c.variant = NAMES[k][v];
            set_shape(&c.ndim, c.shape, 33, OH[hi], VARIANTS[v] == 5);
            run_forward(tr, &c);
          }
    env_restore(&e);
  }
}

/* RMSNorm's forward v2 with LayerNorm's instruction cut (OT_NORM_RMS_FWD_CUT=1, norm.cuh
 * kNormFwdCut; the default since 2026-11-30 for 16-bit rows of <= 4096 elements, which the
 * rest of the suite then runs too; OT_NORM_RMS_FWD_CUT=0 the plain row work): the forward
 * table's
 * variants at widths it takes -- 64 and 1000 (one warp, 1 and 4 vectors a thread, 1000 with
 * lanes past the row's end), 2048 (one warp, 8 vectors), 2056 and 4096 (two warps, 8
 * vectors; 2056 with most of the second warp past the end) -- and 8192 (not taken: the
 * default under the switch), and the consistency checks under it -- since the cut became
 * the default, these run under =0 (the plain row work), the default's under the suite's
 * other tables; the 8-vector instances held to 56 registers
 * (=2) at 2048 / 2056 / 4096 plain; then each call's outputs under 1 and 2 against the
 * plain row work's (=0) bit for bit (the cut keeps the values and their order). CUDA only. */
static void rms_cut_bits(test_run *tr, DLDataType dt, int64_t H, int v, const char *value) {
  const bool fused = v & 1, weight = (v & 2) == 0;
  if (!tr_begin(tr, "rmsnorm %s (cut=%s) H=%lld %s%s: the same bits as the plain row work (=0)",
                dt_name(dt), value, (long long)H, fused ? "fused" : "plain",
                weight ? "" : " no-weight"))
    return;
  const backend *be = tr->be;
  rng r = tr_rng(tr);
  const int64_t R = 37, shape[2] = {R, H};
  tbuf *x = new_act(be, dt, 2, shape, 0, &r, -2, 2);
  tbuf *res = fused ? new_act(be, dt, 2, shape, 0, &r, -2, 2) : NULL;
  tbuf *w = weight ? new_act(be, dt, 1, &H, 0, &r, -1.5, 1.5) : NULL;
  tbuf *out[2] = {NULL, NULL}, *rout[2] = {NULL, NULL}, *rstd[2] = {NULL, NULL};
  bool ok = true;
  for (int k = 0; k < 2 && ok; k++) {
    out[k] = new_act(be, dt, 2, shape, 0, NULL, 0, 0);
    if (fused) rout[k] = new_act(be, dt, 2, shape, 0, NULL, 0, 0);
    rstd[k] = tb_new(be, DT_F32, 1, &R);
    env_saved e = env_set("OT_NORM_RMS_FWD_CUT", k ? value : "0");
    ok = tr_ok(tr, ot_rmsnorm_forward(be->ctx, tb_dl(x), dl_or_null(res), dl_or_null(w), (float)EPS,
                                      tb_dl(out[k]), dl_or_null(rout[k]), tb_dl(rstd[k])),
               k ? "ot_rmsnorm_forward (cut)" : "ot_rmsnorm_forward");
    env_restore(&e);
  }
  if (ok) {
    if (!same_bytes(out[0], out[1]))
      tr_fail(tr, "out differs from the plain row work's (OT_NORM_RMS_FWD_CUT=0)");
    if (fused && !same_bytes(rout[0], rout[1])) tr_fail(tr, "residual_out differs");
    if (!same_bytes(rstd[0], rstd[1])) tr_fail(tr, "rstd differs");
  }
  tr_end(tr);
  for (int k = 0; k < 2; k++) tb_free(out[k]), tb_free(rout[k]), tb_free(rstd[k]);
  tb_free(x), tb_free(res), tb_free(w);
}

static void rms_fwd_cut_cases(test_run *tr) {
  if (!tr->be->is_cuda) return;
  static const int64_t CH[] = {64, 1000, 2048, 2056, 4096, 8192};
  /* the cut is the default (the suite's other tables run it): the table here under =0, the
   * plain row work, which no default call takes since */
  env_saved e = env_set("OT_NORM_RMS_FWD_CUT", "0");
  for (size_t d = 1; d < 3; d++) /* the 16-bit types (float32 takes the plain work anyway) */
    for (size_t hi = 0; hi < sizeof CH / sizeof CH[0]; hi++)
      for (int v = 0; v < 6; v++) {
        if (CH[hi] == 8192 && v > 1) continue;
        fwd_case c = fwd_defaults(false, *DTYPES[d]);
        set_fwd_variant(&c, v, CH[hi]);
        char name[96];
        snprintf(name, sizeof name, "%s (cut=0)", c.variant);
        c.variant = name;
        set_shape(&c.ndim, c.shape, 33, CH[hi], v == 5);
        run_forward(tr, &c);
      }
  consistency(tr);
  env_restore(&e);
  e = env_set("OT_NORM_RMS_FWD_CUT", "2");
  for (size_t d = 1; d < 3; d++)
    for (size_t hi = 2; hi < 5; hi++)
      for (int v = 0; v < 4; v += 3) { /* plain, in-place without statistics */
        fwd_case c = fwd_defaults(false, *DTYPES[d]);
        set_fwd_variant(&c, v, CH[hi]);
        char name[96];
        snprintf(name, sizeof name, "%s (cut=2)", c.variant);
        c.variant = name;
        set_shape(&c.ndim, c.shape, 33, CH[hi], false);
        run_forward(tr, &c);
      }
  env_restore(&e);
  for (size_t d = 1; d < 3; d++)
    for (size_t hi = 0; hi < 5; hi++)
      for (int v = 0; v < 4; v++) {
        rms_cut_bits(tr, *DTYPES[d], CH[hi], v, "1");
        if (hi >= 2 && !(v & 1)) rms_cut_bits(tr, *DTYPES[d], CH[hi], v, "2");
      }
}

/* ---- bad inputs --------------------------------------------------------------------------- */

typedef struct bad_case {
  const char *what; /* case name */
  const char *arg;  /* the argument the message must name, as ": arg:" */
} bad_case;

enum { ROWS_B = 3, H_B = 8 };

static const bad_case FWD_BAD[] = {
    {"ctx NULL", "ctx"},
    {"x NULL", "x"},
    {"out NULL", "out"},
    {"x dtype int32", "x"},
    {"x dtype float64", "x"},
    {"weight dtype differs from x", "weight"},
    {"x 0-d", "x"},
    {"weight rank 2", "weight"},
    {"weight length H+1", "weight"},
    {"weight not contiguous", "weight"},
    {"out shape mismatch", "out"},
    {"residual shape mismatch", "residual"},
    {"rstd shape mismatch", "rstd"},
    {"rstd dtype float16", "rstd"},
    {"rstd not contiguous", "rstd"},
    {"x data NULL", "x"},
    {"x misaligned (byte_offset 2)", "x"},
    {"out misaligned (byte_offset 1)", "out"},
    {"x last dim not contiguous", "x"},
    {"x on another device", "x"},
    {"eps negative", "eps"},
    {"eps NaN", "eps"},
    {"eps inf", "eps"},
    {"residual without residual_out", "residual_out"},
    {"residual_out without residual", "residual_out"},
    {"out overlaps x partially", "out"},
    {"out aliases residual", "out"},
    {"residual_out aliases out", "out"},
    {"rstd inside x", "rstd"},
    {"x hidden size 0", "x"},
    {"bias dtype differs (layernorm)", "bias"},
    {"mean shape mismatch (layernorm)", "mean"},
};

static void bad_forward(test_run *tr, bool ln) {
  const char *op = op_name(ln, false);
  for (size_t k = 0; k < sizeof FWD_BAD / sizeof FWD_BAD[0]; k++) {
    const bad_case *bc = &FWD_BAD[k];
    if (!ln && strstr(bc->what, "(layernorm)")) continue;
    if (!tr_begin(tr, "%s bad input: %s", op, bc->what)) continue;
    const backend *be = tr->be;
    rng r = tr_rng(tr);
    const int64_t shape[2] = {ROWS_B, H_B}, H = H_B, R = ROWS_B;
    tbuf *x = new_act(be, DT_F32, 2, shape, 0, &r, -2, 2);
    tbuf *res = new_act(be, DT_F32, 2, shape, 0, &r, -2, 2);
    tbuf *w = tb_new(be, DT_F32, 1, &H), *b = tb_new(be, DT_F32, 1, &H);
    tb_fill_uniform(w, &r, -1, 1);
    tb_fill_uniform(b, &r, -1, 1);
    tbuf *out = tb_new(be, DT_F32, 2, shape), *rout = tb_new(be, DT_F32, 2, shape);
    tbuf *mean = tb_new(be, DT_F32, 1, &R), *rstd = tb_new(be, DT_F32, 1, &R);
    tbuf *all[] = {x, res, w, b, out, rout, mean, rstd};
    void *snap[8];
    for (int i = 0; i < 8; i++) snap[i] = tb_snapshot(all[i]);
    DLTensor tx = *tb_dl(x), tres = *tb_dl(res), tw = *tb_dl(w), tb = *tb_dl(b);
    DLTensor tout = *tb_dl(out), trout = *tb_dl(rout), tmean = *tb_dl(mean), trstd = *tb_dl(rstd);
    const DLTensor *px = &tx, *pres = &tres, *pw = &tw, *pb = &tb, *pout = &tout,
                   *prout = &trout, *pmean = &tmean, *prstd = &trstd;
    ot_context *ctx = be->ctx;
    float eps = 1e-5f;
    int64_t sh[8], st[8], sh2[8];
    switch (k) {
      case 0: ctx = NULL; break;
      case 1: px = NULL; break;
      case 2: pout = NULL; break;
      case 3: tx.dtype = DT_I32; break;
      case 4: tx.dtype = (DLDataType){kDLFloat, 64, 1}; break;
      case 5: tw.dtype = DT_F16; break;
      case 6: tx.ndim = 0; break;
      case 7: sh[0] = 1, sh[1] = H; tw.shape = sh, tw.ndim = 2, tw.strides = NULL; break;
      case 8: sh[0] = H + 1; tw.shape = sh; break;
      case 9: st[0] = 2; tw.strides = st; break;
      case 10: sh[0] = R - 1, sh[1] = H; tout.shape = sh; break;
      case 11: sh[0] = R, sh[1] = H - 1; tres.shape = sh, tres.strides = NULL; break;
      case 12: sh[0] = R + 1; trstd.shape = sh; break;
      case 13: trstd.dtype = DT_F16; break;
      case 14: /* 2 rows, so that the stride of rstd matters */
        sh[0] = 2, st[0] = 2, sh2[0] = 2, sh2[1] = H;
        trstd.shape = sh, trstd.strides = st, tmean.shape = sh;
        tx.shape = tres.shape = tout.shape = trout.shape = sh2;
        break;
      case 15: tx.data = NULL; break;
      case 16: tx.byte_offset = 2; break;
      case 17: tout.byte_offset = 1; break;
      case 18: sh[0] = R, sh[1] = H / 2, st[0] = H, st[1] = 2; tx.shape = sh, tx.strides = st;
        tres.shape = tout.shape = trout.shape = sh;
        tres.strides = tout.strides = trout.strides = NULL;
        break;
      case 19: tx.device.device_type = tx.device.device_type == kDLCPU ? kDLCUDA : kDLCPU; break;
      case 20: eps = -1e-5f; break;
      case 21: eps = NAN; break;
      case 22: eps = INFINITY; break;
      case 23: prout = NULL; break;
      case 24: pres = NULL; break;
      case 25: tout = tx, tout.byte_offset = 4; sh[0] = R - 1, sh[1] = H; tout.shape = sh; tout.strides = NULL;
        tx.shape = tres.shape = trout.shape = sh;
        tx.strides = tres.strides = trout.strides = NULL;
        sh2[0] = R - 1;
        tmean.shape = trstd.shape = sh2;
        break;
      case 26: tout = tres; break;
      case 27: trout = tout; break;
      case 28: trstd = tx, trstd.ndim = 1, sh[0] = R, trstd.shape = sh, trstd.strides = NULL; break;
      case 29: sh[0] = R, sh[1] = 0; tx.shape = tres.shape = tout.shape = trout.shape = sh;
        tx.strides = tres.strides = tout.strides = trout.strides = NULL;
        break;
      case 30: tb.dtype = DT_BF16; break;
      case 31: sh[0] = 1; tmean.shape = sh; break;
    }
    ot_status s = ln ? ot_layernorm_forward(ctx, px, pres, pw, pb, eps, pout, prout, pmean, prstd)
                     : ot_rmsnorm_forward(ctx, px, pres, pw, eps, pout, prout, prstd);
    char want[64];
    snprintf(want, sizeof want, ": %s:", bc->arg);
    tr_expect_error(tr, s, OT_ERR_INVALID_ARGUMENT, op, want);
    for (int i = 0; i < 8; i++) {
      if (!tb_unchanged(all[i], snap[i])) tr_fail(tr, "tensor %d was modified", i);
      free(snap[i]);
      tb_free(all[i]);
    }
    tr_end(tr);
  }
}

static const bad_case BWD_BAD[] = {
    {"ctx NULL", "ctx"},
    {"dy NULL", "dy"},
    {"h NULL", "h"},
    {"dx NULL", "dx"},
    {"dy dtype int64", "dy"},
    {"h dtype differs from dy", "h"},
    {"dx shape mismatch", "dx"},
    {"dresidual_out shape mismatch", "dresidual_out"},
    {"weight length H-1", "weight"},
    {"dweight without weight", "dweight"},
    {"dweight dtype differs", "dweight"},
    {"rstd rank 2", "rstd"},
    {"eps negative", "eps"},
    {"dx overlaps dy partially", "dx"},
    {"dx aliases h", "dx"},
    {"dweight inside dy", "dweight"},
    {"dy misaligned (byte_offset 2)", "dy"},
    {"h last dim not contiguous", "h"},
    {"h data NULL", "h"},
    {"mean without rstd (layernorm)", "rstd"},
    {"dbias aliases dweight (layernorm)", "dbias"},
    {"dbias rank 0 (layernorm)", "dbias"},
};

static void bad_backward(test_run *tr, bool ln) {
  const char *op = op_name(ln, true);
  for (size_t k = 0; k < sizeof BWD_BAD / sizeof BWD_BAD[0]; k++) {
    const bad_case *bc = &BWD_BAD[k];
    if (!ln && strstr(bc->what, "(layernorm)")) continue;
    if (!tr_begin(tr, "%s bad input: %s", op, bc->what)) continue;
    const backend *be = tr->be;
    rng r = tr_rng(tr);
    const int64_t shape[2] = {ROWS_B, H_B}, H = H_B, R = ROWS_B;
    tbuf *dy = new_act(be, DT_F32, 2, shape, 0, &r, -1, 1);
    tbuf *dres = new_act(be, DT_F32, 2, shape, 0, &r, -1, 1);
    tbuf *h = new_act(be, DT_F32, 2, shape, 0, &r, -2, 2);
    tbuf *w = tb_new(be, DT_F32, 1, &H);
    tb_fill_uniform(w, &r, -1, 1);
    tbuf *mean = tb_new(be, DT_F32, 1, &R), *rstd = tb_new(be, DT_F32, 1, &R);
    tb_fill_uniform(mean, &r, -1, 1);
    tb_fill_uniform(rstd, &r, 0.5, 1.5);
    tbuf *dx = tb_new(be, DT_F32, 2, shape), *dw = tb_new(be, DT_F32, 1, &H),
         *db = tb_new(be, DT_F32, 1, &H);
    tbuf *all[] = {dy, dres, h, w, mean, rstd, dx, dw, db};
    void *snap[9];
    for (int i = 0; i < 9; i++) snap[i] = tb_snapshot(all[i]);
    DLTensor tdy = *tb_dl(dy), tdres = *tb_dl(dres), th = *tb_dl(h), tw = *tb_dl(w);
    DLTensor tmean = *tb_dl(mean), trstd = *tb_dl(rstd), tdx = *tb_dl(dx), tdw = *tb_dl(dw),
             tdb = *tb_dl(db);
    const DLTensor *pdy = &tdy, *pdres = &tdres, *ph = &th, *pw = &tw, *pmean = &tmean,
                   *prstd = &trstd, *pdx = &tdx, *pdw = &tdw, *pdb = &tdb;
    ot_context *ctx = be->ctx;
    float eps = 1e-5f;
    int64_t sh[8], st[8], sh2[8];
    switch (k) {
      case 0: ctx = NULL; break;
      case 1: pdy = NULL; break;
      case 2: ph = NULL; break;
      case 3: pdx = NULL; break;
      case 4: tdy.dtype = DT_I64; break;
      case 5: th.dtype = DT_BF16; break;
      case 6: sh[0] = R, sh[1] = H + 1; tdx.shape = sh, tdx.strides = NULL; break;
      case 7: sh[0] = 1, sh[1] = H; tdres.shape = sh; break;
      case 8: sh[0] = H - 1; tw.shape = sh; break;
      case 9: pw = NULL; break;
      case 10: tdw.dtype = DT_F16; break;
      case 11: sh[0] = R, sh[1] = 1; trstd.shape = sh, trstd.ndim = 2, trstd.strides = NULL; break;
      case 12: eps = -1.0f; break;
      case 13: tdx = tdy, tdx.byte_offset = 4 * H_B; sh[0] = R - 1, sh[1] = H; tdx.shape = sh, tdx.strides = NULL;
        tdy.shape = tdres.shape = th.shape = sh;
        tdy.strides = tdres.strides = th.strides = NULL;
        sh2[0] = R - 1;
        tmean.shape = trstd.shape = sh2;
        break;
      case 14: tdx = th; break;
      case 15: tdw = tdy, tdw.ndim = 1, sh[0] = H, tdw.shape = sh, tdw.strides = NULL; break;
      case 16: tdy.byte_offset = 2; break;
      case 17: sh[0] = R, sh[1] = H / 2, st[0] = H, st[1] = 2; th.shape = sh, th.strides = st;
        tdy.shape = tdres.shape = tdx.shape = sh;
        tdy.strides = tdres.strides = tdx.strides = NULL;
        break;
      case 18: th.data = NULL; break;
      case 19: prstd = NULL; break;
      case 20: tdb = tdw; break;
      case 21: tdb.ndim = 0; break;
    }
    ot_status s = ln ? ot_layernorm_backward(ctx, pdy, pdres, ph, pw, pmean, prstd, eps, pdx, pdw, pdb)
                     : ot_rmsnorm_backward(ctx, pdy, pdres, ph, pw, prstd, eps, pdx, pdw);
    char want[64];
    snprintf(want, sizeof want, ": %s:", bc->arg);
    tr_expect_error(tr, s, OT_ERR_INVALID_ARGUMENT, op, want);
    for (int i = 0; i < 9; i++) {
      if (!tb_unchanged(all[i], snap[i])) tr_fail(tr, "tensor %d was modified", i);
      free(snap[i]);
      tb_free(all[i]);
    }
    tr_end(tr);
  }
}

/* ---- gradient mode ------------------------------------------------------------------------ */

typedef struct grad_state {
  bool ln, has_w, has_b;
  int64_t rows, H;
} grad_state;

/* in = [h (rows*H) | w (H, if has_w) | b (H, if has_b)] -> out (rows*H). */
static void grad_forward(void *state, const double *in, double *out) {
  const grad_state *g = (const grad_state *)state;
  const double *w = g->has_w ? in + g->rows * g->H : NULL;
  const double *b = g->has_b ? in + g->rows * g->H + (g->has_w ? g->H : 0) : NULL;
  ref_forward(g->ln, in, w, b, EPS, g->rows, g->H, out, NULL, NULL);
}

static void grad_case(test_run *tr, bool ln, int64_t rows, int64_t H, bool full) {
  if (!tr_begin(tr, "%s backward vs finite differences rows=%lld H=%lld %s",
                ln ? "layernorm" : "rmsnorm", (long long)rows, (long long)H,
                full ? "weight bias dres saved-stats" : "no-weight recompute"))
    return;
  const backend *be = tr->be;
  rng r = tr_rng(tr);
  const int64_t shape[2] = {rows, H};
  grad_state gs = {ln, full, full && ln, rows, H};
  tbuf *h = new_act(be, DT_F32, 2, shape, 0, &r, -1.5, 2.5);
  tbuf *dy = new_act(be, DT_F32, 2, shape, 0, &r, -1, 1);
  tbuf *dres = full ? new_act(be, DT_F32, 2, shape, 0, &r, -1, 1) : NULL;
  tbuf *w = NULL, *b = NULL, *dw = NULL, *db = NULL, *mean = NULL, *rstd = NULL;
  if (full) {
    w = tb_new(be, DT_F32, 1, &H);
    tb_fill_uniform(w, &r, -1.5, 1.5);
    dw = tb_new(be, DT_F32, 1, &H);
    if (ln) {
      b = tb_new(be, DT_F32, 1, &H);
      tb_fill_uniform(b, &r, -1, 1);
      db = tb_new(be, DT_F32, 1, &H);
    }
  }
  int64_t n = rows * H, n_in = n + (gs.has_w ? H : 0) + (gs.has_b ? H : 0);
  double *in = (double *)malloc((size_t)n_in * sizeof(double));
  for (int64_t i = 0; i < n; i++) in[i] = tb_get(h, i);
  for (int64_t i = 0; gs.has_w && i < H; i++) in[n + i] = tb_get(w, i);
  for (int64_t i = 0; gs.has_b && i < H; i++) in[n + H + i] = tb_get(b, i);
  if (full) {
    double *m = (double *)malloc((size_t)rows * sizeof(double));
    double *rs = (double *)malloc((size_t)rows * sizeof(double));
    double *tmp = (double *)malloc((size_t)n * sizeof(double));
    ref_forward(ln, in, NULL, NULL, EPS, rows, H, tmp, m, rs);
    rstd = tb_new(be, DT_F32, 1, &rows);
    for (int64_t i = 0; i < rows; i++) tb_set(rstd, i, rs[i]);
    if (ln) {
      mean = tb_new(be, DT_F32, 1, &rows);
      for (int64_t i = 0; i < rows; i++) tb_set(mean, i, m[i]);
    }
    free(m), free(rs), free(tmp);
  }
  double *dy64 = tb_to_f64(dy), *grad = (double *)malloc((size_t)n_in * sizeof(double));
  fd_vjp(grad_forward, &gs, in, n_in, n, dy64, grad, 1e-5);
  for (int64_t i = 0; dres && i < n; i++) grad[i] += tb_get(dres, i);
  tbuf *dx = tb_new(be, DT_F32, 2, shape);
  ot_status st = ln ? ot_layernorm_backward(be->ctx, tb_dl(dy), dl_or_null(dres), tb_dl(h),
                                            dl_or_null(w), dl_or_null(mean), dl_or_null(rstd),
                                            (float)EPS, tb_dl(dx), dl_or_null(dw), dl_or_null(db))
                    : ot_rmsnorm_backward(be->ctx, tb_dl(dy), dl_or_null(dres), tb_dl(h),
                                          dl_or_null(w), dl_or_null(rstd), (float)EPS, tb_dl(dx),
                                          dl_or_null(dw));
  if (tr_ok(tr, st, op_name(ln, true))) {
    tol t = tol_for(DT_F32, 10);
    tb_sync(dx);
    check_close(tr, "dx", dx, grad, t);
    if (dw) {
      tb_sync(dw);
      check_close(tr, "dweight", dw, grad + n, t);
    }
    if (db) {
      tb_sync(db);
      check_close(tr, "dbias", db, grad + n + H, t);
    }
  }
  tr_end(tr);
  free(in), free(dy64), free(grad);
  tb_free(h), tb_free(dy), tb_free(dres), tb_free(w), tb_free(b), tb_free(dw), tb_free(db);
  tb_free(mean), tb_free(rstd), tb_free(dx);
}

static void run(test_run *tr) {
  if (tr->grad) {
    static const int64_t gH[] = {1, 5, 16, 37};
    static const int64_t gR[] = {1, 3};
    for (int ln = 0; ln < 2; ln++)
      for (size_t hi = 0; hi < sizeof gH / sizeof gH[0]; hi++)
        for (size_t ri = 0; ri < sizeof gR / sizeof gR[0]; ri++)
          for (int full = 0; full < 2; full++) grad_case(tr, ln, gR[ri], gH[hi], full);
    return;
  }
  forward_table(tr);
  ln_offset_cases(tr);
  backward_table(tr);
  consistency(tr);
  contiguous_backward_cases(tr);
  many_partials_cases(tr);
  arena_backward_cases(tr);
  forward_option_cases(tr);
  forward_impl_cases(tr);
  rms_fwd_cut_cases(tr);
  for (int ln = 0; ln < 2; ln++) {
    bad_forward(tr, ln);
    bad_backward(tr, ln);
  }
}

const test_suite suite_norm = {"norm", run};
