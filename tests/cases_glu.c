/*
 * cases_glu.c -- SwiGLU / GeGLU (erf, tanh) forward and backward, split and fused
 * layouts, strided rows, in-place backward, bad inputs, and (--grad) finite
 * differences of the float64 reference.
 *
 * Tolerances: forward tol_for(dtype, 1) (elementwise: one activation and one product
 * in float32, then one rounding to storage). Backward tol_for(dtype, 2): act'(g) sums
 * two or three rounded float32 terms that cancel near its zeros (silu' at g ~ -1.28,
 * gelu' at g ~ -0.75), so the error there is absolute, about 2 ulp of dout * up.
 * Gradient mode tol_for(float32, 10): float32 backward against central differences
 * (h = 1e-4) of the float64 forward.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const char *kind_name(ot_glu_kind k) {
  return k == OT_GLU_SWIGLU ? "swiglu" : k == OT_GLU_GEGLU ? "geglu" : "geglu_tanh";
}

/* act(g) and act'(g) in float64. */
static double act_ref(ot_glu_kind k, double g, double *dact) {
  const double k0 = sqrt(2.0 / M_PI), k1 = 0.044715;
  if (k == OT_GLU_SWIGLU) {
    double s = 1.0 / (1.0 + exp(-g));
    if (dact) *dact = s + g * s * (1.0 - s);
    return g * s;
  }
  if (k == OT_GLU_GEGLU) {
    double cdf = 0.5 * (1.0 + erf(g / sqrt(2.0))), pdf = exp(-0.5 * g * g) / sqrt(2.0 * M_PI);
    if (dact) *dact = cdf + g * pdf;
    return g * cdf;
  }
  double u = k0 * (g + k1 * g * g * g), t = tanh(u);
  if (dact) *dact = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k0 * (1.0 + 3.0 * k1 * g * g);
  return 0.5 * g * (1.0 + t);
}

/* [rows, cols] with `pad` extra elements at the end of each row (0: contiguous). */
static tbuf *new2d(const backend *be, DLDataType dt, int64_t rows, int64_t cols, int64_t pad) {
  int64_t shape[2] = {rows, cols}, strides[2] = {cols + pad, 1};
  return tb_new_strided(be, dt, 2, shape, pad ? strides : NULL);
}

/* A [rows, F] view of one half of a [rows, 2F] buffer (as torch's chunk(2, -1)). */
typedef struct half_view {
  DLTensor t;
  int64_t shape[2], strides[2];
} half_view;

static const DLTensor *half_of(half_view *h, tbuf *b, int half, int64_t F) {
  const DLTensor *full = tb_dl(b);
  h->t = *full;
  h->shape[0] = b->shape[0];
  h->shape[1] = F;
  h->strides[0] = b->strides[0];
  h->strides[1] = 1;
  h->t.shape = h->shape;
  h->t.strides = h->strides;
  h->t.byte_offset = (uint64_t)(half * F) * (uint64_t)(b->t.dtype.bits / 8);
  return &h->t;
}

/* Element (r, f) of gate / up in either layout: fused buffers hold up at f + F. */
static double gate_at(const tbuf *g, int64_t r, int64_t f, int64_t ld) {
  return tb_get(g, r * ld + f);
}

typedef struct shape_case {
  int64_t rows, F, pad;
} shape_case;

/* {6, 5632, 0}: contiguous rows whose F is a multiple of the vector width but (except for
 * the float32 forward) not of the CUDA kernel's chunk (the 0.54 B model's MLP): the launch
 * treats them as one row -- the split forward and the in-place backward (the split
 * backward's dup rows are padded by one, so it takes the strided launch). */
static const shape_case shapes[] = {
    {1, 1, 0}, {3, 7, 0}, {5, 33, 2}, {4, 100, 0}, {2, 1500, 3}, {64, 257, 0}, {1, 4099, 0},
    {6, 5632, 0},
};
static const DLDataType *const dtypes[] = {&DT_F32, &DT_F16, &DT_BF16};
static const ot_glu_kind kinds[] = {OT_GLU_SWIGLU, OT_GLU_GEGLU, OT_GLU_GEGLU_TANH};

