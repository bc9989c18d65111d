/* attention.c -- validation and dispatch of ot_attention_forward / ot_attention_backward. */
#include <inttypes.h>
#include <math.h>

#include "attention.h"
#include "backend.h"

/* A [.., S, H, D] floating operand of dtype `dt`, same shape as `ref` when ref != NULL. */
static ot_status check_operand(const char *op, const char *name, const ot_context *ctx,
                               const DLTensor *t, int ndim, ot_dtype dt, const char *dt_ref,
                               const char *shape_ref_name, const ot_view *shape_ref,
                               bool output, ot_view *v) {
  OT_TRY(ot_view_of(op, name, ctx, t, v));
  if (dt == OT_DTYPE_INVALID) OT_TRY(ot_check_float(op, name, v));
  else OT_TRY(ot_check_dtype(op, name, v, dt, dt_ref));
  OT_TRY(ot_check_ndim(op, name, v, ndim, ndim));
  if (shape_ref) OT_TRY(ot_check_same_shape(op, name, v, shape_ref_name, shape_ref));
  OT_TRY(ot_check_last_contiguous(op, name, v));
  if (output) OT_TRY(ot_check_no_self_overlap(op, name, v));
  return OT_OK;
}

static ot_status check_cu_seqlens(const char *op, const char *name, const ot_context *ctx,
                                  const DLTensor *t, int64_t total, const char *total_name,
                                  ot_view *v) {
  OT_TRY(ot_view_of(op, name, ctx, t, v));
  OT_TRY(ot_check_dtype(op, name, v, OT_I32, NULL));
  OT_TRY(ot_check_ndim(op, name, v, 1, 1));
  if (v->shape[0] < 1)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: shape [0]: expected [batch + 1] with at least one entry", name);
  OT_TRY(ot_check_contiguous(op, name, v));
  /* On CUDA the values live on the device; the kernels bound-check them there. */
  if (ot_ctx_is_cuda(ctx)) return OT_OK;
  const int32_t *c = (const int32_t *)v->data;
  if (c[0] != 0)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: %s[0] = %" PRId32 ", expected 0", name,
                    name, c[0]);
  for (int64_t i = 1; i < v->shape[0]; i++)
    if (c[i] < c[i - 1])
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "%s: %s[%" PRId64 "] = %" PRId32 " is less than %s[%" PRId64 "] = %" PRId32
                      " (must not decrease)",
                      name, name, i, c[i], name, i - 1, c[i - 1]);
  int64_t last = v->shape[0] - 1;
  if (c[last] != total)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: %s[%" PRId64 "] = %" PRId32 ", expected %" PRId64 " (%s)", name, name,
                    last, c[last], total, total_name);
  return OT_OK;
}

static ot_attn_operand operand(const ot_view *v, bool varlen) {
  ot_attn_operand o;
  o.data = v->data;
  if (varlen) {
    o.batch_stride = 0;
    o.tok_stride = v->stride[0];
    o.head_stride = v->stride[1];
  } else {
    o.batch_stride = v->stride[0];
    o.tok_stride = v->stride[1];
    o.head_stride = v->stride[2];
  }
  return o;
}

/* lse: dense [B, Hq, Sq], varlen [Hq, Tq]; heads and tokens swap places. */
static ot_attn_operand lse_operand(const ot_view *v, bool varlen) {
  ot_attn_operand o;
  o.data = v->data;
  if (!ot_view_present(v)) {
    o.data = NULL;
    o.batch_stride = o.tok_stride = o.head_stride = 0;
  } else if (varlen) {
    o.batch_stride = 0;
    o.head_stride = v->stride[0];
    o.tok_stride = v->stride[1];
  } else {
    o.batch_stride = v->stride[0];
    o.head_stride = v->stride[1];
    o.tok_stride = v->stride[2];
  }
  return o;
}

ot_status ot_attention_check_params(const char *op, const ot_attention_params *p) {
  if (!p) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params: is NULL");
  if (!isfinite(p->softmax_scale))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params.softmax_scale: %g is not finite",
                    (double)p->softmax_scale);
  if (!isfinite(p->softcap) || p->softcap < 0)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "params.softcap: %g, expected 0 (off) or a finite positive value",
                    (double)p->softcap);
  return OT_OK;
}

void ot_attention_resolve_params(const ot_attention_params *p, int64_t head_dim, float *scale,
                                 float *softcap, int64_t *window_left, int64_t *window_right) {
  *scale = p->softmax_scale != 0.0f ? p->softmax_scale : (float)(1.0 / sqrt((double)head_dim));
  *softcap = p->softcap;
  *window_left = p->window_left < 0 ? -1 : p->window_left;
  *window_right = p->causal ? 0 : (p->window_right < 0 ? -1 : p->window_right);
}

