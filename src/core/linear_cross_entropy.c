/* linear_cross_entropy.c -- ot_linear_cross_entropy: validation and dispatch. */
#include <inttypes.h>

#include "backend.h"
#include "linear_cross_entropy.h"

ot_linear_cross_entropy_params ot_linear_cross_entropy_default_params(void) {
  ot_linear_cross_entropy_params p;
  p.ce = ot_cross_entropy_default_params();
  p.chunk_tokens = 0;
  return p;
}

static ot_status check_params(const char *op, const ot_linear_cross_entropy_params *p) {
  OT_TRY(ot_cross_entropy_check_params(op, "params.ce", &p->ce));
  if (p->chunk_tokens < 0)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "params.chunk_tokens: %" PRId64 " is negative (0 = default)",
                    p->chunk_tokens);
  return OT_OK;
}

/* The workspace's sizes without wrapping: one row of logits (V * elem), one chunk's logits
 * (chunk * V * elem, what the GEMM / memset writes) and the per-token arrays (4 T) stay
 * below lim = 2^59 bytes, so the layout's sum fits size_t and int64_t. A zero-size weight
 * [V, 0] holds no memory, so V is not bounded by the tensors themselves. */
static ot_status check_sizes(const char *op, const char *t_name, int64_t T, const char *v_name,
                             int64_t V, size_t es, int64_t chunk_tokens) {
  const int64_t lim = (int64_t)1 << 59;
  if (V > lim / (int64_t)es)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: vocabulary V = %" PRId64 " is too large (a row of logits would be "
                    "%" PRId64 " x %zu bytes)",
                    v_name, V, V, es);
  if (T > lim / 4)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: %" PRId64 " tokens is too many", t_name,
                    T);
  const int64_t chunk = ot_lce_chunk(chunk_tokens, T, V, es);
  if (V > 0 && chunk > lim / (V * (int64_t)es))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "params.chunk_tokens: a chunk of %" PRId64 " tokens x V = %" PRId64
                    " logits does not fit the address space (choose fewer tokens per chunk)",
                    chunk, V);
  return OT_OK;
}

ot_status ot_linear_cross_entropy_workspace_size(const ot_linear_cross_entropy_params *params,
                                                 int64_t tokens, int64_t hidden_size,
                                                 int64_t vocab_size, DLDataType dtype,
                                                 size_t *bytes) {
  static const char op[] = "ot_linear_cross_entropy_workspace_size";
  ot_linear_cross_entropy_params p = params ? *params : ot_linear_cross_entropy_default_params();
  OT_TRY(check_params(op, &p));
  if (!bytes) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "bytes: is NULL");
  if (tokens < 0 || hidden_size < 0 || vocab_size < 0)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "tokens, hidden_size, vocab_size: %" PRId64 ", %" PRId64 ", %" PRId64
                    " (each must be >= 0)",
                    tokens, hidden_size, vocab_size);
  ot_dtype d = ot_dtype_from_dl(dtype);
  if (!ot_dtype_is_float(d))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "dtype: %s is not a storage dtype (float32, float16, bfloat16)",
                    ot_dl_dtype_name(dtype));
  size_t es = ot_dtype_size(d);
  OT_TRY(check_sizes(op, "tokens", tokens, "vocab_size", vocab_size, es, p.chunk_tokens));
  *bytes = ot_lce_layout_of(tokens, vocab_size, ot_lce_chunk(p.chunk_tokens, tokens, vocab_size, es),
                            es)
               .total;
  return OT_OK;
}

