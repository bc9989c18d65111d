/*
 * cases_softmax_ce.c -- softmax forward / backward and cross-entropy forward /
 * backward against float64 references, bad inputs, and (--grad) finite differences.
 *
 * Tolerances:
 *  - softmax forward tol_for(dtype, 2): outputs in [0, 1] from one float32 exp (about
 *    2 ulp) and a row sum (float32 blocks, float64 across blocks), then one rounding.
 *  - softmax backward tol_for(dtype, 2): the row dot product sum(dy * y) is a float32
 *    reduction; dx = y (dy - dot) rounds once more.
 *  - cross-entropy loss and lse (float32 whatever the logits dtype, computed from the
 *    stored logits) tol_for(float32, 4): loss = lse - z_y is a difference of two
 *    numbers of size |z| (up to 30 here) and its error is relative to |lse|, not to the
 *    loss; lse itself is float32-rounded.
 *  - cross-entropy dlogits tol_for(dtype, 2): exp(z - lse) with z - lse rounded in
 *    float32 (relative error ~ |z| * 2^-24 ~ 2e-6) times g, then the storage rounding.
 *  - gradient mode tol_for(float32, 10): float32 backward vs central differences
 *    (h = 1e-4) of the float64 forward.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const DLDataType *const dtypes[] = {&DT_F32, &DT_F16, &DT_BF16};

static tbuf *new2d(const backend *be, DLDataType dt, int64_t rows, int64_t cols, int64_t pad) {
  int64_t shape[2] = {rows, cols}, strides[2] = {cols + pad, 1};
  return tb_new_strided(be, dt, 2, shape, pad ? strides : NULL);
}

static tbuf *new1d(const backend *be, DLDataType dt, int64_t n) {
  int64_t shape[1] = {n};
  return tb_new(be, dt, 1, shape);
}

/* [n] with element stride `stride` (1: contiguous). */
static tbuf *new1d_s(const backend *be, DLDataType dt, int64_t n, int64_t stride) {
  int64_t shape[1] = {n}, strides[1] = {stride};
  return tb_new_strided(be, dt, 1, shape, strides);
}

