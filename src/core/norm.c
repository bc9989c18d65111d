/*
 * norm.c -- the public RMSNorm / LayerNorm ops: validation of every argument, then
 * dispatch to the backend (see norm.h for the argument structs).
 *
 * Semantics beyond the header's comment:
 *  - H (the last dimension) must be >= 1; zero rows is a valid no-op (the backward
 *    then writes zeros to dweight / dbias).
 *  - rstd / mean have x's leading shape; for a 1-D x ([H], one row) they may be 0-d
 *    or [1].
 *  - Forward aliasing: out may be x, residual_out may be x or residual (the exact same
 *    view); any other overlap between an output and anything else is rejected.
 *  - Backward aliasing: dx may be dy or dresidual_out (the exact same view).
 *  - residual_out is required with residual and must be NULL without it.
 */
#include <math.h>

#include "backend.h"
#include "norm.h"

static ot_status check_ctx(const char *op, const ot_context *ctx) {
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: context is NULL");
  return OT_OK;
}

static ot_status check_eps(const char *op, float eps) {
  if (!(eps >= 0.0f) || !isfinite(eps))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "eps: %g, expected a finite value >= 0",
                    (double)eps);
  return OT_OK;
}

/* The [..., H] tensor that defines the shape and dtype of the others (x or dy). */
static ot_status check_lead(const char *op, const char *name, const ot_context *ctx,
                            const DLTensor *t, ot_view *v, ot_rows *r) {
  OT_TRY(ot_view_of(op, name, ctx, t, v));
  OT_TRY(ot_check_float(op, name, v));
  OT_TRY(ot_check_ndim(op, name, v, 1, OT_MAX_DIMS));
  OT_TRY(ot_as_rows(op, name, v, r));
  if (r->cols < 1)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: the last dimension (hidden size) is 0, expected >= 1", name);
  return OT_OK;
}

/* Another [..., H] tensor, optional or not: same dtype and shape as `ref`. */
static ot_status check_like(const char *op, const char *name, const ot_context *ctx,
                            const DLTensor *t, bool optional, ot_view *v, ot_rows *r,
                            const char *ref_name, const ot_view *ref) {
  if (optional) OT_TRY(ot_view_of_optional(op, name, ctx, t, v));
  else OT_TRY(ot_view_of(op, name, ctx, t, v));
  r->rows = r->cols = r->row_stride = 0;
  if (!ot_view_present(v)) return OT_OK;
  OT_TRY(ot_check_dtype(op, name, v, ref->dtype, ref_name));
  OT_TRY(ot_check_same_shape(op, name, v, ref_name, ref));
  return ot_as_rows(op, name, v, r);
}

/* An optional [H] parameter vector (weight, bias, dweight, dbias). */
static ot_status check_vec(const char *op, const char *name, const ot_context *ctx,
                           const DLTensor *t, ot_view *v, const char *ref_name,
                           const ot_view *ref, int64_t cols) {
  OT_TRY(ot_view_of_optional(op, name, ctx, t, v));
  if (!ot_view_present(v)) return OT_OK;
  OT_TRY(ot_check_dtype(op, name, v, ref->dtype, ref_name));
  OT_TRY(ot_check_ndim(op, name, v, 1, 1));
  OT_TRY(ot_check_dim(op, name, v, 0, cols, "the hidden size, the last dimension of x"));
  return ot_check_contiguous(op, name, v);
}

/* An optional float32 per-row statistic (rstd, mean): x's leading shape, contiguous. */
static ot_status check_stat(const char *op, const char *name, const ot_context *ctx,
                            const DLTensor *t, ot_view *v, const ot_view *ref) {
  OT_TRY(ot_view_of_optional(op, name, ctx, t, v));
  if (!ot_view_present(v)) return OT_OK;
  OT_TRY(ot_check_dtype(op, name, v, OT_F32, NULL));
  if (ref->ndim == 1) {
    OT_TRY(ot_check_ndim(op, name, v, 0, 1));
    if (v->ndim == 1) OT_TRY(ot_check_dim(op, name, v, 0, 1, "one value per row"));
  } else {
    OT_TRY(ot_check_ndim(op, name, v, ref->ndim - 1, ref->ndim - 1));
    for (int i = 0; i < ref->ndim - 1; i++)
      OT_TRY(ot_check_dim(op, name, v, i, ref->shape[i], "the leading shape of the input"));
  }
  return ot_check_contiguous(op, name, v);
}

