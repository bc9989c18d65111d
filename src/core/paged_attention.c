/* paged_attention.c -- validation and dispatch of ot_kv_append and ot_paged_attention. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention.h"
#include "backend.h"
#include "paged_attention.h"

/* A contiguous int32 vector of the page table, its length (shape[0]) in *n. */
static ot_status check_i32_vec(const char *op, const char *name, const ot_context *ctx,
                               const DLTensor *t, ot_view *v) {
  OT_TRY(ot_view_of(op, name, ctx, t, v));
  OT_TRY(ot_check_dtype(op, name, v, OT_I32, NULL));
  OT_TRY(ot_check_ndim(op, name, v, 1, 1));
  return ot_check_contiguous(op, name, v);
}

/* The pages and the page table; on the CPU also every value of the table. */
static ot_status check_paged(const char *op, const ot_context *ctx, const ot_paged_kv *kv,
                             ot_view *kp, ot_view *vp, ot_paged_table *t) {
  memset(t, 0, sizeof *t);
  if (!kv) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "kv: is NULL");
  OT_TRY(ot_view_of(op, "kv.k_pages", ctx, kv->k_pages, kp));
  OT_TRY(ot_check_float(op, "kv.k_pages", kp));
  OT_TRY(ot_check_ndim(op, "kv.k_pages", kp, 4, 4));
  OT_TRY(ot_check_contiguous(op, "kv.k_pages", kp));
  for (int i = 0; i < 4; i++)
    if (kp->shape[i] < 1)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "kv.k_pages: shape[%d] is 0, expected [num_pages, heads_kv, block_size, "
                      "head_dim] all >= 1",
                      i);
  OT_TRY(ot_view_of(op, "kv.v_pages", ctx, kv->v_pages, vp));
  OT_TRY(ot_check_dtype(op, "kv.v_pages", vp, kp->dtype, "kv.k_pages"));
  OT_TRY(ot_check_same_shape(op, "kv.v_pages", vp, "kv.k_pages", kp));
  OT_TRY(ot_check_contiguous(op, "kv.v_pages", vp));
  OT_TRY(ot_check_no_overlap(op, "kv.v_pages", vp, "kv.k_pages", kp, false));
  if (kp->shape[0] > INT32_MAX)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "kv.k_pages: %" PRId64 " pages, more than int32 page ids address",
                    kp->shape[0]);
  ot_view ip, ix, lp;
  OT_TRY(check_i32_vec(op, "kv.indptr", ctx, kv->indptr, &ip));
  if (ip.shape[0] < 1)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "kv.indptr: has 0 entries, expected batch + 1");
  OT_TRY(check_i32_vec(op, "kv.indices", ctx, kv->indices, &ix));
  OT_TRY(check_i32_vec(op, "kv.last_page_len", ctx, kv->last_page_len, &lp));
  int64_t batch = ip.shape[0] - 1;
  OT_TRY(ot_check_dim(op, "kv.last_page_len", &lp, 0, batch, "batch, from kv.indptr [batch + 1]"));
  t->k_pages = kp->data;
  t->v_pages = vp->data;
  t->num_pages = kp->shape[0];
  t->hkv = kp->shape[1];
  t->bs = kp->shape[2];
  t->d = kp->shape[3];
  t->batch = batch;
  t->num_indices = ix.shape[0];
  t->indptr = (const int32_t *)ip.data;
  t->indices = (const int32_t *)ix.data;
  t->last_page_len = (const int32_t *)lp.data;
  /* On CUDA the tables live on the device; the kernels trust them (OT_DEBUG checks there
   * are the CUDA backend's job). */
  if (ot_ctx_is_cuda(ctx)) return OT_OK;
  if (t->indptr[0] != 0)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "kv.indptr: indptr[0] = %" PRId32 ", expected 0",
                    t->indptr[0]);
  for (int64_t b = 0; b < batch; b++) {
    int32_t lo = t->indptr[b], hi = t->indptr[b + 1];
    if (hi < lo)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "kv.indptr: indptr[%" PRId64 "] = %" PRId32 " is less than indptr[%" PRId64
                      "] = %" PRId32 " (must not decrease)",
                      b + 1, hi, b, lo);
    if (hi > ix.shape[0])
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "kv.indptr: indptr[%" PRId64 "] = %" PRId32
                      " exceeds the %" PRId64 " entries of kv.indices",
                      b + 1, hi, ix.shape[0]);
    int32_t l = t->last_page_len[b];
    if (hi == lo ? l != 0 : (l < 1 || l > t->bs))
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "kv.last_page_len: last_page_len[%" PRId64 "] = %" PRId32
                      ", expected %s (sequence %" PRId64 " has %" PRId32 " pages)",
                      b, l, hi == lo ? "0" : "1 .. block_size", b, hi - lo);
    for (int32_t j = lo; j < hi; j++)
      if (t->indices[j] < 0 || t->indices[j] >= t->num_pages)
        return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                        "kv.indices: indices[%" PRId32 "] = %" PRId32 ", expected 0 .. %" PRId64
                        " (num_pages of kv.k_pages)",
                        j, t->indices[j], t->num_pages - 1);
  }
  return OT_OK;
}

