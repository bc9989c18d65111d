/*
 * paged_attention.cu -- ot_paged_attention on CUDA: decode, speculative decode and
 * chunked prefill over the paged KV cache (HND pages, a CSR page table on the device).
 *
 * Main kernel (bf16 / fp16, head_dim 64 or 128): tensor cores (mma.sync m16n8k16) with
 * the rows of one GQA group as the M dimension, split-KV (flash-decoding).
 *   - Work item = (row tile, kv head, key split). A sequence's rows are its (query token,
 *     head of the group) pairs, token-major (row = token * group + head); a tile is 16 of
 *     them, so the group's heads (and a few speculative tokens) share every K / V load.
 *     grid.x enumerates tile slots (at most batch + ceil(T_q * group / 16)); each CTA finds
 *     its sequence with a warp-wide prefix sum over cu_seqlens_q (the host never reads the
 *     device tables, so the launch is graph-capturable and needs no synchronization).
 *   - A CTA has 4 warps; the key range of its split is walked 256 keys per iteration
 *     (page ids of those keys staged in shared memory once), warp w taking the 16-key
 *     steps w, w + 4, w + 8, w + 12. Each warp loads K and V straight from the pages into
 *     mma fragments with 128-bit loads (no shared-memory staging):
 *       QK^T: the head_dim axis is permuted so a thread's 16-byte run of a key (8 features)
 *             is the B fragment of two k-steps, with q loaded through the same permutation;
 *             the 4 threads of a quad read 64 contiguous bytes of one key.
 *       PV:   output column n of n-tile j is feature (j / 8) * 64 + n * 8 + j % 8, so a
 *             thread's B fragment is 16-byte runs of 4 keys (one __byte_perm per pair);
 *             8 threads read 128 contiguous bytes of one key.
 *     Both K and V loads of a step are issued before any math (16 x 16 B per thread in
 *     flight); with 2 CTAs per SM (~200 registers) that is 64 KB in flight per SM. Opt-in
 *     (OT_PAGED_PREFETCH=1, sm_90): an L2 bulk prefetch of the next step besides.
 *   - Online softmax in fp32 (base 2, scale folded in), P rounded to the input type for
 *     the PV mma (the FA2 register trick: the S accumulators of two key blocks are the A
 *     fragment of P). The 4 warps' (m, l, O) merge through shared memory at the end.
 *   - One split: out and lse are written directly. Several: normalized O_s (fp32) and
 *     lse_s go to context scratch and a merge kernel combines them
 *     (O = sum_s exp(lse_s - lse) O_s), skipping empty splits (lse_s = -inf).
 *   - Splits: chosen on the host from the estimated tiles (batch, T_q, group), heads_kv,
 *     the context estimated from the size of kv.indices, and SMs x CTAs per SM (occupancy
 *     queried once): the fewest splits within 2% of the best wave-quantized cost, never
 *     chunks under 256 keys. Batch 1 x 64k with 8 kv heads gets ~49 splits on 132 SMs.
 * Masks (causal bottom-right, windows), softcap and empty rows as ot_attention_forward.
 *
 * Fallback kernel (float32, other head dims, misaligned q): one warp per (token, q head),
 * all keys of the sequence, lanes over the head dim, fp32 online softmax. Correct for
 * every case the API allows; not tuned.
 *
 * OT_DEBUG=1: device bound checks of the tables, see paged_common.cuh.
 */
#include <math.h>

#include "../core/paged_attention.h"
#include "common.cuh"
#include "cuda_state.h"
#include "mma.cuh"
#include "paged_common.cuh"