/* Every label in [0, V) or ignore_index; counts the others (host labels: CPU only). */
ot_status ot_linear_cross_entropy(ot_context *ctx, const ot_linear_cross_entropy_params *params,
                                  const DLTensor *hidden, const DLTensor *weight,
                                  const DLTensor *labels, const DLTensor *loss,
                                  const DLTensor *dhidden, const DLTensor *dweight,
                                  const DLTensor *workspace) {
  static const char op[] = "ot_linear_cross_entropy";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  ot_linear_cross_entropy_params p = params ? *params : ot_linear_cross_entropy_default_params();
  OT_TRY(check_params(op, &p));
  ot_view hv, wv, yv, lv, dhv, dwv, wsv;
  ot_rows hr, dhr = {0, 0, 0};
  OT_TRY(ot_view_of(op, "hidden", ctx, hidden, &hv));
  OT_TRY(ot_check_float(op, "hidden", &hv));
  OT_TRY(ot_check_ndim(op, "hidden", &hv, 2, 2));
  OT_TRY(ot_as_rows(op, "hidden", &hv, &hr));
  const int64_t T = hr.rows, H = hr.cols;
  OT_TRY(ot_view_of(op, "weight", ctx, weight, &wv));
  OT_TRY(ot_check_dtype(op, "weight", &wv, hv.dtype, "hidden"));
  OT_TRY(ot_check_ndim(op, "weight", &wv, 2, 2));
  OT_TRY(ot_check_dim(op, "weight", &wv, 1, H, "H, the last dimension of hidden"));
  OT_TRY(ot_check_contiguous(op, "weight", &wv));
  const int64_t V = wv.shape[0];
  if (T > 0 && V < 1)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "weight: shape [0, %" PRId64 "]: the vocabulary V must be >= 1", H);
  OT_TRY(ot_view_of(op, "labels", ctx, labels, &yv));
  OT_TRY(ot_check_index_dtype(op, "labels", &yv));
  OT_TRY(ot_check_ndim(op, "labels", &yv, 1, 1));
  OT_TRY(ot_check_dim(op, "labels", &yv, 0, T, "T, the rows of hidden"));

  const ot_reduction red = p.ce.reduction;
  OT_TRY(ot_view_of(op, "loss", ctx, loss, &lv));
  OT_TRY(ot_check_dtype(op, "loss", &lv, OT_F32, NULL));
  int64_t loss_stride = 0;
  if (red == OT_REDUCTION_NONE) {
    OT_TRY(ot_check_ndim(op, "loss", &lv, 1, 1));
    OT_TRY(ot_check_dim(op, "loss", &lv, 0, T, "T, one loss per token with reduction NONE"));
    loss_stride = lv.stride[0];
  } else if (!(lv.ndim == 0 || (lv.ndim == 1 && lv.shape[0] == 1))) {
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "loss: expected shape [] or [1] for reduction %s, got %d dimension(s) and "
                    "%" PRId64 " element(s)",
                    red == OT_REDUCTION_MEAN ? "MEAN" : "SUM", lv.ndim, lv.numel);
  }

  OT_TRY(ot_view_of_optional(op, "dhidden", ctx, dhidden, &dhv));
  OT_TRY(ot_view_of_optional(op, "dweight", ctx, dweight, &dwv));
  if (red == OT_REDUCTION_NONE && (ot_view_present(&dhv) || ot_view_present(&dwv)))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: gradients need reduction MEAN or SUM (with NONE pass NULL)",
                    ot_view_present(&dhv) ? "dhidden" : "dweight");
  if (ot_view_present(&dhv)) {
    OT_TRY(ot_check_dtype(op, "dhidden", &dhv, hv.dtype, "hidden"));
    OT_TRY(ot_check_same_shape(op, "dhidden", &dhv, "hidden", &hv));
    OT_TRY(ot_as_rows(op, "dhidden", &dhv, &dhr));
  }
  if (ot_view_present(&dwv)) {
    if (dwv.dtype != OT_F32) OT_TRY(ot_check_dtype(op, "dweight", &dwv, hv.dtype, "hidden"));
    OT_TRY(ot_check_same_shape(op, "dweight", &dwv, "weight", &wv));
    OT_TRY(ot_check_contiguous(op, "dweight", &dwv));
  }
  const size_t es = ot_dtype_size(hv.dtype);
  OT_TRY(check_sizes(op, "hidden", T, "weight", V, es, p.chunk_tokens));
  const int64_t chunk = ot_lce_chunk(p.chunk_tokens, T, V, es);
  const ot_lce_layout lay = ot_lce_layout_of(T, V, chunk, es);
  OT_TRY(ot_view_of_optional(op, "workspace", ctx, workspace, &wsv));
  if (ot_view_present(&wsv)) {
    OT_TRY(ot_check_contiguous(op, "workspace", &wsv));
    size_t have = (size_t)wsv.numel * ot_dtype_size(wsv.dtype);
    if (have < lay.total)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "workspace: %zu bytes, need %zu (ot_linear_cross_entropy_workspace_size)",
                      have, lay.total);
    if (((uintptr_t)wsv.data & 15u) != 0)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op, "workspace: not aligned to 16 bytes");
  }

  /* No output may touch an input or another output. */
  const char *in_names[4] = {"hidden", "weight", "labels", "workspace"};
  const ot_view *ins[4] = {&hv, &wv, &yv, &wsv};
  const char *out_names[4] = {"loss", "dhidden", "dweight", "workspace"};
  const ot_view *outs[4] = {&lv, &dhv, &dwv, &wsv};
  for (int o = 0; o < 4; o++) {
    for (int i = 0; i < 3; i++)
      OT_TRY(ot_check_no_overlap(op, out_names[o], outs[o], in_names[i], ins[i], false));
    for (int q = 0; q < o; q++)
      OT_TRY(ot_check_no_overlap(op, out_names[o], outs[o], out_names[q], outs[q], false));
  }

  ot_lce_args a;
  memset(&a, 0, sizeof a);
  a.dtype = hv.dtype;
  a.T = T;
  a.H = H;
  a.V = V;
  a.chunk = chunk;
  a.hidden = hv.data;
  a.hidden_stride = hr.row_stride;
  a.weight = wv.data;
  a.labels = yv.data;
  a.labels_dtype = yv.dtype;
  a.labels_stride = yv.stride[0];
  a.ignore_index = p.ce.ignore_index;
  a.label_smoothing = p.ce.label_smoothing;
  a.reduction = red;
  a.loss = (float *)lv.data;
  a.loss_stride = loss_stride;
  a.dhidden = ot_view_present(&dhv) ? dhv.data : NULL;
  a.dhidden_stride = dhr.row_stride;
  a.dweight = ot_view_present(&dwv) ? dwv.data : NULL;
  a.dweight_dtype = ot_view_present(&dwv) ? dwv.dtype : hv.dtype;
  a.workspace = ot_view_present(&wsv) ? wsv.data : NULL;
  if (ot_ctx_is_cuda(ctx)) {
    a.count = -1;
    return OT_CUDA_CALL(op, ot_cuda_linear_cross_entropy, ctx, &a);
  }
  OT_TRY(ot_cross_entropy_check_labels(op, &yv, V, p.ce.ignore_index, "token", &a.count));
  return ot_cpu_linear_cross_entropy(ctx, &a);
}
