/*
 * cases_linear_ce.c -- ot_linear_cross_entropy against a float64 reference.
 *
 * The reference follows the op's contract (F.linear then F.cross_entropy in the storage
 * dtype): logits = round_dtype(hidden W^T) computed exactly from the stored inputs,
 * lse / losses in float64, dlogits = round_dtype(g (softmax - s/V - (1-s) onehot)) with
 * g = 1 (SUM) or 1 / count (MEAN), then dhidden = dlogits W and dweight = dlogits^T
 * hidden in float64. So the errors measured are the library's: float32 accumulation,
 * the output rounding, and the rare logit that a float32-accumulated product rounds to
 * the neighbouring 16-bit value (a 1-ulp change of one logit).
 * Tolerances: loss tol_for(dtype, 2) (float32: tol_for(float32, 4)); gradients relative
 * to the largest reference value, whose size depends on g: atol = e * max|ref|,
 * rtol = e with e = 1.6e-2 (bf16), 2e-3 (fp16), 1e-5 max(1, sqrt(R)/8) (fp32, R the
 * reduction length); a 16-bit dweight is rounded once per chunk, so its e is multiplied
 * by the number of chunks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef struct lce_ref_in {
  const double *h, *w;
  const int64_t *y;
  int64_t T, H, V, ignore;
  double smoothing;
  ot_reduction red;
  DLDataType dt;
  bool round; /* round logits / dlogits to dt (false: exact, for finite differences) */
} lce_ref_in;

static double rnd(const lce_ref_in *in, double v) { return in->round ? dt_round(in->dt, v) : v; }

/* loss: [T] (NONE) or [1]; dh [T, H] and dw [V, H] when not NULL. */
static void lce_ref(const lce_ref_in *in, double *loss, double *dh, double *dw) {
  const int64_t T = in->T, H = in->H, V = in->V;
  const double s = in->smoothing;
  double *z = malloc((size_t)(V > 0 ? V : 1) * sizeof *z);
  int64_t count = 0;
  for (int64_t t = 0; t < T; t++) count += in->y[t] != in->ignore;
  const double g = in->red == OT_REDUCTION_SUM ? 1.0 : count > 0 ? 1.0 / (double)count : 0.0;
  double total = 0.0;
  if (dh) memset(dh, 0, (size_t)(T * H) * sizeof *dh);
  if (dw) memset(dw, 0, (size_t)(V * H) * sizeof *dw);
  for (int64_t t = 0; t < T; t++) {
    const int64_t y = in->y[t];
    if (y == in->ignore) {
      if (in->red == OT_REDUCTION_NONE) loss[t] = 0.0;
      continue;
    }
    double m = -INFINITY, sz = 0.0;
    for (int64_t v = 0; v < V; v++) {
      double a = 0.0;
      for (int64_t k = 0; k < H; k++) a += in->h[t * H + k] * in->w[v * H + k];
      z[v] = rnd(in, a);
      if (z[v] > m) m = z[v];
      sz += z[v];
    }
    double se = 0.0;
    for (int64_t v = 0; v < V; v++) se += exp(z[v] - m);
    const double lse = m + log(se);
    const double li = (1.0 - s) * (lse - z[y]) + s * (lse - sz / (double)V);
    if (in->red == OT_REDUCTION_NONE) loss[t] = li;
    else total += li;
    if (!dh && !dw) continue;
    for (int64_t v = 0; v < V; v++) {
      double d = rnd(in, g * (exp(z[v] - lse) - s / (double)V - (v == y ? 1.0 - s : 0.0)));
      if (d == 0.0) continue;
      for (int64_t k = 0; k < H; k++) {
        if (dh) dh[t * H + k] += d * in->w[v * H + k];
        if (dw) dw[v * H + k] += d * in->h[t * H + k];
      }
    }
  }
  if (in->red != OT_REDUCTION_NONE)
    loss[0] = in->red == OT_REDUCTION_MEAN ? (count > 0 ? total / (double)count : NAN) : total;
  free(z);
}

static double max_abs(const double *x, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
  return m;
}

