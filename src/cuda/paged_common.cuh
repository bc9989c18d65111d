/*
 * paged_common.cuh -- device helpers shared by the CUDA paged-KV kernels (append in
 * kv_append.cu, attention in paged_attention.cu): the sequence length from the CSR page
 * table, the sequence of a packed token (binary search over cu_seqlens), and the OT_DEBUG
 * error flag.
 *
 * OT_DEBUG (runtime, read from the environment at every launch): when OT_DEBUG=1 the
 * kernels bound-check every value of the device tables they read (indptr monotone and
 * within indices, last_page_len in 1..block_size, page ids in [0, num_pages),
 * cu_seqlens monotone and ending at T) and record the first violation in a 4-int device
 * flag {code, sequence, entry, value} instead of reading out of bounds; the host copies
 * the flag back after the launch (one stream synchronization) and returns
 * OT_ERR_INVALID_ARGUMENT naming the table. Without OT_DEBUG the tables are trusted
 * (the host cannot read them without a synchronization).
 */
#ifndef OT_CUDA_PAGED_COMMON_CUH
#define OT_CUDA_PAGED_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "common.cuh" /* ot_env_is_zero */

namespace ot {

enum paged_err_code {
  kPagedOk = 0,
  kPagedBadIndptr = 1,     /* indptr decreasing, negative or past indices */
  kPagedBadLastLen = 2,    /* last_page_len out of range */
  kPagedBadIndex = 3,      /* a page id out of [0, num_pages) */
  kPagedBadCu = 4,         /* cu_seqlens decreasing or not ending at T */
  kPagedTooManyNew = 5,    /* append: n_b > length_b */
};

/* Record the first error (debug mode only). */
__device__ __forceinline__ void paged_flag(int *err, int code, int64_t seq, int64_t entry,
                                           int64_t value) {
  if (atomicCAS(err, 0, code) == 0) {
    err[1] = (int)seq;
    err[2] = (int)entry;
    err[3] = (int)value;
  }
}

/* Length in tokens of sequence b from its entries indptr[b] = lo, indptr[b + 1] = hi and
 * last_page_len[b] = l (paged_seq_len_of) or from the tables (paged_seq_len); under debug
 * checks them and returns -1 after flagging a bad entry. */
__device__ __forceinline__ int64_t paged_seq_len_of(int32_t lo, int32_t hi, int32_t l, int64_t b,
                                                    int bs, int64_t num_indices, int *err) {
  const int32_t np = hi - lo;
  if (err) {
    if (lo < 0 || hi < lo || hi > num_indices || (b == 0 && lo != 0)) {
      paged_flag(err, kPagedBadIndptr, b, b + 1, hi);
      return -1;
    }
    if (np == 0 ? l != 0 : (l < 1 || l > bs)) {
      paged_flag(err, kPagedBadLastLen, b, b, l);
      return -1;
    }
  }
  return np ? (int64_t)(np - 1) * bs + l : 0;
}
__device__ __forceinline__ int64_t paged_seq_len(const int32_t *indptr, const int32_t *lpl,
                                                 int64_t b, int bs, int64_t num_indices,
                                                 int *err) {
  return paged_seq_len_of(indptr[b], indptr[b + 1], lpl[b], b, bs, num_indices, err);
}

/* The sequence b of packed token `tok` (cu[b] <= tok < cu[b + 1]), cu of batch + 1
 * non-decreasing entries. */
__device__ __forceinline__ int64_t paged_seq_of(const int32_t *cu, int64_t batch, int64_t tok) {
  int64_t lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= tok) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* Debug check of cu_seqlens around sequence b (entries b and b + 1, the end at T). */
__device__ __forceinline__ bool paged_cu_ok(const int32_t *cu, int64_t b, int64_t batch,
                                            int64_t total, int *err) {
  if (!err) return true;
  const int32_t lo = cu[b], hi = cu[b + 1];
  if (lo < 0 || hi < lo || (b == 0 && lo != 0) || (b == batch - 1 && hi != total) ||
      hi > total) {
    paged_flag(err, kPagedBadCu, b, b + 1, hi);
    return false;
  }
  return true;
}

} /* namespace ot */

/* ---- host side of the debug flag ------------------------------------------------------- */

/* Whether an OT_DEBUG value (NULL: unset) turns the checks on: set, not empty, not "0".
 * The one rule for both readers: ot_paged_debug and paged_attention.cu's pa_read_env,
 * which reads it in its one pass over the environment. */
static inline bool ot_paged_debug_on(const char *v) { return v && v[0] && !ot_env_is_zero(v); }

/* OT_DEBUG=1 in the environment (read at each launch so tests can toggle it). */
static inline bool ot_paged_debug(void) { return ot_paged_debug_on(getenv("OT_DEBUG")); }

#endif /* OT_CUDA_PAGED_COMMON_CUH */

#ifdef OT_CORE_PAGED_ATTENTION_H
/* The table fields every paged kernel's parameter block has. */
template <typename P>
static inline void ot_paged_fill_table(P &p, const ot_paged_table *t) {
  p.k_pages = t->k_pages;
  p.v_pages = t->v_pages;
  p.indptr = t->indptr;
  p.indices = t->indices;
  p.lpl = t->last_page_len;
  p.num_pages = t->num_pages;
  p.num_indices = t->num_indices;
  p.batch = t->batch;
  p.hkv = (int)t->hkv;
  p.bs = (int)t->bs;
  p.d = (int)t->d;
}
#endif

#ifdef OT_CORE_INTERNAL_H
/* After a debug launch: read the flag back (synchronizing the stream) and turn a
 * recorded violation into OT_ERR_INVALID_ARGUMENT naming the table. cu_name names the
 * cu_seqlens argument of the op. */
static inline ot_status ot_paged_debug_report(ot_context *ctx, const char *op, const int *dev_err,
                                              const char *cu_name) {
  int h[4] = {0, 0, 0, 0};
  cudaError_t e = cudaMemcpyAsync(h, dev_err, sizeof h, cudaMemcpyDeviceToHost,
                                  (cudaStream_t)ctx->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)ctx->stream);
  if (e != cudaSuccess)
    return ot_error(OT_ERR_BACKEND, op, "OT_DEBUG flag read-back: %s", cudaGetErrorString(e));
  switch (h[0]) {
    case ot::kPagedOk: return OT_OK;
    case ot::kPagedBadIndptr:
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "kv.indptr: (OT_DEBUG device check) indptr[%d] = %d is out of order or "
                      "past the entries of kv.indices (sequence %d)",
                      h[2], h[3], h[1]);
    case ot::kPagedBadLastLen:
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "kv.last_page_len: (OT_DEBUG device check) last_page_len[%d] = %d, expected "
                      "1 .. block_size (0 for a sequence without pages)",
                      h[2], h[3]);
    case ot::kPagedBadIndex:
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "kv.indices: (OT_DEBUG device check) indices[%d] = %d is not a page id of "
                      "kv.k_pages (sequence %d)",
                      h[2], h[3], h[1]);
    case ot::kPagedBadCu:
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "%s: (OT_DEBUG device check) entry %d = %d is out of order or does not end "
                      "at the token count",
                      cu_name, h[2], h[3]);
    case ot::kPagedTooManyNew:
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "%s: (OT_DEBUG device check) sequence %d appends %d tokens, more than its "
                      "page table holds (reserve the slots first)",
                      cu_name, h[1], h[3]);
    default:
      return ot_error(OT_ERR_INTERNAL, op, "OT_DEBUG flag holds unknown code %d", h[0]);
  }
}
#endif