namespace ot {

constexpr int kPaWarps = 4;
constexpr int kPaThreads = 32 * kPaWarps;
constexpr int kPaStep = 16;                          /* keys per warp step */
constexpr int kPaIter = kPaStep * kPaWarps * 4;      /* keys per CTA iteration: 256 */
constexpr int kPaMaxPages = kPaIter + 2;             /* page ids staged per iteration */
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct pa_params {
  const void *k_pages, *v_pages;
  const int32_t *indptr, *indices, *lpl, *cu_q;
  int64_t num_pages, num_indices, batch, tq;
  int hkv, bs, bs_shift, d, hq, group;
  const void *q;
  int64_t q_ts, q_hs;
  void *out;
  int64_t o_ts, o_hs;
  float *lse;
  int64_t lse_hs, lse_ts;
  float scale, softcap;
  int64_t wl, wr;
  int splits;
  float *part_o;      /* [splits][tq * hq][d] */
  float *part_lse;    /* [splits][tq * hq] */
  int *err;           /* OT_DEBUG flag or NULL */
  int prefetch;       /* sm_90: L2 bulk prefetch of the warp's next step (OT_PAGED_PREFETCH=1) */
};

/* ---- fragment helpers -------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t u4_word(const uint4 &v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* Element (word e / 2, half e % 2) of two 16-byte runs, packed lo = a, hi = b. */
__device__ __forceinline__ uint32_t pair_of(const uint4 &a, const uint4 &b, int e) {
  return __byte_perm(u4_word(a, e >> 1), u4_word(b, e >> 1), (e & 1) ? 0x7632 : 0x5410);
}

/* The tile slot x -> (sequence, tile within it) by a warp-wide prefix sum of
 * ceil(n_b * group / 16). Returns false when the slot has no tile. */
__device__ __forceinline__ bool pa_find_tile(const pa_params &p, int64_t x, int64_t *b_out,
                                             int64_t *tile_out) {
  const int lane = threadIdx.x & 31;
  int64_t base = 0;
  for (int64_t b0 = 0; b0 < p.batch; b0 += 32) {
    const int64_t b = b0 + lane;
    int64_t nt = 0;
    if (b < p.batch && paged_cu_ok(p.cu_q, b, p.batch, p.tq, p.err)) {
      const int64_t n = (int64_t)p.cu_q[b + 1] - p.cu_q[b];
      nt = n > 0 ? (n * p.group + 15) / 16 : 0;
    }
    int64_t incl = nt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const int64_t total = __shfl_sync(0xffffffffu, incl, 31);
    if (x < base + total) {
      const unsigned hit = __ballot_sync(0xffffffffu, x < base + incl);
      const int l = __ffs(hit) - 1;
      const int64_t excl = __shfl_sync(0xffffffffu, incl - nt, l);
      *b_out = b0 + l;
      *tile_out = x - base - excl;
      return true;
    }
    base += total;
  }
  return false;
}

/* ---- the tensor-core kernel ------------------------------------------------------------- */

template <typename T, int D>
__global__ void __launch_bounds__(kPaThreads, 2) pa_mma_kernel(const __grid_constant__ pa_params p) {
  constexpr int KC = D / 32;   /* 16-byte runs of a key per quad thread (QK) */
  constexpr int KS = D / 16;   /* k-steps of QK */
  constexpr int NT = D / 8;    /* n-tiles of PV */
  constexpr int VH = D / 64;   /* 16-byte runs of a key per thread (PV) */
  __shared__ int32_t s_pid[kPaMaxPages];
  __shared__ float s_m[kPaWarps][16], s_l[kPaWarps][16];
  extern __shared__ float s_o[]; /* [warps][16][D] */

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq4 = lane & 3;
  const int kvh = blockIdx.y, split = blockIdx.z;

  int64_t b, tile;
  if (!pa_find_tile(p, blockIdx.x, &b, &tile)) return;
  const int64_t len = paged_seq_len(p.indptr, p.lpl, b, p.bs, p.num_indices, p.err);
  if (len < 0) return;
  const int64_t q0 = p.cu_q[b], nq = (int64_t)p.cu_q[b + 1] - q0;
  const int64_t rows = nq * p.group;
  const int64_t page0 = p.indptr[b];

  /* this thread's two rows (g, g + 8): validity and visible key range */
  int r_lo[2], r_hi[2]; /* keys fit int32 (lengths come from int32 tables) */
  bool r_ok[2];
#pragma unroll
  for (int rr = 0; rr < 2; rr++) {
    const int64_t R = tile * 16 + g + 8 * rr;
    r_ok[rr] = R < rows;
    const int64_t i = r_ok[rr] ? R / p.group : 0, diag = i + len - nq;
    int64_t lo = p.wl >= 0 ? diag - p.wl : 0, hi = p.wr >= 0 ? diag + p.wr : len - 1;
    if (hi > len - 1) hi = len - 1;
    if (lo < 0) lo = 0;
    if (!r_ok[rr]) lo = 1, hi = 0;
    if (hi < lo) lo = 1, hi = 0;
    r_lo[rr] = (int)lo, r_hi[rr] = (int)hi;
  }
  /* the tile's key range within this split: union of its rows' ranges */
  const int64_t tok_first = tile * 16 / p.group;
  int64_t tok_last = (tile * 16 + 15) / p.group;
  if (tok_last > nq - 1) tok_last = nq - 1;
  /* this split's keys: the sequence cut into `splits` chunks of >= 256 keys (a multiple
   * of 64), so splits past the end of a short sequence are empty */
  int64_t chunk = (len + p.splits - 1) / p.splits;
  chunk = chunk < kPaIter ? kPaIter : (chunk + 63) / 64 * 64;
  int64_t k_lo = split * chunk, k_hi = k_lo + chunk;
  {
    const int64_t dfirst = tok_first + len - nq, dlast = tok_last + len - nq;
    const int64_t lo = p.wl >= 0 ? dfirst - p.wl : 0;
    const int64_t hi = p.wr >= 0 ? dlast + p.wr + 1 : len;
    if (k_lo < lo) k_lo = lo;
    if (k_hi > hi) k_hi = hi;
    if (k_hi > len) k_hi = len;
  }

  /* q fragments: row g / g + 8, features c*32 + tq4*8 + [0, 8) per run c */
  uint32_t qa[KS][4];
#pragma unroll
  for (int rr = 0; rr < 2; rr++) {
    const int64_t R = tile * 16 + g + 8 * rr;
    const T *qrow = nullptr;
    if (r_ok[rr])
      qrow = static_cast<const T *>(p.q) + (q0 + R / p.group) * p.q_ts +
             (int64_t)(kvh * p.group + R % p.group) * p.q_hs;
#pragma unroll
    for (int c = 0; c < KC; c++) {
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (qrow) v = *reinterpret_cast<const uint4 *>(qrow + c * 32 + tq4 * 8);
      qa[2 * c][rr] = v.x;
      qa[2 * c][2 + rr] = v.y;
      qa[2 * c + 1][rr] = v.z;
      qa[2 * c + 1][2 + rr] = v.w;
    }
  }

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const float qk_scale = p.softcap > 0 ? p.scale / p.softcap : p.scale * kLog2e;
  const float cap2 = p.softcap * kLog2e;
  const int64_t head_stride = (int64_t)p.bs * D; /* elements between kv heads of a page */
  const T *kbase = static_cast<const T *>(p.k_pages) + (int64_t)kvh * head_stride;
  const T *vbase = static_cast<const T *>(p.v_pages) + (int64_t)kvh * head_stride;
  const int64_t page_stride = (int64_t)p.hkv * head_stride;

  for (int ib = (int)k_lo; ib < (int)k_hi; ib += kPaIter) {
    const int ie = ib + kPaIter < (int)k_hi ? ib + kPaIter : (int)k_hi;
    const int pfirst = p.bs_shift >= 0 ? ib >> p.bs_shift : ib / p.bs;
    const int plast = p.bs_shift >= 0 ? (ie - 1) >> p.bs_shift : (ie - 1) / p.bs;
    __syncthreads(); /* previous iteration's readers of s_pid are done */
    for (int i = threadIdx.x; i <= plast - pfirst; i += blockDim.x) {
      int32_t pg = p.indices[page0 + pfirst + i];
      if (p.err && (pg < 0 || pg >= p.num_pages)) {
        paged_flag(p.err, kPagedBadIndex, b, page0 + pfirst + i, pg);
        pg = 0;
      }
      s_pid[i] = pg;
    }
    __syncthreads();
#pragma unroll 1
    for (int u = 0; u < 4; u++) {
      const int kb = ib + (u * kPaWarps + warp) * kPaStep;
      if (kb >= ie) break;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      /* opt-in: the warp's next step (same iteration, page ids staged) into L2, one key row
       * per lane (lanes 0-15 K, 16-31 V) -- more bytes in flight at no register cost */
      if (p.prefetch && u + 1 < 4) {
        const int key = kb + kPaWarps * kPaStep + (lane & 15);
        if (key < ie) {
          const int pl = (p.bs_shift >= 0 ? key >> p.bs_shift : key / p.bs) - pfirst;
          const int slot = p.bs_shift >= 0 ? key & (p.bs - 1) : key % p.bs;
          const T *src = (lane < 16 ? kbase : vbase) + s_pid[pl] * page_stride + slot * D;
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src),
                       "r"((unsigned)(D * sizeof(T)))
                       : "memory");
        }
      }
#endif
      /* issue every load of the step first */
      uint4 kr[2][KC], vr[4][VH];
#pragma unroll
      for (int nb = 0; nb < 2; nb++) {
        const int key = kb + nb * 8 + g;
        if (key < ie) {
          const int pl = (p.bs_shift >= 0 ? key >> p.bs_shift : key / p.bs) - pfirst;
          const int slot = p.bs_shift >= 0 ? key & (p.bs - 1) : key % p.bs;
          const T *kp = kbase + s_pid[pl] * page_stride + slot * D + tq4 * 8;
#pragma unroll
          for (int c = 0; c < KC; c++) kr[nb][c] = *reinterpret_cast<const uint4 *>(kp + c * 32);
        } else {
#pragma unroll
          for (int c = 0; c < KC; c++) kr[nb][c] = make_uint4(0u, 0u, 0u, 0u);
        }
      }
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = kb + tq4 * 2 + (e & 1) + (e >> 1) * 8;
        if (key < ie) {
          const int pl = (p.bs_shift >= 0 ? key >> p.bs_shift : key / p.bs) - pfirst;
          const int slot = p.bs_shift >= 0 ? key & (p.bs - 1) : key % p.bs;
          const T *vp = vbase + s_pid[pl] * page_stride + slot * D + g * 8;
#pragma unroll
          for (int h = 0; h < VH; h++) vr[e][h] = *reinterpret_cast<const uint4 *>(vp + h * 64);
        } else {
#pragma unroll
          for (int h = 0; h < VH; h++) vr[e][h] = make_uint4(0u, 0u, 0u, 0u);
        }
      }
      /* S = q k^T for the 16 keys: two n-blocks of 8 */
      float s[2][4];
#pragma unroll
      for (int nb = 0; nb < 2; nb++) {
        s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
#pragma unroll
        for (int c = 0; c < KC; c++) {
          mma_m16n8k16<T>::run(s[nb], qa[2 * c], kr[nb][c].x, kr[nb][c].y);
          mma_m16n8k16<T>::run(s[nb], qa[2 * c + 1], kr[nb][c].z, kr[nb][c].w);
        }
      }
      /* scale, softcap, mask, online softmax (base 2) */
      uint32_t pa[4];
#pragma unroll
      for (int rr = 0; rr < 2; rr++) {
        float v[4];
        float mx = -INFINITY;
#pragma unroll
        for (int nb = 0; nb < 2; nb++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            const int key = kb + nb * 8 + tq4 * 2 + e;
            float x = s[nb][2 * rr + e] * qk_scale;
            if (p.softcap > 0) x = cap2 * tanhf(x);
            if (key < r_lo[rr] || key > r_hi[rr] || key >= ie) x = -INFINITY;
            v[nb * 2 + e] = x;
            mx = fmaxf(mx, x);
          }
        mx = quad_max(mx);
        const float m_new = fmaxf(m_run[rr], mx);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = exp2f(m_run[rr] - m_use);
        float ps = 0.f;
#pragma unroll
        for (int e = 0; e < 4; e++) {
          v[e] = exp2f(v[e] - m_use);
          ps += v[e];
        }
        l_run[rr] = l_run[rr] * alpha + ps;
        m_run[rr] = m_new;
#pragma unroll
        for (int j = 0; j < NT; j++) {
          acc[j][2 * rr] *= alpha;
          acc[j][2 * rr + 1] *= alpha;
        }
        pa[rr] = mma_m16n8k16<T>::pack(v[0], v[1]);      /* keys tq4*2, +1      (n-block 0) */
        pa[2 + rr] = mma_m16n8k16<T>::pack(v[2], v[3]);  /* keys 8 + tq4*2, +1  (n-block 1) */
      }
      /* O += P V */
#pragma unroll
      for (int j = 0; j < NT; j++) {
        const int h = j >> 3, e = j & 7;
        const uint32_t b0 = pair_of(vr[0][h], vr[1][h], e);
        const uint32_t b1 = pair_of(vr[2][h], vr[3][h], e);
        mma_m16n8k16<T>::run(acc[j], pa, b0, b1);
      }
    }
  }

  /* merge the warps: row sums over the quad, then (m, l, O) through shared memory */