static ot_status norm_forward(const char *op, bool layernorm, ot_context *ctx,
                              const DLTensor *x, const DLTensor *residual,
                              const DLTensor *weight, const DLTensor *bias, float eps,
                              const DLTensor *out, const DLTensor *residual_out,
                              const DLTensor *mean, const DLTensor *rstd) {
  OT_TRY(check_ctx(op, ctx));
  ot_view vx, vres, vw, vb, vout, vrout, vmean, vrstd;
  ot_rows rx, rres, rout, rrout;
  OT_TRY(check_lead(op, "x", ctx, x, &vx, &rx));
  OT_TRY(check_like(op, "residual", ctx, residual, true, &vres, &rres, "x", &vx));
  OT_TRY(check_vec(op, "weight", ctx, weight, &vw, "x", &vx, rx.cols));
  vb.ndim = -1;
  if (layernorm) OT_TRY(check_vec(op, "bias", ctx, bias, &vb, "x", &vx, rx.cols));
  OT_TRY(check_eps(op, eps));
  OT_TRY(check_like(op, "out", ctx, out, false, &vout, &rout, "x", &vx));
  OT_TRY(check_like(op, "residual_out", ctx, residual_out, true, &vrout, &rrout, "x", &vx));
  if (ot_view_present(&vres) && !ot_view_present(&vrout))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "residual_out: is NULL, but it is required when residual is given");
  if (!ot_view_present(&vres) && ot_view_present(&vrout))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "residual_out: must be NULL when residual is NULL");
  vmean.ndim = -1;
  if (layernorm) OT_TRY(check_stat(op, "mean", ctx, mean, &vmean, &vx));
  OT_TRY(check_stat(op, "rstd", ctx, rstd, &vrstd, &vx));

  /* Outputs against inputs and against each other. */
  OT_TRY(ot_check_no_overlap(op, "out", &vout, "x", &vx, true));
  OT_TRY(ot_check_no_overlap(op, "out", &vout, "residual", &vres, false));
  OT_TRY(ot_check_no_overlap(op, "out", &vout, "weight", &vw, false));
  OT_TRY(ot_check_no_overlap(op, "out", &vout, "bias", &vb, false));
  OT_TRY(ot_check_no_overlap(op, "out", &vout, "residual_out", &vrout, false));
  OT_TRY(ot_check_no_overlap(op, "residual_out", &vrout, "x", &vx, true));
  OT_TRY(ot_check_no_overlap(op, "residual_out", &vrout, "residual", &vres, true));
  OT_TRY(ot_check_no_overlap(op, "residual_out", &vrout, "weight", &vw, false));
  OT_TRY(ot_check_no_overlap(op, "residual_out", &vrout, "bias", &vb, false));
  const char *stat_names[2] = {"mean", "rstd"};
  const ot_view *stats[2] = {&vmean, &vrstd};
  for (int s = 0; s < 2; s++) {
    const char *n = stat_names[s];
    const ot_view *v = stats[s];
    OT_TRY(ot_check_no_overlap(op, n, v, "x", &vx, false));
    OT_TRY(ot_check_no_overlap(op, n, v, "residual", &vres, false));
    OT_TRY(ot_check_no_overlap(op, n, v, "weight", &vw, false));
    OT_TRY(ot_check_no_overlap(op, n, v, "bias", &vb, false));
    OT_TRY(ot_check_no_overlap(op, n, v, "out", &vout, false));
    OT_TRY(ot_check_no_overlap(op, n, v, "residual_out", &vrout, false));
  }
  OT_TRY(ot_check_no_overlap(op, "rstd", &vrstd, "mean", &vmean, false));

  ot_norm_forward_args a;
  memset(&a, 0, sizeof a);
  a.dtype = vx.dtype;
  a.rows = rx.rows;
  a.cols = rx.cols;
  a.x = vx.data;
  a.x_stride = rx.row_stride;
  if (ot_view_present(&vres)) {
    a.residual = vres.data;
    a.residual_stride = rres.row_stride;
    a.residual_out = vrout.data;
    a.residual_out_stride = rrout.row_stride;
  }
  a.weight = ot_view_present(&vw) ? vw.data : NULL;
  a.bias = ot_view_present(&vb) ? vb.data : NULL;
  a.eps = eps;
  a.out = vout.data;
  a.out_stride = rout.row_stride;
  a.mean = ot_view_present(&vmean) ? (float *)vmean.data : NULL;
  a.rstd = ot_view_present(&vrstd) ? (float *)vrstd.data : NULL;
  if (a.rows == 0) return OT_OK;

  if (ot_ctx_is_cuda(ctx))
    return layernorm ? OT_CUDA_CALL(op, ot_cuda_layernorm_forward, ctx, &a)
                     : OT_CUDA_CALL(op, ot_cuda_rmsnorm_forward, ctx, &a);
  return layernorm ? ot_cpu_layernorm_forward(ctx, &a) : ot_cpu_rmsnorm_forward(ctx, &a);
}

