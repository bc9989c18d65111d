/*
 * attention_shim.c -- a small C shim that lets bench/bench_attention.py (ctypes) call the
 * library's attention on raw device pointers (torch tensors):
 *   shim_attn_sm90: the Hopper forward kernel directly (ot_cuda_attention_forward_sm90),
 *     with arbitrary element strides, reporting whether it covered the call;
 *   shim_attn_fwd / shim_attn_bwd: the public API (ot_attention_forward / _backward) on
 *     contiguous BSHD tensors, i.e. whatever the CUDA dispatcher picks.
 * Benchmark and check use only: the caller passes consistent shapes. Linked against the
 * static library:
 *   cc -O2 -shared -fPIC bench/attention_shim.c -Iinclude -Isrc -I<dlpack> \
 *      build/libops_transformer.a -lcudart -lcublasLt -lopenblas -lgomp -lm -lstdc++ \
 *      -o libattention_shim.so
 *   shim_attn_fwd_trace: the Hopper forward's per-CTA, per-tile %globaltimer stamps of a
 *     -DOT_FWD_TRACE build (ot_cuda_attn_fwd_trace; -1 in other builds).
 * dtype codes are the core's ot_dtype: 2 float16, 3 bfloat16.
 */
#include <stdbool.h>
#include <string.h>

#include "core/attention.h"
#include "cuda/attention_sm90.h"

#include "shim_common.h"

/* only in a library built with -DOT_FWD_TRACE. Weak and hidden, as in decode_shim.c:
 * resolved from the static library this shim is linked against, NULL where it has none. */
int ot_cuda_attn_fwd_trace(unsigned long long *dst, int clear)
    __attribute__((weak, visibility("hidden")));

/* dst: 1024 x 64 x 4 x 4 u64 (or NULL); -1 when the library has no trace (a normal build) */
SHIM_API int shim_attn_fwd_trace(void *dst, int clear) {
  return ot_cuda_attn_fwd_trace ? ot_cuda_attn_fwd_trace((unsigned long long *)dst, clear) : -1;
}

static ot_attn_operand operand(void *p, const int64_t *st) {
  ot_attn_operand x;
  x.data = p;
  x.batch_stride = st ? st[0] : 0;
  x.tok_stride = st ? st[1] : 0;
  x.head_stride = st ? st[2] : 0;
  return x;
}

/* strides: element strides {batch, token, head} of q, k, v, out; lse {batch, token, head}. */
SHIM_API int shim_attn_sm90(void *stream, int dtype, int64_t b, int64_t hq, int64_t hkv,
                            int64_t d, int64_t sq, int64_t sk, float scale, int64_t wl,
                            int64_t wr, void *q, const int64_t *qs, void *k, const int64_t *ks,
                            void *v, const int64_t *vs, void *out, const int64_t *os, float *lse,
                            const int64_t *ls, int *handled) {
  ot_attention_args a;
  memset(&a, 0, sizeof a);
  a.dtype = (ot_dtype)dtype;
  a.batch = b;
  a.hq = hq;
  a.hkv = hkv;
  a.d = d;
  a.sq = sq;
  a.sk = sk;
  a.scale = scale;
  a.softcap = 0.f;
  a.window_left = wl;
  a.window_right = wr;
  a.q = operand(q, qs);
  a.k = operand(k, ks);
  a.v = operand(v, vs);
  a.out = operand(out, os);
  a.lse = operand(lse, lse ? ls : NULL);
  g_ctx->stream = stream;
  bool h = false;
  ot_status st = ot_cuda_attention_forward_sm90(g_ctx, &a, &h);
  *handled = h;
  return (int)st;
}

static DLTensor tensor(void *p, int dtype, int ndim, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = p;
  t.device.device_type = kDLCUDA;
  t.device.device_id = g_dev;
  t.ndim = ndim;
  t.dtype = shim_dtype(dtype);
  t.shape = shape;
  t.strides = NULL; /* contiguous */
  return t;
}

/* Contiguous [B, S, H, D] q/k/v/out (dout, dq, dk, dv), lse float32 [B, Hq, Sq]. */
SHIM_API int shim_attn_fwd(void *stream, int dtype, int64_t b, int64_t hq, int64_t hkv, int64_t d,
                           int64_t sq, int64_t sk, int causal, void *q, void *k, void *v,
                           void *out, float *lse) {
  int64_t qsh[4] = {b, sq, hq, d}, ksh[4] = {b, sk, hkv, d}, lsh[3] = {b, hq, sq};
  DLTensor tq = tensor(q, dtype, 4, qsh), tk = tensor(k, dtype, 4, ksh),
           tv = tensor(v, dtype, 4, ksh), to = tensor(out, dtype, 4, qsh),
           tl = tensor(lse, 1, 3, lsh);
  ot_attention_params p = ot_attention_default_params();
  p.causal = causal;
  g_ctx->stream = stream;
  return (int)ot_attention_forward(g_ctx, &p, &tq, &tk, &tv, NULL, NULL, &to, lse ? &tl : NULL);
}

SHIM_API int shim_attn_bwd(void *stream, int dtype, int64_t b, int64_t hq, int64_t hkv, int64_t d,
                           int64_t sq, int64_t sk, int causal, void *q, void *k, void *v,
                           void *out, void *dout, float *lse, void *dq, void *dk, void *dv) {
  int64_t qsh[4] = {b, sq, hq, d}, ksh[4] = {b, sk, hkv, d}, lsh[3] = {b, hq, sq};
  DLTensor tq = tensor(q, dtype, 4, qsh), tk = tensor(k, dtype, 4, ksh),
           tv = tensor(v, dtype, 4, ksh), to = tensor(out, dtype, 4, qsh),
           tdo = tensor(dout, dtype, 4, qsh), tl = tensor(lse, 1, 3, lsh),
           tdq = tensor(dq, dtype, 4, qsh), tdk = tensor(dk, dtype, 4, ksh),
           tdv = tensor(dv, dtype, 4, ksh);
  ot_attention_params p = ot_attention_default_params();
  p.causal = causal;
  g_ctx->stream = stream;
  return (int)ot_attention_backward(g_ctx, &p, &tq, &tk, &tv, &to, &tdo, &tl, NULL, NULL, &tdq,
                                    &tdk, &tdv);
}
