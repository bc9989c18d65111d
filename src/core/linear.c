/* linear.c -- validation and dispatch of ot_linear_forward / ot_linear_backward. */
#include <inttypes.h>

#include "backend.h"
#include "linear.h"

/* A leading shape of `v` (all dims but the last) equal to the one of `ref`. */
static ot_status check_leading_shape(const char *op, const char *name, const ot_view *v,
                                     const char *ref_name, const ot_view *ref) {
  bool same = v->ndim == ref->ndim;
  for (int i = 0; same && i < v->ndim - 1; i++) same = v->shape[i] == ref->shape[i];
  if (!same)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: leading dimensions (all but the last) must match those of %s "
                    "(%d vs %d dimensions)",
                    name, ref_name, v->ndim, ref->ndim);
  return OT_OK;
}

/* weight: [N, K] contiguous, dtype `dt`. */
static ot_status check_weight(const char *op, const char *name, const ot_view *w, ot_dtype dt,
                              const char *dt_ref, int64_t n, const char *n_what, int64_t k,
                              const char *k_what) {
  OT_TRY(ot_check_dtype(op, name, w, dt, dt_ref));
  OT_TRY(ot_check_ndim(op, name, w, 2, 2));
  if (n >= 0) OT_TRY(ot_check_dim(op, name, w, 0, n, n_what));
  OT_TRY(ot_check_dim(op, name, w, 1, k, k_what));
  return ot_check_contiguous(op, name, w);
}

/* bias-like vector: [N] contiguous. */
static ot_status check_vector(const char *op, const char *name, const ot_view *b, ot_dtype dt,
                              const char *dt_ref, int64_t n, const char *n_what) {
  OT_TRY(ot_check_dtype(op, name, b, dt, dt_ref));
  OT_TRY(ot_check_ndim(op, name, b, 1, 1));
  OT_TRY(ot_check_dim(op, name, b, 0, n, n_what));
  return ot_check_contiguous(op, name, b);
}

ot_status ot_linear_forward(ot_context *ctx, const DLTensor *x, const DLTensor *weight,
                            const DLTensor *bias, const DLTensor *y) {
  static const char *op = "ot_linear_forward";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  ot_view xv, wv, bv, yv;
  ot_rows xr, yr;
  OT_TRY(ot_view_of(op, "x", ctx, x, &xv));
  OT_TRY(ot_check_float(op, "x", &xv));
  OT_TRY(ot_as_rows(op, "x", &xv, &xr));
  const int64_t K = xr.cols;

  OT_TRY(ot_view_of(op, "weight", ctx, weight, &wv));
  OT_TRY(check_weight(op, "weight", &wv, xv.dtype, "x", -1, NULL, K,
                      "in_features, the last dimension of x"));
  const int64_t N = wv.shape[0];

  OT_TRY(ot_view_of_optional(op, "bias", ctx, bias, &bv));
  if (ot_view_present(&bv))
    OT_TRY(check_vector(op, "bias", &bv, xv.dtype, "x", N,
                        "out_features, the first dimension of weight"));

  OT_TRY(ot_view_of(op, "y", ctx, y, &yv));
  OT_TRY(ot_check_dtype(op, "y", &yv, xv.dtype, "x"));
  OT_TRY(check_leading_shape(op, "y", &yv, "x", &xv));
  OT_TRY(ot_check_dim(op, "y", &yv, -1, N, "out_features, the first dimension of weight"));
  OT_TRY(ot_as_rows(op, "y", &yv, &yr));

  OT_TRY(ot_check_no_overlap(op, "y", &yv, "x", &xv, false));
  OT_TRY(ot_check_no_overlap(op, "y", &yv, "weight", &wv, false));
  OT_TRY(ot_check_no_overlap(op, "y", &yv, "bias", &bv, false));

  ot_linear_forward_args a;
  a.dtype = xv.dtype;
  a.rows = xr.rows;
  a.in_features = K;
  a.out_features = N;
  a.x = xv.data;
  a.x_stride = xr.row_stride;
  a.weight = wv.data;
  a.bias = ot_view_present(&bv) ? bv.data : NULL;
  a.y = yv.data;
  a.y_stride = yr.row_stride;
  if (ot_ctx_is_cuda(ctx)) return OT_CUDA_CALL(op, ot_cuda_linear_forward, ctx, &a);
  return ot_cpu_linear_forward(ctx, &a);
}