static ot_status norm_backward(const char *op, bool layernorm, ot_context *ctx,
                               const DLTensor *dy, const DLTensor *dresidual_out,
                               const DLTensor *h, const DLTensor *weight, const DLTensor *mean,
                               const DLTensor *rstd, float eps, const DLTensor *dx,
                               const DLTensor *dweight, const DLTensor *dbias) {
  OT_TRY(check_ctx(op, ctx));
  ot_view vdy, vdres, vh, vw, vmean, vrstd, vdx, vdw, vdb;
  ot_rows rdy, rdres, rh, rdx;
  OT_TRY(check_lead(op, "dy", ctx, dy, &vdy, &rdy));
  OT_TRY(check_like(op, "dresidual_out", ctx, dresidual_out, true, &vdres, &rdres, "dy", &vdy));
  OT_TRY(check_like(op, "h", ctx, h, false, &vh, &rh, "dy", &vdy));
  OT_TRY(check_vec(op, "weight", ctx, weight, &vw, "dy", &vdy, rdy.cols));
  vmean.ndim = -1;
  if (layernorm) OT_TRY(check_stat(op, "mean", ctx, mean, &vmean, &vdy));
  OT_TRY(check_stat(op, "rstd", ctx, rstd, &vrstd, &vdy));
  if (layernorm && ot_view_present(&vmean) != ot_view_present(&vrstd))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: mean and rstd must be given together or both be NULL (recomputed)",
                    ot_view_present(&vmean) ? "rstd" : "mean");
  OT_TRY(check_eps(op, eps));
  OT_TRY(check_like(op, "dx", ctx, dx, false, &vdx, &rdx, "dy", &vdy));
  OT_TRY(check_vec(op, "dweight", ctx, dweight, &vdw, "dy", &vdy, rdy.cols));
  if (ot_view_present(&vdw) && !ot_view_present(&vw))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "dweight: must be NULL when weight is NULL");
  vdb.ndim = -1;
  if (layernorm) OT_TRY(check_vec(op, "dbias", ctx, dbias, &vdb, "dy", &vdy, rdy.cols));

  OT_TRY(ot_check_no_overlap(op, "dx", &vdx, "dy", &vdy, true));
  OT_TRY(ot_check_no_overlap(op, "dx", &vdx, "dresidual_out", &vdres, true));
  OT_TRY(ot_check_no_overlap(op, "dx", &vdx, "h", &vh, false));
  OT_TRY(ot_check_no_overlap(op, "dx", &vdx, "weight", &vw, false));
  OT_TRY(ot_check_no_overlap(op, "dx", &vdx, "mean", &vmean, false));
  OT_TRY(ot_check_no_overlap(op, "dx", &vdx, "rstd", &vrstd, false));
  const char *red_names[2] = {"dweight", "dbias"};
  const ot_view *reds[2] = {&vdw, &vdb};
  for (int s = 0; s < 2; s++) {
    const char *n = red_names[s];
    const ot_view *v = reds[s];
    OT_TRY(ot_check_no_overlap(op, n, v, "dy", &vdy, false));
    OT_TRY(ot_check_no_overlap(op, n, v, "dresidual_out", &vdres, false));
    OT_TRY(ot_check_no_overlap(op, n, v, "h", &vh, false));
    OT_TRY(ot_check_no_overlap(op, n, v, "weight", &vw, false));
    OT_TRY(ot_check_no_overlap(op, n, v, "mean", &vmean, false));
    OT_TRY(ot_check_no_overlap(op, n, v, "rstd", &vrstd, false));
    OT_TRY(ot_check_no_overlap(op, n, v, "dx", &vdx, false));
  }
  OT_TRY(ot_check_no_overlap(op, "dbias", &vdb, "dweight", &vdw, false));

  ot_norm_backward_args a;
  memset(&a, 0, sizeof a);
  a.dtype = vdy.dtype;
  a.rows = rdy.rows;
  a.cols = rdy.cols;
  a.dy = vdy.data;
  a.dy_stride = rdy.row_stride;
  if (ot_view_present(&vdres)) {
    a.dresidual_out = vdres.data;
    a.dresidual_out_stride = rdres.row_stride;
  }
  a.h = vh.data;
  a.h_stride = rh.row_stride;
  a.weight = ot_view_present(&vw) ? vw.data : NULL;
  a.mean = ot_view_present(&vmean) ? (const float *)vmean.data : NULL;
  a.rstd = ot_view_present(&vrstd) ? (const float *)vrstd.data : NULL;
  a.eps = eps;
  a.dx = vdx.data;
  a.dx_stride = rdx.row_stride;
  a.dweight = ot_view_present(&vdw) ? vdw.data : NULL;
  a.dbias = ot_view_present(&vdb) ? vdb.data : NULL;

  if (ot_ctx_is_cuda(ctx))
    return layernorm ? OT_CUDA_CALL(op, ot_cuda_layernorm_backward, ctx, &a)
                     : OT_CUDA_CALL(op, ot_cuda_rmsnorm_backward, ctx, &a);
  return layernorm ? ot_cpu_layernorm_backward(ctx, &a) : ot_cpu_rmsnorm_backward(ctx, &a);
}