static tol grad_tol(DLDataType dt, double maxref, int64_t reduction, double factor) {
  double e;
  if (dt.code == kDLBfloat) e = 1.6e-2;
  else if (dt.bits == 16) e = 2e-3;
  else {
    double k = sqrt((double)reduction) / 8.0;
    e = 1e-5 * (k > 1.0 ? k : 1.0);
  }
  e *= factor;
  return (tol){e * (maxref > 0 ? maxref : 1.0), e};
}

typedef struct lce_case {
  int64_t T, H, V, chunk, pad;
  int ignore_every; /* every n-th token ignored (0: none) */
} lce_case;

static const lce_case cases[] = {
    {1, 8, 5, 0, 0, 0},    {7, 16, 33, 3, 0, 3},  {64, 64, 1000, 16, 0, 5}, {37, 24, 7, 1, 5, 4},
    {5, 3, 1, 2, 0, 0},    {50, 40, 130, 0, 2, 7}, {0, 8, 5, 0, 0, 0},
};
#define N_CASES (sizeof cases / sizeof cases[0])

enum { G_DH = 1, G_DW = 2, G_DW32 = 4, G_WS = 8, G_L32 = 16 };

static void lce_case_run(test_run *tr, DLDataType dt, const lce_case *c, ot_reduction red,
                         float smoothing, int flags) {
  static const char *rn[3] = {"mean", "sum", "none"};
  if (!tr_begin(tr, "linear_ce %s T=%lld H=%lld V=%lld chunk=%lld pad=%lld %s s=%g%s%s%s%s%s",
                dt_name(dt), (long long)c->T, (long long)c->H, (long long)c->V,
                (long long)c->chunk, (long long)c->pad, rn[red], (double)smoothing,
                flags & G_DH ? " dhidden" : "", flags & G_DW ? " dweight" : "",
                flags & G_DW32 ? " (fp32)" : "", flags & G_WS ? " workspace" : "",
                flags & G_L32 ? " int32 labels" : ""))
    return;
  const backend *be = tr->be;
  rng r = tr_rng(tr);
  const int64_t T = c->T, H = c->H, V = c->V;
  int64_t hs[2] = {T, H}, hst[2] = {H + c->pad, 1}, ws_[2] = {V, H}, ts[1] = {T};
  tbuf *h = tb_new_strided(be, dt, 2, hs, c->pad ? hst : NULL);
  tbuf *w = tb_new(be, dt, 2, ws_);
  tbuf *y = tb_new(be, flags & G_L32 ? DT_I32 : DT_I64, 1, ts);
  tb_fill_uniform(h, &r, -1, 1);
  tb_fill_uniform(w, &r, -2.0 / sqrt((double)(H > 0 ? H : 1)), 2.0 / sqrt((double)(H > 0 ? H : 1)));
  int64_t *labels = malloc((size_t)(T > 0 ? T : 1) * sizeof *labels);
  for (int64_t t = 0; t < T; t++) {
    labels[t] = c->ignore_every && t % c->ignore_every == 1 ? -100 : rng_int(&r, 0, V - 1);
    tb_set(y, t, (double)labels[t]);
  }
  int64_t one[1] = {1};
  tbuf *loss = red == OT_REDUCTION_NONE ? tb_new(be, DT_F32, 1, ts) : tb_new(be, DT_F32, 1, one);
  tbuf *dh = flags & G_DH ? tb_new_strided(be, dt, 2, hs, c->pad ? hst : NULL) : NULL;
  tbuf *dw = flags & G_DW ? tb_new(be, flags & G_DW32 ? DT_F32 : dt, 2, ws_) : NULL;
  ot_linear_cross_entropy_params p = ot_linear_cross_entropy_default_params();
  p.ce.reduction = red;
  p.ce.label_smoothing = smoothing;
  p.chunk_tokens = c->chunk;
  tbuf *ws = NULL;
  if (flags & G_WS) {
    size_t bytes = 0;
    if (ot_linear_cross_entropy_workspace_size(&p, T, H, V, dt, &bytes) != OT_OK)
      tr_fail(tr, "workspace_size: %s", ot_last_error());
    int64_t n[1] = {(int64_t)(bytes + 3) / 4};
    ws = tb_new(be, DT_I32, 1, n);
  }
  void *hsnap = dh ? tb_snapshot(dh) : NULL;
  ot_status st = ot_linear_cross_entropy(be->ctx, &p, tb_dl(h), tb_dl(w), tb_dl(y), tb_dl(loss),
                                         dh ? tb_dl(dh) : NULL, dw ? tb_dl(dw) : NULL,
                                         ws ? tb_dl(ws) : NULL);
  if (tr_ok(tr, st, "ot_linear_cross_entropy")) {
    double *hd = tb_to_f64(h), *wd = tb_to_f64(w);
    lce_ref_in in = {hd, wd, labels, T, H, V, -100, smoothing, red, dt, true};
    const int64_t nl = red == OT_REDUCTION_NONE ? T : 1;
    double *rl = malloc((size_t)(nl > 0 ? nl : 1) * sizeof *rl);
    double *rdh = malloc((size_t)(T * H > 0 ? T * H : 1) * sizeof *rdh);
    double *rdw = malloc((size_t)(V * H > 0 ? V * H : 1) * sizeof *rdw);
    lce_ref(&in, rl, dh ? rdh : NULL, dw ? rdw : NULL);
    tb_sync(loss);
    bool f32 = dt.code == kDLFloat && dt.bits == 32;
    check_close(tr, "loss", loss, rl, f32 ? tol_for(DT_F32, 4) : tol_for(dt, 2));
    if (dh) {
      tb_sync(dh);
      check_close(tr, "dhidden", dh, rdh, grad_tol(dt, max_abs(rdh, T * H), V, 1.0));
      if (c->pad && T > 1) { /* the padding of dhidden kept its bytes */
        size_t es = dt_size(dt);
        for (int64_t t = 0; t + 1 < T; t++) {
          size_t off = (size_t)(t * (H + c->pad) + H) * es;
          if (memcmp((char *)dh->host + off, (char *)hsnap + off, (size_t)c->pad * es)) {
            tr_fail(tr, "dhidden: padding after row %lld was written", (long long)t);
            break;
          }
        }
      }
    }
    if (dw) {
      tb_sync(dw);
      int64_t chunk = c->chunk > 0 ? c->chunk : T;
      double nch = T > 0 ? (double)((T + chunk - 1) / chunk) : 1.0;
      DLDataType dwt = flags & G_DW32 ? DT_F32 : dt;
      /* a float32 dweight of 16-bit inputs keeps the inputs' tolerance: a logit rounded
       * to its neighbour changes its dlogits element by up to one 16-bit ulp */
      check_close(tr, "dweight", dw, rdw,
                  grad_tol(dt, max_abs(rdw, V * H), T, dwt.bits == 32 ? 1.0 : nch));
    }
    free(hd);
    free(wd);
    free(rl);
    free(rdh);
    free(rdw);
  }
  free(hsnap);
  free(labels);
  tb_free(h);
  tb_free(w);
  tb_free(y);
  tb_free(loss);
  tb_free(dh);
  tb_free(dw);
  tb_free(ws);
  tr_end(tr);
}

