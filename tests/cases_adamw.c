/*
 * cases_adamw.c -- ot_adamw_step against a float64 reference.
 *
 * Each case builds a list of tensors of mixed sizes (1 element, odd lengths, more than
 * one 64K-element chunk, more tensors than one CUDA launch table holds), runs three
 * steps with fresh gradients, and before every step computes the reference in float64
 * from the values stored at that moment (so errors do not compound across steps):
 *   w = (master or param) * (1 - lr wd); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *   w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
 * Tolerances: float32 results (m, v, master, float32 params) rtol 2e-6 plus an atol of a
 * few float32 ulps of the largest operand of the update (the terms cancel): 5e-7 on w
 * (|w| < ~1), 3e-8 on m (|(1-b1) g| <= 0.1), 2e-9 on v (|(1-b2) g^2| <= 1e-2). Results stored in 16-bit dtypes: one rounding, tol_for(dtype, 1). With
 * master weights the param must be exactly the master rounded to its dtype.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef struct aw_set {
  int n;
  tbuf **p, **g, **m, **v, **w; /* w: master (or NULL entries) */
  DLDataType pd, gd, sd;
  bool master;
} aw_set;

static void set_free(aw_set *s) {
  for (int i = 0; i < s->n; i++) {
    tb_free(s->p[i]);
    tb_free(s->g[i]);
    tb_free(s->m[i]);
    tb_free(s->v[i]);
    tb_free(s->w[i]);
  }
  free(s->p);
  free(s->g);
  free(s->m);
  free(s->v);
  free(s->w);
}

static void set_new(aw_set *s, const backend *be, rng *r, int n, const int64_t *sizes,
                    DLDataType pd, DLDataType gd, DLDataType sd, bool master) {
  s->n = n;
  s->pd = pd;
  s->gd = gd;
  s->sd = sd;
  s->master = master;
  s->p = calloc((size_t)n, sizeof(tbuf *));
  s->g = calloc((size_t)n, sizeof(tbuf *));
  s->m = calloc((size_t)n, sizeof(tbuf *));
  s->v = calloc((size_t)n, sizeof(tbuf *));
  s->w = calloc((size_t)n, sizeof(tbuf *));
  for (int i = 0; i < n; i++) {
    /* alternate 1-D and 2-D shapes of the same size */
    int64_t sz = sizes[i];
    int64_t shape2[2] = {1, sz};
    int nd = (i % 2 && sz > 0) ? 2 : 1;
    const int64_t *shape = nd == 2 ? shape2 : &sizes[i];
    s->p[i] = tb_new(be, pd, nd, shape);
    s->g[i] = tb_new(be, gd, nd, shape);
    s->m[i] = tb_new(be, sd, nd, shape);
    s->v[i] = tb_new(be, sd, nd, shape);
    s->w[i] = master ? tb_new(be, DT_F32, nd, shape) : NULL;
    tb_fill_uniform(s->p[i], r, -1, 1);
    if (master) /* the master holds the weight; the param is its rounding */
      for (int64_t k = 0; k < sz; k++) {
        double x = tb_get(s->p[i], k) + rng_uniform(r, -1e-3, 1e-3);
        tb_set(s->w[i], k, x);
        tb_set(s->p[i], k, tb_get(s->w[i], k));
      }
    tb_fill_uniform(s->m[i], r, -1e-2, 1e-2);
    tb_fill_uniform(s->v[i], r, 1e-6, 1e-3);
  }
}

static ot_status set_step(aw_set *s, ot_context *ctx, const ot_adamw_params *hp) {
  const DLTensor **lists[5];
  for (int l = 0; l < 5; l++) lists[l] = calloc((size_t)s->n + 1, sizeof(DLTensor *));
  for (int i = 0; i < s->n; i++) {
    lists[0][i] = tb_dl(s->p[i]);
    lists[1][i] = tb_dl(s->g[i]);
    lists[2][i] = tb_dl(s->m[i]);
    lists[3][i] = tb_dl(s->v[i]);
    lists[4][i] = s->master ? tb_dl(s->w[i]) : NULL;
  }
  ot_status st = ot_adamw_step(ctx, hp, s->n, lists[0], lists[1], lists[2], lists[3],
                               s->master ? lists[4] : NULL);
  for (int l = 0; l < 5; l++) free(lists[l]);
  return st;
}

static bool is32(DLDataType t) { return t.code == kDLFloat && t.bits == 32; }

static tol tol_state(DLDataType t, double atol) {
  if (is32(t)) return (tol){atol, 2e-6};
  return tol_for(t, 1);
}

