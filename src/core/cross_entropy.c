/* cross_entropy.c -- ot_cross_entropy_forward / _backward: validation and dispatch. */
#include <inttypes.h>
#include <math.h>

#include "backend.h"
#include "softmax.h"

ot_status ot_cross_entropy_check_params(const char *op, const char *name,
                                        const ot_cross_entropy_params *p) {
  if ((int)p->reduction < (int)OT_REDUCTION_MEAN || (int)p->reduction > (int)OT_REDUCTION_NONE)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s.reduction: %d is not an ot_reduction (0 MEAN, 1 SUM, 2 NONE)", name,
                    (int)p->reduction);
  float s = p->label_smoothing;
  if (!(s >= 0.0f && s <= 1.0f))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s.label_smoothing: %g is not a finite value in [0, 1]", name, (double)s);
  return OT_OK;
}

/* loss / dloss: float32, [] or [1] for MEAN / SUM, [N] for NONE. */
static ot_status check_loss_shape(const char *op, const char *name, const ot_view *v,
                                  ot_reduction red, int64_t N, int64_t *stride) {
  OT_TRY(ot_check_dtype(op, name, v, OT_F32, NULL));
  if (red == OT_REDUCTION_NONE) {
    OT_TRY(ot_check_ndim(op, name, v, 1, 1));
    OT_TRY(ot_check_dim(op, name, v, 0, N, "N, one loss per row with reduction NONE"));
    *stride = v->stride[0];
  } else {
    if (!(v->ndim == 0 || (v->ndim == 1 && v->shape[0] == 1)))
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "%s: expected shape [] or [1] for reduction %s, got %d dimension(s) and "
                      "%" PRId64 " element(s)",
                      name, red == OT_REDUCTION_MEAN ? "MEAN" : "SUM", v->ndim, v->numel);
    *stride = 0;
  }
  return OT_OK;
}

/* logits [N, V] (V >= 1 unless N == 0), labels int [N], lse float32 [N] or NULL. */
static ot_status check_inputs(const char *op, const ot_context *ctx, const DLTensor *logits,
                              const DLTensor *labels, const DLTensor *lse, ot_view *lv,
                              ot_rows *lr, ot_view *yv, ot_view *sv) {
  OT_TRY(ot_view_of(op, "logits", ctx, logits, lv));
  OT_TRY(ot_check_float(op, "logits", lv));
  OT_TRY(ot_check_ndim(op, "logits", lv, 2, 2));
  OT_TRY(ot_as_rows(op, "logits", lv, lr));
  if (lr->rows > 0 && lr->cols < 1)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "logits: shape [%" PRId64 ", 0]: the class dimension V must be >= 1",
                    lr->rows);
  OT_TRY(ot_view_of(op, "labels", ctx, labels, yv));
  OT_TRY(ot_check_index_dtype(op, "labels", yv));
  OT_TRY(ot_check_ndim(op, "labels", yv, 1, 1));
  OT_TRY(ot_check_dim(op, "labels", yv, 0, lr->rows, "N, the rows of logits"));
  OT_TRY(ot_view_of_optional(op, "lse", ctx, lse, sv));
  if (ot_view_present(sv)) {
    OT_TRY(ot_check_dtype(op, "lse", sv, OT_F32, NULL));
    OT_TRY(ot_check_ndim(op, "lse", sv, 1, 1));
    OT_TRY(ot_check_dim(op, "lse", sv, 0, lr->rows, "N, the rows of logits"));
  }
  return OT_OK;
}

/* Every label in [0, V) or ignore_index; counts the others. Reads host memory, so
 * only on the CPU backend: on CUDA the labels stay on the device, the kernels count
 * the non-ignored rows there and a label out of range gives a NaN loss row (checking
 * would need a synchronization; the public header states the contract). */
ot_status ot_cross_entropy_check_labels(const char *op, const ot_view *yv, int64_t V,
                                        int64_t ignore, const char *unit, int64_t *count) {
  int64_t n = yv->shape[0], c = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t y = ot_load_index(yv->data, yv->dtype, i * yv->stride[0]);
    if (y == ignore) continue;
    if (y < 0 || y >= V)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "labels: %s %" PRId64 " has label %" PRId64 ", outside [0, %" PRId64
                      ") and not ignore_index (%" PRId64 ")",
                      unit, i, y, V, ignore);
    c++;
  }
  *count = c;
  return OT_OK;
}

static void fill_common(ot_cross_entropy_args *a, const ot_cross_entropy_params *p,
                        const ot_view *lv, const ot_rows *lr, const ot_view *yv,
                        const ot_view *sv) {
  memset(a, 0, sizeof *a);
  a->dtype = lv->dtype;
  a->N = lr->rows;
  a->V = lr->cols;
  a->logits = lv->data;
  a->logits_stride = lr->row_stride;
  a->labels = yv->data;
  a->labels_dtype = yv->dtype;
  a->labels_stride = yv->stride[0];
  a->ignore_index = p->ignore_index;
  a->label_smoothing = p->label_smoothing;
  a->reduction = p->reduction;
  if (ot_view_present(sv)) {
    a->lse = (float *)sv->data;
    a->lse_stride = sv->stride[0];
  }
}

