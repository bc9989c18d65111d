/* adamw.c -- ot_adamw_step: validation of the tensor lists and dispatch. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "adamw.h"
#include "backend.h"

ot_adamw_params ot_adamw_default_params(void) {
  ot_adamw_params p;
  p.lr = 1e-3f;
  p.beta1 = 0.9f;
  p.beta2 = 0.999f;
  p.eps = 1e-8f;
  p.weight_decay = 1e-2f;
  p.step = 1;
  return p;
}

static ot_status check_params(const char *op, const ot_adamw_params *p) {
  if (!(p->lr >= 0.0f && isfinite(p->lr)))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params.lr: %g is not finite and >= 0",
                    (double)p->lr);
  if (!(p->beta1 >= 0.0f && p->beta1 < 1.0f))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params.beta1: %g is not in [0, 1)",
                    (double)p->beta1);
  if (!(p->beta2 >= 0.0f && p->beta2 < 1.0f))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params.beta2: %g is not in [0, 1)",
                    (double)p->beta2);
  if (!(p->eps >= 0.0f && isfinite(p->eps)))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params.eps: %g is not finite and >= 0",
                    (double)p->eps);
  if (!(p->weight_decay >= 0.0f && isfinite(p->weight_decay)))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "params.weight_decay: %g is not finite and >= 0", (double)p->weight_decay);
  if (p->step < 1)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params.step: %" PRId64 " is not >= 1",
                    p->step);
  return OT_OK;
}

/* A byte range of one tensor of the call, for the overlap check. */
typedef struct extent {
  uintptr_t lo, hi;
  int which, index; /* list (0 params .. 4 master) and position */
} extent;

static const char *const list_names[5] = {"params", "grads", "exp_avg", "exp_avg_sq",
                                          "master_params"};

static int extent_cmp(const void *a, const void *b) {
  const extent *x = (const extent *)a, *y = (const extent *)b;
  return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : 0;
}

/* Validate tensor `t` of list `which` at position i: contiguous, numel of the param. */
static ot_status check_one(const char *op, const ot_context *ctx, const DLTensor *t, int which,
                           int i, const ot_view *ref, ot_view *v) {
  char name[48];
  snprintf(name, sizeof name, "%s[%d]", list_names[which], i);
  OT_TRY(ot_view_of(op, name, ctx, t, v));
  OT_TRY(ot_check_float(op, name, v));
  if (ref) {
    char rname[48];
    snprintf(rname, sizeof rname, "params[%d]", i);
    OT_TRY(ot_check_same_shape(op, name, v, rname, ref));
  }
  return ot_check_contiguous(op, name, v);
}