/* cu_seqlens int32 [batch + 1] from 0 to `total`, non-decreasing (values checked on the
 * host backend only). */
static ot_status check_cu(const char *op, const char *name, const ot_context *ctx,
                          const DLTensor *t, int64_t batch, int64_t total, const char *total_name,
                          ot_view *v) {
  OT_TRY(check_i32_vec(op, name, ctx, t, v));
  OT_TRY(ot_check_dim(op, name, v, 0, batch + 1, "batch + 1, from kv.indptr"));
  if (ot_ctx_is_cuda(ctx)) return OT_OK;
  const int32_t *c = (const int32_t *)v->data;
  if (c[0] != 0)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: %s[0] = %" PRId32 ", expected 0", name,
                    name, c[0]);
  for (int64_t i = 1; i <= batch; i++)
    if (c[i] < c[i - 1])
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "%s: %s[%" PRId64 "] = %" PRId32 " is less than %s[%" PRId64 "] = %" PRId32
                      " (must not decrease)",
                      name, name, i, c[i], name, i - 1, c[i - 1]);
  if (c[batch] != total)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: %s[%" PRId64 "] = %" PRId32
                    ", expected %" PRId64 " (%s)", name, name, batch, c[batch], total, total_name);
  return OT_OK;
}

/* [T, heads, d] token-major operand of the pages' dtype and head_dim. */
static ot_status check_tokens(const char *op, const char *name, const ot_context *ctx,
                              const DLTensor *t, ot_dtype dt, int64_t d, ot_view *v) {
  OT_TRY(ot_view_of(op, name, ctx, t, v));
  OT_TRY(ot_check_dtype(op, name, v, dt, "kv.k_pages"));
  OT_TRY(ot_check_ndim(op, name, v, 3, 3));
  OT_TRY(ot_check_dim(op, name, v, 2, d, "head_dim of kv.k_pages"));
  return ot_check_last_contiguous(op, name, v);
}

/* ---- ot_kv_append --------------------------------------------------------------------- */

/* The arguments both backends take: table, cu_seqlens_new, k_new / v_new rows. */
static void append_args_init(ot_kv_append_args *a, ot_dtype dt, const ot_paged_table *t,
                             const int32_t *cu, const ot_view *kn, const ot_view *vn) {
  memset(a, 0, sizeof *a);
  a->dtype = dt;
  a->kv = *t;
  a->cu_new = cu;
  a->tokens = kn->shape[0];
  a->k_new = kn->data;
  a->k_tok_stride = kn->stride[0];
  a->k_head_stride = kn->stride[1];
  a->v_new = vn->data;
  a->v_tok_stride = vn->stride[0];
  a->v_head_stride = vn->stride[1];
}

/* ot_rope_forward's failure re-reported under the calling op ("ot_kv_append: rope: ..."). */
static ot_status rope_failed(ot_status st, const char *op) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", ot_last_error());
  return ot_error(st, op, "rope: %s", msg);
}

/* The CUDA path: RoPE and the scatter in one kernel. The rope parameters are validated
 * by ot_rope_forward itself on zero-token views of the same tensors (its checks, its
 * messages), then handed to the kernel as an ot_rope_args. */