static void adamw_case(test_run *tr, const char *label, int n, const int64_t *sizes,
                       DLDataType pd, DLDataType gd, DLDataType sd, bool master, float wd) {
  if (!tr_begin(tr, "adamw %s: %d tensors params %s grads %s states %s%s wd=%g", label, n,
                dt_name(pd), dt_name(gd), dt_name(sd), master ? " + fp32 master" : "",
                (double)wd))
    return;
  rng r = tr_rng(tr);
  aw_set s;
  set_new(&s, tr->be, &r, n, sizes, pd, gd, sd, master);
  ot_adamw_params hp = ot_adamw_default_params();
  hp.lr = 1e-2f;
  hp.weight_decay = wd;
  hp.beta2 = 0.99f;
  hp.eps = 1e-6f;
  for (int step = 1; step <= 3 && !tr->case_failed; step++) {
    hp.step = step;
    for (int i = 0; i < n; i++) tb_fill_uniform(s.g[i], &r, -1, 1);
    /* reference from the stored values */
    double **rw = calloc((size_t)n, sizeof(double *)), **rm = calloc((size_t)n, sizeof(double *));
    double **rv = calloc((size_t)n, sizeof(double *));
    const double b1 = hp.beta1, b2 = hp.beta2, t = step;
    const double ss = hp.lr / (1.0 - pow(b1, t)), bc2 = sqrt(1.0 - pow(b2, t));
    for (int i = 0; i < n; i++) {
      double *w = tb_to_f64(master ? s.w[i] : s.p[i]), *g = tb_to_f64(s.g[i]);
      double *m = tb_to_f64(s.m[i]), *v = tb_to_f64(s.v[i]);
      for (int64_t k = 0; k < sizes[i]; k++) {
        double ww = w[k] * (1.0 - (double)hp.lr * (double)wd);
        m[k] = b1 * m[k] + (1.0 - b1) * g[k];
        v[k] = b2 * v[k] + (1.0 - b2) * g[k] * g[k];
        w[k] = ww - ss * m[k] / (sqrt(v[k]) / bc2 + (double)hp.eps);
      }
      free(g);
      rw[i] = w;
      rm[i] = m;
      rv[i] = v;
    }
    if (tr_ok(tr, set_step(&s, tr->be->ctx, &hp), "ot_adamw_step")) {
      for (int i = 0; i < n && !tr->case_failed; i++) {
        char what[64];
        tb_sync(s.p[i]);
        tb_sync(s.m[i]);
        tb_sync(s.v[i]);
        snprintf(what, sizeof what, "step %d exp_avg[%d]", step, i);
        check_close(tr, what, s.m[i], rm[i], tol_state(sd, 3e-8));
        snprintf(what, sizeof what, "step %d exp_avg_sq[%d]", step, i);
        check_close(tr, what, s.v[i], rv[i], tol_state(sd, 2e-9));
        if (master) {
          tb_sync(s.w[i]);
          snprintf(what, sizeof what, "step %d master[%d]", step, i);
          check_close(tr, what, s.w[i], rw[i], tol_state(DT_F32, 5e-7));
          for (int64_t k = 0; k < sizes[i]; k++)
            if (tb_get(s.p[i], k) != dt_round(pd, tb_get(s.w[i], k))) {
              tr_fail(tr, "step %d params[%d][%lld] = %.9g is not master %.9g rounded to %s",
                      step, i, (long long)k, tb_get(s.p[i], k), tb_get(s.w[i], k), dt_name(pd));
              break;
            }
        } else {
          snprintf(what, sizeof what, "step %d params[%d]", step, i);
          check_close(tr, what, s.p[i], rw[i], tol_state(pd, 5e-7));
        }
      }
    }
    for (int i = 0; i < n; i++) {
      free(rw[i]);
      free(rm[i]);
      free(rv[i]);
    }
    free(rw);
    free(rm);
    free(rv);
  }
  set_free(&s);
  tr_end(tr);
}