ot_status ot_adamw_step(ot_context *ctx, const ot_adamw_params *params, int n,
                        const DLTensor *const *param_tensors, const DLTensor *const *grads,
                        const DLTensor *const *exp_avg, const DLTensor *const *exp_avg_sq,
                        const DLTensor *const *master_params) {
  static const char op[] = "ot_adamw_step";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  if (!params) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params: is NULL");
  OT_TRY(check_params(op, params));
  if (n < 0) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "n: %d is negative", n);
  if (n == 0) return OT_OK;
  const DLTensor *const *lists[5] = {param_tensors, grads, exp_avg, exp_avg_sq, master_params};
  for (int l = 0; l < 4; l++)
    if (!lists[l]) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: is NULL", list_names[l]);
  const bool has_master = master_params && master_params[0];

  ot_adamw_tensor *tab = (ot_adamw_tensor *)calloc((size_t)n, sizeof *tab);
  extent *ext = (extent *)malloc((size_t)n * 5 * sizeof *ext);
  if (!tab || !ext) {
    free(tab);
    free(ext);
    return ot_error(OT_ERR_OOM, op, "cannot allocate the table of %d tensors", n);
  }
  ot_status st = OT_OK;
  int next = 0;
  ot_dtype dts[5] = {OT_DTYPE_INVALID, OT_DTYPE_INVALID, OT_DTYPE_INVALID, OT_DTYPE_INVALID,
                     OT_F32};
  int64_t total = 0;
  for (int i = 0; i < n && st == OT_OK; i++) {
    ot_view v[5];
    st = check_one(op, ctx, param_tensors[i], 0, i, NULL, &v[0]);
    for (int l = 1; l < 5 && st == OT_OK; l++) {
      if (l == 4) {
        bool given = master_params && master_params[i];
        if (given != has_master) {
          st = ot_error(OT_ERR_INVALID_ARGUMENT, op,
                        "master_params[%d]: is %s but master_params[0] is %s (all or none)",
                        i, given ? "given" : "NULL", has_master ? "given" : "NULL");
          break;
        }
        if (!given) break;
      }
      st = check_one(op, ctx, lists[l][i], l, i, &v[0], &v[l]);
    }
    /* dtypes: one per list; grads params' or float32; states float32 or params' */
    for (int l = 0; l < 5 && st == OT_OK; l++) {
      if (l == 4 && !has_master) break;
      char name[48];
      snprintf(name, sizeof name, "%s[%d]", list_names[l], i);
      ot_dtype d = v[l].dtype;
      if (l == 1 || l == 2 || l == 3) {
        if (d != OT_F32 && d != v[0].dtype) {
          st = ot_error(OT_ERR_INVALID_ARGUMENT, op,
                        "%s: dtype %s is neither float32 nor the params' dtype %s", name,
                        ot_dtype_name(d), ot_dtype_name(v[0].dtype));
          break;
        }
      }
      ot_dtype want = l == 3 ? dts[2] : dts[l];
      if (want == OT_DTYPE_INVALID) {
        dts[l] = d;
      } else if (d != want) {
        st = ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "%s: dtype %s differs from %s (one dtype per list%s)", name,
                      ot_dtype_name(d), ot_dtype_name(want),
                      l == 3 ? "; exp_avg_sq shares exp_avg's" : "");
        break;
      }
    }
    if (st != OT_OK) break;
    ot_adamw_tensor *t = &tab[i];
    t->param = v[0].data;
    t->grad = v[1].data;
    t->exp_avg = v[2].data;
    t->exp_avg_sq = v[3].data;
    t->master = has_master ? (float *)v[4].data : NULL;
    t->numel = v[0].numel;
    total += t->numel;
    for (int l = 0; l < (has_master ? 5 : 4); l++) {
      if (v[l].numel == 0) continue;
      extent *e = &ext[next++];
      ot_view_extent(&v[l], &e->lo, &e->hi);
      e->which = l;
      e->index = i;
    }
  }
  /* No two tensors of the call may share a byte (sorted extents, neighbours). */
  if (st == OT_OK && next > 1) {
    qsort(ext, (size_t)next, sizeof *ext, extent_cmp);
    uintptr_t hi = ext[0].hi;
    int owner = 0;
    for (int k = 1; k < next; k++) {
      if (ext[k].lo < hi) {
        st = ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "%s[%d]: overlaps %s[%d] (every tensor of the call must be distinct "
                      "memory)",
                      list_names[ext[k].which], ext[k].index, list_names[ext[owner].which],
                      ext[owner].index);
        break;
      }
      if (ext[k].hi > hi) {
        hi = ext[k].hi;
        owner = k;
      }
    }
  }
  free(ext);
  if (st != OT_OK) {
    free(tab);
    return st;
  }

  ot_adamw_args a;
  memset(&a, 0, sizeof a);
  a.param_dtype = dts[0];
  a.grad_dtype = dts[1];
  a.state_dtype = dts[2];
  a.has_master = has_master;
  a.n = n;
  a.tensors = tab;
  a.total = total;
  a.lr = params->lr;
  a.beta1 = params->beta1;
  a.beta2 = params->beta2;
  a.eps = params->eps;
  a.weight_decay = params->weight_decay;
  const double t = (double)params->step;
  a.decay = (float)(1.0 - (double)params->lr * (double)params->weight_decay);
  a.step_size = (float)((double)params->lr / (1.0 - pow((double)params->beta1, t)));
  a.bc2_sqrt = (float)sqrt(1.0 - pow((double)params->beta2, t));
  if (ot_ctx_is_cuda(ctx)) st = OT_CUDA_CALL(op, ot_cuda_adamw_step, ctx, &a);
  else st = ot_cpu_adamw_step(ctx, &a);
  free(tab);
  return st;
}