ot_status ot_linear_backward(ot_context *ctx, const DLTensor *dy, const DLTensor *x,
                             const DLTensor *weight, const DLTensor *dx, const DLTensor *dweight,
                             const DLTensor *dbias) {
  static const char *op = "ot_linear_backward";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  if (!dx && !dweight && !dbias)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "dx, dweight, dbias: all are NULL, at least one output must be given");
  ot_view dyv, xv, wv, dxv, dwv, dbv;
  ot_rows dyr, xr, dxr = {0, 0, 0};
  OT_TRY(ot_view_of(op, "dy", ctx, dy, &dyv));
  OT_TRY(ot_check_float(op, "dy", &dyv));
  OT_TRY(ot_as_rows(op, "dy", &dyv, &dyr));
  const int64_t N = dyr.cols;

  OT_TRY(ot_view_of(op, "x", ctx, x, &xv));
  OT_TRY(ot_check_dtype(op, "x", &xv, dyv.dtype, "dy"));
  OT_TRY(check_leading_shape(op, "x", &xv, "dy", &dyv));
  OT_TRY(ot_as_rows(op, "x", &xv, &xr));
  const int64_t K = xr.cols;

  OT_TRY(ot_view_of(op, "weight", ctx, weight, &wv));
  OT_TRY(check_weight(op, "weight", &wv, dyv.dtype, "dy", N,
                      "out_features, the last dimension of dy", K,
                      "in_features, the last dimension of x"));

  OT_TRY(ot_view_of_optional(op, "dx", ctx, dx, &dxv));
  if (ot_view_present(&dxv)) {
    OT_TRY(ot_check_dtype(op, "dx", &dxv, dyv.dtype, "dy"));
    OT_TRY(ot_check_same_shape(op, "dx", &dxv, "x", &xv));
    OT_TRY(ot_as_rows(op, "dx", &dxv, &dxr));
  }
  OT_TRY(ot_view_of_optional(op, "dweight", ctx, dweight, &dwv));
  if (ot_view_present(&dwv))
    OT_TRY(check_weight(op, "dweight", &dwv, dyv.dtype, "dy", N,
                        "out_features, the first dimension of weight", K,
                        "in_features, the second dimension of weight"));
  OT_TRY(ot_view_of_optional(op, "dbias", ctx, dbias, &dbv));
  if (ot_view_present(&dbv))
    OT_TRY(check_vector(op, "dbias", &dbv, dyv.dtype, "dy", N,
                        "out_features, the last dimension of dy"));

  /* No output may touch an input or another output. */
  const char *in_names[3] = {"dy", "x", "weight"};
  const ot_view *ins[3] = {&dyv, &xv, &wv};
  const char *out_names[3] = {"dx", "dweight", "dbias"};
  const ot_view *outs[3] = {&dxv, &dwv, &dbv};
  for (int o = 0; o < 3; o++) {
    for (int i = 0; i < 3; i++)
      OT_TRY(ot_check_no_overlap(op, out_names[o], outs[o], in_names[i], ins[i], false));
    for (int p = 0; p < o; p++)
      OT_TRY(ot_check_no_overlap(op, out_names[o], outs[o], out_names[p], outs[p], false));
  }

  ot_linear_backward_args a;
  a.dtype = dyv.dtype;
  a.rows = dyr.rows;
  a.in_features = K;
  a.out_features = N;
  a.dy = dyv.data;
  a.dy_stride = dyr.row_stride;
  a.x = xv.data;
  a.x_stride = xr.row_stride;
  a.weight = wv.data;
  a.dx = ot_view_present(&dxv) ? dxv.data : NULL;
  a.dx_stride = dxr.row_stride;
  a.dweight = ot_view_present(&dwv) ? dwv.data : NULL;
  a.dbias = ot_view_present(&dbv) ? dbv.data : NULL;
  if (ot_ctx_is_cuda(ctx)) return OT_CUDA_CALL(op, ot_cuda_linear_backward, ctx, &a);
  return ot_cpu_linear_backward(ctx, &a);
}