static void bad_inputs(test_run *tr) {
  if (!tr_begin(tr, "adamw bad inputs")) return;
  rng r = tr_rng(tr);
  const int64_t sizes[3] = {5, 1, 7};
  aw_set s;
  set_new(&s, tr->be, &r, 3, sizes, DT_BF16, DT_BF16, DT_F32, true);
  for (int i = 0; i < 3; i++) tb_fill_uniform(s.g[i], &r, -1, 1);
  ot_context *ctx = tr->be->ctx;
  const ot_status E = OT_ERR_INVALID_ARGUMENT;
  const char *F = "ot_adamw_step";
  const DLTensor *P[3], *G[3], *M[3], *V[3], *W[3];
  for (int i = 0; i < 3; i++) {
    P[i] = tb_dl(s.p[i]);
    G[i] = tb_dl(s.g[i]);
    M[i] = tb_dl(s.m[i]);
    V[i] = tb_dl(s.v[i]);
    W[i] = tb_dl(s.w[i]);
  }
  void *snaps[15];
  tbuf *all[15];
  for (int i = 0; i < 3; i++) {
    all[5 * i] = s.p[i];
    all[5 * i + 1] = s.g[i];
    all[5 * i + 2] = s.m[i];
    all[5 * i + 3] = s.v[i];
    all[5 * i + 4] = s.w[i];
  }
  for (int k = 0; k < 15; k++) snaps[k] = tb_snapshot(all[k]);
  ot_adamw_params hp = ot_adamw_default_params();
  tr_expect_error(tr, ot_adamw_step(NULL, &hp, 3, P, G, M, V, W), E, F, "ctx");
  tr_expect_error(tr, ot_adamw_step(ctx, NULL, 3, P, G, M, V, W), E, F, "params");
  tr_expect_error(tr, ot_adamw_step(ctx, &hp, -1, P, G, M, V, W), E, F, "n:");
  tr_expect_error(tr, ot_adamw_step(ctx, &hp, 3, P, NULL, M, V, W), E, F, "grads");
  ot_adamw_params b = hp;
  b.beta1 = 1.0f;
  tr_expect_error(tr, ot_adamw_step(ctx, &b, 3, P, G, M, V, W), E, F, "beta1");
  b = hp;
  b.step = 0;
  tr_expect_error(tr, ot_adamw_step(ctx, &b, 3, P, G, M, V, W), E, F, "step");
  b = hp;
  b.lr = NAN;
  tr_expect_error(tr, ot_adamw_step(ctx, &b, 3, P, G, M, V, W), E, F, "lr");
  /* a grad of another shape */
  int64_t sh[1] = {6};
  tbuf *g6 = tb_new(tr->be, DT_BF16, 1, sh);
  tb_fill_uniform(g6, &r, -1, 1);
  const DLTensor *G2[3] = {G[0], G[1], tb_dl(g6)};
  tr_expect_error(tr, ot_adamw_step(ctx, &hp, 3, P, G2, M, V, W), E, F, "grads[2]");
  /* a state of a third dtype (float16 with bfloat16 params) */
  tbuf *m16 = tb_new(tr->be, DT_F16, 1, sizes + 1);
  tb_fill_uniform(m16, &r, -1, 1);
  const DLTensor *M2[3] = {M[0], tb_dl(m16), M[2]};
  tr_expect_error(tr, ot_adamw_step(ctx, &hp, 3, P, G, M2, V, W), E, F, "exp_avg[1]");
  /* states of two dtypes in one call */
  tbuf *mb = tb_new(tr->be, DT_BF16, 1, sizes + 1);
  tb_fill_uniform(mb, &r, -1, 1);
  const DLTensor *M3[3] = {M[0], tb_dl(mb), M[2]};
  tr_expect_error(tr, ot_adamw_step(ctx, &hp, 3, P, G, M3, V, W), E, F, "exp_avg[1]");
  /* master given for some only */
  const DLTensor *W2[3] = {W[0], NULL, W[2]};
  tr_expect_error(tr, ot_adamw_step(ctx, &hp, 3, P, G, M, V, W2), E, F, "master_params[1]");
  /* the same tensor twice (exp_avg_sq[0] is exp_avg[0]) */
  const DLTensor *V2[3] = {M[0], V[1], V[2]};
  tr_expect_error(tr, ot_adamw_step(ctx, &hp, 3, P, G, M, V2, W), E, F, "overlaps");
  /* a non-contiguous param */
  {
    int64_t shp[2] = {2, 2}, str[2] = {3, 1};
    tbuf *pc = tb_new_strided(tr->be, DT_BF16, 2, shp, str);
    tbuf *gc = tb_new(tr->be, DT_BF16, 2, shp), *mc = tb_new(tr->be, DT_F32, 2, shp);
    tbuf *vc = tb_new(tr->be, DT_F32, 2, shp), *wc = tb_new(tr->be, DT_F32, 2, shp);
    tb_fill_uniform(pc, &r, -1, 1);
    const DLTensor *P1[1] = {tb_dl(pc)}, *G1[1] = {tb_dl(gc)}, *M1[1] = {tb_dl(mc)},
                    *V1[1] = {tb_dl(vc)}, *W1[1] = {tb_dl(wc)};
    tr_expect_error(tr, ot_adamw_step(ctx, &hp, 1, P1, G1, M1, V1, W1), E, F, "params[0]");
    tb_free(pc);
    tb_free(gc);
    tb_free(mc);
    tb_free(vc);
    tb_free(wc);
  }
  for (int k = 0; k < 15; k++) {
    if (!tb_unchanged(all[k], snaps[k])) tr_fail(tr, "tensor %d of the list was written", k);
    free(snaps[k]);
  }
  /* n == 0 is a no-op */
  if (ot_adamw_step(ctx, &hp, 0, P, G, M, V, W) != OT_OK) tr_fail(tr, "n = 0: %s", ot_last_error());
  tb_free(g6);
  tb_free(m16);
  tb_free(mb);
  set_free(&s);
  tr_end(tr);
}