#pragma unroll
  for (int rr = 0; rr < 2; rr++) {
    l_run[rr] = quad_sum(l_run[rr]);
  }
  if (tq4 == 0) {
    s_m[warp][g] = m_run[0], s_m[warp][g + 8] = m_run[1];
    s_l[warp][g] = l_run[0], s_l[warp][g + 8] = l_run[1];
  }
  float *ow = s_o + (size_t)warp * 16 * D;
#pragma unroll
  for (int j = 0; j < NT; j++) {
    const int d0 = (j >> 3) * 64 + (tq4 * 2) * 8 + (j & 7), d1 = d0 + 8;
    ow[g * D + d0] = acc[j][0];
    ow[g * D + d1] = acc[j][1];
    ow[(g + 8) * D + d0] = acc[j][2];
    ow[(g + 8) * D + d1] = acc[j][3];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < 16 * D; idx += blockDim.x) {
    const int r = idx / D, dd = idx - r * D;
    const int64_t R = tile * 16 + r;
    if (R >= rows) continue;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kPaWarps; w++) M = fmaxf(M, s_m[w][r]);
    float L = 0.f, O = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kPaWarps; w++) {
        const float f = exp2f(s_m[w][r] - M);
        L += s_l[w][r] * f;
        O += s_o[((size_t)w * 16 + r) * D + dd] * f;
      }
    }
    const float o = L > 0.f ? O / L : 0.f;
    const float lse = L > 0.f ? (M + log2f(L)) * kLn2 : -INFINITY;
    const int64_t tok = q0 + R / p.group, head = (int64_t)kvh * p.group + R % p.group;
    if (p.splits == 1) {
      static_cast<T *>(p.out)[tok * p.o_ts + head * p.o_hs + dd] = from_f32<T>(o);
      if (p.lse && dd == 0) p.lse[head * p.lse_hs + tok * p.lse_ts] = lse;
    } else {
      const int64_t row = tok * p.hq + head;
      p.part_o[((int64_t)split * p.tq * p.hq + row) * D + dd] = o;
      if (dd == 0) p.part_lse[(int64_t)split * p.tq * p.hq + row] = lse;
    }
  }
}