/* Validation shared by forward and backward: params, q, k, v, cu_seqlens; fills the
 * shape part of `a` and the views of q, k, v. */
static ot_status check_common(const char *op, ot_context *ctx, const ot_attention_params *p,
                              const DLTensor *q, const DLTensor *k, const DLTensor *v,
                              const DLTensor *cu_q, const DLTensor *cu_k, ot_view *qv,
                              ot_view *kv, ot_view *vv, ot_attention_args *a) {
  memset(a, 0, sizeof *a);
  OT_TRY(ot_attention_check_params(op, p));
  if ((cu_q == NULL) != (cu_k == NULL))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: is NULL but %s is given (give both for varlen, or neither)",
                    cu_q ? "cu_seqlens_k" : "cu_seqlens_q", cu_q ? "cu_seqlens_q" : "cu_seqlens_k");
  bool varlen = cu_q != NULL;
  int nd = varlen ? 3 : 4;
  OT_TRY(check_operand(op, "q", ctx, q, nd, OT_DTYPE_INVALID, NULL, NULL, NULL, false, qv));
  OT_TRY(check_operand(op, "k", ctx, k, nd, qv->dtype, "q", NULL, NULL, false, kv));
  OT_TRY(check_operand(op, "v", ctx, v, nd, qv->dtype, "q", "k", kv, false, vv));
  int hd = nd - 2, dd = nd - 1;
  int64_t d = qv->shape[dd];
  if (d < 1) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "q: head_dim is 0, expected >= 1");
  OT_TRY(ot_check_dim(op, "k", kv, dd, d, "head_dim of q"));
  if (!varlen) OT_TRY(ot_check_dim(op, "k", kv, 0, qv->shape[0], "batch of q"));
  int64_t hq = qv->shape[hd], hkv = kv->shape[hd];
  if (hkv < 1) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "k: has 0 heads, expected >= 1");
  if (hq % hkv != 0)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "k: %" PRId64 " kv heads do not divide the %" PRId64
                    " query heads of q (GQA needs Hq %% Hkv == 0)",
                    hkv, hq);
  a->dtype = qv->dtype;
  a->hq = hq;
  a->hkv = hkv;
  a->d = d;
  if (varlen) {
    ot_view cq, ck;
    OT_TRY(check_cu_seqlens(op, "cu_seqlens_q", ctx, cu_q, qv->shape[0], "Tq, the tokens of q", &cq));
    OT_TRY(check_cu_seqlens(op, "cu_seqlens_k", ctx, cu_k, kv->shape[0], "Tk, the tokens of k", &ck));
    if (ck.shape[0] != cq.shape[0])
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "cu_seqlens_k: has %" PRId64 " entries but cu_seqlens_q has %" PRId64,
                      ck.shape[0], cq.shape[0]);
    a->batch = cq.shape[0] - 1;
    a->cu_q = (const int32_t *)cq.data;
    a->cu_k = (const int32_t *)ck.data;
    a->tq = qv->shape[0];
    a->tk = kv->shape[0];
  } else {
    a->batch = qv->shape[0];
    a->sq = qv->shape[1];
    a->sk = kv->shape[1];
  }
  ot_attention_resolve_params(p, d, &a->scale, &a->softcap, &a->window_left, &a->window_right);
  a->q = operand(qv, varlen);
  a->k = operand(kv, varlen);
  a->v = operand(vv, varlen);
  return OT_OK;
}

static ot_status check_lse(const char *op, const ot_context *ctx, const DLTensor *lse,
                           const ot_view *qv, bool varlen, ot_view *lv) {
  OT_TRY(ot_view_of(op, "lse", ctx, lse, lv));
  OT_TRY(ot_check_dtype(op, "lse", lv, OT_F32, NULL));
  if (varlen) {
    OT_TRY(ot_check_ndim(op, "lse", lv, 2, 2));
    OT_TRY(ot_check_dim(op, "lse", lv, 0, qv->shape[1], "Hq, lse is [Hq, Tq]"));
    OT_TRY(ot_check_dim(op, "lse", lv, 1, qv->shape[0], "Tq, lse is [Hq, Tq]"));
  } else {
    OT_TRY(ot_check_ndim(op, "lse", lv, 3, 3));
    OT_TRY(ot_check_dim(op, "lse", lv, 0, qv->shape[0], "B, lse is [B, Hq, Sq]"));
    OT_TRY(ot_check_dim(op, "lse", lv, 1, qv->shape[2], "Hq, lse is [B, Hq, Sq]"));
    OT_TRY(ot_check_dim(op, "lse", lv, 2, qv->shape[1], "Sq, lse is [B, Hq, Sq]"));
  }
  return ot_check_last_contiguous(op, "lse", lv);
}