static void case_forward(test_run *tr, ot_glu_kind kind, DLDataType dt, const shape_case *s,
                         bool fused) {
  if (!tr_begin(tr, "glu fwd %s %s %s rows=%lld F=%lld pad=%lld", kind_name(kind), dt_name(dt),
                fused ? "fused" : "split", (long long)s->rows, (long long)s->F,
                (long long)s->pad))
    return;
  rng r = tr_rng(tr);
  int64_t R = s->rows, F = s->F, gw = fused ? 2 * F : F;
  tbuf *g = new2d(tr->be, dt, R, gw, s->pad), *u = fused ? NULL : new2d(tr->be, dt, R, F, 0);
  tbuf *o = new2d(tr->be, dt, R, F, s->pad ? s->pad + 1 : 0);
  tb_fill_uniform(g, &r, -6.0, 6.0);
  if (u) tb_fill_uniform(u, &r, -2.0, 2.0);
  double *ref = malloc((size_t)(R * F) * sizeof *ref);
  for (int64_t i = 0; i < R; i++)
    for (int64_t f = 0; f < F; f++) {
      double gv = gate_at(g, i, f, gw);
      double uv = fused ? gate_at(g, i, f + F, gw) : tb_get(u, i * F + f);
      ref[i * F + f] = act_ref(kind, gv, NULL) * uv;
    }
  if (tr_ok(tr, ot_glu_forward(tr->be->ctx, kind, tb_dl(g), u ? tb_dl(u) : NULL, tb_dl(o)),
            "ot_glu_forward")) {
    tb_sync(o);
    check_close(tr, "out", o, ref, tol_for(dt, 1));
  }
  free(ref);
  tb_free(g);
  tb_free(u);
  tb_free(o);
  tr_end(tr);
}

/* inplace: dgate is gate and dup is up (same tensors). recompute:
 * ot_glu_backward_recompute, whose out (poisoned first, padded rows) must hold the float64
 * act(gate) * up and, bit for bit, what ot_glu_forward writes for the same gate and up. */
