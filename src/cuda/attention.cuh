/*
 * attention.cuh -- device code shared by the portable (sm_80+) flash attention forward
 * (attention_fwd.cu) and backward (attention_bwd.cu): the kernels' parameter block,
 * the mapping of a block to (sequence, tile) for dense and varlen batches, per-row key
 * ranges, and the warp-level building blocks (mma.sync m16n8k16 with fp32 accumulate,
 * ldmatrix, cp.async tile loads into padded shared memory).
 *
 * Every kernel gives each warp 16 rows of an "row" operand (queries in the forward and
 * the dQ pass, keys in the dK/dV pass) and keeps that warp's scores, probabilities and
 * accumulators in registers: the C fragment of one product is turned into the A
 * fragment of the next without going through shared memory. See docs/ATTENTION.md.
 *
 * Shared-memory tiles hold rows of DP = D + 8 elements (16 bytes of padding): for the
 * row pitches this gives (144, 208, 272, 528 bytes) the 8 row addresses of one
 * ldmatrix phase fall on 8 disjoint groups of 4 banks, so ldmatrix and the 16-byte
 * cp.async stores are free of bank conflicts without an XOR swizzle (which would not
 * fit D = 96, 12 chunks a row).
 */
#ifndef OT_CUDA_ATTENTION_CUH
#define OT_CUDA_ATTENTION_CUH

#include "../core/attention.h"
#include "common.cuh"
#include "mma.cuh"