/* ---- the other CUDA kernels (OT_ADAMW_IMPL, src/cuda/adamw.cu) -------------------------- */

/* Two sets from the same random stream, stepped `steps` times with the same gradients: one
 * under OT_ADAMW_IMPL=ref, one under OT_ADAMW_IMPL=impl (NULL: unset, the default). "v4"
 * (W = 4) must give "exact"'s bits (W = 8, IEEE arithmetic) in every tensor, tails included
 * (the sizes end inside groups of four and of eight), and the default "fast"'s by name;
 * "fast" (approximate square root and division) "exact"'s results within tol_state's
 * tolerances (one rounding in 16-bit dtypes, a few float32 ulps in float32). */
static void impl_pair_case(test_run *tr, const char *ref, const char *impl, bool same_bits,
                           const char *label, int n, const int64_t *sizes, DLDataType pd,
                           DLDataType gd, DLDataType sd, bool master, int steps) {
  if (!tr->be->is_cuda) return; /* (the CPU backend reads no OT_ADAMW_IMPL) */
  if (!tr_begin(tr, "adamw %s (impl=%s vs %s): %d tensors params %s grads %s states %s%s: %s",
                label, impl ? impl : "default", ref, n, dt_name(pd), dt_name(gd), dt_name(sd),
                master ? " + fp32 master" : "", same_bits ? "the same bits" : "near"))
    return;
  rng r0 = tr_rng(tr), r1 = r0;
  aw_set a, b;
  set_new(&a, tr->be, &r0, n, sizes, pd, gd, sd, master);
  set_new(&b, tr->be, &r1, n, sizes, pd, gd, sd, master);
  ot_adamw_params hp = ot_adamw_default_params();
  hp.lr = 1e-2f;
  hp.weight_decay = 1e-2f;
  hp.beta2 = 0.99f;
  hp.eps = 1e-6f;
  for (int step = 1; step <= steps && !tr->case_failed; step++) {
    hp.step = step;
    for (int i = 0; i < n; i++) {
      tb_fill_uniform(a.g[i], &r0, -1, 1);
      tb_fill_uniform(b.g[i], &r1, -1, 1);
    }
    env_saved e = env_set("OT_ADAMW_IMPL", ref);
    bool ok = tr_ok(tr, set_step(&a, tr->be->ctx, &hp), "ot_adamw_step (reference impl)");
    env_restore(&e);
    e = env_set("OT_ADAMW_IMPL", impl);
    ok = ok && tr_ok(tr, set_step(&b, tr->be->ctx, &hp), "ot_adamw_step (impl)");
    env_restore(&e);
    if (!ok) break;
    for (int i = 0; i < n && !tr->case_failed; i++) {
      tbuf *got[4] = {b.p[i], b.m[i], b.v[i], master ? b.w[i] : NULL};
      tbuf *want[4] = {a.p[i], a.m[i], a.v[i], master ? a.w[i] : NULL};
      static const char *const NAME[4] = {"params", "exp_avg", "exp_avg_sq", "master"};
      /* the atol of adamw_case's float32 tolerances (w, m, v, master) */
      static const double ATOL[4] = {5e-7, 3e-8, 2e-9, 5e-7};
      for (int k = 0; k < 4 && !tr->case_failed; k++) {
        if (!got[k]) continue;
        tb_sync(got[k]);
        tb_sync(want[k]);
        char what[80];
        snprintf(what, sizeof what, "step %d %s[%d]", step, NAME[k], i);
        if (same_bits) {
          for (int64_t j = 0; j < sizes[i]; j++) {
            const double x = tb_get(got[k], j), y = tb_get(want[k], j);
            if (!(x == y)) {
              tr_fail(tr, "%s[%lld] = %.9g, %s's %.9g", what, (long long)j, x, ref, y);
              break;
            }
          }
        } else {
          double *want64 = tb_to_f64(want[k]);
          DLDataType dt = k == 0 ? pd : k == 3 ? DT_F32 : sd;
          check_close(tr, what, got[k], want64, tol_state(dt, ATOL[k]));
          free(want64);
        }
      }
    }
  }
  set_free(&a);
  set_free(&b);
  tr_end(tr);
}