static ot_status kv_append_cuda(const char *op, ot_context *ctx, const ot_paged_kv *kv,
                                const ot_paged_table *t, ot_dtype dt, const int32_t *cu,
                                const ot_view *kn, const ot_view *vn, const ot_rope_params *rope,
                                const ot_view *pv, const ot_view *qv, const ot_view *qo,
                                const ot_view *ko) {
  ot_kv_append_args a;
  append_args_init(&a, dt, t, cu, kn, vn);
  ot_rope_args ra;
  memset(&ra, 0, sizeof ra);
  if (rope) {
    DLDataType edt = kv->k_pages->dtype;
    int64_t ksh[3] = {0, t->hkv, t->d}, qsh[3] = {0, ot_view_present(qv) ? qv->shape[1] : 1, t->d};
    int64_t psh[1] = {0};
    DLTensor k0 = {kn->data, ctx->device, 3, edt, ksh, NULL, 0};
    DLTensor kr0 = {t->k_pages, ctx->device, 3, edt, ksh, NULL, 0};
    DLTensor q0 = {ot_view_present(qv) ? qv->data : NULL, ctx->device, 3, edt, qsh, NULL, 0};
    DLTensor qo0 = {ot_view_present(qo) ? qo->data : NULL, ctx->device, 3, edt, qsh, NULL, 0};
    DLTensor p0 = {kn->data, ctx->device, 1, {kDLInt, 64, 1}, psh, NULL, 0};
    ot_status st = ot_view_present(qv) ? ot_rope_forward(ctx, rope, &q0, &k0, &p0, NULL, &qo0, &kr0)
                                       : ot_rope_forward(ctx, rope, &k0, NULL, &p0, NULL, &kr0, NULL);
    if (st != OT_OK) return rope_failed(st, op);
    ra.op = op;
    ra.dtype = dt;
    ra.mode = rope->mode;
    ra.head_dim = t->d;
    ra.rotary_dim = rope->rotary_dim ? rope->rotary_dim : t->d;
    ra.theta = rope->theta;
    ra.llama3_factor = rope->llama3_factor > 0 ? rope->llama3_factor : 0.0;
    ra.llama3_low_freq_factor = rope->llama3_low_freq_factor;
    ra.llama3_high_freq_factor = rope->llama3_high_freq_factor;
    ra.llama3_original_max_position = rope->llama3_original_max_position;
    a.rope = &ra;
    if (ot_view_present(qv)) {
      a.hq = qv->shape[1];
      a.q = qv->data;
      a.q_tok_stride = qv->stride[0];
      a.q_head_stride = qv->stride[1];
      a.q_out = qo->data;
      a.qo_tok_stride = qo->stride[0];
      a.qo_head_stride = qo->stride[1];
    }
    if (ot_view_present(pv)) {
      a.positions = pv->data;
      a.pos_dtype = pv->dtype;
      a.pos_stride = pv->stride[0];
    }
    if (ot_view_present(ko)) {
      a.k_out = ko->data;
      a.ko_tok_stride = ko->stride[0];
      a.ko_head_stride = ko->stride[1];
    }
  }
  if (a.tokens == 0) return OT_OK;
  return OT_CUDA_CALL(op, ot_cuda_kv_append, ctx, &a);
}