namespace ot {
namespace attn {

/* ---- parameters --------------------------------------------------------------------- */

/* One operand in device form: base pointer (bytes) and element strides. */
struct Op {
  const char *p;
  int64_t bs, ts, hs; /* batch (dense only), token, head strides in elements */
};

struct Params {
  Op q, k, v, o, dout, dq, dk, dv;
  float *lse;                 /* may be NULL in the forward */
  int64_t lse_bs, lse_ts, lse_hs;
  const int32_t *cu_q, *cu_k; /* device, varlen only */
  int batch, hq, hkv, group, d;
  int sq, sk;                 /* dense lengths */
  int tq, tk;                 /* varlen token totals (bounds for cu_seqlens) */
  float scale_log2;           /* scale * log2(e) (no softcap) or log2(e) (softcap) */
  float scale;                /* softmax scale */
  float softcap;              /* 0: off */
  int wl, wr;                 /* windows, -1: unbounded */
  bool vec;                   /* every row 16-byte aligned and d % 8 == 0: cp.async path */
  /* forward split-KV */
  int nsplit;
  float *part_o;              /* [nsplit][rows][hq][DPAD] float32, normalized */
  float *part_lse;            /* [nsplit][rows][hq] */
  int part_dpad;
  /* backward: delta = rowsum(dout * out), compact [B, Hq, Sq] or [Hq, Tq] */
  float *delta;
};

/* Sequence b's token offset and lengths; false (and lengths 0) for bad cu_seqlens
 * (start < 0, decreasing, end past the tensor): such sequences are skipped, so bad
 * device values never read or write out of bounds. */
__device__ __forceinline__ bool seq_of(const Params &P, int b, int &q0, int &sq, int &k0,
                                       int &sk) {
  if (!P.cu_q) {
    q0 = 0, sq = P.sq, k0 = 0, sk = P.sk;
    return true;
  }
  int a0 = P.cu_q[b], a1 = P.cu_q[b + 1], c0 = P.cu_k[b], c1 = P.cu_k[b + 1];
  q0 = a0, k0 = c0, sq = a1 - a0, sk = c1 - c0;
  if (a0 < 0 || a1 < a0 || a1 > P.tq || c0 < 0 || c1 < c0 || c1 > P.tk) {
    sq = sk = 0;
    return false;
  }
  return true;
}

/* Kernels with one warp per (token row, head) over all query rows of the batch (the
 * split-KV merge, the backward's delta): rows_total is Tq (varlen) or B * Sq; this warp's
 * row, head, and its sequence b / token tok within it (varlen: b = 0, tok = the packed
 * row). false for the warps past the end (whole warps: callers may shuffle after it). */
__device__ __forceinline__ bool warp_row_head(const Params &P, int64_t &rows_total, int64_t &row,
                                              int &head, int &b, int64_t &tok) {
  rows_total = P.cu_q ? P.tq : (int64_t)P.batch * P.sq;
  const int64_t w = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (w >= rows_total * P.hq) return false;
  row = w / P.hq;
  head = (int)(w % P.hq);
  b = 0;
  tok = row;
  if (!P.cu_q) b = (int)(row / P.sq), tok = row % P.sq;
  return true;
}

/* Varlen tile mapping without a host read of cu_seqlens: sequence b's tiles of TILE
 * rows take the virtual indices [cu[b] / TILE + b, cu[b] / TILE + b + ceil(len / TILE)),
 * which never overlap and stay below total / TILE + batch + 1 (the grid's size).
 * Returns the sequence of virtual index x (binary search; -1 when none) and its tile. */
__device__ __forceinline__ int varlen_tile(const int32_t *cu, int batch, int tile_rows, int x,
                                           int &tile) {
  int lo = 0, hi = batch - 1, b = -1;
  while (lo <= hi) {
    int mid = (lo + hi) >> 1;
    int start = cu[mid] / tile_rows + mid;
    if (start <= x) b = mid, lo = mid + 1;
    else hi = mid - 1;
  }
  if (b >= 0) tile = x - (cu[b] / tile_rows + b);
  return b;
}

/* Visible keys of row i (sequence frame): [lo, hi], empty when lo > hi
 * (ot_attn_key_range on the device). */
__device__ __forceinline__ void key_range(const Params &P, int i, int sq, int sk, int &lo,
                                          int &hi) {
  int diag = i + (sk - sq);
  int l = P.wl < 0 ? 0 : diag - P.wl;
  int h = P.wr < 0 ? sk - 1 : diag + P.wr;
  lo = l < 0 ? 0 : l;
  hi = h > sk - 1 ? sk - 1 : h;
}

template <typename T>
__device__ __forceinline__ const T *row_ptr(const Op &o, int b, int64_t tok, int head) {
  return reinterpret_cast<const T *>(o.p) + (int64_t)b * o.bs + tok * o.ts + (int64_t)head * o.hs;
}
template <typename T>
__device__ __forceinline__ T *row_ptr_w(const Op &o, int b, int64_t tok, int head) {
  return const_cast<T *>(row_ptr<T>(o, b, tok, head));
}

/* ---- PTX wrappers -------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* 16-byte async copy; src_bytes = 0 zero-fills the destination (nothing is read). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                        const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                          const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_u32(p)));
}

/* mma.sync m16n8k16 with fp32 accumulation and the 16-bit pair packing (mma.cuh). */
template <typename T> using mma_t = ot::mma_m16n8k16<T>;

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* ---- warp products (16 rows per warp) -------------------------------------------------
 *
 * Fragment layout of m16n8k16 (g = lane / 4, t = lane % 4): C / D tile [16, 8]: c[0..1]
 * at (g, 2t..2t+1), c[2..3] at (g + 8, 2t..2t+1). An accumulator over N columns is
 * acc[N / 8][4]. */

/* acc[mt][16, NT*8] += A_mt[16, 16*KS] * B^T for the warp's MT m16 tiles: A_mt is 16 smem
 * rows at sA + 16 mt * DP (pitch DP elements), B is NT*8 smem rows [n][k] of the same
 * pitch (scores Q K^T, K Q^T, dO V^T, V dO^T). Each B fragment loaded by ldmatrix feeds
 * MT MMAs: MT = 2 halves the shared-memory traffic per MMA, the inner loop's bound with
 * one m16 tile a warp. */
template <typename T, int MT, int KS, int NT, int DP>
__device__ __forceinline__ void mma_rows_nt_mt(float (*acc)[NT][4], const T *sA, const T *sB,
                                               int lane) {
  static_assert(NT % 2 == 0, "pairs of n-tiles");
  const int mi = lane >> 3;
#pragma unroll
  for (int ks = 0; ks < KS; ks++) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
      ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
              sA + (mt * 16 + (lane & 15)) * DP + ks * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < NT / 2; np++) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4(b0, b1, b2, b3, sB + (np * 16 + (mi >> 1) * 8 + (lane & 7)) * DP + ks * 16 + (mi & 1) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        mma_t<T>::run(acc[mt][2 * np], a[mt], b0, b1);
        mma_t<T>::run(acc[mt][2 * np + 1], a[mt], b2, b3);
      }
    }
  }
}

/* acc[mt][16, NT*8] += A_mt[16, 16*KS] * B where A_mt is in registers (a[mt][KS][4], from
 * to_a_frags) and B is 16*KS smem rows [k][n] of pitch DP, columns [0, NT*8) from sB
 * (P V, dS K, P^T dO, dS^T Q). */