ot_status ot_attention_forward(ot_context *ctx, const ot_attention_params *params,
                               const DLTensor *q, const DLTensor *k, const DLTensor *v,
                               const DLTensor *cu_seqlens_q, const DLTensor *cu_seqlens_k,
                               const DLTensor *out, const DLTensor *lse) {
  static const char *op = "ot_attention_forward";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  ot_attention_args a;
  ot_view qv, kv, vv, ov, lv;
  OT_TRY(check_common(op, ctx, params, q, k, v, cu_seqlens_q, cu_seqlens_k, &qv, &kv, &vv, &a));
  bool varlen = a.cu_q != NULL;
  OT_TRY(check_operand(op, "out", ctx, out, qv.ndim, qv.dtype, "q", "q", &qv, true, &ov));
  OT_TRY(ot_check_no_overlap(op, "out", &ov, "q", &qv, false));
  OT_TRY(ot_check_no_overlap(op, "out", &ov, "k", &kv, false));
  OT_TRY(ot_check_no_overlap(op, "out", &ov, "v", &vv, false));
  lv.ndim = -1;
  if (lse) {
    OT_TRY(check_lse(op, ctx, lse, &qv, varlen, &lv));
    OT_TRY(ot_check_no_self_overlap(op, "lse", &lv));
    OT_TRY(ot_check_no_overlap(op, "lse", &lv, "q", &qv, false));
    OT_TRY(ot_check_no_overlap(op, "lse", &lv, "k", &kv, false));
    OT_TRY(ot_check_no_overlap(op, "lse", &lv, "v", &vv, false));
    OT_TRY(ot_check_no_overlap(op, "lse", &lv, "out", &ov, false));
  }
  a.out = operand(&ov, varlen);
  a.lse = lse_operand(&lv, varlen);
  if (ot_ctx_is_cuda(ctx)) return OT_CUDA_CALL(op, ot_cuda_attention_forward, ctx, &a);
  return ot_cpu_attention_forward(ctx, &a);
}

ot_status ot_attention_backward(ot_context *ctx, const ot_attention_params *params,
                                const DLTensor *q, const DLTensor *k, const DLTensor *v,
                                const DLTensor *out, const DLTensor *dout, const DLTensor *lse,
                                const DLTensor *cu_seqlens_q, const DLTensor *cu_seqlens_k,
                                const DLTensor *dq, const DLTensor *dk, const DLTensor *dv) {
  static const char *op = "ot_attention_backward";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  ot_attention_args a;
  ot_view qv, kv, vv, ov, dov, lv, dqv, dkv, dvv;
  OT_TRY(check_common(op, ctx, params, q, k, v, cu_seqlens_q, cu_seqlens_k, &qv, &kv, &vv, &a));
  bool varlen = a.cu_q != NULL;
  OT_TRY(check_operand(op, "out", ctx, out, qv.ndim, qv.dtype, "q", "q", &qv, false, &ov));
  OT_TRY(check_operand(op, "dout", ctx, dout, qv.ndim, qv.dtype, "q", "q", &qv, false, &dov));
  OT_TRY(check_lse(op, ctx, lse, &qv, varlen, &lv));
  OT_TRY(check_operand(op, "dq", ctx, dq, qv.ndim, qv.dtype, "q", "q", &qv, true, &dqv));
  OT_TRY(check_operand(op, "dk", ctx, dk, qv.ndim, qv.dtype, "q", "k", &kv, true, &dkv));
  OT_TRY(check_operand(op, "dv", ctx, dv, qv.ndim, qv.dtype, "q", "v", &vv, true, &dvv));
  const char *in_names[] = {"q", "k", "v", "out", "dout", "lse"};
  const ot_view *ins[] = {&qv, &kv, &vv, &ov, &dov, &lv};
  const char *out_names[] = {"dq", "dk", "dv"};
  const ot_view *outs[] = {&dqv, &dkv, &dvv};
  for (int o = 0; o < 3; o++) {
    for (int i = 0; i < 6; i++)
      OT_TRY(ot_check_no_overlap(op, out_names[o], outs[o], in_names[i], ins[i], false));
    for (int j = 0; j < o; j++)
      OT_TRY(ot_check_no_overlap(op, out_names[o], outs[o], out_names[j], outs[j], false));
  }
  a.out = operand(&ov, varlen);
  a.dout = operand(&dov, varlen);
  a.lse = lse_operand(&lv, varlen);
  a.dq = operand(&dqv, varlen);
  a.dk = operand(&dkv, varlen);
  a.dv = operand(&dvv, varlen);
  a.deterministic = params->deterministic != 0;
  if (ot_ctx_is_cuda(ctx)) return OT_CUDA_CALL(op, ot_cuda_attention_backward, ctx, &a);
  return ot_cpu_attention_backward(ctx, &a);
}
