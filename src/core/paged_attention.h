/*
 * paged_attention.h -- private argument structs and backend entry points of the paged
 * KV ops: ot_kv_append (scatter new tokens into pages) and ot_paged_attention (decode /
 * chunked prefill through a CSR page table).
 *
 * Element (page p, kv head h, slot s, feature x) of a layer's K (or V) is at
 *     ((p * hkv + h) * block_size + s) * head_dim + x
 * and token t of sequence b lives in page indices[indptr[b] + t / block_size], slot
 * t % block_size.
 */
#ifndef OT_CORE_PAGED_ATTENTION_H
#define OT_CORE_PAGED_ATTENTION_H

#include "internal.h"
#include "rope.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ot_paged_table {
  void *k_pages, *v_pages;  /* contiguous [num_pages, hkv, bs, d] */
  int64_t num_pages, hkv, bs, d;
  int64_t batch;
  int64_t num_indices;      /* entries of indices (CUDA OT_DEBUG bound checks) */
  const int32_t *indptr;    /* [batch + 1]; host pointers on the CPU, device on CUDA */
  const int32_t *indices;
  const int32_t *last_page_len;
} ot_paged_table;

/* Tokens held by sequence b (host tables only). */
static inline int64_t ot_paged_len(const ot_paged_table *t, int64_t b) {
  int64_t np = (int64_t)t->indptr[b + 1] - t->indptr[b];
  return np ? (np - 1) * t->bs + t->last_page_len[b] : 0;
}

/* Element offset of (token tok of sequence b, kv head h, feature 0). */
static inline int64_t ot_paged_offset(const ot_paged_table *t, int64_t b, int64_t tok,
                                      int64_t h) {
  int64_t page = t->indices[t->indptr[b] + tok / t->bs];
  return ((page * t->hkv + h) * t->bs + tok % t->bs) * t->d;
}

typedef struct ot_kv_append_args {
  ot_dtype dtype;
  ot_paged_table kv;
  const int32_t *cu_new;         /* [batch + 1] */
  const void *k_new, *v_new;     /* [T_new, hkv, d] rows with these element strides */
  int64_t k_tok_stride, k_head_stride, v_tok_stride, v_head_stride;
  /* CUDA only (the CPU path rotates through ot_rope_forward first): RoPE fused into
   * the scatter. rope == NULL: no rotation. rope->q / q_out / k / k_out / positions
   * are not used; the fields below say where q, q_out and the positions are. */
  const ot_rope_args *rope;
  int64_t tokens;                /* T_new */
  int64_t hq;                    /* q heads, 0 without q */
  const void *q;
  void *q_out;
  int64_t q_tok_stride, q_head_stride, qo_tok_stride, qo_head_stride;
  const void *positions;         /* [T_new] or NULL: index in the sequence */
  ot_dtype pos_dtype;
  int64_t pos_stride;
  /* CUDA only, with rope (ot_rope_kv_append): the rotated k rows also stored here
   * (k_new itself when in place); NULL: not */
  void *k_out;
  int64_t ko_tok_stride, ko_head_stride;
} ot_kv_append_args;

typedef struct ot_paged_attention_args {
  ot_dtype dtype;
  ot_paged_table kv;
  int64_t hq;                    /* query heads, a multiple of kv.hkv */
  const int32_t *cu_q;           /* [batch + 1] */
  const void *q;                 /* [T_q, hq, d] */
  int64_t q_tok_stride, q_head_stride;
  void *out;                     /* [T_q, hq, d] */
  int64_t out_tok_stride, out_head_stride;
  float *lse;                    /* [hq, T_q] float32 or NULL */
  int64_t lse_head_stride, lse_tok_stride;
  float scale;                   /* resolved, never 0 */
  float softcap;                 /* 0: off */
  int64_t window_left;           /* -1 unbounded */
  int64_t window_right;          /* -1 unbounded; causal resolved to 0 */
  int64_t tokens;                /* T_q */
  int kv_ready;                  /* ot_attention_params.paged_kv_ready */
} ot_paged_attention_args;

ot_status ot_cpu_kv_append(ot_context *ctx, const ot_kv_append_args *a);
ot_status ot_cpu_paged_attention(ot_context *ctx, const ot_paged_attention_args *a);
ot_status ot_cuda_kv_append(ot_context *ctx, const ot_kv_append_args *a);
ot_status ot_cuda_paged_attention(ot_context *ctx, const ot_paged_attention_args *a);

/* The CPU backend's choice of key splits for sequence b of a batch (exposed for tests
 * and for the CUDA planner to mirror): at least 2 x threads tasks of (sequence, kv head,
 * split) when the context allows, never chunks under OT_PAGED_MIN_CHUNK keys. */
#define OT_PAGED_MIN_CHUNK 128
int64_t ot_paged_num_splits(int64_t batch, int64_t hkv, int64_t len, int threads);

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_PAGED_ATTENTION_H */