/* ---- merge of the splits: one warp per (token, q head) row ----------------------------- */

template <typename T>
__global__ void __launch_bounds__(128) pa_merge_kernel(const __grid_constant__ pa_params p) {
  const int64_t row = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= p.tq * p.hq) return;
  const int64_t tok = row / p.hq, head = row - tok * p.hq;
  const int64_t rs = p.tq * p.hq;
  float M = -INFINITY;
  for (int s = 0; s < p.splits; s++) M = fmaxf(M, p.part_lse[s * rs + row]);
  float L = 0.f;
  if (M != -INFINITY)
    for (int s = 0; s < p.splits; s++) {
      const float ls = p.part_lse[s * rs + row];
      if (ls != -INFINITY) L += expf(ls - M);
    }
  const float lse = M != -INFINITY ? M + logf(L) : -INFINITY;
  T *o = static_cast<T *>(p.out) + tok * p.o_ts + head * p.o_hs;
  for (int dd = lane; dd < p.d; dd += 32) {
    float acc = 0.f;
    if (M != -INFINITY)
      for (int s = 0; s < p.splits; s++) {
        const float ls = p.part_lse[s * rs + row];
        if (ls != -INFINITY) acc += expf(ls - lse) * p.part_o[(s * rs + row) * p.d + dd];
      }
    o[dd] = from_f32<T>(acc);
  }
  if (p.lse && lane == 0) p.lse[head * p.lse_hs + tok * p.lse_ts] = lse;
}