/* ot_kv_append and ot_rope_kv_append (k_out; op names the caller in every message). */
static ot_status kv_append_impl(const char *op, ot_context *ctx, const ot_paged_kv *kv,
                                const DLTensor *cu_seqlens_new, const DLTensor *k_new,
                                const DLTensor *v_new, const ot_rope_params *rope,
                                const DLTensor *positions, const DLTensor *q,
                                const DLTensor *q_out, const DLTensor *k_out) {
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  ot_view kp, vp, cu, kn, vn, pv, qv, qo, ko;
  ot_paged_table t;
  OT_TRY(check_paged(op, ctx, kv, &kp, &vp, &t));
  OT_TRY(check_tokens(op, "k_new", ctx, k_new, kp.dtype, t.d, &kn));
  OT_TRY(ot_check_dim(op, "k_new", &kn, 1, t.hkv, "heads_kv of kv.k_pages"));
  OT_TRY(check_tokens(op, "v_new", ctx, v_new, kp.dtype, t.d, &vn));
  OT_TRY(ot_check_same_shape(op, "v_new", &vn, "k_new", &kn));
  const int64_t tokens = kn.shape[0];
  OT_TRY(check_cu(op, "cu_seqlens_new", ctx, cu_seqlens_new, t.batch, tokens,
                  "T_new, the tokens of k_new", &cu));
  const int32_t *c = (const int32_t *)cu.data;
  if (!ot_ctx_is_cuda(ctx))
    for (int64_t b = 0; b < t.batch; b++) {
      int64_t n = (int64_t)c[b + 1] - c[b], len = ot_paged_len(&t, b);
      if (n > len)
        return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                        "cu_seqlens_new: sequence %" PRId64 " appends %" PRId64
                        " tokens but its page table holds only %" PRId64
                        " (reserve the slots first: ot_kv_cache_reserve)",
                        b, n, len);
    }
  OT_TRY(ot_view_of_optional(op, "positions", ctx, positions, &pv));
  OT_TRY(ot_view_of_optional(op, "q", ctx, q, &qv));
  OT_TRY(ot_view_of_optional(op, "q_out", ctx, q_out, &qo));
  OT_TRY(ot_view_of_optional(op, "k_out", ctx, k_out, &ko));
  if (!rope) {
    const char *extra = ot_view_present(&pv) ? "positions" : ot_view_present(&qv) ? "q"
                        : ot_view_present(&qo)                  ? "q_out"
                        : ot_view_present(&ko)                  ? "k_out" : NULL;
    if (extra)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: is given but rope is NULL", extra);
  }
  if (ot_view_present(&qv) != ot_view_present(&qo))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: is NULL but %s is given",
                    ot_view_present(&qv) ? "q_out" : "q", ot_view_present(&qv) ? "q" : "q_out");
  if (ot_view_present(&qv)) {
    OT_TRY(check_tokens(op, "q", ctx, q, kp.dtype, t.d, &qv));
    OT_TRY(ot_check_dim(op, "q", &qv, 0, tokens, "T_new, the tokens of k_new"));
    /* q_out is written through its own strides (CUDA: by the append kernel itself): its
     * dtype, shape and layout are checked here, and it is q itself or shares nothing. */
    OT_TRY(check_tokens(op, "q_out", ctx, q_out, kp.dtype, t.d, &qo));
    OT_TRY(ot_check_same_shape(op, "q_out", &qo, "q", &qv));
    OT_TRY(ot_check_no_overlap(op, "q_out", &qo, "q", &qv, true));
    const char *others[] = {"k_new", "v_new", "cu_seqlens_new", "positions"};
    const ot_view *ov[] = {&kn, &vn, &cu, &pv};
    for (int i = 0; i < 4; i++) OT_TRY(ot_check_no_overlap(op, "q_out", &qo, others[i], ov[i], false));
  }
  if (ot_view_present(&ko)) {
    /* the rotated k rows, written through k_out's own strides: k_new itself or apart */
    OT_TRY(check_tokens(op, "k_out", ctx, k_out, kp.dtype, t.d, &ko));
    OT_TRY(ot_check_same_shape(op, "k_out", &ko, "k_new", &kn));
    OT_TRY(ot_check_no_overlap(op, "k_out", &ko, "k_new", &kn, true));
    const char *others[] = {"v_new", "cu_seqlens_new", "positions", "q", "q_out"};
    const ot_view *ov[] = {&vn, &cu, &pv, &qv, &qo};
    for (int i = 0; i < 5; i++) OT_TRY(ot_check_no_overlap(op, "k_out", &ko, others[i], ov[i], false));
  }
  if (ot_view_present(&pv)) {
    OT_TRY(ot_check_index_dtype(op, "positions", &pv));
    OT_TRY(ot_check_ndim(op, "positions", &pv, 1, 1));
    OT_TRY(ot_check_dim(op, "positions", &pv, 0, tokens, "T_new, the tokens of k_new"));
  }
  /* The pages are the outputs: they must not share memory with any input. */
  const char *in_names[] = {"k_new", "v_new", "cu_seqlens_new", "positions", "q", "q_out", "k_out"};
  const ot_view *ins[] = {&kn, &vn, &cu, &pv, &qv, &qo, &ko};
  for (int i = 0; i < 7; i++) {
    OT_TRY(ot_check_no_overlap(op, "kv.k_pages", &kp, in_names[i], ins[i], false));
    OT_TRY(ot_check_no_overlap(op, "kv.v_pages", &vp, in_names[i], ins[i], false));
  }
  if (ot_ctx_is_cuda(ctx))
    return kv_append_cuda(op, ctx, kv, &t, kp.dtype, c, &kn, &vn, rope, &pv, &qv, &qo, &ko);

  ot_kv_append_args a;
  append_args_init(&a, kp.dtype, &t, c, &kn, &vn);
  if (!rope || tokens == 0) return ot_cpu_kv_append(ctx, &a);

  /* RoPE through ot_rope_forward itself (its validation, its kernel): k_new is rotated
   * into k_out or else a contiguous scratch [T_new, hkv, d], which is then scattered; q
   * into q_out. */
  size_t esz = ot_dtype_size(kp.dtype);
  const bool has_ko = ot_view_present(&ko);
  void *k_rot = has_ko ? NULL : malloc((size_t)(tokens * t.hkv * t.d) * esz);
  int64_t *pos = ot_view_present(&pv) ? NULL : (int64_t *)malloc((size_t)tokens * sizeof *pos);
  if ((!has_ko && !k_rot) || (!ot_view_present(&pv) && !pos)) {
    free(k_rot), free(pos);
    return ot_error(OT_ERR_OOM, op, "cannot allocate %" PRId64 " rotated key rows", tokens);
  }
  if (pos)
    for (int64_t b = 0; b < t.batch; b++) {
      int64_t len = ot_paged_len(&t, b), n = (int64_t)c[b + 1] - c[b];
      for (int64_t i = 0; i < n; i++) pos[c[b] + i] = len - n + i;
    }
  int64_t rot_shape[3] = {tokens, t.hkv, t.d}, pos_shape[1] = {tokens};
  DLTensor rot_t = {k_rot, ctx->device, 3, kv->k_pages->dtype, rot_shape, NULL, 0};
  DLTensor pos_t = {pos, ctx->device, 1, {kDLInt, 64, 1}, pos_shape, NULL, 0};
  const DLTensor *pos_arg = pos ? &pos_t : positions, *rot = has_ko ? k_out : &rot_t;
  ot_status st = q ? ot_rope_forward(ctx, rope, q, k_new, pos_arg, NULL, q_out, rot)
                   : ot_rope_forward(ctx, rope, k_new, NULL, pos_arg, NULL, rot, NULL);
  if (st != OT_OK) {
    free(k_rot), free(pos);
    return rope_failed(st, op);
  }
  a.k_new = has_ko ? ko.data : k_rot;
  a.k_tok_stride = has_ko ? ko.stride[0] : t.hkv * t.d;
  a.k_head_stride = has_ko ? ko.stride[1] : t.d;
  st = ot_cpu_kv_append(ctx, &a);
  free(k_rot), free(pos);
  return st;
}