static void case_backward(test_run *tr, ot_glu_kind kind, DLDataType dt, const shape_case *s,
                          bool fused, bool inplace, bool recompute) {
  if (!tr_begin(tr, "glu bwd%s %s %s %s%s rows=%lld F=%lld pad=%lld",
                recompute ? " recompute" : "", kind_name(kind), dt_name(dt),
                fused ? "fused" : "split", inplace ? " inplace" : "", (long long)s->rows,
                (long long)s->F, (long long)s->pad))
    return;
  rng r = tr_rng(tr);
  int64_t R = s->rows, F = s->F, gw = fused ? 2 * F : F;
  tbuf *d = new2d(tr->be, dt, R, F, s->pad);
  tbuf *g = new2d(tr->be, dt, R, gw, s->pad ? s->pad + 1 : 0);
  tbuf *u = fused ? NULL : new2d(tr->be, dt, R, F, 0);
  tbuf *dg = inplace ? g : new2d(tr->be, dt, R, gw, s->pad ? s->pad + 2 : 0);
  tbuf *du = fused ? NULL : inplace ? u : new2d(tr->be, dt, R, F, 1);
  tb_fill_uniform(d, &r, -1.0, 1.0);
  tb_fill_uniform(g, &r, -6.0, 6.0);
  if (u) tb_fill_uniform(u, &r, -2.0, 2.0);
  /* Reference laid out like dgate [R, gw] and dup [R, F] (and out [R, F]). */
  double *rg = malloc((size_t)(R * gw) * sizeof *rg), *ru = malloc((size_t)(R * F) * sizeof *ru);
  double *ro = malloc((size_t)(R * F) * sizeof *ro);
  for (int64_t i = 0; i < R; i++)
    for (int64_t f = 0; f < F; f++) {
      double gv = gate_at(g, i, f, gw), dv = tb_get(d, i * F + f), da;
      double uv = fused ? gate_at(g, i, f + F, gw) : tb_get(u, i * F + f);
      double a = act_ref(kind, gv, &da);
      rg[i * gw + f] = dv * uv * da;
      if (fused) rg[i * gw + F + f] = dv * a;
      else ru[i * F + f] = dv * a;
      ro[i * F + f] = a * uv;
    }
  tbuf *o = NULL, *fo = NULL;
  bool fwd_ok = false;
  if (recompute) {
    o = new2d(tr->be, dt, R, F, s->pad ? s->pad + 3 : 0);
    tb_poison(o);
    /* the forward's output first (in place, the backward overwrites gate) */
    fo = new2d(tr->be, dt, R, F, 0);
    fwd_ok = tr_ok(tr, ot_glu_forward(tr->be->ctx, kind, tb_dl(g), u ? tb_dl(u) : NULL,
                                      tb_dl(fo)), "ot_glu_forward");
    if (fwd_ok) tb_sync(fo);
  }
  ot_status st =
      recompute ? ot_glu_backward_recompute(tr->be->ctx, kind, tb_dl(d), tb_dl(g),
                                            u ? tb_dl(u) : NULL, tb_dl(dg),
                                            du ? tb_dl(du) : NULL, tb_dl(o))
                : ot_glu_backward(tr->be->ctx, kind, tb_dl(d), tb_dl(g), u ? tb_dl(u) : NULL,
                                  tb_dl(dg), du ? tb_dl(du) : NULL);
  if (tr_ok(tr, st, recompute ? "ot_glu_backward_recompute" : "ot_glu_backward")) {
    tb_sync(dg);
    check_close(tr, "dgate", dg, rg, tol_for(dt, 2));
    if (du) {
      tb_sync(du);
      check_close(tr, "dup", du, ru, tol_for(dt, 2));
    }
    if (o) {
      tb_sync(o);
      check_close(tr, "out", o, ro, tol_for(dt, 1));
      int64_t diff = 0, first = -1;
      for (int64_t i = 0; fwd_ok && i < R * F; i++)
        if (tb_get(o, i) != tb_get(fo, i) && diff++ == 0) first = i;
      if (diff)
        tr_fail(tr, "out: %lld of %lld elements differ from ot_glu_forward's (first at %lld: "
                    "%.9g vs %.9g)", (long long)diff, (long long)(R * F), (long long)first,
                tb_get(o, first), tb_get(fo, first));
    }
  }
  free(rg);
  free(ru);
  free(ro);
  tb_free(o);
  tb_free(fo);
  if (!inplace) {
    tb_free(dg);
    tb_free(du);
  }
  tb_free(d);
  tb_free(g);
  tb_free(u);
  tr_end(tr);
}

/* Split layout over the two halves of one fused buffer, backward in place: gate and
 * up (and dgate, dup) are interleaved strided views that never share an element. */