/* ---- fallback: one warp per (token, q head) -------------------------------------------- */

constexpr int kPaFallbackMaxD = 512;

template <typename T>
__global__ void __launch_bounds__(128) pa_simple_kernel(const __grid_constant__ pa_params p) {
  constexpr int R = kPaFallbackMaxD / 32;
  const int64_t row = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= p.tq * p.hq) return;
  const int64_t tok = row / p.hq, head = row - tok * p.hq;
  const int64_t b = paged_seq_of(p.cu_q, p.batch, tok);
  if (!paged_cu_ok(p.cu_q, b, p.batch, p.tq, p.err)) return;
  const int64_t len = paged_seq_len(p.indptr, p.lpl, b, p.bs, p.num_indices, p.err);
  if (len < 0) return;
  const int64_t nq = (int64_t)p.cu_q[b + 1] - p.cu_q[b], i = tok - p.cu_q[b];
  const int64_t diag = i + len - nq;
  int64_t lo = p.wl >= 0 ? diag - p.wl : 0, hi = p.wr >= 0 ? diag + p.wr : len - 1;
  if (lo < 0) lo = 0;
  if (hi > len - 1) hi = len - 1;
  const int kvh = (int)(head / p.group);
  const T *qrow = static_cast<const T *>(p.q) + tok * p.q_ts + head * p.q_hs;
  float qv[R], acc[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int dd = lane + 32 * r;
    qv[r] = dd < p.d ? to_f32(qrow[dd]) : 0.f;
    acc[r] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int64_t j = lo; j <= hi; j++) {
    const int64_t pidx = p.indptr[b] + j / p.bs;
    int32_t pg = p.indices[pidx];
    if (p.err && (pg < 0 || pg >= p.num_pages)) {
      paged_flag(p.err, kPagedBadIndex, b, pidx, pg);
      return;
    }
    const int64_t off = (((int64_t)pg * p.hkv + kvh) * p.bs + j % p.bs) * p.d;
    const T *kr = static_cast<const T *>(p.k_pages) + off;
    const T *vr = static_cast<const T *>(p.v_pages) + off;
    float dot = 0.f;
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int dd = lane + 32 * r;
      if (dd < p.d) dot += qv[r] * to_f32(kr[dd]);
    }
    dot = warp_sum(dot);
    float x = dot * p.scale;
    if (p.softcap > 0) x = p.softcap * tanhf(x / p.softcap);
    const float m_new = fmaxf(m, x);
    const float alpha = expf(m - m_new), pj = expf(x - m_new);
    l = l * alpha + pj;
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int dd = lane + 32 * r;
      acc[r] = acc[r] * alpha + (dd < p.d ? pj * to_f32(vr[dd]) : 0.f);
    }
    m = m_new;
  }
  T *o = static_cast<T *>(p.out) + tok * p.o_ts + head * p.o_hs;
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int dd = lane + 32 * r;
    if (dd < p.d) o[dd] = from_f32<T>(l > 0.f ? acc[r] / l : 0.f);
  }
  if (p.lse && lane == 0) p.lse[head * p.lse_hs + tok * p.lse_ts] = l > 0.f ? m + logf(l) : -INFINITY;
}