/* Every token ignored: MEAN gives NaN and zero gradients (torch's convention). */
static void all_ignored(test_run *tr, DLDataType dt) {
  if (!tr_begin(tr, "linear_ce %s all tokens ignored", dt_name(dt))) return;
  const backend *be = tr->be;
  rng r = tr_rng(tr);
  int64_t hs[2] = {6, 8}, wsh[2] = {11, 8}, ts[1] = {6}, one[1] = {1};
  tbuf *h = tb_new(be, dt, 2, hs), *w = tb_new(be, dt, 2, wsh), *y = tb_new(be, DT_I64, 1, ts);
  tbuf *loss = tb_new(be, DT_F32, 1, one), *dh = tb_new(be, dt, 2, hs), *dw = tb_new(be, dt, 2, wsh);
  tb_fill_uniform(h, &r, -1, 1);
  tb_fill_uniform(w, &r, -1, 1);
  for (int t = 0; t < 6; t++) tb_set(y, t, -100);
  ot_linear_cross_entropy_params p = ot_linear_cross_entropy_default_params();
  p.chunk_tokens = 4;
  if (tr_ok(tr, ot_linear_cross_entropy(be->ctx, &p, tb_dl(h), tb_dl(w), tb_dl(y), tb_dl(loss),
                                        tb_dl(dh), tb_dl(dw), NULL),
            "ot_linear_cross_entropy")) {
    tb_sync(loss);
    tb_sync(dh);
    tb_sync(dw);
    if (!isnan(tb_get(loss, 0))) tr_fail(tr, "loss %g, expected NaN", tb_get(loss, 0));
    for (int64_t i = 0; i < 48; i++)
      if (tb_get(dh, i) != 0.0) { tr_fail(tr, "dhidden[%lld] = %g", (long long)i, tb_get(dh, i)); break; }
    for (int64_t i = 0; i < 88; i++)
      if (tb_get(dw, i) != 0.0) { tr_fail(tr, "dweight[%lld] = %g", (long long)i, tb_get(dw, i)); break; }
  }
  tb_free(h);
  tb_free(w);
  tb_free(y);
  tb_free(loss);
  tb_free(dh);
  tb_free(dw);
  tr_end(tr);
}