static void case_chunk_views(test_run *tr, ot_glu_kind kind, DLDataType dt) {
  if (!tr_begin(tr, "glu bwd %s %s chunk views inplace", kind_name(kind), dt_name(dt))) return;
  rng r = tr_rng(tr);
  const int64_t R = 9, F = 37;
  tbuf *buf = new2d(tr->be, dt, R, 2 * F, 3), *d = new2d(tr->be, dt, R, F, 0);
  tbuf *o = new2d(tr->be, dt, R, F, 0);
  tb_fill_uniform(buf, &r, -5.0, 5.0);
  tb_fill_uniform(d, &r, -1.0, 1.0);
  double *ro = malloc((size_t)(R * F) * sizeof *ro), *rb = malloc((size_t)(R * 2 * F) * sizeof *rb);
  for (int64_t i = 0; i < R; i++)
    for (int64_t f = 0; f < F; f++) {
      double gv = tb_get(buf, i * 2 * F + f), uv = tb_get(buf, i * 2 * F + F + f), da;
      double a = act_ref(kind, gv, &da), dv = tb_get(d, i * F + f);
      ro[i * F + f] = a * uv;
      rb[i * 2 * F + f] = dv * uv * da;
      rb[i * 2 * F + F + f] = dv * a;
    }
  half_view hg, hu;
  const DLTensor *gt = half_of(&hg, buf, 0, F), *ut = half_of(&hu, buf, 1, F);
  if (tr_ok(tr, ot_glu_forward(tr->be->ctx, kind, gt, ut, tb_dl(o)), "ot_glu_forward")) {
    tb_sync(o);
    check_close(tr, "out", o, ro, tol_for(dt, 1));
  }
  if (tr_ok(tr, ot_glu_backward(tr->be->ctx, kind, tb_dl(d), gt, ut, gt, ut),
            "ot_glu_backward")) {
    tb_sync(buf);
    check_close(tr, "dgate|dup", buf, rb, tol_for(dt, 2));
  }
  free(ro);
  free(rb);
  tb_free(buf);
  tb_free(d);
  tb_free(o);
  tr_end(tr);
}

/* ---- bad inputs ---------------------------------------------------------------- */