ot_status ot_cross_entropy_forward(ot_context *ctx, const ot_cross_entropy_params *params,
                                   const DLTensor *logits, const DLTensor *labels,
                                   const DLTensor *loss, const DLTensor *lse) {
  static const char op[] = "ot_cross_entropy_forward";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  ot_cross_entropy_params p = params ? *params : ot_cross_entropy_default_params();
  OT_TRY(ot_cross_entropy_check_params(op, "params", &p));
  ot_view lv, yv, sv, ov;
  ot_rows lr;
  int64_t loss_stride = 0;
  OT_TRY(check_inputs(op, ctx, logits, labels, lse, &lv, &lr, &yv, &sv));
  OT_TRY(ot_view_of(op, "loss", ctx, loss, &ov));
  OT_TRY(check_loss_shape(op, "loss", &ov, p.reduction, lr.rows, &loss_stride));
  OT_TRY(ot_check_no_overlap(op, "loss", &ov, "logits", &lv, false));
  OT_TRY(ot_check_no_overlap(op, "loss", &ov, "labels", &yv, false));
  OT_TRY(ot_check_no_overlap(op, "loss", &ov, "lse", &sv, false));
  OT_TRY(ot_check_no_overlap(op, "lse", &sv, "logits", &lv, false));
  OT_TRY(ot_check_no_overlap(op, "lse", &sv, "labels", &yv, false));

  ot_cross_entropy_args a;
  fill_common(&a, &p, &lv, &lr, &yv, &sv);
  a.loss = (float *)ov.data;
  a.loss_stride = loss_stride;
  if (ot_ctx_is_cuda(ctx)) {
    /* labels are device memory: counted (for MEAN) on the device, not validated */
    a.count = -1;
    return OT_CUDA_CALL(op, ot_cuda_cross_entropy_forward, ctx, &a);
  }
  OT_TRY(ot_cross_entropy_check_labels(op, &yv, lr.cols, p.ignore_index, "row", &a.count));
  return ot_cpu_cross_entropy_forward(ctx, &a);
}

ot_status ot_cross_entropy_backward(ot_context *ctx, const ot_cross_entropy_params *params,
                                    const DLTensor *dloss, const DLTensor *logits,
                                    const DLTensor *labels, const DLTensor *lse,
                                    const DLTensor *dlogits) {
  static const char op[] = "ot_cross_entropy_backward";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  ot_cross_entropy_params p = params ? *params : ot_cross_entropy_default_params();
  OT_TRY(ot_cross_entropy_check_params(op, "params", &p));
  ot_view lv, yv, sv, dv, gv;
  ot_rows lr, gr;
  int64_t dloss_stride = 0;
  OT_TRY(check_inputs(op, ctx, logits, labels, lse, &lv, &lr, &yv, &sv));
  OT_TRY(ot_view_of(op, "dloss", ctx, dloss, &dv));
  OT_TRY(check_loss_shape(op, "dloss", &dv, p.reduction, lr.rows, &dloss_stride));
  OT_TRY(ot_view_of(op, "dlogits", ctx, dlogits, &gv));
  OT_TRY(ot_check_dtype(op, "dlogits", &gv, lv.dtype, "logits"));
  OT_TRY(ot_check_same_shape(op, "dlogits", &gv, "logits", &lv));
  OT_TRY(ot_as_rows(op, "dlogits", &gv, &gr));
  OT_TRY(ot_check_no_overlap(op, "dlogits", &gv, "logits", &lv, true));
  OT_TRY(ot_check_no_overlap(op, "dlogits", &gv, "labels", &yv, false));
  OT_TRY(ot_check_no_overlap(op, "dlogits", &gv, "lse", &sv, false));
  OT_TRY(ot_check_no_overlap(op, "dlogits", &gv, "dloss", &dv, false));

  ot_cross_entropy_args a;
  fill_common(&a, &p, &lv, &lr, &yv, &sv);
  a.dloss = (const float *)dv.data;
  a.dloss_stride = dloss_stride;
  a.dlogits = gv.data;
  a.dlogits_stride = gr.row_stride;
  if (ot_ctx_is_cuda(ctx)) {
    a.count = -1; /* as in the forward: the device counts, labels are not validated */
    return OT_CUDA_CALL(op, ot_cuda_cross_entropy_backward, ctx, &a);
  }
  OT_TRY(ot_cross_entropy_check_labels(op, &yv, lr.cols, p.ignore_index, "row", &a.count));
  return ot_cpu_cross_entropy_backward(ctx, &a);
}