template <typename T, int MT, int KS, int NT, int DP>
__device__ __forceinline__ void mma_regs_nn_mt(float (*acc)[NT][4], const uint32_t (*a)[KS][4],
                                               const T *sB, int lane) {
  static_assert(NT % 2 == 0, "pairs of n-tiles");
  const int mi = lane >> 3;
#pragma unroll
  for (int ks = 0; ks < KS; ks++) {
#pragma unroll
    for (int np = 0; np < NT / 2; np++) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4_t(b0, b1, b2, b3, sB + (ks * 16 + (mi & 1) * 8 + (lane & 7)) * DP + np * 16 + (mi >> 1) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        mma_t<T>::run(acc[mt][2 * np], a[mt][ks], b0, b1);
        mma_t<T>::run(acc[mt][2 * np + 1], a[mt][ks], b2, b3);
      }
    }
  }
}

/* C fragments over 2*KS n-tiles (fp32) -> A fragments of the next product (storage T). */
template <typename T, int KS>
__device__ __forceinline__ void to_a_frags(uint32_t (*a)[4], const float (*c)[4]) {
#pragma unroll
  for (int k = 0; k < KS; k++) {
    a[k][0] = mma_t<T>::pack(c[2 * k][0], c[2 * k][1]);
    a[k][1] = mma_t<T>::pack(c[2 * k][2], c[2 * k][3]);
    a[k][2] = mma_t<T>::pack(c[2 * k + 1][0], c[2 * k + 1][1]);
    a[k][3] = mma_t<T>::pack(c[2 * k + 1][2], c[2 * k + 1][3]);
  }
}

/* Score x (raw q.k) -> log2-domain logit: x * scale * log2(e), or under softcap
 * cap * tanh(x * scale / cap) * log2(e); *dsm = d(capped) / d(scaled) = 1 - tanh^2. */
__device__ __forceinline__ float logit2(float x, float cap, float inv_cap, float scale_log2,
                                        float &dsm) {
  const float LOG2E = 1.4426950408889634f;
  if (cap > 0.0f) {
    float th = tanhf(x * inv_cap);
    dsm = 1.0f - th * th;
    return cap * LOG2E * th;
  }
  dsm = 1.0f;
  return x * scale_log2;
}

/* ---- tile loads ---------------------------------------------------------------------- */

/* Rows [0, ROWS) of a tile into smem (pitch DP): row r is global row `first + r` of
 * (b, head) in operand o when r < nrows, else zeros; columns >= d are zeros. The
 * vector path issues cp.async (the caller commits and waits); the scalar path (rows
 * not 16-byte aligned or d % 8 != 0) loads and stores element by element. */
template <typename T, int ROWS, int D, int DP, int NTHREADS>
__device__ __forceinline__ void load_tile(T *s, const Op &o, int b, int64_t first, int head,
                                          int nrows, int d, bool vec, int tid) {
  constexpr int CH = D / 8; /* 16-byte chunks per row */
  if (vec && NTHREADS % CH == 0) {
    /* Each thread keeps one column chunk and steps over rows: one pointer increment a
     * copy instead of the row / column / 64-bit address arithmetic of the loop below. */
    constexpr int RS = NTHREADS / CH;
    const int x = (tid % CH) * 8;
    int r = tid / CH;
    const T *src = row_ptr<T>(o, b, first + r, head) + x;
    const int64_t step = (int64_t)RS * o.ts;
    const T *base = reinterpret_cast<const T *>(o.p);
#pragma unroll
    for (int k = 0; k < (ROWS + RS - 1) / RS; k++, r += RS, src += step) {
      if (ROWS % RS != 0 && r >= ROWS) break;
      const bool in = r < nrows && x < d;
      cp_async16(s + r * DP + x, in ? src : base, in ? 16 : 0);
    }
  } else if (vec) {
    for (int c = tid; c < ROWS * CH; c += NTHREADS) {
      int r = c / CH, x = (c % CH) * 8;
      bool in = r < nrows && x < d;
      const T *src = in ? row_ptr<T>(o, b, first + r, head) + x : reinterpret_cast<const T *>(o.p);
      cp_async16(s + r * DP + x, src, in ? 16 : 0);
    }
  } else {
    for (int c = tid; c < ROWS * CH; c += NTHREADS) {
      int r = c / CH, x = (c % CH) * 8;
      const T *src = r < nrows ? row_ptr<T>(o, b, first + r, head) : nullptr;
      T tmp[8];
#pragma unroll
      for (int e = 0; e < 8; e++) tmp[e] = (src && x + e < d) ? src[x + e] : from_f32<T>(0.0f);
      *reinterpret_cast<uint4 *>(s + r * DP + x) = *reinterpret_cast<uint4 *>(tmp);
    }
  }
}