ot_status ot_rmsnorm_forward(ot_context *ctx, const DLTensor *x, const DLTensor *residual,
                             const DLTensor *weight, float eps, const DLTensor *out,
                             const DLTensor *residual_out, const DLTensor *rstd) {
  return norm_forward("ot_rmsnorm_forward", false, ctx, x, residual, weight, NULL, eps, out,
                      residual_out, NULL, rstd);
}

ot_status ot_rmsnorm_backward(ot_context *ctx, const DLTensor *dy, const DLTensor *dresidual_out,
                              const DLTensor *h, const DLTensor *weight, const DLTensor *rstd,
                              float eps, const DLTensor *dx, const DLTensor *dweight) {
  return norm_backward("ot_rmsnorm_backward", false, ctx, dy, dresidual_out, h, weight, NULL,
                       rstd, eps, dx, dweight, NULL);
}

ot_status ot_layernorm_forward(ot_context *ctx, const DLTensor *x, const DLTensor *residual,
                               const DLTensor *weight, const DLTensor *bias, float eps,
                               const DLTensor *out, const DLTensor *residual_out,
                               const DLTensor *mean, const DLTensor *rstd) {
  return norm_forward("ot_layernorm_forward", true, ctx, x, residual, weight, bias, eps, out,
                      residual_out, mean, rstd);
}

ot_status ot_layernorm_backward(ot_context *ctx, const DLTensor *dy,
                                const DLTensor *dresidual_out, const DLTensor *h,
                                const DLTensor *weight, const DLTensor *mean,
                                const DLTensor *rstd, float eps, const DLTensor *dx,
                                const DLTensor *dweight, const DLTensor *dbias) {
  return norm_backward("ot_layernorm_backward", true, ctx, dy, dresidual_out, h, weight, mean,
                       rstd, eps, dx, dweight, dbias);
}