static void bad_inputs(test_run *tr, DLDataType dt) {
  if (!tr_begin(tr, "linear_ce bad inputs %s", dt_name(dt))) return;
  const backend *be = tr->be;
  ot_context *ctx = be->ctx;
  rng r = tr_rng(tr);
  int64_t hs[2] = {6, 8}, wsh[2] = {11, 8}, w7[2] = {11, 7}, ts[1] = {6}, one[1] = {1};
  tbuf *h = tb_new(be, dt, 2, hs), *w = tb_new(be, dt, 2, wsh), *y = tb_new(be, DT_I64, 1, ts);
  tbuf *loss = tb_new(be, DT_F32, 1, one), *dh = tb_new(be, dt, 2, hs), *dw = tb_new(be, dt, 2, wsh);
  tbuf *lossn = tb_new(be, DT_F32, 1, ts), *wbad = tb_new(be, dt, 2, w7);
  DLDataType other = dt.code == kDLBfloat ? DT_F16 : DT_BF16;
  tbuf *dwo = tb_new(be, other, 2, wsh);
  int64_t small[1] = {4};
  tbuf *ws = tb_new(be, DT_I32, 1, small);
  tb_fill_uniform(h, &r, -1, 1);
  tb_fill_uniform(w, &r, -1, 1);
  tb_fill_uniform(wbad, &r, -1, 1);
  for (int t = 0; t < 6; t++) tb_set(y, t, t);
  void *s_loss = tb_snapshot(loss), *s_dh = tb_snapshot(dh), *s_dw = tb_snapshot(dw);
  ot_linear_cross_entropy_params p = ot_linear_cross_entropy_default_params();
  const ot_status E = OT_ERR_INVALID_ARGUMENT;
  const char *F = "ot_linear_cross_entropy";
  tr_expect_error(tr, ot_linear_cross_entropy(NULL, &p, tb_dl(h), tb_dl(w), tb_dl(y), tb_dl(loss), tb_dl(dh), tb_dl(dw), NULL), E, F, "ctx");
  tr_expect_error(tr, ot_linear_cross_entropy(ctx, &p, tb_dl(h), tb_dl(wbad), tb_dl(y), tb_dl(loss), tb_dl(dh), tb_dl(dw), NULL), E, F, "weight");
  tr_expect_error(tr, ot_linear_cross_entropy(ctx, &p, tb_dl(h), tb_dl(w), tb_dl(y), tb_dl(lossn), tb_dl(dh), tb_dl(dw), NULL), E, F, "loss");
  tr_expect_error(tr, ot_linear_cross_entropy(ctx, &p, tb_dl(h), tb_dl(w), tb_dl(y), tb_dl(loss), tb_dl(dh), tb_dl(dwo), NULL), E, F, "dweight");
  tr_expect_error(tr, ot_linear_cross_entropy(ctx, &p, tb_dl(h), tb_dl(w), tb_dl(y), tb_dl(loss), tb_dl(h), tb_dl(dw), NULL), E, F, "dhidden");
  tr_expect_error(tr, ot_linear_cross_entropy(ctx, &p, tb_dl(h), tb_dl(w), tb_dl(y), tb_dl(loss), tb_dl(dh), tb_dl(dw), tb_dl(ws)), E, F, "workspace");
  ot_linear_cross_entropy_params b = p;
  b.ce.reduction = OT_REDUCTION_NONE;
  tr_expect_error(tr, ot_linear_cross_entropy(ctx, &b, tb_dl(h), tb_dl(w), tb_dl(y), tb_dl(lossn), tb_dl(dh), NULL, NULL), E, F, "dhidden");
  b = p;
  b.chunk_tokens = -1;
  tr_expect_error(tr, ot_linear_cross_entropy(ctx, &b, tb_dl(h), tb_dl(w), tb_dl(y), tb_dl(loss), tb_dl(dh), tb_dl(dw), NULL), E, F, "chunk_tokens");
  b = p;
  b.ce.label_smoothing = 2.0f;
  tr_expect_error(tr, ot_linear_cross_entropy(ctx, &b, tb_dl(h), tb_dl(w), tb_dl(y), tb_dl(loss), tb_dl(dh), tb_dl(dw), NULL), E, F, "label_smoothing");
  if (!be->is_cuda) { /* labels are validated on the host only */
    tb_set(y, 2, 11);
    tr_expect_error(tr, ot_linear_cross_entropy(ctx, &p, tb_dl(h), tb_dl(w), tb_dl(y), tb_dl(loss), tb_dl(dh), tb_dl(dw), NULL), E, F, "labels");
  }
  if (!tb_unchanged(loss, s_loss)) tr_fail(tr, "loss was written");
  if (!tb_unchanged(dh, s_dh)) tr_fail(tr, "dhidden was written");
  if (!tb_unchanged(dw, s_dw)) tr_fail(tr, "dweight was written");
  size_t bytes;
  tr_expect_error(tr, ot_linear_cross_entropy_workspace_size(&p, 4, 4, 4, DT_I32, &bytes), E,
                  "ot_linear_cross_entropy_workspace_size", "dtype");
  /* sizes whose workspace would wrap size_t: refused, not a wrapped (small) answer */
  b = p;
  b.chunk_tokens = (int64_t)1 << 40;
  tr_expect_error(tr, ot_linear_cross_entropy_workspace_size(&b, (int64_t)1 << 40, 4,
                                                            (int64_t)1 << 40, dt, &bytes),
                  E, "ot_linear_cross_entropy_workspace_size", "chunk_tokens");
  tr_expect_error(tr, ot_linear_cross_entropy_workspace_size(&p, 4, 4, (int64_t)1 << 62, dt,
                                                            &bytes),
                  E, "ot_linear_cross_entropy_workspace_size", "vocab_size");
  {
    /* H = 0: a [2^61, 0] weight holds no memory; its logits would (row = 2^61 x elem) */
    int64_t h0[2] = {6, 0}, w0[2] = {(int64_t)1 << 61, 0};
    tbuf *hz = tb_new(be, dt, 2, h0), *wz = tb_new(be, dt, 2, w0);
    tr_expect_error(tr, ot_linear_cross_entropy(ctx, &p, tb_dl(hz), tb_dl(wz), tb_dl(y), tb_dl(loss), NULL, NULL, NULL), E, F, "weight");
    if (!tb_unchanged(loss, s_loss)) tr_fail(tr, "loss was written (huge V)");
    tb_free(hz);
    tb_free(wz);
  }
  free(s_loss);
  free(s_dh);
  free(s_dw);
  tb_free(h);
  tb_free(w);
  tb_free(y);
  tb_free(loss);
  tb_free(dh);
  tb_free(dw);
  tb_free(lossn);
  tb_free(wbad);
  tb_free(dwo);
  tb_free(ws);
  tr_end(tr);
}