static void case_bad_inputs(test_run *tr) {
  if (!tr_begin(tr, "glu bad inputs")) return;
  ot_context *ctx = tr->be->ctx;
  rng r = tr_rng(tr);
  const int64_t R = 4, F = 6;
  tbuf *g = new2d(tr->be, DT_F32, R, F, 0), *u = new2d(tr->be, DT_F32, R, F, 0);
  tbuf *gf = new2d(tr->be, DT_F32, R, 2 * F, 0), *d = new2d(tr->be, DT_F32, R, F, 0);
  tbuf *o = new2d(tr->be, DT_F32, R, F, 0), *dg = new2d(tr->be, DT_F32, R, F, 0);
  tbuf *du = new2d(tr->be, DT_F32, R, F, 0), *dgf = new2d(tr->be, DT_F32, R, 2 * F, 0);
  tbuf *u16 = new2d(tr->be, DT_F16, R, F, 0), *gi = new2d(tr->be, DT_I32, R, F, 0);
  tbuf *o5 = new2d(tr->be, DT_F32, R, 5, 0);
  int64_t odd_shape[2] = {R, 2 * F - 1};
  tbuf *godd = tb_new(tr->be, DT_F32, 2, odd_shape);
  int64_t s0[1] = {1};
  tbuf *g0 = tb_new(tr->be, DT_F32, 0, s0);
  tb_fill_uniform(g, &r, -1, 1);
  tb_fill_uniform(u, &r, -1, 1);
  tb_fill_uniform(gf, &r, -1, 1);
  tb_fill_uniform(d, &r, -1, 1);
  tb_fill_uniform(u16, &r, -1, 1);
  tb_fill_uniform(godd, &r, -1, 1);
  tb_fill_uniform(g0, &r, -1, 1);
  tbuf *outs[] = {o, dg, du, dgf, o5};
  void *snap[5];
  for (int i = 0; i < 5; i++) snap[i] = tb_snapshot(outs[i]);
  const ot_glu_kind K = OT_GLU_SWIGLU;
  const ot_status E = OT_ERR_INVALID_ARGUMENT;
  const char *F1 = "ot_glu_forward", *B1 = "ot_glu_backward";
  DLTensor t;

  tr_expect_error(tr, ot_glu_forward(NULL, K, tb_dl(g), tb_dl(u), tb_dl(o)), E, F1, "ctx");
  tr_expect_error(tr, ot_glu_forward(ctx, (ot_glu_kind)7, tb_dl(g), tb_dl(u), tb_dl(o)), E, F1,
                  "kind");
  tr_expect_error(tr, ot_glu_forward(ctx, K, NULL, tb_dl(u), tb_dl(o)), E, F1, "gate");
  tr_expect_error(tr, ot_glu_forward(ctx, K, tb_dl(gi), tb_dl(u), tb_dl(o)), E, F1, "gate");
  tr_expect_error(tr, ot_glu_forward(ctx, K, tb_dl(g0), NULL, tb_dl(o)), E, F1, "gate");
  tr_expect_error(tr, ot_glu_forward(ctx, K, tb_dl(g), tb_dl(u16), tb_dl(o)), E, F1, "up");
  tr_expect_error(tr, ot_glu_forward(ctx, K, tb_dl(g), tb_dl(u), NULL), E, F1, "out");
  tr_expect_error(tr, ot_glu_forward(ctx, K, tb_dl(g), tb_dl(u), tb_dl(o5)), E, F1, "out");
  tr_expect_error(tr, ot_glu_forward(ctx, K, tb_dl(gf), NULL, tb_dl(o5)), E, F1, "out");
  tr_expect_error(tr, ot_glu_forward(ctx, K, tb_dl(godd), NULL, tb_dl(o)), E, F1, "gate");
  tr_expect_error(tr, ot_glu_forward(ctx, K, tb_dl(g), NULL, tb_dl(o)), E, F1, "out");
  t = *tb_dl(g);
  t.data = NULL;
  tr_expect_error(tr, ot_glu_forward(ctx, K, &t, tb_dl(u), tb_dl(o)), E, F1, "gate");
  t = *tb_dl(g);
  t.byte_offset = 2;
  tr_expect_error(tr, ot_glu_forward(ctx, K, &t, tb_dl(u), tb_dl(o)), E, F1, "gate");
  {
    /* last dimension not contiguous: every other element of gf's rows */
    int64_t sh[2] = {R, F}, st[2] = {2 * F, 2};
    t = *tb_dl(gf);
    t.shape = sh;
    t.strides = st;
    tr_expect_error(tr, ot_glu_forward(ctx, K, &t, tb_dl(u), tb_dl(o)), E, F1, "gate");
  }
  {
    /* out partially overlapping up: up's first R-1 rows, out shifted by one element */
    int64_t sh[2] = {R - 1, F};
    DLTensor tg = *tb_dl(g), tu = *tb_dl(u), to = *tb_dl(u);
    tg.shape = tu.shape = to.shape = sh;
    to.byte_offset = 4;
    tr_expect_error(tr, ot_glu_forward(ctx, K, &tg, &tu, &to), E, F1, "out");
  }
  /* out exactly gate: not allowed in the forward */
  tr_expect_error(tr, ot_glu_forward(ctx, K, tb_dl(g), tb_dl(u), tb_dl(g)), E, F1, "out");

  tr_expect_error(tr, ot_glu_backward(ctx, K, NULL, tb_dl(g), tb_dl(u), tb_dl(dg), tb_dl(du)),
                  E, B1, "dout");
  tr_expect_error(tr, ot_glu_backward(ctx, K, tb_dl(o5), tb_dl(g), tb_dl(u), tb_dl(dg), tb_dl(du)),
                  E, B1, "dout");
  tr_expect_error(tr, ot_glu_backward(ctx, K, tb_dl(d), tb_dl(g), tb_dl(u16), tb_dl(dg), tb_dl(du)),
                  E, B1, "up");
  tr_expect_error(tr, ot_glu_backward(ctx, K, tb_dl(d), tb_dl(g), tb_dl(u), tb_dl(dgf), tb_dl(du)),
                  E, B1, "dgate");
  tr_expect_error(tr, ot_glu_backward(ctx, K, tb_dl(d), tb_dl(g), tb_dl(u), tb_dl(dg), NULL), E,
                  B1, "dup");
  tr_expect_error(tr, ot_glu_backward(ctx, K, tb_dl(d), tb_dl(gf), NULL, tb_dl(dgf), tb_dl(du)),
                  E, B1, "dup");
  tr_expect_error(tr, ot_glu_backward(ctx, K, tb_dl(d), tb_dl(gf), NULL, tb_dl(dg), NULL), E, B1,
                  "dgate");
  tr_expect_error(tr, ot_glu_backward(ctx, K, tb_dl(d), tb_dl(g), tb_dl(u), tb_dl(d), tb_dl(du)),
                  E, B1, "dgate");
  tr_expect_error(tr, ot_glu_backward(ctx, K, tb_dl(d), tb_dl(g), tb_dl(u), tb_dl(dg), tb_dl(g)),
                  E, B1, "dup");
  tr_expect_error(tr, ot_glu_backward(ctx, K, tb_dl(d), tb_dl(g), tb_dl(u), tb_dl(dg), tb_dl(dg)),
                  E, B1, "dgate");
  {
    /* dgate a shifted window of gate (partial overlap) */
    t = *tb_dl(gf);
    int64_t sh[2] = {R, F}, st[2] = {2 * F, 1};
    t.shape = sh;
    t.strides = st;
    DLTensor t2 = t;
    t2.byte_offset = 4;
    tr_expect_error(tr, ot_glu_backward(ctx, K, tb_dl(d), &t, tb_dl(u), &t2, tb_dl(du)), E, B1,
                    "dgate");
  }
  t = *tb_dl(dg);
  t.byte_offset = 1;
  tr_expect_error(tr, ot_glu_backward(ctx, K, tb_dl(d), tb_dl(g), tb_dl(u), &t, tb_dl(du)), E,
                  B1, "dgate");
  /* the recompute's out: missing, of another shape or dtype, overlapping an input or an
   * output; and the backward's own checks still first */
  const char *B2 = "ot_glu_backward_recompute";
  {
    /* NULL; 5 columns; float16; exactly gate, dout, dgate, dup */
    tbuf *bad_out[] = {NULL, o5, u16, g, d, dg, du};
    for (size_t i = 0; i < sizeof bad_out / sizeof bad_out[0]; i++)
      tr_expect_error(tr,
                      ot_glu_backward_recompute(ctx, K, tb_dl(d), tb_dl(g), tb_dl(u), tb_dl(dg),
                                                tb_dl(du), bad_out[i] ? tb_dl(bad_out[i]) : NULL),
                      E, B2, "out");
  }
  tr_expect_error(tr, ot_glu_backward_recompute(NULL, K, tb_dl(d), tb_dl(g), tb_dl(u), tb_dl(dg),
                                                tb_dl(du), tb_dl(o)), E, B2, "ctx");
  tr_expect_error(tr, ot_glu_backward_recompute(ctx, K, tb_dl(d), tb_dl(g), tb_dl(u), tb_dl(dg),
                                                NULL, tb_dl(o)), E, B2, "dup");
  for (int i = 0; i < 5; i++) {
    if (!tb_unchanged(outs[i], snap[i])) tr_fail(tr, "output %d written by a failing call", i);
    free(snap[i]);
  }
  tbuf *all[] = {g, u, gf, d, o, dg, du, dgf, u16, gi, o5, godd, g0};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tb_free(all[i]);
  tr_end(tr);
}