/* ---- host side -------------------------------------------------------------------------- */

/* CTAs of pa_mma_kernel<T, D> per SM on the context's device (cached per device, first
 * 16 devices: occupancy differs between GPU models). */
template <typename T, int D>
static int pa_ctas_per_sm(int dev) {
  static int cached[16];
  if (dev >= 0 && dev < 16 && cached[dev] > 0) return cached[dev];
  int n = 0;
  const size_t smem = (size_t)kPaWarps * 16 * D * sizeof(float);
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, pa_mma_kernel<T, D>, kPaThreads, smem) !=
          cudaSuccess || n < 1) {
    (void)cudaGetLastError();
    n = 1;
  }
  if (dev >= 0 && dev < 16) cached[dev] = n;
  return n;
}

/* Splits per sequence: the fewest within 2% of the best wave-quantized cost
 * ceil(base * s / slots) / s, chunks of at least 256 keys (a CTA iteration). */
static int pa_plan_splits(int64_t base, int64_t est_len, int64_t slots) {
  int64_t max_s = est_len / kPaIter;
  if (max_s < 1) max_s = 1;
  if (max_s > 1024) max_s = 1024;
  double best = 1e30;
  for (int64_t s = 1; s <= max_s; s++) {
    const double c = (double)((base * s + slots - 1) / slots) / (double)s;
    if (c < best) best = c;
  }
  for (int64_t s = 1; s <= max_s; s++) {
    const double c = (double)((base * s + slots - 1) / slots) / (double)s;
    if (c <= best * 1.02) return (int)s;
  }
  return 1;
}