/* ---- gradient mode: finite differences of the exact float64 loss ---------------------- */

typedef struct fd_state {
  lce_ref_in in;
  int64_t nh;
} fd_state;

static void fd_loss(void *state, const double *x, double *out) {
  fd_state *s = state;
  lce_ref_in in = s->in;
  in.h = x;
  in.w = x + s->nh;
  lce_ref(&in, out, NULL, NULL);
}

static void grad_case(test_run *tr, int64_t T, int64_t H, int64_t V, ot_reduction red, float sm) {
  if (!tr_begin(tr, "linear_ce grad T=%lld H=%lld V=%lld red=%d s=%g", (long long)T,
                (long long)H, (long long)V, (int)red, (double)sm))
    return;
  const backend *be = tr->be;
  rng r = tr_rng(tr);
  int64_t hs[2] = {T, H}, wsh[2] = {V, H}, ts[1] = {T}, one[1] = {1};
  tbuf *h = tb_new(be, DT_F32, 2, hs), *w = tb_new(be, DT_F32, 2, wsh);
  tbuf *y = tb_new(be, DT_I64, 1, ts), *loss = tb_new(be, DT_F32, 1, one);
  tbuf *dh = tb_new(be, DT_F32, 2, hs), *dw = tb_new(be, DT_F32, 2, wsh);
  tb_fill_uniform(h, &r, -1, 1);
  tb_fill_uniform(w, &r, -1, 1);
  int64_t *labels = malloc((size_t)T * sizeof *labels);
  for (int64_t t = 0; t < T; t++) {
    labels[t] = t == 1 ? -100 : rng_int(&r, 0, V - 1);
    tb_set(y, t, (double)labels[t]);
  }
  ot_linear_cross_entropy_params p = ot_linear_cross_entropy_default_params();
  p.ce.reduction = red;
  p.ce.label_smoothing = sm;
  p.chunk_tokens = 2;
  if (tr_ok(tr, ot_linear_cross_entropy(be->ctx, &p, tb_dl(h), tb_dl(w), tb_dl(y), tb_dl(loss),
                                        tb_dl(dh), tb_dl(dw), NULL),
            "ot_linear_cross_entropy")) {
    tb_sync(dh);
    tb_sync(dw);
    const int64_t nh = T * H, nw = V * H;
    double *x = malloc((size_t)(nh + nw) * sizeof *x), *gr = malloc((size_t)(nh + nw) * sizeof *gr);
    double *hd = tb_to_f64(h), *wd = tb_to_f64(w);
    memcpy(x, hd, (size_t)nh * sizeof *x);
    memcpy(x + nh, wd, (size_t)nw * sizeof *x);
    fd_state s = {{NULL, NULL, labels, T, H, V, -100, sm, red, DT_F32, false}, nh};
    double dl = 1.0;
    fd_vjp(fd_loss, &s, x, nh + nw, 1, &dl, gr, 1e-4);
    check_close(tr, "dhidden vs finite differences", dh, gr, (tol){1e-5, 1e-4});
    check_close(tr, "dweight vs finite differences", dw, gr + nh, (tol){1e-5, 1e-4});
    free(x);
    free(gr);
    free(hd);
    free(wd);
  }
  free(labels);
  tb_free(h);
  tb_free(w);
  tb_free(y);
  tb_free(loss);
  tb_free(dh);
  tb_free(dw);
  tr_end(tr);
}