/* ---- gradient mode ----------------------------------------------------------------- */

typedef struct fd_state {
  ot_glu_kind kind;
  int64_t R, F;
  bool fused;
} fd_state;

/* in: gate [R, gw] then (split) up [R, F]; out [R, F]. */
static void glu_ref(void *state, const double *in, double *out) {
  const fd_state *s = (const fd_state *)state;
  int64_t gw = s->fused ? 2 * s->F : s->F;
  for (int64_t i = 0; i < s->R; i++)
    for (int64_t f = 0; f < s->F; f++) {
      double gv = in[i * gw + f];
      double uv = s->fused ? in[i * gw + s->F + f] : in[s->R * gw + i * s->F + f];
      out[i * s->F + f] = act_ref(s->kind, gv, NULL) * uv;
    }
}

static void case_grad(test_run *tr, ot_glu_kind kind, bool fused) {
  if (!tr_begin(tr, "glu grad %s %s", kind_name(kind), fused ? "fused" : "split")) return;
  rng r = tr_rng(tr);
  fd_state s = {kind, 3, 5, fused};
  int64_t gw = fused ? 2 * s.F : s.F, n_in = s.R * gw + (fused ? 0 : s.R * s.F);
  tbuf *g = new2d(tr->be, DT_F32, s.R, gw, 0), *u = fused ? NULL : new2d(tr->be, DT_F32, s.R, s.F, 0);
  tbuf *d = new2d(tr->be, DT_F32, s.R, s.F, 0), *dg = new2d(tr->be, DT_F32, s.R, gw, 0);
  tbuf *du = fused ? NULL : new2d(tr->be, DT_F32, s.R, s.F, 0);
  tb_fill_uniform(g, &r, -3.0, 3.0);
  if (u) tb_fill_uniform(u, &r, -2.0, 2.0);
  tb_fill_uniform(d, &r, -1.0, 1.0);
  double *in = malloc((size_t)n_in * sizeof *in), *grad = malloc((size_t)n_in * sizeof *grad);
  for (int64_t i = 0; i < s.R * gw; i++) in[i] = tb_get(g, i);
  if (u)
    for (int64_t i = 0; i < s.R * s.F; i++) in[s.R * gw + i] = tb_get(u, i);
  double *dout = tb_to_f64(d);
  fd_vjp(glu_ref, &s, in, n_in, s.R * s.F, dout, grad, 1e-4);
  if (tr_ok(tr, ot_glu_backward(tr->be->ctx, kind, tb_dl(d), tb_dl(g), u ? tb_dl(u) : NULL,
                                tb_dl(dg), du ? tb_dl(du) : NULL),
            "ot_glu_backward")) {
    tb_sync(dg);
    check_close(tr, "dgate vs finite differences", dg, grad, tol_for(DT_F32, 10));
    if (du) {
      tb_sync(du);
      check_close(tr, "dup vs finite differences", du, grad + s.R * gw, tol_for(DT_F32, 10));
    }
  }
  free(in);
  free(grad);
  free(dout);
  tb_free(g);
  tb_free(u);
  tb_free(d);
  tb_free(dg);
  tb_free(du);
  tr_end(tr);
}