/* softmax of x[0..n) in float64 into y. */
static void softmax_ref(const double *x, double *y, int64_t n) {
  double m = -INFINITY, s = 0.0;
  for (int64_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
  for (int64_t j = 0; j < n; j++) s += (y[j] = exp(x[j] - m));
  for (int64_t j = 0; j < n; j++) y[j] /= s;
}

/* ---- softmax ---------------------------------------------------------------------- */

typedef struct sm_shape {
  int64_t rows, cols, pad;
} sm_shape;

static const sm_shape sm_shapes[] = {
    {1, 1, 0}, {3, 1, 2}, {1, 7, 0}, {5, 33, 3}, {7, 1000, 0}, {3, 4099, 5}, {2, 32003, 0},
    {64, 129, 1},
};

/* masked: every third element of a row except its first is -inf (an attention mask). */
static void case_softmax_forward(test_run *tr, DLDataType dt, const sm_shape *s, double range,
                                 bool inplace, bool masked) {
  if (!tr_begin(tr, "softmax fwd %s %lldx%lld pad=%lld range=%g%s%s", dt_name(dt),
                (long long)s->rows, (long long)s->cols, (long long)s->pad, range,
                inplace ? " inplace" : "", masked ? " masked" : ""))
    return;
  rng r = tr_rng(tr);
  tbuf *x = new2d(tr->be, dt, s->rows, s->cols, s->pad);
  tbuf *o = inplace ? x : new2d(tr->be, dt, s->rows, s->cols, s->pad ? s->pad + 1 : 0);
  tb_fill_uniform(x, &r, -range, range);
  if (masked)
    for (int64_t i = 0; i < x->numel; i++)
      if (i % s->cols && i % 3 == 0) tb_set(x, i, -INFINITY);
  double *xv = tb_to_f64(x), *ref = malloc((size_t)x->numel * sizeof *ref);
  for (int64_t i = 0; i < s->rows; i++) softmax_ref(xv + i * s->cols, ref + i * s->cols, s->cols);
  if (tr_ok(tr, ot_softmax_forward(tr->be->ctx, tb_dl(x), tb_dl(o)), "ot_softmax_forward")) {
    tb_sync(o);
    check_close(tr, "out", o, ref, tol_for(dt, 2));
  }
  free(xv);
  free(ref);
  if (!inplace) tb_free(o);
  tb_free(x);
  tr_end(tr);
}

static void case_softmax_backward(test_run *tr, DLDataType dt, const sm_shape *s, bool inplace) {
  if (!tr_begin(tr, "softmax bwd %s %lldx%lld pad=%lld%s", dt_name(dt), (long long)s->rows,
                (long long)s->cols, (long long)s->pad, inplace ? " inplace" : ""))
    return;
  rng r = tr_rng(tr);
  int64_t R = s->rows, N = s->cols;
  tbuf *dy = new2d(tr->be, dt, R, N, s->pad), *y = new2d(tr->be, dt, R, N, 0);
  tbuf *dx = inplace ? dy : new2d(tr->be, dt, R, N, s->pad + 2);
  tb_fill_uniform(dy, &r, -1.0, 1.0);
  /* y: a real softmax output (of logits in [-4, 4]), stored in the dtype. */
  double *xs = malloc((size_t)N * sizeof *xs), *ys = malloc((size_t)N * sizeof *ys);
  for (int64_t i = 0; i < R; i++) {
    for (int64_t j = 0; j < N; j++) xs[j] = rng_uniform(&r, -4.0, 4.0);
    softmax_ref(xs, ys, N);
    for (int64_t j = 0; j < N; j++) tb_set(y, i * N + j, ys[j]);
  }
  double *ref = malloc((size_t)(R * N) * sizeof *ref);
  for (int64_t i = 0; i < R; i++) {
    double dot = 0.0;
    for (int64_t j = 0; j < N; j++) dot += tb_get(dy, i * N + j) * tb_get(y, i * N + j);
    for (int64_t j = 0; j < N; j++)
      ref[i * N + j] = tb_get(y, i * N + j) * (tb_get(dy, i * N + j) - dot);
  }
  if (tr_ok(tr, ot_softmax_backward(tr->be->ctx, tb_dl(dy), tb_dl(y), tb_dl(dx)),
            "ot_softmax_backward")) {
    tb_sync(dx);
    check_close(tr, "dx", dx, ref, tol_for(dt, 2));
  }
  free(xs);
  free(ys);
  free(ref);
  if (!inplace) tb_free(dx);
  tb_free(dy);
  tb_free(y);
  tr_end(tr);
}

/* ---- cross-entropy reference ---------------------------------------------------------- */

typedef struct ce_problem {
  int64_t N, V;
  const int64_t *labels;
  ot_cross_entropy_params p;
} ce_problem;

/* Per-row lse and loss (0 for ignored rows); returns the non-ignored count. */
static int64_t ce_rows_ref(const ce_problem *pb, const double *z, double *lse, double *loss) {
  int64_t count = 0;
  double s = pb->p.label_smoothing;
  for (int64_t i = 0; i < pb->N; i++) {
    const double *row = z + i * pb->V;
    double m = -INFINITY, se = 0.0, sz = 0.0;
    for (int64_t j = 0; j < pb->V; j++) m = row[j] > m ? row[j] : m;
    for (int64_t j = 0; j < pb->V; j++) {
      se += exp(row[j] - m);
      sz += row[j];
    }
    lse[i] = m + log(se);
    loss[i] = 0.0;
    if (pb->labels[i] == pb->p.ignore_index) continue;
    count++;
    loss[i] = (1.0 - s) * (lse[i] - row[pb->labels[i]]) + s * (lse[i] - sz / (double)pb->V);
  }
  return count;
}

/* The op's output: [1] for MEAN / SUM, [N] for NONE. */
static void ce_loss_ref(void *state, const double *z, double *out) {
  const ce_problem *pb = (const ce_problem *)state;
  double *lse = malloc((size_t)(pb->N + 1) * sizeof *lse), *rl = malloc((size_t)(pb->N + 1) * sizeof *rl);
  int64_t count = ce_rows_ref(pb, z, lse, rl);
  if (pb->p.reduction == OT_REDUCTION_NONE) {
    memcpy(out, rl, (size_t)pb->N * sizeof *out);
  } else {
    double t = 0.0;
    for (int64_t i = 0; i < pb->N; i++) t += rl[i];
    out[0] = pb->p.reduction == OT_REDUCTION_SUM ? t : count ? t / (double)count : NAN;
  }
  free(lse);
  free(rl);
}

/* Analytic dlogits for upstream gradient dloss ([1] or [N]). */
static void ce_grad_ref(const ce_problem *pb, const double *z, const double *dloss, double *dz) {
  double *lse = malloc((size_t)(pb->N + 1) * sizeof *lse), *rl = malloc((size_t)(pb->N + 1) * sizeof *rl);
  int64_t count = ce_rows_ref(pb, z, lse, rl);
  double s = pb->p.label_smoothing;
  for (int64_t i = 0; i < pb->N; i++) {
    double g = pb->p.reduction == OT_REDUCTION_NONE  ? dloss[i]
               : pb->p.reduction == OT_REDUCTION_SUM ? dloss[0]
                                                     : dloss[0] / (double)count;
    bool ign = pb->labels[i] == pb->p.ignore_index;
    for (int64_t j = 0; j < pb->V; j++) {
      double p = exp(z[i * pb->V + j] - lse[i]);
      dz[i * pb->V + j] =
          ign ? 0.0 : g * (p - (j == pb->labels[i] ? 1.0 - s : 0.0) - s / (double)pb->V);
    }
  }
  free(lse);
  free(rl);
}

/* ---- cross-entropy cases ---------------------------------------------------------------- */

typedef enum { IGN_NONE, IGN_SOME, IGN_ALL } ignore_mode;
static const char *ign_name(ignore_mode m) {
  return m == IGN_NONE ? "none-ignored" : m == IGN_SOME ? "some-ignored" : "all-ignored";
}
static const char *red_name(ot_reduction r) {
  return r == OT_REDUCTION_MEAN ? "mean" : r == OT_REDUCTION_SUM ? "sum" : "none";
}

typedef struct ce_case {
  DLDataType dt, label_dt;
  int64_t N, V, pad;
  ot_reduction red;
  double smoothing;
  ignore_mode ign;
  int64_t ignore_index;
  bool with_lse; /* forward: save lse; backward: pass the saved lse */
  bool inplace;  /* backward: dlogits is logits */
  bool loss_1d;  /* MEAN / SUM: loss shape [1] rather than [] */
  int64_t stride1d; /* element stride of labels, lse and NONE's loss / dloss (0 = 1) */
} ce_case;

/* Inputs of a case: logits in [-30, 30], labels with ignored rows per the mode. */
static tbuf *ce_setup(test_run *tr, const ce_case *c, rng *r, tbuf **labels, int64_t **lab) {
  tbuf *z = new2d(tr->be, c->dt, c->N, c->V, c->pad);
  tb_fill_uniform(z, r, -30.0, 30.0);
  *labels = new1d_s(tr->be, c->label_dt, c->N, c->stride1d ? c->stride1d : 1);
  *lab = malloc((size_t)(c->N + 1) * sizeof **lab);
  for (int64_t i = 0; i < c->N; i++) {
    int64_t y = rng_int(r, 0, c->V - 1);
    if (c->ign == IGN_ALL || (c->ign == IGN_SOME && i % 3 == 1)) y = c->ignore_index;
    (*lab)[i] = y;
    tb_set(*labels, i, (double)y);
  }
  return z;
}

static tbuf *new_loss(test_run *tr, const ce_case *c) {
  if (c->red == OT_REDUCTION_NONE)
    return new1d_s(tr->be, DT_F32, c->N, c->stride1d ? c->stride1d : 1);
  int64_t one[1] = {1};
  return tb_new(tr->be, DT_F32, c->loss_1d ? 1 : 0, one);
}

static ot_cross_entropy_params params_of(const ce_case *c) {
  ot_cross_entropy_params p = ot_cross_entropy_default_params();
  p.ignore_index = c->ignore_index;
  p.label_smoothing = (float)c->smoothing;
  p.reduction = c->red;
  return p;
}

static void case_ce_forward(test_run *tr, const ce_case *c) {
  if (!tr_begin(tr, "ce fwd %s labels=%s %lldx%lld pad=%lld %s s=%g %s ign=%lld%s%s%s",
                dt_name(c->dt), dt_name(c->label_dt), (long long)c->N, (long long)c->V,
                (long long)c->pad, red_name(c->red), c->smoothing, ign_name(c->ign),
                (long long)c->ignore_index, c->with_lse ? " lse" : "",
                c->loss_1d ? " loss[1]" : "", c->stride1d > 1 ? " strided-1d" : ""))
    return;
  rng r = tr_rng(tr);
  tbuf *labels;
  int64_t *lab;
  tbuf *z = ce_setup(tr, c, &r, &labels, &lab);
  tbuf *loss = new_loss(tr, c);
  tbuf *lse = c->with_lse ? new1d_s(tr->be, DT_F32, c->N, c->stride1d ? c->stride1d : 1) : NULL;
  ce_problem pb = {c->N, c->V, lab, params_of(c)};
  double *zv = tb_to_f64(z), *ref_loss = malloc((size_t)(c->N + 1) * sizeof *ref_loss);
  double *ref_lse = malloc((size_t)(c->N + 1) * sizeof *ref_lse);
  double *rl = malloc((size_t)(c->N + 1) * sizeof *rl);
  ce_rows_ref(&pb, zv, ref_lse, rl);
  ce_loss_ref(&pb, zv, ref_loss);
  ot_status st = ot_cross_entropy_forward(tr->be->ctx, &pb.p, tb_dl(z), tb_dl(labels),
                                          tb_dl(loss), lse ? tb_dl(lse) : NULL);
  if (tr_ok(tr, st, "ot_cross_entropy_forward")) {
    tb_sync(loss);
    check_close(tr, "loss", loss, ref_loss, tol_for(DT_F32, 4));
    if (lse) {
      tb_sync(lse);
      check_close(tr, "lse", lse, ref_lse, tol_for(DT_F32, 4));
    }
  }
  free(zv);
  free(ref_loss);
  free(ref_lse);
  free(rl);
  free(lab);
  tb_free(z);
  tb_free(labels);
  tb_free(loss);
  tb_free(lse);
  tr_end(tr);
}

static void case_ce_backward(test_run *tr, const ce_case *c) {
  if (!tr_begin(tr, "ce bwd %s labels=%s %lldx%lld pad=%lld %s s=%g %s%s%s%s", dt_name(c->dt),
                dt_name(c->label_dt), (long long)c->N, (long long)c->V, (long long)c->pad,
                red_name(c->red), c->smoothing, ign_name(c->ign), c->with_lse ? " lse" : "",
                c->inplace ? " inplace" : "", c->stride1d > 1 ? " strided-1d" : ""))
    return;
  rng r = tr_rng(tr);
  tbuf *labels;
  int64_t *lab;
  tbuf *z = ce_setup(tr, c, &r, &labels, &lab);
  tbuf *dloss = new_loss(tr, c);
  tb_fill_uniform(dloss, &r, 0.5, 2.0);
  ce_problem pb = {c->N, c->V, lab, params_of(c)};
  double *zv = tb_to_f64(z), *dl = tb_to_f64(dloss);
  double *ref = malloc((size_t)(c->N * c->V + 1) * sizeof *ref);
  ce_grad_ref(&pb, zv, dl, ref);
  tbuf *lse = NULL;
  if (c->with_lse) {
    /* The lse a forward would save (float32 rounding of the exact value). */
    double *rlse = malloc((size_t)(c->N + 1) * sizeof *rlse), *rl = malloc((size_t)(c->N + 1) * sizeof *rl);
    ce_rows_ref(&pb, zv, rlse, rl);
    lse = new1d_s(tr->be, DT_F32, c->N, c->stride1d ? c->stride1d : 1);
    for (int64_t i = 0; i < c->N; i++) tb_set(lse, i, rlse[i]);
    free(rlse);
    free(rl);
  }
  tbuf *dz = c->inplace ? z : new2d(tr->be, c->dt, c->N, c->V, c->pad ? c->pad + 1 : 0);
  ot_status st = ot_cross_entropy_backward(tr->be->ctx, &pb.p, tb_dl(dloss), tb_dl(z),
                                           tb_dl(labels), lse ? tb_dl(lse) : NULL, tb_dl(dz));
  if (tr_ok(tr, st, "ot_cross_entropy_backward")) {
    tb_sync(dz);
    check_close(tr, "dlogits", dz, ref, tol_for(c->dt, 2));
  }
  free(zv);
  free(dl);
  free(ref);
  free(lab);
  if (!c->inplace) tb_free(dz);
  tb_free(z);
  tb_free(labels);
  tb_free(dloss);
  tb_free(lse);
  tr_end(tr);
}

typedef struct ce_shape {
  int64_t N, V, pad;
} ce_shape;

static const ce_shape ce_shapes[] = {
    {1, 1, 0}, {7, 3, 0}, {64, 1000, 0}, {3, 32003, 0}, {7, 1000, 5}, {5, 2049, 3},
};

static void run_ce_table(test_run *tr) {
  const ot_reduction reds[] = {OT_REDUCTION_MEAN, OT_REDUCTION_SUM, OT_REDUCTION_NONE};
  const double smooth[] = {0.0, 0.1};
  int n = 0;
  for (int t = 0; t < 3; t++)
    for (size_t si = 0; si < sizeof ce_shapes / sizeof ce_shapes[0]; si++)
      for (int ri = 0; ri < 3; ri++)
        for (int k = 0; k < 2; k++, n++) {
          const ce_shape *s = &ce_shapes[si];
          ce_case c;
          memset(&c, 0, sizeof c);
          c.dt = *dtypes[t];
          c.label_dt = n % 2 ? DT_I32 : DT_I64;
          c.N = s->N;
          c.V = s->V;
          c.pad = s->pad;
          c.red = reds[ri];
          c.smoothing = smooth[k];
          /* N = 1: one ignored row is the all-ignored case */
          c.ign = (n % 3 == 2) ? IGN_SOME : IGN_NONE;
          c.ignore_index = (n % 5 == 4 && s->V > 2) ? 1 : -100; /* an in-range ignore_index */
          c.with_lse = n % 4 != 3;
          c.inplace = n % 3 == 1;
          c.loss_1d = n % 2 == 1;
          c.stride1d = n % 7 == 5 ? 3 : 1;
          case_ce_forward(tr, &c);
          case_ce_backward(tr, &c);
        }
  /* every row ignored: MEAN -> NaN, SUM -> 0, NONE -> zeros; dlogits all zero */
  for (int ri = 0; ri < 3; ri++)
    for (int k = 0; k < 2; k++) {
      ce_case c;
      memset(&c, 0, sizeof c);
      c.dt = DT_BF16;
      c.label_dt = DT_I64;
      c.N = 4;
      c.V = 37;
      c.red = reds[ri];
      c.smoothing = smooth[k];
      c.ign = IGN_ALL;
      c.ignore_index = -100;
      c.with_lse = true;
      c.inplace = k == 1;
      case_ce_forward(tr, &c);
      case_ce_backward(tr, &c);
    }
}

/* ---- bad inputs ------------------------------------------------------------------------ */

static void case_softmax_bad(test_run *tr) {
  if (!tr_begin(tr, "softmax bad inputs")) return;
  ot_context *ctx = tr->be->ctx;
  rng r = tr_rng(tr);
  tbuf *x = new2d(tr->be, DT_F32, 4, 8, 0), *o = new2d(tr->be, DT_F32, 4, 8, 0);
  tbuf *o16 = new2d(tr->be, DT_F16, 4, 8, 0), *o7 = new2d(tr->be, DT_F32, 4, 7, 0);
  tbuf *xi = new2d(tr->be, DT_I32, 4, 8, 0), *y = new2d(tr->be, DT_F32, 4, 8, 0);
  int64_t one[1] = {1};
  tbuf *x0 = tb_new(tr->be, DT_F32, 0, one);
  tb_fill_uniform(x, &r, -1, 1);
  tb_fill_uniform(y, &r, 0.1, 1);
  tb_fill_uniform(x0, &r, -1, 1);
  tbuf *outs[] = {o, o16, o7};
  void *snap[3];
  for (int i = 0; i < 3; i++) snap[i] = tb_snapshot(outs[i]);
  void *snap_x = tb_snapshot(x), *snap_y = tb_snapshot(y);
  const ot_status E = OT_ERR_INVALID_ARGUMENT;
  const char *F1 = "ot_softmax_forward", *B1 = "ot_softmax_backward";
  DLTensor t;
  tr_expect_error(tr, ot_softmax_forward(NULL, tb_dl(x), tb_dl(o)), E, F1, "ctx");
  tr_expect_error(tr, ot_softmax_forward(ctx, NULL, tb_dl(o)), E, F1, "x");
  tr_expect_error(tr, ot_softmax_forward(ctx, tb_dl(xi), tb_dl(o)), E, F1, "x");
  tr_expect_error(tr, ot_softmax_forward(ctx, tb_dl(x0), tb_dl(o)), E, F1, "x");
  tr_expect_error(tr, ot_softmax_forward(ctx, tb_dl(x), tb_dl(o16)), E, F1, "out");
  tr_expect_error(tr, ot_softmax_forward(ctx, tb_dl(x), tb_dl(o7)), E, F1, "out");
  tr_expect_error(tr, ot_softmax_forward(ctx, tb_dl(x), NULL), E, F1, "out");
  t = *tb_dl(x);
  t.data = NULL;
  tr_expect_error(tr, ot_softmax_forward(ctx, &t, tb_dl(o)), E, F1, "x");
  t = *tb_dl(x);
  t.byte_offset = 2;
  tr_expect_error(tr, ot_softmax_forward(ctx, &t, tb_dl(o)), E, F1, "x");
  {
    int64_t sh[2] = {4, 4}, st[2] = {8, 2};
    t = *tb_dl(x);
    t.shape = sh;
    t.strides = st;
    DLTensor to = *tb_dl(o);
    to.shape = sh;
    tr_expect_error(tr, ot_softmax_forward(ctx, &t, &to), E, F1, "x");
    /* out a window of x shifted by one element: partial overlap */
    int64_t sh2[2] = {3, 8};
    DLTensor a = *tb_dl(x), b = *tb_dl(x);
    a.shape = b.shape = sh2;
    b.byte_offset = 4;
    tr_expect_error(tr, ot_softmax_forward(ctx, &a, &b), E, F1, "out");
    DLTensor yy = *tb_dl(y);
    yy.shape = sh2;
    tr_expect_error(tr, ot_softmax_backward(ctx, &a, &yy, &b), E, B1, "dx");
  }
  tr_expect_error(tr, ot_softmax_backward(ctx, tb_dl(x), tb_dl(o16), tb_dl(o)), E, B1, "y");
  tr_expect_error(tr, ot_softmax_backward(ctx, tb_dl(x), tb_dl(y), tb_dl(o7)), E, B1, "dx");
  tr_expect_error(tr, ot_softmax_backward(ctx, tb_dl(x), tb_dl(y), tb_dl(y)), E, B1, "dx");
  tr_expect_error(tr, ot_softmax_backward(ctx, NULL, tb_dl(y), tb_dl(o)), E, B1, "dy");
  for (int i = 0; i < 3; i++) {
    if (!tb_unchanged(outs[i], snap[i])) tr_fail(tr, "output %d written by a failing call", i);
    free(snap[i]);
  }
  if (!tb_unchanged(x, snap_x) || !tb_unchanged(y, snap_y))
    tr_fail(tr, "x or y written by a failing call");
  free(snap_x);
  free(snap_y);
  tbuf *all[] = {x, o, o16, o7, xi, y, x0};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tb_free(all[i]);
  tr_end(tr);
}

static void case_ce_bad(test_run *tr) {
  if (!tr_begin(tr, "ce bad inputs")) return;
  ot_context *ctx = tr->be->ctx;
  rng r = tr_rng(tr);
  const int64_t N = 5, V = 11;
  tbuf *z = new2d(tr->be, DT_F32, N, V, 0), *dz = new2d(tr->be, DT_F32, N, V, 0);
  tbuf *dz16 = new2d(tr->be, DT_F16, N, V, 0), *zi = new2d(tr->be, DT_I32, N, V, 0);
  int64_t s3[3] = {1, N, V};
  tbuf *z3 = tb_new(tr->be, DT_F32, 3, s3);
  tbuf *lab = new1d(tr->be, DT_I64, N), *labf = new1d(tr->be, DT_F32, N);
  tbuf *lab4 = new1d(tr->be, DT_I32, N - 1);
  int64_t one[1] = {1};
  tbuf *loss0 = tb_new(tr->be, DT_F32, 0, one), *lossN = new1d(tr->be, DT_F32, N);
  tbuf *loss16 = tb_new(tr->be, DT_F16, 0, one), *lse = new1d(tr->be, DT_F32, N);
  tbuf *lse4 = new1d(tr->be, DT_F32, N - 1), *dl0 = tb_new(tr->be, DT_F32, 0, one);
  tb_fill_uniform(z, &r, -3, 3);
  tb_fill_uniform(z3, &r, -3, 3);
  tb_fill_uniform(labf, &r, 0, 3);
  tb_fill_uniform(dl0, &r, 0.5, 1);
  for (int64_t i = 0; i < N; i++) tb_set(lab, i, (double)(i * 2));
  for (int64_t i = 0; i < N - 1; i++) tb_set(lab4, i, 1);
  tbuf *outs[] = {dz, dz16, loss0, lossN, loss16, lse, lse4};
  void *snap[7];
  for (int i = 0; i < 7; i++) snap[i] = tb_snapshot(outs[i]);
  void *snap_z = tb_snapshot(z);
  const ot_status E = OT_ERR_INVALID_ARGUMENT;
  const char *F1 = "ot_cross_entropy_forward", *B1 = "ot_cross_entropy_backward";
  ot_cross_entropy_params p = ot_cross_entropy_default_params(), q;
  DLTensor t;
#define FWD(pp, zz, ll, lo, ls) ot_cross_entropy_forward(ctx, pp, zz, ll, lo, ls)
#define BWD(pp, dl, zz, ll, ls, d) ot_cross_entropy_backward(ctx, pp, dl, zz, ll, ls, d)
  tr_expect_error(tr, ot_cross_entropy_forward(NULL, &p, tb_dl(z), tb_dl(lab), tb_dl(loss0), NULL),
                  E, F1, "ctx");
  tr_expect_error(tr, FWD(&p, NULL, tb_dl(lab), tb_dl(loss0), NULL), E, F1, "logits");
  tr_expect_error(tr, FWD(&p, tb_dl(zi), tb_dl(lab), tb_dl(loss0), NULL), E, F1, "logits");
  tr_expect_error(tr, FWD(&p, tb_dl(z3), tb_dl(lab), tb_dl(loss0), NULL), E, F1, "logits");
  tr_expect_error(tr, FWD(&p, tb_dl(z), tb_dl(labf), tb_dl(loss0), NULL), E, F1, "labels");
  tr_expect_error(tr, FWD(&p, tb_dl(z), tb_dl(lab4), tb_dl(loss0), NULL), E, F1, "labels");
  tr_expect_error(tr, FWD(&p, tb_dl(z), tb_dl(lab), tb_dl(lossN), NULL), E, F1, "loss");
  tr_expect_error(tr, FWD(&p, tb_dl(z), tb_dl(lab), tb_dl(loss16), NULL), E, F1, "loss");
  tr_expect_error(tr, FWD(&p, tb_dl(z), tb_dl(lab), tb_dl(loss0), tb_dl(lse4)), E, F1, "lse");
  tr_expect_error(tr, FWD(&p, tb_dl(z), tb_dl(lab), tb_dl(lse), tb_dl(lse)), E, F1, "loss");
  q = p;
  q.reduction = OT_REDUCTION_NONE;
  tr_expect_error(tr, FWD(&q, tb_dl(z), tb_dl(lab), tb_dl(loss0), NULL), E, F1, "loss");
  q = p;
  q.reduction = (ot_reduction)7;
  tr_expect_error(tr, FWD(&q, tb_dl(z), tb_dl(lab), tb_dl(loss0), NULL), E, F1, "reduction");
  q = p;
  q.label_smoothing = 1.5f;
  tr_expect_error(tr, FWD(&q, tb_dl(z), tb_dl(lab), tb_dl(loss0), NULL), E, F1, "label_smoothing");
  q.label_smoothing = NAN;
  tr_expect_error(tr, FWD(&q, tb_dl(z), tb_dl(lab), tb_dl(loss0), NULL), E, F1, "label_smoothing");
  q.label_smoothing = -0.1f;
  tr_expect_error(tr, FWD(&q, tb_dl(z), tb_dl(lab), tb_dl(loss0), NULL), E, F1, "label_smoothing");
  t = *tb_dl(z);
  t.data = NULL;
  tr_expect_error(tr, FWD(&p, &t, tb_dl(lab), tb_dl(loss0), NULL), E, F1, "logits");
  t = *tb_dl(z);
  t.byte_offset = 2;
  tr_expect_error(tr, FWD(&p, &t, tb_dl(lab), tb_dl(loss0), NULL), E, F1, "logits");
  {
    int64_t sh[2] = {N, 5}, st[2] = {V, 2};
    t = *tb_dl(z);
    t.shape = sh;
    t.strides = st;
    tr_expect_error(tr, FWD(&p, &t, tb_dl(lab), tb_dl(loss0), NULL), E, F1, "logits");
  }
  t = *tb_dl(lab);
  t.data = NULL;
  tr_expect_error(tr, FWD(&p, tb_dl(z), &t, tb_dl(loss0), NULL), E, F1, "labels");
  /* labels out of range: row 3 holds V, then row 2 holds -5. Label values are checked
   * on the host only: on CUDA they live on the device and are not checked (the header
   * states the contract: NaN rows), so these calls would succeed there. */
  if (!tr->be->is_cuda) {
    tb_set(lab, 3, (double)V);
    tr_expect_error(tr, FWD(&p, tb_dl(z), tb_dl(lab), tb_dl(loss0), tb_dl(lse)), E, "labels",
                    "row 3");
    tr_expect_error(tr, BWD(&p, tb_dl(dl0), tb_dl(z), tb_dl(lab), NULL, tb_dl(dz)), E, B1,
                    "row 3");
    tb_set(lab, 3, 1);
    tb_set(lab, 2, -5);
    tr_expect_error(tr, FWD(&p, tb_dl(z), tb_dl(lab), tb_dl(loss0), tb_dl(lse)), E, "labels",
                    "-5");
    tr_expect_error(tr, BWD(&p, tb_dl(dl0), tb_dl(z), tb_dl(lab), NULL, tb_dl(z)), E, "labels",
                    "row 2");
    tb_set(lab, 2, 4);
  }
  tr_expect_error(tr, BWD(&p, tb_dl(lossN), tb_dl(z), tb_dl(lab), NULL, tb_dl(dz)), E, B1, "dloss");
  tr_expect_error(tr, BWD(&p, NULL, tb_dl(z), tb_dl(lab), NULL, tb_dl(dz)), E, B1, "dloss");
  tr_expect_error(tr, BWD(&p, tb_dl(dl0), tb_dl(z), tb_dl(lab), NULL, tb_dl(dz16)), E, B1,
                  "dlogits");
  tr_expect_error(tr, BWD(&p, tb_dl(dl0), tb_dl(z), tb_dl(lab), tb_dl(lse4), tb_dl(dz)), E, B1,
                  "lse");
  tr_expect_error(tr, BWD(&p, tb_dl(dl0), tb_dl(z), tb_dl(lab), NULL, NULL), E, B1, "dlogits");
  {
    /* dlogits: logits shifted by one row-and-one-element window (partial overlap) */
    int64_t sh[2] = {N - 1, V};
    DLTensor a = *tb_dl(z), b = *tb_dl(z);
    a.shape = b.shape = sh;
    b.byte_offset = 4;
    DLTensor l4 = *tb_dl(lab4);
    tr_expect_error(tr, BWD(&p, tb_dl(dl0), &a, &l4, NULL, &b), E, B1, "dlogits");
  }
#undef FWD
#undef BWD
  for (int i = 0; i < 7; i++) {
    if (!tb_unchanged(outs[i], snap[i])) tr_fail(tr, "output %d written by a failing call", i);
    free(snap[i]);
  }
  if (!tb_unchanged(z, snap_z)) tr_fail(tr, "logits written by a failing in-place call");
  free(snap_z);
  tbuf *all[] = {z, dz, dz16, zi, z3, lab, labf, lab4, loss0, lossN, loss16, lse, lse4, dl0};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tb_free(all[i]);
  tr_end(tr);
}

/* ---- gradient mode ----------------------------------------------------------------------- */

typedef struct sm_fd {
  int64_t R, N;
} sm_fd;

static void softmax_rows_ref(void *state, const double *in, double *out) {
  const sm_fd *s = (const sm_fd *)state;
  for (int64_t i = 0; i < s->R; i++) softmax_ref(in + i * s->N, out + i * s->N, s->N);
}

static void case_softmax_grad(test_run *tr, int64_t R, int64_t N) {
  if (!tr_begin(tr, "softmax grad %lldx%lld", (long long)R, (long long)N)) return;
  rng r = tr_rng(tr);
  sm_fd s = {R, N};
  tbuf *x = new2d(tr->be, DT_F32, R, N, 0), *y = new2d(tr->be, DT_F32, R, N, 0);
  tbuf *dy = new2d(tr->be, DT_F32, R, N, 0), *dx = new2d(tr->be, DT_F32, R, N, 0);
  tb_fill_uniform(x, &r, -3, 3);
  tb_fill_uniform(dy, &r, -1, 1);
  double *xv = tb_to_f64(x), *dyv = tb_to_f64(dy), *grad = malloc((size_t)(R * N) * sizeof *grad);
  fd_vjp(softmax_rows_ref, &s, xv, R * N, R * N, dyv, grad, 1e-4);
  if (tr_ok(tr, ot_softmax_forward(tr->be->ctx, tb_dl(x), tb_dl(y)), "ot_softmax_forward") &&
      tr_ok(tr, ot_softmax_backward(tr->be->ctx, tb_dl(dy), tb_dl(y), tb_dl(dx)),
            "ot_softmax_backward")) {
    tb_sync(dx);
    check_close(tr, "dx vs finite differences", dx, grad, tol_for(DT_F32, 10));
  }
  free(xv);
  free(dyv);
  free(grad);
  tb_free(x);
  tb_free(y);
  tb_free(dy);
  tb_free(dx);
  tr_end(tr);
}

static void case_ce_grad(test_run *tr, ot_reduction red, double smoothing, bool with_lse) {
  if (!tr_begin(tr, "ce grad %s s=%g%s", red_name(red), smoothing, with_lse ? " lse" : ""))
    return;
  rng r = tr_rng(tr);
  const int64_t N = 4, V = 6;
  ce_case c;
  memset(&c, 0, sizeof c);
  c.dt = DT_F32;
  c.label_dt = DT_I32;
  c.N = N;
  c.V = V;
  c.red = red;
  c.smoothing = smoothing;
  c.ign = IGN_SOME;
  c.ignore_index = -100;
  tbuf *labels;
  int64_t *lab;
  tbuf *z = ce_setup(tr, &c, &r, &labels, &lab);
  /* modest logits: finite differences of exp need no huge exponents */
  for (int64_t i = 0; i < N * V; i++) tb_set(z, i, dt_round(DT_F32, tb_get(z, i) / 10.0));
  ce_problem pb = {N, V, lab, params_of(&c)};
  tbuf *dloss = new_loss(tr, &c), *dz = new2d(tr->be, DT_F32, N, V, 0);
  tbuf *lse = with_lse ? new1d(tr->be, DT_F32, N) : NULL, *loss = new_loss(tr, &c);
  tb_fill_uniform(dloss, &r, 0.5, 2.0);
  int64_t n_out = red == OT_REDUCTION_NONE ? N : 1;
  double *zv = tb_to_f64(z), *dl = tb_to_f64(dloss), *grad = malloc((size_t)(N * V) * sizeof *grad);
  fd_vjp(ce_loss_ref, &pb, zv, N * V, n_out, dl, grad, 1e-4);
  bool ran = true;
  if (lse)
    ran = tr_ok(tr, ot_cross_entropy_forward(tr->be->ctx, &pb.p, tb_dl(z), tb_dl(labels),
                                             tb_dl(loss), tb_dl(lse)),
                "ot_cross_entropy_forward");
  if (ran && tr_ok(tr, ot_cross_entropy_backward(tr->be->ctx, &pb.p, tb_dl(dloss), tb_dl(z),
                                                 tb_dl(labels), lse ? tb_dl(lse) : NULL,
                                                 tb_dl(dz)),
                   "ot_cross_entropy_backward")) {
    tb_sync(dz);
    check_close(tr, "dlogits vs finite differences", dz, grad, tol_for(DT_F32, 10));
  }
  free(zv);
  free(dl);
  free(grad);
  free(lab);
  tb_free(z);
  tb_free(labels);
  tb_free(dloss);
  tb_free(dz);
  tb_free(lse);
  tb_free(loss);
  tr_end(tr);
}

static void run(test_run *tr) {
  if (tr->grad) {
    case_softmax_grad(tr, 1, 1);
    case_softmax_grad(tr, 3, 7);
    const ot_reduction reds[] = {OT_REDUCTION_MEAN, OT_REDUCTION_SUM, OT_REDUCTION_NONE};
    for (int ri = 0; ri < 3; ri++)
      for (int k = 0; k < 2; k++) case_ce_grad(tr, reds[ri], k ? 0.1 : 0.0, k == 1);
    return;
  }
  const size_t ns = sizeof sm_shapes / sizeof sm_shapes[0];
  for (int t = 0; t < 3; t++)
    for (size_t i = 0; i < ns; i++) {
      case_softmax_forward(tr, *dtypes[t], &sm_shapes[i], i % 2 ? 30.0 : 3.0, false, i % 3 == 2);
      case_softmax_forward(tr, *dtypes[t], &sm_shapes[i], 30.0, true, false);
      case_softmax_backward(tr, *dtypes[t], &sm_shapes[i], i % 2 == 0);
    }
  run_ce_table(tr);
  case_softmax_bad(tr);
  case_ce_bad(tr);
}

const test_suite suite_softmax_ce = {"softmax_ce", run};