static void run(test_run *tr) {
  if (tr->grad) {
    grad_case(tr, 5, 4, 7, OT_REDUCTION_MEAN, 0.0f);
    grad_case(tr, 3, 6, 5, OT_REDUCTION_SUM, 0.1f);
    return;
  }
  const DLDataType dts[3] = {DT_F32, DT_BF16, DT_F16};
  for (int d = 0; d < 3; d++) {
    for (size_t i = 0; i < N_CASES; i++) {
      const lce_case *c = &cases[i];
      lce_case_run(tr, dts[d], c, OT_REDUCTION_MEAN, 0.0f, G_DH | G_DW);
      lce_case_run(tr, dts[d], c, OT_REDUCTION_SUM, 0.1f, G_DH | G_DW | G_DW32 | G_WS);
      lce_case_run(tr, dts[d], c, OT_REDUCTION_NONE, 0.05f, G_L32);
      if (i % 2 == 0) {
        lce_case_run(tr, dts[d], c, OT_REDUCTION_MEAN, 0.2f, G_DH | G_L32 | G_WS);
        lce_case_run(tr, dts[d], c, OT_REDUCTION_MEAN, 0.0f, G_DW | G_DW32);
      }
    }
    all_ignored(tr, dts[d]);
    bad_inputs(tr, dts[d]);
  }
}

const test_suite suite_linear_ce = {"linear_ce", run};