static void impl_cases(test_run *tr) {
  if (!tr->be->is_cuda) return;
  /* sizes ending inside a group of eight (and of four), shorter than one, exact multiples */
  static const int64_t sizes8[8] = {1, 7, 8, 299, 65536 + 13, 131072 + 8, 4104, 4};
  /* the training case (bf16 parameters, gradients and moments) and the suite's others */
  static const struct {
    DLDataType p, g, s;
    bool master;
  } DT[6] = {{{kDLBfloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLBfloat, 16, 1}, false},
             {{kDLFloat, 32, 1}, {kDLFloat, 32, 1}, {kDLFloat, 32, 1}, false},
             {{kDLBfloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 32, 1}, true},
             {{kDLFloat, 16, 1}, {kDLFloat, 32, 1}, {kDLFloat, 32, 1}, true},
             {{kDLBfloat, 16, 1}, {kDLFloat, 32, 1}, {kDLBfloat, 16, 1}, false},
             {{kDLFloat, 16, 1}, {kDLFloat, 16, 1}, {kDLFloat, 16, 1}, false}};
  /* (reference, impl, same bits): "v4" and "v8" are "exact"; the default is "fast";
   * "fast" is near "exact" */
  static const struct {
    const char *ref, *impl;
    bool same;
  } PAIR[4] = {{"exact", "v4", true}, {"exact", "v8", true}, {"fast", NULL, true},
               {"exact", "fast", false}};
  for (int k = 0; k < 4; k++)
    for (int d = 0; d < 6; d++)
      impl_pair_case(tr, PAIR[k].ref, PAIR[k].impl, PAIR[k].same, "sizes8", 8, sizes8, DT[d].p,
                     DT[d].g, DT[d].s, DT[d].master, 3);
  /* more chunks than one launch of the capped table holds (401 > 396 / 264 on the H200) */
  static const int64_t big[2] = {401 * 65536 + 3, 5};
  for (int k = 0; k < 4; k++)
    impl_pair_case(tr, PAIR[k].ref, PAIR[k].impl, PAIR[k].same, "big", 2, big, DT[0].p,
                   DT[0].g, DT[0].s, false, 2);
  /* the float64 reference of the suite's cases under "exact" and "v4" (the suite's other
   * cases run the default, "fast") */
  static const char *const IMPL[2] = {"exact", "v4"};
  const int64_t mixed[6] = {1, 3, 1000, 65536 + 5, 131072 + 7, 4};
  for (int k = 0; k < 2; k++) {
    env_saved e = env_set("OT_ADAMW_IMPL", IMPL[k]);
    for (int d = 0; d < 6; d++)
      adamw_case(tr, k ? "mixed (impl=v4)" : "mixed (impl=exact)", 6, mixed, DT[d].p, DT[d].g,
                 DT[d].s, DT[d].master, 1e-2f);
    env_restore(&e);
  }
}

static void run(test_run *tr) {
  if (tr->grad) return; /* no gradient to check */
  const int64_t mixed[6] = {1, 3, 1000, 65536 + 5, 131072 + 7, 4};
  adamw_case(tr, "mixed", 6, mixed, DT_F32, DT_F32, DT_F32, false, 1e-2f);
  adamw_case(tr, "mixed", 6, mixed, DT_BF16, DT_BF16, DT_F32, true, 1e-2f);
  adamw_case(tr, "mixed", 6, mixed, DT_F16, DT_F32, DT_F32, true, 0.1f);
  adamw_case(tr, "mixed", 6, mixed, DT_BF16, DT_F32, DT_BF16, false, 0.0f);
  adamw_case(tr, "mixed", 6, mixed, DT_F32, DT_F32, DT_F32, true, 1e-2f);
  adamw_case(tr, "mixed", 6, mixed, DT_BF16, DT_BF16, DT_BF16, false, 1e-2f);
  /* many small tensors (several CUDA launch tables), sizes 0..97 */
  int64_t many[80];
  for (int i = 0; i < 80; i++) many[i] = (i * 37) % 98;
  adamw_case(tr, "many", 80, many, DT_BF16, DT_BF16, DT_F32, true, 1e-2f);
  adamw_case(tr, "many", 80, many, DT_F32, DT_F32, DT_F32, false, 1e-2f);
  bad_inputs(tr);
  impl_cases(tr);
}

const test_suite suite_adamw = {"adamw", run};