/* The two-stage pipeline over key / value tiles of BN rows (kv head g of sequence b):
 * start loading tile t + 1 into the other stage when there is one, then wait for tile
 * t and make it visible to the block. */
template <typename T, int BN, int D, int DP, int NTH>
__device__ __forceinline__ void kv_next_or_wait(const Params &P, T *sK, T *sV, int stage, int t,
                                                int t_hi, int b, int k0, int sk, int g, int tid) {
  if (t + 1 <= t_hi) {
    const int kb = (t + 1) * BN;
    load_tile<T, BN, D, DP, NTH>(sK + (stage ^ 1) * BN * DP, P.k, b, (int64_t)k0 + kb, g, sk - kb,
                                 P.d, P.vec, tid);
    load_tile<T, BN, D, DP, NTH>(sV + (stage ^ 1) * BN * DP, P.v, b, (int64_t)k0 + kb, g, sk - kb,
                                 P.d, P.vec, tid);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

/* Store the warp's 16 rows (staged in smem rows [0, 16) of pitch DP, storage T, W
 * columns) to rows first .. first + nrows - 1 of (b, head) in operand o, global columns
 * c0 + [0, W) clipped to d (c0 a multiple of 8). */
template <typename T, int W, int DP>
__device__ __forceinline__ void store_rows16(const T *s, const Op &o, int b, int64_t first, int head,
                                             int nrows, int c0, int d, bool vec, int lane) {
  constexpr int CH = W / 8;
  for (int c = lane; c < 16 * CH; c += 32) {
    int r = c / CH, x = (c % CH) * 8;
    if (r >= nrows || c0 + x >= d) continue;
    T *dst = row_ptr_w<T>(o, b, first + r, head) + c0 + x;
    if (vec) {
      *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(s + r * DP + x);
    } else {
      for (int e = 0; e < 8 && c0 + x + e < d; e++) dst[e] = s[r * DP + x + e];
    }
  }
}

/* Write an accumulator acc[NT][4] (columns c0 + [0, NT*8)) times mul[row] into the warp's
 * staging rows (pitch DP, storage T). */
template <typename T, int NT, int DP>
__device__ __forceinline__ void stage_acc(T *s, const float (*acc)[4], float mul0, float mul1,
                                          int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < NT; j++) {
    uint32_t lo = mma_t<T>::pack(acc[j][0] * mul0, acc[j][1] * mul0);
    uint32_t hi = mma_t<T>::pack(acc[j][2] * mul1, acc[j][3] * mul1);
    *reinterpret_cast<uint32_t *>(s + g * DP + j * 8 + 2 * t) = lo;
    *reinterpret_cast<uint32_t *>(s + (g + 8) * DP + j * 8 + 2 * t) = hi;
  }
}

/* Dense / varlen alignment check of one operand for the cp.async path. */
static inline bool op_vec_ok(const ot_attn_operand &o, size_t es) {
  if (!o.data) return true;
  if (((uintptr_t)o.data & 15u) != 0) return false;
  int64_t m = (int64_t)(16 / es);
  return o.batch_stride % m == 0 && o.tok_stride % m == 0 && o.head_stride % m == 0;
}

static inline Op op_of(const ot_attn_operand &o) {
  Op r;
  r.p = (const char *)o.data;
  r.bs = o.batch_stride, r.ts = o.tok_stride, r.hs = o.head_stride;
  return r;
}

} /* namespace attn */
} /* namespace ot */

/* Checks what the CUDA kernels support (dtype, head dim, device, sizes) and fills the
 * kernels' parameter block; *dpad: the compiled head dim the call runs in (64, 96, 128
 * or 256). Defined in attention_fwd.cu, used by both dispatchers. */
ot_status ot_cuda_attention_params(ot_context *ctx, const ot_attention_args *a, const char *op,
                                   ot::attn::Params *P, int *dpad);

#endif /* OT_CUDA_ATTENTION_CUH */
