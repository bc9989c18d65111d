/*
 * attention.h -- private argument structs and backend entry points of the attention
 * family (ot_attention_forward / ot_attention_backward).
 *
 * Dense (BSHD) and packed varlen (THD) inputs are both described as B sequences:
 * token i of sequence b, head h of tensor X starts at element
 *     b * X.batch_stride + (X_start(b) + i) * X.tok_stride + h * X.head_stride
 * where X_start(b) is 0 for dense inputs (batch_stride is the B stride) and
 * cu_seqlens[b] for varlen ones (batch_stride 0). lse uses the same scheme with its own
 * strides (dense [B, Hq, Sq], varlen [Hq, Tq]).
 */
#ifndef OT_CORE_ATTENTION_H
#define OT_CORE_ATTENTION_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One [.., S, H, D] operand: base pointer and element strides. */
typedef struct ot_attn_operand {
  void *data;               /* NULL when absent (lse in a forward without backward) */
  int64_t batch_stride;     /* dense only; 0 for varlen */
  int64_t tok_stride;
  int64_t head_stride;
} ot_attn_operand;

typedef struct ot_attention_args {
  ot_dtype dtype;           /* storage of q, k, v, out (and dout, dq, dk, dv) */
  int64_t batch;            /* B (dense) or number of sequences (varlen) */
  int64_t hq, hkv, d;       /* query heads, kv heads, head_dim */
  int64_t sq, sk;           /* dense sequence lengths; unused for varlen */
  const int32_t *cu_q;      /* varlen: int32 [batch + 1] in the context's memory (device
                             * memory on CUDA); NULL for dense */
  const int32_t *cu_k;
  int64_t tq, tk;           /* varlen: tokens of q and of k (rows of the THD tensors), the
                             * bounds the CUDA kernels check cu_seqlens against; 0 for dense */
  float scale;              /* resolved: never 0 */
  float softcap;            /* 0: off */
  int64_t window_left;      /* resolved: -1 unbounded, else >= 0 */
  int64_t window_right;     /* resolved with causal: -1 unbounded, else >= 0 */
  ot_attn_operand q, k, v, out;
  ot_attn_operand lse;      /* float32 */
  /* backward only */
  ot_attn_operand dout, dq, dk, dv;
  int deterministic;        /* params.deterministic: bitwise repeatable dq (no atomics) */
} ot_attention_args;

/* Sequence b's token offsets and lengths. */
static inline void ot_attn_seq(const ot_attention_args *a, int64_t b, int64_t *q0, int64_t *sq,
                               int64_t *k0, int64_t *sk) {
  if (a->cu_q) {
    *q0 = a->cu_q[b];
    *sq = (int64_t)a->cu_q[b + 1] - a->cu_q[b];
    *k0 = a->cu_k[b];
    *sk = (int64_t)a->cu_k[b + 1] - a->cu_k[b];
  } else {
    *q0 = 0;
    *sq = a->sq;
    *k0 = 0;
    *sk = a->sk;
  }
}

/* Visible keys of query row i (sequence frame): [*lo, *hi], empty when *lo > *hi. */
static inline void ot_attn_key_range(const ot_attention_args *a, int64_t i, int64_t sq,
                                     int64_t sk, int64_t *lo, int64_t *hi) {
  int64_t diag = i + (sk - sq);
  int64_t l = a->window_left < 0 ? 0 : diag - a->window_left;
  int64_t h = a->window_right < 0 ? sk - 1 : diag + a->window_right;
  *lo = l < 0 ? 0 : l;
  *hi = h > sk - 1 ? sk - 1 : h;
}

/* The parameter checks and the resolution of defaults (scale 0 -> 1/sqrt(D); causal ->
 * window_right 0; negative windows -> -1) shared by the dense and the paged attention. */
ot_status ot_attention_check_params(const char *op, const ot_attention_params *p);
void ot_attention_resolve_params(const ot_attention_params *p, int64_t head_dim, float *scale,
                                 float *softcap, int64_t *window_left, int64_t *window_right);

ot_status ot_cpu_attention_forward(ot_context *ctx, const ot_attention_args *a);
ot_status ot_cpu_attention_backward(ot_context *ctx, const ot_attention_args *a);
ot_status ot_cuda_attention_forward(ot_context *ctx, const ot_attention_args *a);
ot_status ot_cuda_attention_backward(ot_context *ctx, const ot_attention_args *a);

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_ATTENTION_H */
