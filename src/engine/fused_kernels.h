/* fused_kernels.h -- the arguments of the engine's fused one-row linears
 * (fused_kernels.cu; launched through ote_dev_fused_gemv / _staged_gemv / _rowblock_gemv,
 * device.c). C and CUDA. */
#ifndef OTE_FUSED_KERNELS_H
#define OTE_FUSED_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y [N] = x W^T (+ bias) for one row, W [N, K] row-major, every pointer 16-byte aligned
 * and K a multiple of 8 (bf16 / fp16 only), with x formed in the kernel (the mode argument
 * of ote_cuda_fused_gemv):
 *   norm (mode 0): h = res (+ delta), x = rmsnorm(h) * gamma (eps); res_out (may be
 *     NULL) receives h rounded to the dtype; res_out must not alias delta or res.
 *   swiglu (mode 1): x = silu(gate_up[0, K)) * gate_up[K, 2K), rounded to the dtype.
 * argmax_out (norm only, may be NULL): the index of y's largest value (ties: the lowest;
 * NaN never chosen; 0 when none), through argmax_key / argmax_count, which must be zero
 * before the first call and are left zero by each call. */
typedef struct ote_fused_gemv_args {
  const void *w;
  int64_t N, K;
  const void *bias;
  void *y;
  const void *delta, *res, *gamma;
  void *res_out;
  float eps;
  const void *gate_up;
  int pair_rows; /* not 0: each warp takes two adjacent rows of W (the input formed once
                  * for both), else one (rope: always a pair) */
  /* glu_out (norm only, N even): y is the fused gate_up projection [gate | up]; instead of
   * y, glu_out [N / 2] receives silu(gate) * up of y's rounded values, rounded (the
   * ot_glu_forward of the unfused step) */
  void *glu_out;
  int max_waves; /* > 0: at most this many waves of blocks (the warps loop over tasks) */
  int max_blocks; /* > 0: at most this many blocks (a test's many tasks a warp) */
  int32_t *argmax_out;
  unsigned long long *argmax_key;
  unsigned int *argmax_count;
  /* rope (norm only): y is the fused qkv projection [(hq + 2 hkv) head_dim] of one token,
   * whose q heads are rotated in place (NeoX, the whole head, the RoPE of ot_rope_forward
   * with these parameters) and whose k (rotated) and v heads are written to the token's
   * slot in the pages instead of y -- the slot of ot_kv_append: position length - 1 of
   * sequence 0 of the page table (indptr, indices, last_page_len; block_size tokens a page,
   * pages [num_pages, hkv, block_size, head_dim]) */
  int rope;
  int hq, hkv, head_dim, block_size;
  void *k_pages, *v_pages;
  const int32_t *indptr, *indices, *last_page_len;
  double theta, l3_factor, l3_low, l3_high, l3_orig;
  /* the staged kernel (ote_cuda_staged_gemv, fused_kernels.cu: o_proj): its input row */
  const void *x;
  /* the rowblock kernel (ote_cuda_rowblock_gemv, fused_kernels.cu: down_proj, input x):
   * y = x W^T (+ bias) + res, the sum of y's rounded value and res rounded again (res may
   * be y; NULL: no residual), and the rows of W in flight a thread (2, else 4); with rope or
   * glu_out (the norm-fed qkv / gate_up on the rowblock scheme) 4, else 8 */
  int depth;
  /* the staged and the fused kernel: an L2 prefetch of up to OTE_L2_PF_RANGES byte ranges
   * (a later kernel's weights; never read by this kernel), each CTA issuing its share by one
   * thread after its own loads -- the staged kernel before its PDL wait, the fused kernel
   * when its warp 0 is done -- while the decode attention runs and the DRAM is mostly idle. l2_pf[i] 16-byte aligned (NULL or 0 bytes: none); l2_pf_bytes[i] is
   * rounded down to a multiple of 16; l2_pf_last: the lines kept with the evict-last
   * policy (else the default's). The fused kernel takes range 0 only. A hint only: sm_90 and later, ignored before. */
  const void *l2_pf[3];
  int64_t l2_pf_bytes[3];
  int l2_pf_last;
  /* the fused kernel: its prefetch right after its first weight loads (before its PDL
   * wait), not at its end */
  int l2_pf_early;
} ote_fused_gemv_args;

#define OTE_L2_PF_RANGES 3

/* The batch-1 decode's attention and o_proj in one kernel (ote_cuda_attn_oproj,
 * fused_kernels.cu attn_oproj_kernel): for sequence 0 of the page table (its last token
 * the query, already appended to the pages), attn [hq head_dim] = the attention of q over
 * the sequence's cached keys and values (causal: all of them; window_left >= 0: only the
 * last window_left + 1), rounded to the dtype, and y [N] = attn W^T (+ bias), W [N, hq
 * head_dim]. scratch: ote_cuda_attn_oproj_scratch bytes, its first OTE_AO_STATE_BYTES
 * zero before the first call (the counters of its grid barrier, left reusable by every
 * call); the rest holds the key splits' partial results. head_dim 32, 64 or 128, hq / hkv 1, 2, 4 (or 8 at
 * head_dim <= 64), hq head_dim <= 4096, N <= 32 CTAs' worth of rows (else declined). kv_ready: the page table and every cached row but the
 * last may be read before the PDL wait (the engine's paged_kv_ready). max_blocks > 0: at
 * most that many CTAs (tests); smem_rows_cap > 0: at most that many rows of W a CTA in
 * shared memory, the rest in registers (tests); max_splits > 0: at most that many key
 * ranges a kv head. */
#define OTE_AO_STATE_BYTES 1024
typedef struct ote_attn_oproj_args {
  const void *q; /* [hq head_dim], the rotated query row (may be a strided row's start) */
  const void *k_pages, *v_pages; /* [num_pages, hkv, block_size, head_dim] */
  const int32_t *indptr, *indices, *last_page_len;
  int hq, hkv, head_dim, block_size;
  float scale; /* softmax scale */
  int window_left; /* < 0: none */
  int kv_ready;
  void *attn;
  const void *w, *bias;
  void *y;
  int64_t N;
  void *scratch;
  size_t scratch_bytes;
  int max_blocks, smem_rows_cap;
  int max_splits; /* > 0: at most that many key ranges a kv head (else the CTAs / hkv) */
} ote_attn_oproj_args;

#ifdef __cplusplus
}
#endif

#endif /* OTE_FUSED_KERNELS_H */