/* Context scratch for the OT_DEBUG flag (first 256 bytes, cleared) and the split
 * partials after it; p.err / p.part_* point into it. */
static ot_status pa_scratch(ot_context *ctx, pa_params &p, bool debug, size_t partial_bytes,
                            const char *op) {
  if (!debug && partial_bytes == 0) return OT_OK;
  char *scr = (char *)ot_cuda_scratch(ctx, 256 + partial_bytes, op);
  if (!scr) return OT_ERR_OOM;
  if (debug) {
    p.err = (int *)scr;
    OT_CUDA_CHECK(op, cudaMemsetAsync(p.err, 0, 4 * sizeof(int), (cudaStream_t)ctx->stream));
  }
  if (partial_bytes) {
    const size_t rs = (size_t)p.tq * p.hq;
    p.part_lse = (float *)(scr + 256);
    p.part_o = p.part_lse + (size_t)p.splits * rs;
  }
  return OT_OK;
}

template <typename T, int D>
static ot_status pa_launch_mma(ot_context *ctx, pa_params &p, bool debug, const char *op) {
  cudaStream_t s = (cudaStream_t)ctx->stream;
  const int64_t tiles_upper = p.batch + (p.tq * p.group + 15) / 16;
  if (tiles_upper > 0x7fffffff || p.hkv > 65535)
    return ot_error(OT_ERR_UNSUPPORTED, op, "grid too large (%lld tiles x %d kv heads)",
                    (long long)tiles_upper, p.hkv);
  /* estimates for the plan: equal queries per sequence, keys from the table's size */
  const int64_t qps = (p.tq + p.batch - 1) / p.batch;
  const int64_t tiles_est = p.batch * ((qps * p.group + 15) / 16);
  const int64_t est_len = p.num_indices * p.bs / p.batch;
  const ot_cuda_state *cs = ot_cuda_state_of(ctx);
  const int64_t slots = (int64_t)cs->sm_count * pa_ctas_per_sm<T, D>(cs->device);
  int splits = pa_plan_splits(tiles_est * p.hkv, est_len, slots);
  if (splits > 65535) splits = 65535;
  const char *env = getenv("OT_PAGED_SPLITS"); /* benchmarking / tests: force a count */
  if (env && atoi(env) > 0) splits = atoi(env) < 65535 ? atoi(env) : 65535;
  p.splits = splits;
  const size_t partial = splits > 1 ? (size_t)splits * p.tq * p.hq * (D + 1) * sizeof(float) : 0;
  OT_TRY(pa_scratch(ctx, p, debug, partial, op));
  const size_t smem = (size_t)kPaWarps * 16 * D * sizeof(float);
  if (smem > 48 * 1024)
    OT_CUDA_CHECK(op, cudaFuncSetAttribute(pa_mma_kernel<T, D>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const dim3 grid((unsigned)tiles_upper, (unsigned)p.hkv, (unsigned)splits);
  pa_mma_kernel<T, D><<<grid, kPaThreads, smem, s>>>(p);
  OT_CUDA_CHECK_LAUNCH(op);
  if (splits > 1) {
    const int64_t rows = p.tq * p.hq;
    pa_merge_kernel<T><<<(unsigned)((rows + 3) / 4), 128, 0, s>>>(p);
    OT_CUDA_CHECK_LAUNCH(op);
  }
  return OT_OK;
}

template <typename T>
static ot_status pa_launch_simple(ot_context *ctx, pa_params &p, bool debug, const char *op) {
  OT_TRY(pa_scratch(ctx, p, debug, 0, op));
  const int64_t rows = p.tq * p.hq;
  pa_simple_kernel<T><<<(unsigned)((rows + 3) / 4), 128, 0, (cudaStream_t)ctx->stream>>>(p);
  OT_CUDA_CHECK_LAUNCH(op);
  return OT_OK;
}

template <typename T>
static ot_status pa_dispatch(ot_context *ctx, pa_params &p, bool mma_ok, bool debug,
                             const char *op) {
  if constexpr (sizeof(T) == 2) {
    if (mma_ok && p.d == 64) return pa_launch_mma<T, 64>(ctx, p, debug, op);
    if (mma_ok && p.d == 128) return pa_launch_mma<T, 128>(ctx, p, debug, op);
  }
  return pa_launch_simple<T>(ctx, p, debug, op);
}

} /* namespace ot */

extern "C" ot_status ot_cuda_paged_attention(ot_context *ctx, const ot_paged_attention_args *a) {
  static const char *op = "ot_paged_attention";
  const ot_paged_table *t = &a->kv;
  if (a->tokens == 0 || t->batch == 0) return OT_OK;
  if (t->d > ot::kPaFallbackMaxD)
    return ot_error(OT_ERR_UNSUPPORTED, op, "head_dim %lld: the CUDA kernels handle up to %d",
                    (long long)t->d, ot::kPaFallbackMaxD);
  ot::pa_params p;
  memset(&p, 0, sizeof p);
  ot_paged_fill_table(p, t);
  p.cu_q = a->cu_q;
  p.tq = a->tokens;
  p.bs_shift = -1;
  for (int sh = 0; sh < 16; sh++)
    if ((1 << sh) == p.bs) p.bs_shift = sh;
  p.hq = (int)a->hq;
  p.group = (int)(a->hq / t->hkv);
  p.q = a->q;
  p.q_ts = a->q_tok_stride;
  p.q_hs = a->q_head_stride;
  p.out = a->out;
  p.o_ts = a->out_tok_stride;
  p.o_hs = a->out_head_stride;
  p.lse = a->lse;
  p.lse_hs = a->lse_head_stride;
  p.lse_ts = a->lse_tok_stride;
  p.scale = a->scale;
  p.softcap = a->softcap;
  p.wl = a->window_left;
  p.wr = a->window_right;
  p.splits = 1;
  {
    const char *pf = getenv("OT_PAGED_PREFETCH");
    p.prefetch = pf && pf[0] == '1' && ot_cuda_state_of(ctx)->cc_major >= 9;
  }
  const bool debug = ot_paged_debug();
  /* the tensor-core path: 16-bit types, head_dim 64 / 128, 16-byte aligned q rows and
   * pages (the pages are contiguous, so their base decides) */
  const size_t es = ot_dtype_size(a->dtype);
  const bool aligned = ot_rows_aligned16(a->q, a->q_tok_stride, es, a->tokens) &&
                       ((a->q_head_stride * (int64_t)es) & 15) == 0 &&
                       ot_is_aligned16(t->k_pages) && ot_is_aligned16(t->v_pages);
  const bool mma_ok = aligned && (a->dtype == OT_BF16 || a->dtype == OT_F16) &&
                      getenv("OT_PAGED_SIMPLE") == NULL;
  ot_status st;
  switch (a->dtype) {
    case OT_F32: st = ot::pa_dispatch<float>(ctx, p, false, debug, op); break;
    case OT_F16: st = ot::pa_dispatch<__half>(ctx, p, mma_ok, debug, op); break;
    case OT_BF16: st = ot::pa_dispatch<__nv_bfloat16>(ctx, p, mma_ok, debug, op); break;
    default: return ot_error(OT_ERR_INTERNAL, op, "unexpected dtype %d", (int)a->dtype);
  }
  if (st != OT_OK || !debug) return st;
  return ot_paged_debug_report(ctx, op, p.err, "cu_seqlens_q");
}
