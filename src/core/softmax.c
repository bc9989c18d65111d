/* softmax.c -- ot_softmax_forward / ot_softmax_backward: validation and dispatch. */
#include "backend.h"
#include "softmax.h"

ot_status ot_softmax_forward(ot_context *ctx, const DLTensor *x, const DLTensor *out) {
  static const char op[] = "ot_softmax_forward";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  ot_view xv, ov;
  ot_rows xr, orow;
  OT_TRY(ot_view_of(op, "x", ctx, x, &xv));
  OT_TRY(ot_check_float(op, "x", &xv));
  OT_TRY(ot_as_rows(op, "x", &xv, &xr));
  OT_TRY(ot_view_of(op, "out", ctx, out, &ov));
  OT_TRY(ot_check_dtype(op, "out", &ov, xv.dtype, "x"));
  OT_TRY(ot_check_same_shape(op, "out", &ov, "x", &xv));
  OT_TRY(ot_as_rows(op, "out", &ov, &orow));
  OT_TRY(ot_check_no_overlap(op, "out", &ov, "x", &xv, true));

  ot_softmax_forward_args a;
  a.dtype = xv.dtype;
  a.rows = xr.rows;
  a.cols = xr.cols;
  a.x = xv.data;
  a.x_stride = xr.row_stride;
  a.out = ov.data;
  a.out_stride = orow.row_stride;
  if (ot_ctx_is_cuda(ctx)) return OT_CUDA_CALL(op, ot_cuda_softmax_forward, ctx, &a);
  return ot_cpu_softmax_forward(ctx, &a);
}

ot_status ot_softmax_backward(ot_context *ctx, const DLTensor *dy, const DLTensor *y,
                              const DLTensor *dx) {
  static const char op[] = "ot_softmax_backward";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  ot_view dyv, yv, dxv;
  ot_rows dyr, yr, dxr;
  OT_TRY(ot_view_of(op, "dy", ctx, dy, &dyv));
  OT_TRY(ot_check_float(op, "dy", &dyv));
  OT_TRY(ot_as_rows(op, "dy", &dyv, &dyr));
  OT_TRY(ot_view_of(op, "y", ctx, y, &yv));
  OT_TRY(ot_check_dtype(op, "y", &yv, dyv.dtype, "dy"));
  OT_TRY(ot_check_same_shape(op, "y", &yv, "dy", &dyv));
  OT_TRY(ot_as_rows(op, "y", &yv, &yr));
  OT_TRY(ot_view_of(op, "dx", ctx, dx, &dxv));
  OT_TRY(ot_check_dtype(op, "dx", &dxv, dyv.dtype, "dy"));
  OT_TRY(ot_check_same_shape(op, "dx", &dxv, "dy", &dyv));
  OT_TRY(ot_as_rows(op, "dx", &dxv, &dxr));
  OT_TRY(ot_check_no_overlap(op, "dx", &dxv, "dy", &dyv, true));
  OT_TRY(ot_check_no_overlap(op, "dx", &dxv, "y", &yv, false));

  ot_softmax_backward_args a;
  a.dtype = dyv.dtype;
  a.rows = dyr.rows;
  a.cols = dyr.cols;
  a.dy = dyv.data;
  a.dy_stride = dyr.row_stride;
  a.y = yv.data;
  a.y_stride = yr.row_stride;
  a.dx = dxv.data;
  a.dx_stride = dxr.row_stride;
  if (ot_ctx_is_cuda(ctx)) return OT_CUDA_CALL(op, ot_cuda_softmax_backward, ctx, &a);
  return ot_cpu_softmax_backward(ctx, &a);
}