ot_status ot_kv_append(ot_context *ctx, const ot_paged_kv *kv, const DLTensor *cu_seqlens_new,
                       const DLTensor *k_new, const DLTensor *v_new, const ot_rope_params *rope,
                       const DLTensor *positions, const DLTensor *q, const DLTensor *q_out) {
  return kv_append_impl("ot_kv_append", ctx, kv, cu_seqlens_new, k_new, v_new, rope, positions,
                        q, q_out, NULL);
}

ot_status ot_rope_kv_append(ot_context *ctx, const ot_rope_params *rope, const ot_paged_kv *kv,
                            const DLTensor *cu_seqlens_new, const DLTensor *k_new,
                            const DLTensor *v_new, const DLTensor *positions, const DLTensor *q,
                            const DLTensor *q_out, const DLTensor *k_out) {
  static const char *op = "ot_rope_kv_append";
  if (!rope) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "rope: is NULL (without RoPE: ot_kv_append)");
  return kv_append_impl(op, ctx, kv, cu_seqlens_new, k_new, v_new, rope, positions, q, q_out,
                        k_out);
}

/* ---- ot_paged_attention ------------------------------------------------------------------ */

ot_status ot_paged_attention(ot_context *ctx, const ot_attention_params *p, const DLTensor *q,
                             const DLTensor *cu_seqlens_q, const ot_paged_kv *kv,
                             const DLTensor *out, const DLTensor *lse) {
  static const char *op = "ot_paged_attention";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  OT_TRY(ot_attention_check_params(op, p));
  ot_view kp, vp, qv, cu, ov, lv;
  ot_paged_table t;
  OT_TRY(check_paged(op, ctx, kv, &kp, &vp, &t));
  OT_TRY(check_tokens(op, "q", ctx, q, kp.dtype, t.d, &qv));
  const int64_t hq = qv.shape[1], tokens = qv.shape[0];
  if (hq < 1 || hq % t.hkv != 0)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "q: %" PRId64 " query heads, expected a positive multiple of the %" PRId64
                    " kv heads of kv.k_pages (GQA)",
                    hq, t.hkv);
  OT_TRY(check_cu(op, "cu_seqlens_q", ctx, cu_seqlens_q, t.batch, tokens, "T_q, the tokens of q",
                  &cu));
  OT_TRY(ot_view_of(op, "out", ctx, out, &ov));
  OT_TRY(ot_check_dtype(op, "out", &ov, qv.dtype, "q"));
  OT_TRY(ot_check_same_shape(op, "out", &ov, "q", &qv));
  OT_TRY(ot_check_last_contiguous(op, "out", &ov));
  OT_TRY(ot_check_no_self_overlap(op, "out", &ov));
  const char *in_names[] = {"q", "kv.k_pages", "kv.v_pages", "cu_seqlens_q"};
  const ot_view *ins[] = {&qv, &kp, &vp, &cu};
  for (int i = 0; i < 4; i++) OT_TRY(ot_check_no_overlap(op, "out", &ov, in_names[i], ins[i], false));
  OT_TRY(ot_view_of_optional(op, "lse", ctx, lse, &lv));
  if (ot_view_present(&lv)) {
    OT_TRY(ot_check_dtype(op, "lse", &lv, OT_F32, NULL));
    OT_TRY(ot_check_ndim(op, "lse", &lv, 2, 2));
    OT_TRY(ot_check_dim(op, "lse", &lv, 0, hq, "heads_q, lse is [heads_q, T_q]"));
    OT_TRY(ot_check_dim(op, "lse", &lv, 1, tokens, "T_q, lse is [heads_q, T_q]"));
    OT_TRY(ot_check_last_contiguous(op, "lse", &lv));
    OT_TRY(ot_check_no_self_overlap(op, "lse", &lv));
    for (int i = 0; i < 4; i++)
      OT_TRY(ot_check_no_overlap(op, "lse", &lv, in_names[i], ins[i], false));
    OT_TRY(ot_check_no_overlap(op, "lse", &lv, "out", &ov, false));
  }
  ot_paged_attention_args a;
  memset(&a, 0, sizeof a);
  a.dtype = qv.dtype;
  a.kv = t;
  a.hq = hq;
  a.cu_q = (const int32_t *)cu.data;
  a.q = qv.data;
  a.q_tok_stride = qv.stride[0];
  a.q_head_stride = qv.stride[1];
  a.out = ov.data;
  a.out_tok_stride = ov.stride[0];
  a.out_head_stride = ov.stride[1];
  if (ot_view_present(&lv)) {
    a.lse = (float *)lv.data;
    a.lse_head_stride = lv.stride[0];
    a.lse_tok_stride = lv.stride[1];
  }
  ot_attention_resolve_params(p, t.d, &a.scale, &a.softcap, &a.window_left, &a.window_right);
  a.tokens = tokens;
  a.kv_ready = p->paged_kv_ready != 0;
  if (ot_ctx_is_cuda(ctx)) return OT_CUDA_CALL(op, ot_cuda_paged_attention, ctx, &a);
  return ot_cpu_paged_attention(ctx, &a);
}