static void run(test_run *tr) {
  if (tr->grad) {
    for (int k = 0; k < 3; k++)
      for (int fused = 0; fused < 2; fused++) case_grad(tr, kinds[k], fused);
    return;
  }
  const size_t ns = sizeof shapes / sizeof shapes[0];
  for (int k = 0; k < 3; k++)
    for (int t = 0; t < 3; t++)
      for (size_t i = 0; i < ns; i++)
        for (int fused = 0; fused < 2; fused++) {
          case_forward(tr, kinds[k], *dtypes[t], &shapes[i], fused);
          case_backward(tr, kinds[k], *dtypes[t], &shapes[i], fused, false, false);
          /* in place on a subset of shapes, both layouts; with the recompute on the other
           * subset, and in place on the last shape */
          if (i % 2 == 1) case_backward(tr, kinds[k], *dtypes[t], &shapes[i], fused, true, false);
          else case_backward(tr, kinds[k], *dtypes[t], &shapes[i], fused, false, true);
          if (i == ns - 1) case_backward(tr, kinds[k], *dtypes[t], &shapes[i], fused, true, true);
        }
  for (int k = 0; k < 3; k++)
    for (int t = 0; t < 3; t++) case_chunk_views(tr, kinds[k], *dtypes[t]);
  case_bad_inputs(tr);
}

const test_suite suite_glu = {"glu", run};
