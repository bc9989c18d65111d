/*
 * norm.cuh -- the CUDA kernels of RMSNorm and LayerNorm, written once for both
 * (LAYER = false: RMSNorm, true: LayerNorm) and instantiated by rmsnorm.cu and
 * layernorm.cu.
 *
 * Layout: a row group of blockDim.x threads (a multiple of 32) owns one row; a block
 * holds blockDim.y row groups (several rows per block when rows are short). Thread x
 * of a group handles the 16-byte vectors x, x + blockDim.x, ... (NV of them) of its
 * row, so a warp's accesses are contiguous 512-byte runs.
 *
 * Forward: the row is held in registers (x and residual read once from HBM, out and
 * residual_out written once); LayerNorm takes mean and variance in two exact passes
 * over the registers. Rows longer
 * than NV_MAX vectors per thread take a looping kernel that re-reads the row (from L2 in
 * practice).
 *
 * Programmatic dependent launch (sm_90, OT_NORM_PDL): forward v2 and the partials' sum
 * are launched as dependents of the previous kernel and wait (griddepcontrol.wait)
 * before their first global access; forward v2 (right after that wait, so the chain
 * stays ordered) and the backward's v2 / v3 / tma kernels (launched plainly) let their
 * dependents be scheduled at their start: safe only because every kernel launched as a
 * dependent (here, linear.cu, paged_attention.cu) waits for its predecessor's
 * completion before any access that may conflict with that kernel's (reading what it
 * writes, writing what it reads or writes; linear.cu's weight prefetch relies on no
 * norm writing a linear's weight).
 *
 * Backward: a persistent grid (SMs x occupancy blocks); each row group keeps fp32
 * partial sums of dweight / dbias for its columns in registers across the rows it
 * handles, writes them once to a [groups, cols] fp32 workspace, and a second kernel
 * sums the groups (two-stage reduction, no atomics). The workspace (and the recomputed
 * statistics) are the op's temporaries (ot_cuda_temp_alloc / ot_cuda_temp_free: the
 * context's arena when one is configured, else cudaMallocAsync / cudaFreeAsync on the
 * context's stream).
 *
 * Generations (all kept: the benchmark times them side by side through the env knobs
 * below): v1 (f46b949, any alignment: the fallback), v2 (aligned rows, more bytes in
 * flight per thread, register rings; the forward's default), v3 (aligned rows, the
 * backward's default, opt-in for the forward: v2's arithmetic with the rows staged in
 * shared memory by per-thread cp.async rings on a persistent grid, so the bytes in
 * flight per SM are bounded by shared memory, not registers), tma (sm_90, LayerNorm's
 * backward default for rows of 4-16 KB: the rows staged by 1-D bulk copies).
 *
 * All pointers may be NULL where the API allows it: residual (then residual_out is
 * unused), weight (= 1), bias (= 0), mean / rstd (not saved, or recomputed in the
 * backward), dresidual_out (no extra gradient), dweight / dbias partials.
 */
#ifndef OT_CUDA_NORM_CUH
#define OT_CUDA_NORM_CUH

#include <atomic>
#include <type_traits>
#include <stdlib.h>
#include <string.h>

#include "bulk_copy.cuh"
#include "common.cuh"
#include "cuda_state.h"
#include "pdl.cuh"
#include "unpack_fast.cuh"

namespace ot {

struct norm_fwd_params {
  int64_t rows, cols;
  const void *x;             /* [rows, cols], row stride x_stride */
  int64_t x_stride;
  const void *residual;      /* [rows, cols] or NULL */
  int64_t residual_stride;
  const void *weight;        /* [cols] or NULL */
  const void *bias;          /* [cols] or NULL (LayerNorm only) */
  void *out;                 /* [rows, cols] */
  int64_t out_stride;
  void *residual_out;        /* [rows, cols]; required when residual != NULL */
  int64_t residual_out_stride;
  float *mean;               /* [rows] or NULL (LayerNorm only) */
  float *rstd;               /* [rows] or NULL */
  float eps;
};

/* Forward v2 compile-time options (template parameter F of norm_fwd_row / the v2 kernel):
 * kNormFwdCs: out stored with the evict-first hint (st.global.cs); kNormFwdRegs: held to
 * 64 registers by __launch_bounds__ (8 blocks of 128 threads per SM, 4 of 256) -- the
 * LayerNorm instances without the residual at 8 vectors a thread, which ptxas otherwise
 * gives 72 (7 blocks of 128 per SM; RMSNorm's take 56 unbounded). Measured (H200, 16k x
 * 4096 bf16, run of ecdf3b4, ncu): 71.1 vs 73.3 us, DRAM 70.7 vs 69.0%, 8 vs 7 blocks per
 * SM; benchmark 3.68 vs 3.65 TB/s. Held to 56 (9 blocks) ptxas spills 240 bytes: 2.47.
 * (One-reduction statistics, Chan's merge of per-thread mean / squared deviations, took
 * 94 registers and ran at 2.88 there, 2.73 held to 56: removed. Again in the run for
 * aa39fb0 as one pass of per-thread sums around the thread's first element, merged in one
 * butterfly: 64 registers with a 32-byte spill, 45.5 M warp instructions, 3.39 vs 3.68
 * TB/s: removed; docs/PERFORMANCE.md.) */
constexpr int kNormFwdCs = 1, kNormFwdRegs = 4;
/* kNormFwdCut: RMSNorm's row work takes LayerNorm's instruction cut (norm_fwd_row's FAST:
 * integer bf16 unpack, 32-bit row bounds, the out pass with the weight's presence fixed per
 * row) -- the same values and order, so the same bits. The default since 2026-11-30 for
 * 16-bit rows of <= 4096 elements (norm_fwd_v2_cut_pick; OT_NORM_RMS_FWD_CUT=0: the plain
 * row work): balanced same-process A/B on the H200 (4 rounds, copy 4.26 TB/s; bench/results/
 * fused_ops_cut_ab.json) 16k x 4096 3.89 vs 3.85 TB/s, with the residual 3.97 vs 3.93, 8k x
 * 2048 3.47 vs 3.32 / 3.69 vs 3.59; 8192 (not taken) 3.90 / 4.05 either way; =2 no better
 * (3.89 / 3.97, 3.37 / 3.68). Before: LayerNorm's changes in RMSNorm with 4-chain row sums
 * measured +4.1% at 8k x 2048, +0.7% at 16k x 4096 and -2.9% at 16k x 8192 with the
 * residual (docs/PERFORMANCE.md); the 4 chains are not part of it. Instructions a thread on
 * the path taken (sm_90a SASS, bf16 with weight, every vector in the row): 2048 (one warp a
 * row, 8 vectors) 866 -> 658, with the residual 1224 -> 1010; 4096 (two warps) 897 -> 689,
 * 1254 -> 1040; registers at 8 vectors 56 -> 58 (64 allocated: 9 -> 8 blocks of 128
 * threads per SM; kNormFwdHold56 keeps 56 and 9, no spill, the same instructions), with the
 * residual 92 -> 96 (5 blocks either way). */
constexpr int kNormFwdCut = 8;
/* kNormFwdHold56: with kNormFwdCut, the instances without the residual at 8 vectors a thread
 * (rows of 128 threads) held to 56 registers -- 9 blocks per SM as the default's 56; ptxas
 * gives the cut 58 (64 allocated: 8 blocks). OT_NORM_RMS_FWD_CUT=2. */
constexpr int kNormFwdHold56 = 16;
/* kNormFwdLdPlain: x and the residual loaded by plain ld.global, not ld.global.cs (the
 * evict-first hint): every instance without the residual (norm_fwd_v2_select, 2026-12-04
 * evening, measured under an L2 scrub), and LayerNorm's 8-vector instances with the residual at 64 and 128 threads
 * (16-bit rows of 2056-8192 elements). Measured on the H200, 2026-12-04: a build A/B in one
 * process (8 balanced rounds, bench/results/fused_ops_norm_fwd_build_ab.json) 16k x 4096 4.00
 * vs 3.94 TB/s, 16k x 8192 4.08 vs 3.93; without the residual the same build read +0.3% at
 * 4096 and -1.0% at 8192 (the run-time switch's A/B had said +1.7% / +0.8%), so those keep the
 * hint. RMSNorm (not taken): +0.5% with the residual, -1% without at 8192 through the switch
 * (docs/PERFORMANCE.md). The same values: the same bits. Build A/Bs of 2026-12-04 (f7754b0's
 * hooks, not kept), RMSNorm 16k x 8192 without the residual: x loaded L1::evict_last (inductor's
 * first-pass hint) with plain or evict-first stores -1%; inductor's two-pass form (the row loaded
 * twice, the second time from L1; 512 threads x 2 vectors, 30 registers) +1% (4.11-4.12 vs
 * 4.07-4.08 TB/s; torch.compile 4.21), not enough to change the statistics' code, which the
 * backward's recompute and the fused forward share bit for bit (docs/PERFORMANCE.md). */
constexpr int kNormFwdLdPlain = 64;

/* __launch_bounds__ of forward v2: the block (TPR threads, or 128 as row groups of
 * TPR < 128), and with kNormFwdRegs the blocks per SM that hold the registers to 64. */
constexpr int norm_fwd_v2_block(int tpr) { return tpr >= 128 ? tpr : 128; }
constexpr int norm_fwd_v2_min_blocks(int tpr, int f) {
  return (f & kNormFwdRegs) ? (norm_fwd_v2_block(tpr) >= 256 ? 4 : 8)
         : (f & kNormFwdHold56) ? (norm_fwd_v2_block(tpr) >= 256 ? 4 : 9) : 1;
}

struct norm_bwd_params {
  int64_t rows, cols;
  const void *dy;            /* [rows, cols] */
  int64_t dy_stride;
  const void *dres;          /* [rows, cols] or NULL: gradient reaching residual_out */
  int64_t dres_stride;
  const void *h;             /* [rows, cols]: the normalized input */
  int64_t h_stride;
  const void *weight;        /* [cols] or NULL */
  const float *mean;         /* [rows] or NULL (recompute); LayerNorm only */
  const float *rstd;         /* [rows] or NULL (recompute) */
  float eps;
  void *dx;                  /* [rows, cols] */
  int64_t dx_stride;
  float *dw_part;            /* [groups, cols] fp32 or NULL */
  float *db_part;            /* [groups, cols] fp32 or NULL (LayerNorm only) */
};

constexpr int kNormMaxRowsPerBlock = 8;

/* Programmatic dependent launch: ot_pdl_wait / ot_pdl_launch_dependents (pdl.cuh). */

/* ---- forward, row in registers ------------------------------------------------------
 * x (+ residual), weight and bias loads are all issued before the reduction, and
 * residual_out is stored before it too, so each row costs one memory round trip. */
template <typename T, bool LAYER, int NV, bool ALIGNED>
__global__ void __launch_bounds__(512, NV <= 2 ? 2 : 1) norm_fwd_kernel(norm_fwd_params p) {
  constexpr int V = vec_width<T>::value;
  __shared__ float2 scratch[32 * kNormMaxRowsPerBlock];
  const int64_t n = p.cols;
  const int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  const bool valid = row < p.rows;
  const int64_t r = valid ? row : 0;
  const T *x = static_cast<const T *>(p.x) + r * p.x_stride;
  const T *res = p.residual ? static_cast<const T *>(p.residual) + r * p.residual_stride : nullptr;
  const T *w = static_cast<const T *>(p.weight);
  const T *b = LAYER ? static_cast<const T *>(p.bias) : nullptr;

  raw16 xr[NV], rr[NV], wr[NV], br[NV];
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int64_t base = ((int64_t)threadIdx.x + (int64_t)i * blockDim.x) * V;
    const bool in = valid && base < n;
    load_raw<T, ALIGNED, true>(xr[i], x, base, n, in);
    if (res) load_raw<T, ALIGNED, true>(rr[i], res, base, n, in);
    if (w) load_raw<T, ALIGNED, false>(wr[i], w, base, n, in);
    if (b) load_raw<T, ALIGNED, false>(br[i], b, base, n, in);
  }
  /* h stays packed in storage form (exact: with the residual it is rounded to T
   * anyway), halving the registers a row needs for 16-bit types. */
  T *rout = res ? static_cast<T *>(p.residual_out) + r * p.residual_out_stride : nullptr;
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    float hv[V];
    unpack<T>(hv, xr[i]);
    if (res) {
      float rv[V];
      unpack<T>(rv, rr[i]);
#pragma unroll
      for (int j = 0; j < V; j++) hv[j] += rv[j];
      pack<T>(xr[i], hv);
      unpack<T>(hv, xr[i]);
      const int64_t base = ((int64_t)threadIdx.x + (int64_t)i * blockDim.x) * V;
      if (valid && base < n) store_row_vec<T, ALIGNED>(rout, base, n, hv);
    }
#pragma unroll
    for (int j = 0; j < V; j++) s += LAYER ? hv[j] : hv[j] * hv[j];
  }
  /* Out-of-range elements are 0 (tails included), so they add nothing to the sums. */
  float *scr = reinterpret_cast<float *>(scratch);
  float mu = 0.0f, rs;
  if (LAYER) {
    mu = row_group_sum(s, scr) / (float)n;
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int64_t base = ((int64_t)threadIdx.x + (int64_t)i * blockDim.x) * V;
      float hv[V];
      unpack<T>(hv, xr[i]);
#pragma unroll
      for (int j = 0; j < V; j++) {
        const float d = base + j < n ? hv[j] - mu : 0.0f;
        v += d * d;
      }
    }
    rs = rsqrtf(row_group_sum(v, scr) / (float)n + p.eps);
  } else {
    rs = rsqrtf(row_group_sum(s, scr) / (float)n + p.eps);
  }
  if (!valid) return;

  T *out = static_cast<T *>(p.out) + r * p.out_stride;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int64_t base = ((int64_t)threadIdx.x + (int64_t)i * blockDim.x) * V;
    if (base >= n) continue;
    float hv[V], wv[V], bv[V], o[V];
    unpack<T>(hv, xr[i]);
    if (w) unpack<T>(wv, wr[i]);
    if (b) unpack<T>(bv, br[i]);
#pragma unroll
    for (int j = 0; j < V; j++) {
      float y = (hv[j] - mu) * rs;
      if (w) y *= wv[j];
      if (b) y += bv[j];
      o[j] = y;
    }
    store_row_vec<T, ALIGNED>(out, base, n, o);
  }
  if (threadIdx.x == 0) {
    if (p.rstd) p.rstd[r] = rs;
    if (LAYER && p.mean) p.mean[r] = mu;
  }
}

/* ---- forward, long rows: loops over the row, re-reading it ------------------------- */

template <typename T, bool LAYER, bool ALIGNED>
__global__ void __launch_bounds__(1024) norm_fwd_loop_kernel(norm_fwd_params p) {
  constexpr int V = vec_width<T>::value;
  __shared__ float2 scratch[32 * kNormMaxRowsPerBlock];
  float *scr = reinterpret_cast<float *>(scratch);
  const int64_t n = p.cols;
  const int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  const bool valid = row < p.rows;
  const int64_t r = valid ? row : 0;
  const T *x = static_cast<const T *>(p.x) + r * p.x_stride;
  const T *res = p.residual ? static_cast<const T *>(p.residual) + r * p.residual_stride : nullptr;
  T *rout = res ? static_cast<T *>(p.residual_out) + r * p.residual_out_stride : nullptr;
  /* After pass 1 the (rounded) h lives in residual_out when fused, else in x; each
   * thread re-reads only the elements it wrote itself, so aliasing is safe. */
  const T *hsrc = res ? rout : x;
  const int64_t step = (int64_t)blockDim.x * V;

  float s = 0.0f;
  if (valid) {
    for (int64_t base = (int64_t)threadIdx.x * V; base < n; base += step) {
      float hv[V];
      load_row_vec<T, ALIGNED>(hv, x, base, n);
      if (res) {
        float rv[V];
        load_row_vec<T, ALIGNED>(rv, res, base, n);
#pragma unroll
        for (int j = 0; j < V; j++) hv[j] = round_to<T>(hv[j] + rv[j]);
        store_row_vec<T, ALIGNED>(rout, base, n, hv);
      }
#pragma unroll
      for (int j = 0; j < V; j++) s += LAYER ? hv[j] : hv[j] * hv[j];
    }
  }
  float mu = 0.0f, rs;
  if (LAYER) {
    mu = row_group_sum(s, scr) / (float)n;
    float v = 0.0f;
    if (valid) {
      for (int64_t base = (int64_t)threadIdx.x * V; base < n; base += step) {
        float hv[V];
        load_row_vec<T, ALIGNED>(hv, hsrc, base, n);
#pragma unroll
        for (int j = 0; j < V; j++) {
          const float d = base + j < n ? hv[j] - mu : 0.0f;
          v += d * d;
        }
      }
    }
    rs = rsqrtf(row_group_sum(v, scr) / (float)n + p.eps);
  } else {
    rs = rsqrtf(row_group_sum(s, scr) / (float)n + p.eps);
  }
  if (!valid) return;
  T *out = static_cast<T *>(p.out) + r * p.out_stride;
  const T *w = static_cast<const T *>(p.weight);
  const T *b = LAYER ? static_cast<const T *>(p.bias) : nullptr;
  for (int64_t base = (int64_t)threadIdx.x * V; base < n; base += step) {
    float hv[V], wv[V], bv[V];
    load_row_vec<T, ALIGNED>(hv, hsrc, base, n);
    if (w) load_row_vec<T, ALIGNED>(wv, w, base, n);
    if (b) load_row_vec<T, ALIGNED>(bv, b, base, n);
#pragma unroll
    for (int j = 0; j < V; j++) {
      float y = (hv[j] - mu) * rs;
      if (w) y *= wv[j];
      if (b) y += bv[j];
      hv[j] = y;
    }
    store_row_vec<T, ALIGNED>(out, base, n, hv);
  }
  if (threadIdx.x == 0) {
    if (p.rstd) p.rstd[r] = rs;
    if (LAYER && p.mean) p.mean[r] = mu;
  }
}

/* ---- backward, row in registers, persistent grid --------------------------------------
 * RMSNorm:   g = dy*w, dx = r*(g - h*r^2*mean(g*h)) [+ dres],  dw += dy*h*r
 * LayerNorm: xh = (h-mu)*r, dx = r*(g - mean(g) - xh*mean(g*xh)) [+ dres],
 *            dw += dy*xh, db += dy
 * h and dy stay packed in storage form (raw 16-byte registers) and are unpacked in
 * each pass; the next row's h and dy are loaded while the current row is reduced, so
 * a row's loads are always in flight. Partial row of group (blockIdx.x, threadIdx.y)
 * is blockIdx.x * blockDim.y + y. */
template <typename T, bool LAYER, int NV, bool ALIGNED>
__global__ void __launch_bounds__(512, NV <= 1 ? 2 : 1) norm_bwd_kernel(norm_bwd_params p) {
  constexpr int V = vec_width<T>::value;
  __shared__ float2 scratch[32 * kNormMaxRowsPerBlock];
  float *scr = reinterpret_cast<float *>(scratch);
  const int64_t n = p.cols;
  const float inv_n = 1.0f / (float)n;
  const T *w = static_cast<const T *>(p.weight);
  const bool want_dw = p.dw_part != nullptr, want_db = LAYER && p.db_part != nullptr;

  raw16 wr[NV], hc[NV], dc[NV], hn[NV], dn[NV];
  float dw[NV][V], db[NV][V];
  const int64_t stride_rows = (int64_t)gridDim.x * blockDim.y;
  int64_t row0 = (int64_t)blockIdx.x * blockDim.y;
  {
    const int64_t row = row0 + threadIdx.y;
    const bool valid = row < p.rows;
    const T *hp = static_cast<const T *>(p.h) + (valid ? row : 0) * p.h_stride;
    const T *dyp = static_cast<const T *>(p.dy) + (valid ? row : 0) * p.dy_stride;
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int64_t base = ((int64_t)threadIdx.x + (int64_t)i * blockDim.x) * V;
#pragma unroll
      for (int j = 0; j < V; j++) dw[i][j] = 0.0f, db[i][j] = 0.0f;
      load_raw<T, ALIGNED, false>(wr[i], w, base, n, w != nullptr && base < n);
      load_raw<T, ALIGNED, true>(hc[i], hp, base, n, valid && base < n);
      load_raw<T, ALIGNED, true>(dc[i], dyp, base, n, valid && base < n);
    }
  }

  for (; row0 < p.rows; row0 += stride_rows) {
    const int64_t row = row0 + threadIdx.y;
    const bool valid = row < p.rows;
    const int64_t r = valid ? row : 0;
    /* prefetch the next row of this group */
    {
      const int64_t nrow = row + stride_rows;
      const bool nvalid = nrow < p.rows;
      const T *hp = static_cast<const T *>(p.h) + (nvalid ? nrow : 0) * p.h_stride;
      const T *dyp = static_cast<const T *>(p.dy) + (nvalid ? nrow : 0) * p.dy_stride;
#pragma unroll
      for (int i = 0; i < NV; i++) {
        const int64_t base = ((int64_t)threadIdx.x + (int64_t)i * blockDim.x) * V;
        load_raw<T, ALIGNED, true>(hn[i], hp, base, n, nvalid && base < n);
        load_raw<T, ALIGNED, true>(dn[i], dyp, base, n, nvalid && base < n);
      }
    }
    /* Statistics: saved, or recomputed exactly as the forward does. */
    float mu = 0.0f, rs;
    if (p.rstd) {
      rs = valid ? p.rstd[r] : 1.0f;
      if (LAYER) mu = valid ? p.mean[r] : 0.0f;
    } else if (LAYER) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < NV; i++) {
        float hv[V];
        unpack<T>(hv, hc[i]);
#pragma unroll
        for (int j = 0; j < V; j++) s += hv[j];
      }
      mu = row_group_sum(s, scr) * inv_n;
      float v = 0.0f;
#pragma unroll
      for (int i = 0; i < NV; i++) {
        const int64_t base = ((int64_t)threadIdx.x + (int64_t)i * blockDim.x) * V;
        float hv[V];
        unpack<T>(hv, hc[i]);
#pragma unroll
        for (int j = 0; j < V; j++) {
          const float d = base + j < n ? hv[j] - mu : 0.0f;
          v += d * d;
        }
      }
      rs = rsqrtf(row_group_sum(v, scr) * inv_n + p.eps);
    } else {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < NV; i++) {
        float hv[V];
        unpack<T>(hv, hc[i]);
#pragma unroll
        for (int j = 0; j < V; j++) s += hv[j] * hv[j];
      }
      rs = rsqrtf(row_group_sum(s, scr) * inv_n + p.eps);
    }
    /* weight-gradient partials and the two row sums */
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int64_t base = ((int64_t)threadIdx.x + (int64_t)i * blockDim.x) * V;
      float hv[V], dyv[V], wv[V];
      unpack<T>(hv, hc[i]);
      unpack<T>(dyv, dc[i]);
      if (w) unpack<T>(wv, wr[i]);
#pragma unroll
      for (int j = 0; j < V; j++) {
        const bool in = base + j < n;
        const float xh = in ? (hv[j] - mu) * rs : 0.0f;
        if (want_dw) dw[i][j] += dyv[j] * xh;
        if (want_db) db[i][j] += dyv[j];
        /* __fmul_rn everywhere g = dy * w is formed: the sums and dx must see the same
         * rounded product. A product contracted into an FMA in dx keeps its rounding error,
         * which rstd amplifies (a constant row has rstd = 1/sqrt(eps)). */
        const float gg = w ? __fmul_rn(dyv[j], wv[j]) : dyv[j];
        sg += gg;
        sgx += gg * xh;
      }
    }
    float a = 0.0f, c;
    if (LAYER) {
      const float2 t = row_group_sum2(sg, sgx, scr);
      a = t.x * inv_n;
      c = t.y * inv_n;
    } else {
      c = row_group_sum(sgx, scr) * inv_n;
    }
    if (valid) {
      T *dxp = static_cast<T *>(p.dx) + r * p.dx_stride;
      const T *drp = p.dres ? static_cast<const T *>(p.dres) + r * p.dres_stride : nullptr;
#pragma unroll
      for (int i = 0; i < NV; i++) {
        const int64_t base = ((int64_t)threadIdx.x + (int64_t)i * blockDim.x) * V;
        if (base >= n) continue;
        float hv[V], dyv[V], wv[V], o[V], dr[V];
        unpack<T>(hv, hc[i]);
        unpack<T>(dyv, dc[i]);
        if (w) unpack<T>(wv, wr[i]);
        if (drp) load_row_vec<T, ALIGNED>(dr, drp, base, n);
#pragma unroll
        for (int j = 0; j < V; j++) {
          const float xh = (hv[j] - mu) * rs;
          const float gg = w ? __fmul_rn(dyv[j], wv[j]) : dyv[j];
          o[j] = rs * (gg - a - xh * c);
          if (drp) o[j] += dr[j];
        }
        store_row_vec<T, ALIGNED>(dxp, base, n, o);
      }
    }
#pragma unroll
    for (int i = 0; i < NV; i++) hc[i] = hn[i], dc[i] = dn[i];
  }

  const int64_t part = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int64_t base = ((int64_t)threadIdx.x + (int64_t)i * blockDim.x) * V;
#pragma unroll
    for (int j = 0; j < V; j++) {
      if (base + j >= n) continue;
      if (want_dw) p.dw_part[part * n + base + j] = dw[i][j];
      if (want_db) p.db_part[part * n + base + j] = db[i][j];
    }
  }
}

/* ---- backward, long rows: loops, partials accumulated in the workspace row that the
 * group owns (read-modify-write by its single owner thread, no atomics). ---------------- */
template <typename T, bool LAYER, bool ALIGNED>
__global__ void __launch_bounds__(1024) norm_bwd_loop_kernel(norm_bwd_params p) {
  constexpr int V = vec_width<T>::value;
  __shared__ float2 scratch[32 * kNormMaxRowsPerBlock];
  float *scr = reinterpret_cast<float *>(scratch);
  const int64_t n = p.cols;
  const float inv_n = 1.0f / (float)n;
  const T *w = static_cast<const T *>(p.weight);
  const bool want_dw = p.dw_part != nullptr, want_db = LAYER && p.db_part != nullptr;
  const int64_t part = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  const int64_t step = (int64_t)blockDim.x * V;
  float *dwp = want_dw ? p.dw_part + part * n : nullptr;
  float *dbp = want_db ? p.db_part + part * n : nullptr;
  for (int64_t base = (int64_t)threadIdx.x * V; base < n; base += step)
    for (int j = 0; j < V && base + j < n; j++) {
      if (dwp) dwp[base + j] = 0.0f;
      if (dbp) dbp[base + j] = 0.0f;
    }

  const int64_t stride_rows = (int64_t)gridDim.x * blockDim.y;
  for (int64_t row0 = (int64_t)blockIdx.x * blockDim.y; row0 < p.rows; row0 += stride_rows) {
    const int64_t row = row0 + threadIdx.y;
    const bool valid = row < p.rows;
    const int64_t r = valid ? row : 0;
    const T *hp = static_cast<const T *>(p.h) + r * p.h_stride;
    const T *dyp = static_cast<const T *>(p.dy) + r * p.dy_stride;
    float mu = 0.0f, rs;
    if (p.rstd) {
      rs = valid ? p.rstd[r] : 1.0f;
      if (LAYER) mu = valid ? p.mean[r] : 0.0f;
    } else {
      float s = 0.0f;
      if (valid)
        for (int64_t base = (int64_t)threadIdx.x * V; base < n; base += step) {
          float hv[V];
          load_row_vec<T, ALIGNED>(hv, hp, base, n);
#pragma unroll
          for (int j = 0; j < V; j++) s += LAYER ? hv[j] : hv[j] * hv[j];
        }
      if (LAYER) {
        mu = row_group_sum(s, scr) * inv_n;
        float v = 0.0f;
        if (valid)
          for (int64_t base = (int64_t)threadIdx.x * V; base < n; base += step) {
            float hv[V];
            load_row_vec<T, ALIGNED>(hv, hp, base, n);
#pragma unroll
            for (int j = 0; j < V; j++) {
              const float d = base + j < n ? hv[j] - mu : 0.0f;
              v += d * d;
            }
          }
        rs = rsqrtf(row_group_sum(v, scr) * inv_n + p.eps);
      } else {
        rs = rsqrtf(row_group_sum(s, scr) * inv_n + p.eps);
      }
    }
    float sg = 0.0f, sgx = 0.0f;
    if (valid)
      for (int64_t base = (int64_t)threadIdx.x * V; base < n; base += step) {
        float hv[V], dyv[V], wv[V];
        load_row_vec<T, ALIGNED>(hv, hp, base, n);
        load_row_vec<T, ALIGNED>(dyv, dyp, base, n);
        if (w) load_row_vec<T, ALIGNED>(wv, w, base, n);
#pragma unroll
        for (int j = 0; j < V; j++) {
          if (base + j >= n) continue;
          const float xh = (hv[j] - mu) * rs;
          const float gg = w ? __fmul_rn(dyv[j], wv[j]) : dyv[j];
          sg += gg;
          sgx += gg * xh;
          if (dwp) dwp[base + j] += dyv[j] * xh;
          if (dbp) dbp[base + j] += dyv[j];
        }
      }
    float a = 0.0f, c;
    if (LAYER) {
      const float2 t = row_group_sum2(sg, sgx, scr);
      a = t.x * inv_n;
      c = t.y * inv_n;
    } else {
      c = row_group_sum(sgx, scr) * inv_n;
    }
    if (!valid) continue;
    T *dxp = static_cast<T *>(p.dx) + r * p.dx_stride;
    const T *drp = p.dres ? static_cast<const T *>(p.dres) + r * p.dres_stride : nullptr;
    for (int64_t base = (int64_t)threadIdx.x * V; base < n; base += step) {
      float hv[V], dyv[V], wv[V], dr[V], o[V];
      load_row_vec<T, ALIGNED>(hv, hp, base, n);
      load_row_vec<T, ALIGNED>(dyv, dyp, base, n);
      if (w) load_row_vec<T, ALIGNED>(wv, w, base, n);
      if (drp) load_row_vec<T, ALIGNED>(dr, drp, base, n);
#pragma unroll
      for (int j = 0; j < V; j++) {
        const float xh = (hv[j] - mu) * rs;
        const float gg = w ? __fmul_rn(dyv[j], wv[j]) : dyv[j];
        o[j] = rs * (gg - a - xh * c);
        if (drp) o[j] += dr[j];
      }
      store_row_vec<T, ALIGNED>(dxp, base, n, o);
    }
  }
}

/* ---- stage two: sum the partial rows -------------------------------------------------
 * dw[c] = sum_p dw_part[p, c]; block (32 columns) x (32 partial-row lanes), each lane's
 * loads unrolled by 4 so a lane has its ~parts/32 loads in flight at once (the kernel is
 * a few L2 round trips, not a loop of them; unrolled by 16: the same time, run of
 * 718ecab). dw / db NULL: not wanted; parts == 0 writes zeros (no rows). Waits for the
 * previous grid first: it is launched as that grid's programmatic dependent (OT_NORM_PDL).
 * Measured (ncu, run of 718ecab, 16k x 4096 bf16, 528 partial rows): 7-10 us, 18-25% of
 * DRAM bandwidth (latency-bound: 128 blocks, one per 32 columns), 6-8% of the backward's
 * time. Since 8b0b8b7 the fallback: H % 4 != 0, or OT_NORM_REDUCE=old (the v2 kernel below
 * is the default: RMSNorm bwd 16k x 4096 bf16 3.38 vs 3.28 TB/s with this one, run of
 * 8b0b8b7). */
template <typename T>
__global__ void __launch_bounds__(1024) norm_reduce_partials_kernel(
    const float *__restrict__ dw_part, const float *__restrict__ db_part, int64_t parts,
    int64_t n, T *dw, T *db) {
  __shared__ float sw[32][33], sb[32][33];
  ot_pdl_wait();
  const int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x;
  float aw = 0.0f, ab = 0.0f;
  if (c < n) {
#pragma unroll 4
    for (int64_t q = threadIdx.y; q < parts; q += blockDim.y) {
      if (dw) aw += dw_part[q * n + c];
      if (db) ab += db_part[q * n + c];
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < n) {
    for (int k = 1; k < (int)blockDim.y; k++) aw += sw[k][threadIdx.x], ab += sb[k][threadIdx.x];
    if (dw) dw[c] = from_f32<T>(aw);
    if (db) db[c] = from_f32<T>(ab);
  }
}

/* The partials' sum, wide (OT_NORM_REDUCE unset; the kernel above with =old): 16 columns
 * per block as float4 (4 lanes of a warp, 64 bytes of a partial row), 128 partial-row
 * lanes (8 per warp x 16 warps); a lane's loads of B rows (predicated) are issued before
 * any is added, so that the lanes of the 16k x 4096 case (528 partial rows: about 4
 * each) hold all their rows in flight at once (ptxas keeps them batched under
 * __launch_bounds__(512, 2); with (512) alone it targeted 40 registers and interleaved
 * the loads with the adds, two in flight). cols / 16 blocks (256 at 4096, against 128 blocks of 4-byte loads
 * above). NB = 2: a (dweight) and b (dbias) partials, summed into oa / ob; NB = 1: a
 * only (the launch passes whichever is wanted as a). Sum: fixed order per lane, a fixed
 * xor tree over the warp's 8 row lanes, then the 16 warps in order through shared memory
 * (deterministic; no atomics). Needs cols % 4 == 0 (16-byte aligned partial rows; the
 * launch checks). parts == 0 writes zeros. Index math before the wait on the previous
 * grid (OT_NORM_PDL). Fewer partial rows by clusters of 4 backward blocks summing theirs
 * through distributed shared memory first lost (run for aa39fb0: 75 registers, fewer
 * blocks resident; RMSNorm 16k x 4096 3.57 vs 3.72 TB/s, 8k x 2048 with dres 2.13 vs 2.27). */
__device__ __forceinline__ void f4_add(float4 &a, const float4 &b) {
  a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
}
__device__ __forceinline__ float4 f4_shfl_xor(const float4 &v, int m) {
  return make_float4(__shfl_xor_sync(0xffffffffu, v.x, m), __shfl_xor_sync(0xffffffffu, v.y, m),
                     __shfl_xor_sync(0xffffffffu, v.z, m), __shfl_xor_sync(0xffffffffu, v.w, m));
}
template <typename T>
__device__ __forceinline__ void store4(T *o, const float4 &v) {
  o[0] = from_f32<T>(v.x), o[1] = from_f32<T>(v.y), o[2] = from_f32<T>(v.z), o[3] = from_f32<T>(v.w);
}
template <typename T, int NB>
__global__ void __launch_bounds__(512, 2) norm_reduce_partials_v2_kernel(
    const float *__restrict__ pa, const float *__restrict__ pb, int64_t parts, int64_t n,
    T *oa, T *ob) {
  constexpr int B = NB == 1 ? 8 : 5; /* rows per lane per batch: 64 registers at most */
  __shared__ float4 sm[NB][16][4];
  const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
  const int x = lane & 3;
  const int64_t c = (int64_t)blockIdx.x * 16 + x * 4;
  const bool in = c < n;
  const float *src[2] = {pa + (in ? c : 0), NB == 2 ? pb + (in ? c : 0) : nullptr};
  const int64_t stride = 128 * n;
  float4 acc[NB];
#pragma unroll
  for (int j = 0; j < NB; j++) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  ot_pdl_wait();
  if (in) {
    for (int64_t q = warp * 8 + (lane >> 2); q < parts; q += 128 * B) {
      float4 v[NB][B];
#pragma unroll
      for (int k = 0; k < B; k++)
#pragma unroll
        for (int j = 0; j < NB; j++)
          v[j][k] = q + k * 128 < parts
                        ? __ldcs(reinterpret_cast<const float4 *>(src[j] + q * n + k * stride))
                        : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int k = 0; k < B; k++)
#pragma unroll
        for (int j = 0; j < NB; j++) f4_add(acc[j], v[j][k]);
    }
  }
#pragma unroll
  for (int m = 4; m < 32; m <<= 1)
#pragma unroll
    for (int j = 0; j < NB; j++) f4_add(acc[j], f4_shfl_xor(acc[j], m));
  if (lane < 4)
#pragma unroll
    for (int j = 0; j < NB; j++) sm[j][warp][lane] = acc[j];
  __syncthreads();
  if (threadIdx.x < 4 && in) {
#pragma unroll
    for (int j = 0; j < NB; j++) {
      float4 t = sm[j][0][x];
      for (int k = 1; k < 16; k++) f4_add(t, sm[j][k][x]);
      store4<T>((j == 0 ? oa : ob) + c, t);
    }
  }
}

/* Make the compiler forget what a packed register holds, so that the float32 values
 * unpacked from it in an earlier pass are not kept alive (CSE) across a reduction:
 * unpacking again costs a few integer ops, keeping them costs the registers that
 * would otherwise hold more bytes in flight. */
__device__ __forceinline__ void opaque(raw16 &r) {
  asm volatile("" : "+r"(r.u.x), "+r"(r.u.y), "+r"(r.u.z), "+r"(r.u.w));
}

/* out = (h - mu) * rs * w + b per element, as y = h * rs + nmr (nmr = -mu * rs, one FMA)
 * then one FMA with weight and bias: the expression of forward v2 / v3. has_w / has_b
 * false: 1 / 0. */
template <bool LAYER, int V>
__device__ __forceinline__ void norm_fwd_out(const float *hv, const float *wv, const float *bv,
                                             bool has_w, bool has_b, float rs, float nmr,
                                             float *o) {
#pragma unroll
  for (int j = 0; j < V; j++) {
    float y = LAYER ? fmaf(hv[j], rs, nmr) : hv[j] * rs;
    if (has_w && has_b) y = fmaf(y, wv[j], bv[j]);
    else if (has_w) y *= wv[j];
    else if (has_b) y += bv[j];
    o[j] = y;
  }
}

/* Store f[0..VEC) rounded to T at p (16-byte aligned) with the evict-first hint
 * (st.global.cs): data not read again soon. */
template <typename T>
__device__ __forceinline__ void store_vec_cs(T *p, const float *f) {
  raw16 r;
  pack<T>(r, f);
  __stcs(reinterpret_cast<uint4 *>(p), r.u);
}

/* unpack<T>, or for the forward's row work (FAST: LayerNorm, RMSNorm's kNormFwdCut)
 * unpack_fast<T> (unpack_fast.cuh: bf16 by one integer op per element; the same values). */
template <typename T, bool FAST>
__device__ __forceinline__ void norm_unpack(float *f, const raw16 &r) {
  if (FAST) unpack_fast<T>(f, r);
  else unpack<T>(f, r);
}

/* Sum over the thread's in-row vectors of (h - center)^2 (the row's elements in xr). */
template <typename T, int NV, int TPR>
__device__ __forceinline__ float norm_sq_dev(raw16 (&xr)[NV], float center, int n) {
  constexpr int V = vec_width<T>::value;
  float v = 0.0f;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int base = ((int)threadIdx.x + i * TPR) * V;
    float hv[V];
    opaque(xr[i]);
    norm_unpack<T, true>(hv, xr[i]);
    if (base < n) {
#pragma unroll
      for (int j = 0; j < V; j++) v += (hv[j] - center) * (hv[j] - center);
    }
  }
  return v;
}

/* A plain 16-byte global load (ld.global: the pointer has gone through an empty asm,
 * after which the compiler would emit a generic ld). volatile: a non-volatile asm is a
 * pure function to the compiler, which hoisted the weight load common to the out pass's
 * <HW, HB> branches above the test of the pointer -- in the v3 kernels with the residual,
 * a no-weight call read address 16 * thread (memcheck, 2026-11-30); the v2 kernels' SASS
 * is the same either way. */
__device__ __forceinline__ uint4 norm_ld_global(const void *p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

/* LayerNorm's out pass with the weight / bias presence fixed (HW / HB): one branch per
 * row instead of a test of each pointer at each vector. w / b / out point at the
 * thread's first vector, the others at immediate offsets. Each vector's weight and bias
 * loads wait (an empty asm on the pointers) for the previous vector's result: without it
 * ptxas hoists all of them (64 more registers, spilled under kNormFwdRegs's 64) -- the
 * order the per-vector tests gave. */
template <typename T, bool LAYER, int NV, int TPR, int F, bool HW, bool HB>
__device__ __forceinline__ void norm_fwd_out_pass(raw16 (&xr)[NV], const T *w, const T *b,
                                                  T *out, int n, float rs, float nmr) {
  constexpr int V = vec_width<T>::value;
  const int t0 = (int)threadIdx.x * V;
  if (HW) w += t0;
  if (HB) b += t0;
  out += t0;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    if (t0 + i * TPR * V >= n) break;
    float hv[V], wv[V], bv[V], o[V];
    opaque(xr[i]);
    norm_unpack<T, true>(hv, xr[i]);
    raw16 t;
    if (HW) {
      t.u = norm_ld_global(w + i * TPR * V);
      norm_unpack<T, true>(wv, t);
    }
    if (HB) {
      t.u = norm_ld_global(b + i * TPR * V);
      norm_unpack<T, true>(bv, t);
    }
    norm_fwd_out<LAYER, V>(hv, wv, bv, HW, HB, rs, nmr, o);
    pack<T>(t, o);
    if (F & kNormFwdCs) __stcs(reinterpret_cast<uint4 *>(out + i * TPR * V), t.u);
    else *reinterpret_cast<uint4 *>(out + i * TPR * V) = t.u;
    if (HW) asm volatile("" : "+l"(w) : "r"(t.u.x));
    if (HB) asm volatile("" : "+l"(b) : "r"(t.u.x));
  }
}

/* The per-row work of forward v2 / v3 once the thread's NV vectors of x (and of the
 * residual) are in registers: residual add and store, the statistics, out. Both
 * kernels call it with the same thread-to-vector map (vector x + i * TPR), so they
 * give the same bits. valid: the row exists (the barriers are passed either way).
 * LayerNorm (FAST) unpacks bf16 with norm_unpack's integer ops, bounds the row in 32
 * bits (rows held in registers have at most 256 x 16 vectors) and takes the out pass of
 * norm_fwd_out_pass: the same values and order, so the same bits, and ~1460 -> ~1060
 * instructions per thread (64 elements at 4096 bf16, weight and bias) on the path taken
 * (sm_90a SASS; the out pass ~700 -> ~400, the unpacks of the two sums ~100); measured
 * (H200, 2026-11-30 night, balanced same-process A/B against the parent's kernels):
 * 3.81 vs 3.69 TB/s at 16k x 4096, 3.32 vs 2.96 at 8k x 2048, with the residual 3.96 vs
 * 3.85 / 3.65 vs 3.46, 16k x 8192 4.04 vs 4.00. RMSNorm keeps the plain code by default: the
 * same changes there (with the row sums in 4 chains) gave +0.7% at 4096 but -2.9% at 8192
 * with the residual; its opt-in kNormFwdCut takes them (without the 4 chains) for 16-bit rows
 * of <= 4096 elements. The row sums in 4 independent chains (shorter dependent chains, other
 * bits) gave LayerNorm nothing (with them 3.81 / 3.95 / 4.03 / 3.34 there): not kept.
 * docs/PERFORMANCE.md. */
template <typename T, bool LAYER, int NV, bool RES, int TPR, int F>
__device__ __forceinline__ void norm_fwd_row(const norm_fwd_params &p, raw16 (&xr)[NV],
                                             const raw16 (&rr)[NV], int64_t r, bool valid,
                                             float *scr) {
  constexpr int V = vec_width<T>::value;
  constexpr bool FAST = LAYER || (F & kNormFwdCut) != 0;
  using ntype = typename std::conditional<FAST, int, int64_t>::type;
  const ntype n = (ntype)p.cols;
  float s = 0.0f;
  if (RES) {
    T *rout = static_cast<T *>(p.residual_out) + r * p.residual_out_stride;
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int base = ((int)threadIdx.x + i * TPR) * V;
      float hv[V], rv[V];
      norm_unpack<T, FAST>(hv, xr[i]);
      norm_unpack<T, FAST>(rv, rr[i]);
#pragma unroll
      for (int j = 0; j < V; j++) hv[j] += rv[j];
      pack<T>(xr[i], hv); /* h rounded to storage: what residual_out holds */
      if (valid && base < n) *reinterpret_cast<uint4 *>(rout + base) = xr[i].u;
    }
  }
#pragma unroll
  for (int i = 0; i < NV; i++) {
    float hv[V];
    norm_unpack<T, FAST>(hv, xr[i]);
#pragma unroll
    for (int j = 0; j < V; j++) s += LAYER ? hv[j] : hv[j] * hv[j];
  }
  /* Out-of-range vectors are 0, so they add nothing to the sums. */
  float mu = 0.0f, rs;
  if (LAYER) {
    mu = row_group_sum(s, scr) / (float)n;
    const float v = norm_sq_dev<T, NV, TPR>(xr, mu, (int)n);
    rs = rsqrtf(row_group_sum(v, scr) / (float)n + p.eps);
  } else {
    rs = rsqrtf(row_group_sum(s, scr) / (float)n + p.eps);
  }
  if (!valid) return;
  if (!p.out) { /* statistics only (the backward's recompute: the same bits as here) */
    if (threadIdx.x == 0) {
      if (p.rstd) p.rstd[r] = rs;
      if (LAYER && p.mean) p.mean[r] = mu;
    }
    return;
  }

  const T *w = static_cast<const T *>(p.weight);
  const float nmr = -mu * rs; /* y = h * rs + nmr: one FMA per element */
  const T *b = LAYER ? static_cast<const T *>(p.bias) : nullptr;
  T *out = static_cast<T *>(p.out) + r * p.out_stride;
  if (FAST) {
    const int n32 = (int)n;
    if (w && b) norm_fwd_out_pass<T, LAYER, NV, TPR, F, true, true>(xr, w, b, out, n32, rs, nmr);
    else if (w) norm_fwd_out_pass<T, LAYER, NV, TPR, F, true, false>(xr, w, b, out, n32, rs, nmr);
    else if (b) norm_fwd_out_pass<T, LAYER, NV, TPR, F, false, true>(xr, w, b, out, n32, rs, nmr);
    else norm_fwd_out_pass<T, LAYER, NV, TPR, F, false, false>(xr, w, b, out, n32, rs, nmr);
  } else {
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int base = ((int)threadIdx.x + i * TPR) * V;
      if (base >= n) continue;
      float hv[V], wv[V], bv[V], o[V];
      opaque(xr[i]);
      unpack<T>(hv, xr[i]);
      if (w) load_vec(wv, w + base);
      if (b) load_vec(bv, b + base);
      norm_fwd_out<LAYER, V>(hv, wv, bv, w != nullptr, b != nullptr, rs, nmr, o);
      if (F & kNormFwdCs) store_vec_cs(out + base, o);
      else store_vec(out + base, o);
    }
  }
  if (threadIdx.x == 0) {
    if (p.rstd) p.rstd[r] = rs;
    if (LAYER && p.mean) p.mean[r] = mu;
  }
}

/* ---- forward v2: aligned rows, many bytes in flight per thread ------------------------
 * The forward is bound by how many bytes each SM keeps in flight (loads issued, not yet
 * returned); measured on the H200 (f46b949): 32 KB/SM gave ~70% of copy bandwidth, 64 KB
 * ~81%. So this version gives each thread many 16-byte vectors of the row (NV up to 32:
 * a warp owns a whole 4096- or 8192-wide bf16 row, and reduces it with shuffles only,
 * no barrier; TPR = blockDim.x is a compile-time constant, so the NV addresses of a
 * row are one register plus immediates) and keeps only the row in registers: weight and bias are read after the
 * reduction (L1 hits: every row of the SM reads the same ones), so the registers hold
 * data that is in flight from HBM. Rows are 16-byte aligned and cols % VEC == 0. */
template <typename T, bool LAYER, int NV, bool RES, int TPR, int F>
__global__ void __launch_bounds__(norm_fwd_v2_block(TPR), norm_fwd_v2_min_blocks(TPR, F))
    norm_fwd_v2_kernel(norm_fwd_params p) {
  constexpr int V = vec_width<T>::value;
  __shared__ float2 scratch[32 * kNormMaxRowsPerBlock];
  float *scr = reinterpret_cast<float *>(scratch);
  const int64_t n = p.cols;
  const int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  const bool valid = row < p.rows;
  const int64_t r = valid ? row : 0;
  const T *x = static_cast<const T *>(p.x) + r * p.x_stride;
  const T *res = RES ? static_cast<const T *>(p.residual) + r * p.residual_stride : nullptr;
  /* launched as a programmatic dependent (OT_NORM_PDL, default): nothing is read or
   * written before the previous grid has completed; the next launch may be scheduled at
   * once (its own wait holds it until this grid has completed) */
  ot_pdl_wait();
  ot_pdl_launch_dependents();

  raw16 xr[NV], rr[NV];
  constexpr bool STREAM = (F & kNormFwdLdPlain) == 0;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int base = ((int)threadIdx.x + i * TPR) * V;
    load_raw<T, true, STREAM>(xr[i], x, base, n, valid && base < n);
  }
  if (RES) {
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int base = ((int)threadIdx.x + i * TPR) * V;
      load_raw<T, true, STREAM>(rr[i], res, base, n, valid && base < n);
    }
  }
  norm_fwd_row<T, LAYER, NV, RES, TPR, F>(p, xr, rr, r, valid, scr);
}

/* ---- cp.async rings (sm_80+) ------------------------------------------------------------
 * v3 kernels stage rows in shared memory with cp.async (16 bytes per thread, L2 only):
 * the bytes in flight per SM are then bounded by shared memory (up to 227 KB on the
 * H200), not by the registers that hold loads in flight in v2. Each thread copies only
 * the vectors it reads back itself, so the ring needs no barrier: cp.async.wait_group
 * makes a thread's own copies visible to it. A stage is refilled one iteration after it
 * was read into registers, whose values the previous row's stores have consumed. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* wait until at most n (1..7, uniform) groups are pending */
__device__ __forceinline__ void cp_async_wait(int n) {
  switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;\n" ::: "memory"); break;
  }
}

/* ---- forward v3: v2's row work, persistent grid, a cp.async ring of S rows ---------------
 * One row per block (blockDim = (TPR, 1)); block b handles rows b, b + G, ...; rows
 * b + G .. b + (S-1) G are in flight in shared memory ([S][NT][NV][TPR] 16-byte vectors,
 * NT = 1 or 2 with the residual) while row b is reduced and written. No wave tail, and
 * the loads of the next rows overlap the reduction and the stores of this one. */
template <typename T, bool LAYER, int NV, bool RES, int TPR>
__global__ void __launch_bounds__(TPR >= 128 ? TPR : 128) norm_fwd_v3_kernel(norm_fwd_params p, int S) {
  constexpr int V = vec_width<T>::value;
  constexpr int NT = RES ? 2 : 1;
  extern __shared__ uint4 ring[];
  __shared__ float2 scratch[32];
  float *scr = reinterpret_cast<float *>(scratch);
  const int64_t n = p.cols;
  const int64_t G = gridDim.x;
  const int tid = threadIdx.x;
  auto issue = [&](int64_t row, int stage) {
    if (row < p.rows) {
      uint4 *st = ring + (size_t)stage * NT * NV * TPR + tid;
      const T *x = static_cast<const T *>(p.x) + row * p.x_stride;
      const T *res = RES ? static_cast<const T *>(p.residual) + row * p.residual_stride : nullptr;
#pragma unroll
      for (int i = 0; i < NV; i++) {
        const int base = (tid + i * TPR) * V;
        if (base < n) {
          cp_async16(st + i * TPR, x + base);
          if (RES) cp_async16(st + (NV + i) * TPR, res + base);
        }
      }
    }
    cp_async_commit();
  };
  for (int s = 0; s + 1 < S; s++) issue((int64_t)blockIdx.x + (int64_t)s * G, s);
  int stage = 0;
  for (int64_t row = blockIdx.x; row < p.rows; row += G) {
    issue(row + (int64_t)(S - 1) * G, stage == 0 ? S - 1 : stage - 1);
    cp_async_wait(S - 1);
    raw16 xr[NV], rr[NV];
    const uint4 *st = ring + (size_t)stage * NT * NV * TPR + tid;
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const bool in = (tid + i * TPR) * V < n;
      xr[i].u = in ? st[i * TPR] : make_uint4(0u, 0u, 0u, 0u);
      if (RES) rr[i].u = in ? st[(NV + i) * TPR] : make_uint4(0u, 0u, 0u, 0u);
    }
    norm_fwd_row<T, LAYER, NV, RES, TPR, 0>(p, xr, rr, row, true, scr);
    stage = stage + 1 == S ? 0 : stage + 1;
  }
  cp_async_wait(0);
}

/* ---- pieces shared by backward v2 and v3 (the same arithmetic, so the same bits) ---- */

/* One vector's terms: dweight / dbias partials and the two row sums. g = dy * w with
 * __fmul_rn everywhere it is formed: the sums and dx must see the same rounded product
 * (a product contracted into an FMA in dx keeps its rounding error, which rstd
 * amplifies: a constant row has rstd = 1/sqrt(eps)). */
template <bool LAYER, int V>
__device__ __forceinline__ void norm_bwd_terms(const float *hv, const float *dyv, const float *wv,
                                               bool has_w, float rs, float nmr, float *dw,
                                               float *db, float &sg, float &sgx) {
#pragma unroll
  for (int j = 0; j < V; j++) {
    const float xh = LAYER ? fmaf(hv[j], rs, nmr) : hv[j] * rs;
    dw[j] = fmaf(dyv[j], xh, dw[j]);
    if (LAYER) db[j] += dyv[j];
    const float gg = has_w ? __fmul_rn(dyv[j], wv[j]) : dyv[j];
    sg += gg;
    sgx = fmaf(gg, xh, sgx);
  }
}

/* The row's a = mean(g) (LayerNorm) and c = mean(g * xh), block-wide. */
template <bool LAYER>
__device__ __forceinline__ void norm_bwd_row_sums(float sg, float sgx, float *scr, float inv_n,
                                                  float &a, float &c) {
  a = 0.0f;
  if (LAYER) {
    const float2 t = row_group_sum2(sg, sgx, scr);
    a = t.x * inv_n;
    c = t.y * inv_n;
  } else {
    c = row_group_sum(sgx, scr) * inv_n;
  }
}

/* dx = rs * (g - a - xh * c) = g * rs + (xh * k1 + k0), k1 = -rs * c, k0 = -rs * a,
 * plus dr when has_dr. The caller's dr is its local array, passed always: a pointer that
 * selects between that array and NULL (p.dres ? dr : nullptr, until 2026-11-30) made
 * ptxas keep the array in local memory (STL / LDL of every dres vector of every row). */
template <bool LAYER, int V>
__device__ __forceinline__ void norm_bwd_dx(const float *hv, const float *dyv, const float *wv,
                                            bool has_w, bool has_dr, const float *dr, float rs,
                                            float nmr, float k1, float k0, float *o) {
#pragma unroll
  for (int j = 0; j < V; j++) {
    const float xh = LAYER ? fmaf(hv[j], rs, nmr) : hv[j] * rs;
    const float gg = has_w ? __fmul_rn(dyv[j], wv[j]) : dyv[j];
    o[j] = fmaf(gg, rs, LAYER ? fmaf(xh, k1, k0) : xh * k1);
    if (has_dr) o[j] += dr[j];
  }
}

/* A thread's V partial sums of one column vector into the fp32 workspace row. */
template <int V>
__device__ __forceinline__ void norm_store_partials(float *dst, const float *v) {
  float4 *q = reinterpret_cast<float4 *>(dst);
#pragma unroll
  for (int j = 0; j < V; j += 4) q[j / 4] = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
}

/* ---- backward v2: aligned rows, persistent grid, a ring of D rows in flight ------------
 * One row group per block (blockDim.y == 1, so every barrier is block-uniform). Block b
 * handles rows b, b + G, b + 2G, ... (G = gridDim.x); h and dy of the next D - 1 rows
 * are always in flight while the current row is reduced and written: buffer s of the
 * ring (s = k mod D, an index that is static because the loop is unrolled by D) is
 * refilled with row k + D as soon as row k is done. dweight / dbias partials stay in
 * fp32 registers over all rows of the block and are written once (row b of the
 * workspace). The register budget goes to the ring, not to the accumulators: with
 * NV = 1 (4096 bf16, 512 threads) D = 6 keeps 5 rows (80 KB) in flight per SM. */
template <typename T, bool LAYER, int NV, int D>
__global__ void __launch_bounds__(512, 1) norm_bwd_v2_kernel(norm_bwd_params p) {
  ot_pdl_launch_dependents(); /* the partials' sum may be scheduled (OT_NORM_PDL) */
  constexpr int V = vec_width<T>::value;
  __shared__ float2 scratch[32];
  float *scr = reinterpret_cast<float *>(scratch);
  const int64_t n = p.cols;
  const float inv_n = 1.0f / (float)n;
  const T *w = static_cast<const T *>(p.weight);
  const bool want_dw = p.dw_part != nullptr, want_db = LAYER && p.db_part != nullptr;
  const int64_t G = gridDim.x;

  /* weight: 16-byte loads per use (L1 hits), not registers; WREG keeps it in registers */
  constexpr bool WREG = NV == 1;
  raw16 wr[NV], hb[D][NV], gb[D][NV];
  float dw[NV][V], db[NV][V];
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int base = ((int)threadIdx.x + i * (int)blockDim.x) * V;
#pragma unroll
    for (int j = 0; j < V; j++) dw[i][j] = 0.0f, db[i][j] = 0.0f;
    if (WREG) load_raw<T, true, false>(wr[i], w, base, n, w != nullptr && base < n);
  }
#pragma unroll
  for (int s = 0; s < D; s++) {
    const int64_t row = (int64_t)blockIdx.x + (int64_t)s * G;
    const bool valid = row < p.rows;
    const T *hp = static_cast<const T *>(p.h) + (valid ? row : 0) * p.h_stride;
    const T *dyp = static_cast<const T *>(p.dy) + (valid ? row : 0) * p.dy_stride;
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int base = ((int)threadIdx.x + i * (int)blockDim.x) * V;
      load_raw<T, true, true>(hb[s][i], hp, base, n, valid && base < n);
      load_raw<T, true, true>(gb[s][i], dyp, base, n, valid && base < n);
    }
  }

  for (int64_t row0 = blockIdx.x; row0 < p.rows; row0 += (int64_t)D * G) {
#pragma unroll
    for (int s = 0; s < D; s++) {
      const int64_t row = row0 + (int64_t)s * G;
      if (row >= p.rows) break; /* block-uniform */
      raw16 drr[NV];
      if (p.dres) {
        const T *drp = static_cast<const T *>(p.dres) + row * p.dres_stride;
#pragma unroll
        for (int i = 0; i < NV; i++) {
          const int base = ((int)threadIdx.x + i * (int)blockDim.x) * V;
          load_raw<T, true, true>(drr[i], drp, base, n, base < n);
        }
      }
      /* statistics: saved, or recomputed exactly as the forward v2 does */
      float mu = 0.0f, rs;
      if (p.rstd) {
        rs = p.rstd[row];
        if (LAYER) mu = p.mean[row];
      } else {
        float sm = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; i++) {
          float hv[V];
          unpack<T>(hv, hb[s][i]);
#pragma unroll
          for (int j = 0; j < V; j++) sm += LAYER ? hv[j] : hv[j] * hv[j];
        }
        if (LAYER) {
          mu = row_group_sum(sm, scr) * inv_n;
          float v = 0.0f;
#pragma unroll
          for (int i = 0; i < NV; i++) {
            const int base = ((int)threadIdx.x + i * (int)blockDim.x) * V;
            float hv[V];
            opaque(hb[s][i]);
            unpack<T>(hv, hb[s][i]);
            if (base < n) {
#pragma unroll
              for (int j = 0; j < V; j++) v += (hv[j] - mu) * (hv[j] - mu);
            }
          }
          rs = rsqrtf(row_group_sum(v, scr) * inv_n + p.eps);
        } else {
          rs = rsqrtf(row_group_sum(sm, scr) * inv_n + p.eps);
        }
      }
      const float nmr = -mu * rs;
      float sg = 0.0f, sgx = 0.0f;
#pragma unroll
      for (int i = 0; i < NV; i++) {
        const int base = ((int)threadIdx.x + i * (int)blockDim.x) * V;
        if (base >= n) continue;
        float hv[V], dyv[V], wv[V];
        opaque(hb[s][i]);
        unpack<T>(hv, hb[s][i]);
        unpack<T>(dyv, gb[s][i]);
        if (w) {
          if (WREG) unpack<T>(wv, wr[i]);
          else load_vec(wv, w + base);
        }
        norm_bwd_terms<LAYER, V>(hv, dyv, wv, w != nullptr, rs, nmr, dw[i], db[i], sg, sgx);
      }
      float a, c;
      norm_bwd_row_sums<LAYER>(sg, sgx, scr, inv_n, a, c);
      const float k1 = -rs * c, k0 = -rs * a;
      T *dxp = static_cast<T *>(p.dx) + row * p.dx_stride;
#pragma unroll
      for (int i = 0; i < NV; i++) {
        const int base = ((int)threadIdx.x + i * (int)blockDim.x) * V;
        if (base >= n) continue;
        float hv[V], dyv[V], wv[V], o[V], dr[V];
        opaque(hb[s][i]);
        opaque(gb[s][i]);
        unpack<T>(hv, hb[s][i]);
        unpack<T>(dyv, gb[s][i]);
        if (w) {
          if (WREG) unpack<T>(wv, wr[i]);
          else load_vec(wv, w + base);
        }
        if (p.dres) unpack<T>(dr, drr[i]);
        norm_bwd_dx<LAYER, V>(hv, dyv, wv, w != nullptr, p.dres != nullptr, dr, rs, nmr, k1, k0, o);
        store_vec(dxp + base, o);
      }
      /* refill this ring slot with row + D*G */
      const int64_t nrow = row + (int64_t)D * G;
      if (nrow < p.rows) {
        const T *hp = static_cast<const T *>(p.h) + nrow * p.h_stride;
        const T *dyp = static_cast<const T *>(p.dy) + nrow * p.dy_stride;
#pragma unroll
        for (int i = 0; i < NV; i++) {
          const int base = ((int)threadIdx.x + i * (int)blockDim.x) * V;
          load_raw<T, true, true>(hb[s][i], hp, base, n, base < n);
          load_raw<T, true, true>(gb[s][i], dyp, base, n, base < n);
        }
      }
    }
  }

  const int64_t part = blockIdx.x;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int base = ((int)threadIdx.x + i * (int)blockDim.x) * V;
    if (base >= n) continue;
    if (want_dw) norm_store_partials<V>(p.dw_part + part * n + base, dw[i]);
    if (want_db) norm_store_partials<V>(p.db_part + part * n + base, db[i]);
  }
}

/* The saved statistics of `row` into rs / mu (left as they are past the last row). */
template <bool LAYER>
__device__ __forceinline__ void norm_stats_of(const norm_bwd_params &p, int64_t row, float &rs,
                                              float &mu) {
  if (row < p.rows) {
    rs = p.rstd[row];
    if (LAYER) mu = p.mean[row];
  }
}

/* ---- backward v3: v2's arithmetic, h / dy (/ dres) staged by a cp.async ring -----------
 * One row group per block (blockDim = (TPR, 1), TPR = ceil(nvec / NV) rounded to a warp),
 * persistent grid, block b handles rows b, b + G, ...; rows b + G .. b + (S-1) G of h
 * and dy (and dres) are in flight in shared memory ([S][NT][NV][TPR] 16-byte vectors)
 * while row b is reduced and its dx written: S - 1 rows per block, 2 or 3 blocks per SM,
 * so ~130-190 KB in flight per SM instead of the ~64 KB that v2's register ring holds.
 * The dx pass reads h and dy again from the ring (two shared loads per vector) rather
 * than keeping their floats alive across the reduction: 64 registers (16-bit, NV = 2)
 * against v2's 128, so 4 blocks of 256 threads fit an SM. Saved statistics only (the
 * launcher computes them first when the caller has none); rstd / mean of the next row
 * are loaded one row ahead. dweight / dbias partials in fp32 registers, written once
 * per block. WF: the thread's weight vectors held in fp32 registers for the whole block
 * (loaded once), not loaded from global memory (L1) and unpacked in both passes of every
 * row -- the per-element instructions are what this kernel's issue slots spend (the
 * launch says where it pays). */
template <typename T, bool LAYER, int NV, bool WF>
__global__ void __launch_bounds__(512) norm_bwd_v3_kernel(norm_bwd_params p, int S) {
  ot_pdl_launch_dependents(); /* the partials' sum may be scheduled (OT_NORM_PDL) */
  constexpr int V = vec_width<T>::value;
  extern __shared__ uint4 ring[];
  __shared__ float2 scratch[32];
  float *scr = reinterpret_cast<float *>(scratch);
  const int64_t n = p.cols;
  const float inv_n = 1.0f / (float)n;
  const T *w = static_cast<const T *>(p.weight);
  const int64_t G = gridDim.x;
  const int tid = threadIdx.x, tpr = blockDim.x;
  const int NT = p.dres ? 3 : 2;
  const size_t stage_vecs = (size_t)NT * NV * tpr;

  auto issue = [&](int64_t row, int stage) {
    if (row < p.rows) {
      uint4 *st = ring + stage * stage_vecs + tid;
      const T *hp = static_cast<const T *>(p.h) + row * p.h_stride;
      const T *dyp = static_cast<const T *>(p.dy) + row * p.dy_stride;
      const T *drp = p.dres ? static_cast<const T *>(p.dres) + row * p.dres_stride : nullptr;
#pragma unroll
      for (int i = 0; i < NV; i++) {
        const int64_t base = (int64_t)(tid + i * tpr) * V;
        if (base < n) {
          cp_async16(st + i * tpr, hp + base);
          cp_async16(st + (NV + i) * tpr, dyp + base);
          if (drp) cp_async16(st + (2 * NV + i) * tpr, drp + base);
        }
      }
    }
    cp_async_commit();
  };

  float dw[NV][V], db[NV][V], wf[WF ? NV : 1][V];
#pragma unroll
  for (int i = 0; i < NV; i++) {
#pragma unroll
    for (int j = 0; j < V; j++) dw[i][j] = 0.0f, db[i][j] = 0.0f;
    const int64_t base = (int64_t)(tid + i * tpr) * V;
    if (WF && w && base < n) load_vec(wf[WF ? i : 0], w + base);
  }
  for (int s = 0; s + 1 < S; s++) issue((int64_t)blockIdx.x + (int64_t)s * G, s);
  float rs_n = 0.0f, mu_n = 0.0f;
  norm_stats_of<LAYER>(p, blockIdx.x, rs_n, mu_n);
  int stage = 0;
  for (int64_t row = blockIdx.x; row < p.rows; row += G) {
    const float rs = rs_n, mu = mu_n;
    norm_stats_of<LAYER>(p, row + G, rs_n, mu_n); /* one row ahead */
    issue(row + (int64_t)(S - 1) * G, stage == 0 ? S - 1 : stage - 1);
    cp_async_wait(S - 1);
    const uint4 *st = ring + stage * stage_vecs + tid;
    float sg = 0.0f, sgx = 0.0f;
    const float nmr = -mu * rs;
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int64_t base = (int64_t)(tid + i * tpr) * V;
      if (base >= n) continue;
      raw16 hr, dr;
      hr.u = st[i * tpr];
      dr.u = st[(NV + i) * tpr];
      float hv[V], gv[V], wv[V];
      unpack<T>(hv, hr);
      unpack<T>(gv, dr);
      if (w && !WF) load_vec(wv, w + base);
      norm_bwd_terms<LAYER, V>(hv, gv, WF ? wf[WF ? i : 0] : wv, w != nullptr, rs, nmr, dw[i], db[i],
                               sg, sgx);
    }
    float a, c;
    norm_bwd_row_sums<LAYER>(sg, sgx, scr, inv_n, a, c);
    /* dx: h and dy are read again from the ring (cheaper than keeping their floats
     * alive across the reduction) */
    const float k1 = -rs * c, k0 = -rs * a;
    T *dxp = static_cast<T *>(p.dx) + row * p.dx_stride;
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int64_t base = (int64_t)(tid + i * tpr) * V;
      if (base >= n) continue;
      raw16 hr, gr;
      hr.u = st[i * tpr];
      gr.u = st[(NV + i) * tpr];
      float hv[V], gv[V], wv[V], o[V], dr[V];
      unpack<T>(hv, hr);
      unpack<T>(gv, gr);
      if (w && !WF) load_vec(wv, w + base);
      if (p.dres) {
        raw16 t;
        t.u = st[(2 * NV + i) * tpr];
        unpack<T>(dr, t);
      }
      norm_bwd_dx<LAYER, V>(hv, gv, WF ? wf[WF ? i : 0] : wv, w != nullptr, p.dres != nullptr, dr,
                            rs, nmr, k1, k0, o);
      store_vec(dxp + base, o);
    }
    stage = stage + 1 == S ? 0 : stage + 1;
  }
  cp_async_wait(0);

  const int64_t part = blockIdx.x;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int64_t base = (int64_t)(tid + i * tpr) * V;
    if (base >= n) continue;
    if (p.dw_part) norm_store_partials<V>(p.dw_part + part * n + base, dw[i]);
    if (LAYER && p.db_part) norm_store_partials<V>(p.db_part + part * n + base, db[i]);
  }
}

/* ---- bulk-copy (TMA) backward, sm_90 ---------------------------------------------------
 * The rows are staged in shared memory by 1-D bulk copies (bulk_copy.cuh): one thread
 * issues a whole row per tensor, completing on the slot's mbarrier, so the bytes in
 * flight per SM are bounded by shared memory (~220 KB on the H200), cost no registers
 * and no per-16-byte load instructions (v3's per-thread cp.async rings issue one per
 * vector). Rows are 16-byte aligned and cols * sizeof(T) is a multiple of 16 (the bulk
 * copy's rules); the host takes v3 / v2 / v1 otherwise.
 * Measured (H200, 16k rows bf16, run of a342519, TB/s, copy 4.29): with register
 * partials it beats v3 for LayerNorm (3.06 / 3.26 at 4096 / 8192 against 2.81 / 3.10:
 * its default); for RMSNorm it tied or lost (3.19-3.23 / 3.23-3.50 against 3.26 /
 * 3.52), partials in shared memory lost (LayerNorm 2.89 / 2.63: the partials' space
 * halves the blocks per SM) and 4 vectors per thread too (LayerNorm 2.91 at 4096): all
 * removed, with a bulk-copy forward (a warp per row, lost to v2 at every shape: RMSNorm
 * 4096 3.42 vs 3.79, LayerNorm 8192 2.50 vs 3.76) -- docs/PERFORMANCE.md. dx is stored
 * evict-first (st.global.cs): LayerNorm 16k x 4096 bf16 3.39 vs 3.35 TB/s, same process
 * (A/B of 1d1bbbc, 2026-11-30; an earlier round, ef875c3 / 465d8ee, saw no gain). */
constexpr int kNormTmaMaxStages = 4;

/* Vector idx of a staged row's h and dy (shared memory), unpacked. */
template <typename T>
__device__ __forceinline__ void norm_bwd_slot_vec(const uint4 *hs, const uint4 *gs, int idx,
                                                  float *hv, float *gv) {
  raw16 hr, gr;
  hr.u = hs[idx];
  gr.u = gs[idx];
  unpack<T>(hv, hr);
  unpack<T>(gv, gr);
}

/* Backward: v3's block-per-row shape and arithmetic (one row group of TPR threads per
 * block, thread t owns the vectors t + i * TPR, i < NV, so the dweight / dbias partials
 * of its columns stay with it over all rows of the block), persistent grid (block b:
 * rows b, b + G, ...), with h, dy (and dres) of the next S - 1 rows staged by bulk
 * copies into a ring of S slots. Thread 0 refills the previous row's slot right after
 * the current row's sums barrier (every thread has then finished the previous row's dx
 * pass, the slot's last reader). Saved statistics only (the launcher computes them first
 * when the caller has none); dweight / dbias partials in fp32 registers, written once per
 * block. (Partials in shared memory, [V/4][nvec] float4 per partial, lost: run of
 * a342519; removed.) The thread's weight vectors are held in fp32 registers for the whole
 * block (v3's WF): ncu of ef875c3's predecessor (run of ecdf3b4, 16k x 4096 bf16) had this
 * kernel issue-bound (5.9 cycles between a warp's instructions at 4 warps per scheduler,
 * SM throughput 62%, DRAM 65%), and the weight's load + unpack in both passes of every row
 * was a good part of its instructions: LayerNorm backward 3.38 / 3.63 TB/s against 3.08 /
 * 3.22 at 4096 / 8192 (99 registers instead of 88: still 2 / 1 blocks per SM; run of
 * ef875c3). Build A/B of 2026-12-05 (16k x 4096 / 8192 bf16, 3.38 / 3.60 TB/s with the
 * bulk loads evict-first): the rows' bulk loads with the L2's default policy instead of
 * evict-first 3.79 / 3.94, the default since (bulk_copy.cuh); plain dx stores 3.38 / 3.60
 * (level); the weight loaded per row instead of held (82 registers) 3.09 / 3.27, and with a
 * cap of 80 registers on top (3 blocks per SM at 4096) 2.98 / 3.31: not kept. */
template <typename T, bool LAYER, int NV>
__global__ void __launch_bounds__(512) norm_bwd_tma_kernel(norm_bwd_params p, int S) {
  ot_pdl_launch_dependents(); /* the partials' sum may be scheduled (OT_NORM_PDL) */
#ifdef OT_BULK_COPY_DEVICE
  constexpr int V = vec_width<T>::value;
  extern __shared__ __align__(128) uint4 tma_smem[];
  __shared__ uint64_t bars[kNormTmaMaxStages];
  __shared__ float2 scratch[32];
  float *scr = reinterpret_cast<float *>(scratch);
  const int nvec = (int)(p.cols / V);
  const uint32_t rb = (uint32_t)nvec * 16u;
  const float inv_n = 1.0f / (float)p.cols;
  const T *w = static_cast<const T *>(p.weight);
  const int64_t G = gridDim.x;
  const int tid = threadIdx.x, tpr = blockDim.x;
  const int NT = p.dres ? 3 : 2;
  const bool want_dw = p.dw_part != nullptr, want_db = LAYER && p.db_part != nullptr;
  if (tid == 0) {
    for (int i = 0; i < S; i++) mbar_init(smem_u32(bars + i), 1);
    mbar_init_fence();
  }
  auto issue = [&](int64_t row, int s) {
    uint4 *dst = tma_smem + (size_t)s * NT * nvec;
    mbar_expect_tx(smem_u32(bars + s), (uint32_t)NT * rb);
    bulk_load(dst, static_cast<const T *>(p.h) + row * p.h_stride, rb, bars + s);
    bulk_load(dst + nvec, static_cast<const T *>(p.dy) + row * p.dy_stride, rb, bars + s);
    if (p.dres)
      bulk_load(dst + 2 * nvec, static_cast<const T *>(p.dres) + row * p.dres_stride, rb, bars + s);
  };
  float dw[NV][V], db[NV][V], wf[NV][V]; /* wf: the weight, loaded once (see the launch) */
#pragma unroll
  for (int i = 0; i < NV; i++) {
#pragma unroll
    for (int j = 0; j < V; j++) dw[i][j] = 0.0f, db[i][j] = 0.0f;
    if (w && tid + i * tpr < nvec) load_vec(wf[i], w + (int64_t)(tid + i * tpr) * V);
  }
  __syncthreads(); /* the barriers are initialized */
  if (tid == 0)
    for (int s = 0; s < S; s++) {
      const int64_t row = (int64_t)blockIdx.x + (int64_t)s * G;
      if (row < p.rows) issue(row, s);
    }
  float rs_n = 0.0f, mu_n = 0.0f;
  norm_stats_of<LAYER>(p, blockIdx.x, rs_n, mu_n);
  int s = 0;
  uint32_t ph = 0;
  for (int64_t row = blockIdx.x; row < p.rows; row += G) {
    const float rs = rs_n, mu = mu_n;
    norm_stats_of<LAYER>(p, row + G, rs_n, mu_n); /* one row ahead */
    mbar_wait(smem_u32(bars + s), ph);
    const uint4 *hs = tma_smem + (size_t)s * NT * nvec, *gs = hs + nvec, *ds = gs + nvec;
    float sg = 0.0f, sgx = 0.0f;
    const float nmr = -mu * rs;
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int idx = tid + i * tpr;
      if (idx >= nvec) continue;
      float hv[V], gv[V];
      norm_bwd_slot_vec<T>(hs, gs, idx, hv, gv);
      norm_bwd_terms<LAYER, V>(hv, gv, wf[i], w != nullptr, rs, nmr, dw[i], db[i], sg, sgx);
    }
    float a, c;
    norm_bwd_row_sums<LAYER>(sg, sgx, scr, inv_n, a, c);
    if (tpr == 32) __syncwarp();
    /* every thread is past the previous row's dx pass: refill its slot */
    if (tid == 0 && row != (int64_t)blockIdx.x) {
      const int ps = s == 0 ? S - 1 : s - 1;
      const int64_t nr = row - G + (int64_t)S * G;
      if (nr < p.rows) issue(nr, ps);
    }
    const float k1 = -rs * c, k0 = -rs * a;
    T *dxp = static_cast<T *>(p.dx) + row * p.dx_stride;
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int idx = tid + i * tpr;
      if (idx >= nvec) continue;
      float hv[V], gv[V], o[V], dr[V];
      norm_bwd_slot_vec<T>(hs, gs, idx, hv, gv);
      if (p.dres) {
        raw16 t;
        t.u = ds[idx];
        unpack<T>(dr, t);
      }
      norm_bwd_dx<LAYER, V>(hv, gv, wf[i], w != nullptr, p.dres != nullptr, dr, rs, nmr, k1, k0, o);
      store_vec_cs(dxp + (int64_t)idx * V, o); /* evict-first (the kernel's comment) */
    }
    if (++s == S) s = 0, ph ^= 1u;
  }

  const int64_t part = blockIdx.x;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int idx = tid + i * tpr;
    if (idx >= nvec) continue;
    const int64_t base = (int64_t)idx * V;
    if (want_dw) norm_store_partials<V>(p.dw_part + part * p.cols + base, dw[i]);
    if (want_db) norm_store_partials<V>(p.db_part + part * p.cols + base, db[i]);
  }
#endif
}

/* ---- launch configuration ---------------------------------------------------------------- */

struct norm_launch {
  int nv;       /* vectors per thread: 1, 2, 4, 8; 0 = looping kernel */
  int threads;  /* blockDim.x, a multiple of 32 */
  int rows;     /* blockDim.y */
};

/* Pick NV (registers per row) so a row group has at most `target` threads; NV above
 * nv_max (or a group wider than 512) takes the looping kernel. */
static inline norm_launch norm_pick_launch(int64_t cols, int vec, int target, int nv_max) {
  norm_launch L;
  const int64_t nvec = (cols + vec - 1) / vec;
  L.nv = 0;
  for (int nv = 1; nv <= nv_max; nv *= 2) {
    if ((nvec + nv - 1) / nv <= target) {
      L.nv = nv;
      break;
    }
  }
  if (L.nv == 0 && (nvec + nv_max - 1) / nv_max <= 512) L.nv = nv_max;
  int64_t t = L.nv ? (nvec + L.nv - 1) / L.nv : (nvec < 1024 ? nvec : 1024);
  t = (t + 31) / 32 * 32;
  if (t < 32) t = 32;
  if (L.nv == 0 && t > 1024) t = 1024;
  L.threads = (int)t;
  int ry = 256 / L.threads;
  L.rows = ry < 1 ? 1 : (ry > kNormMaxRowsPerBlock ? kNormMaxRowsPerBlock : ry);
  return L;
}

/* One call's launch context: the context's device facts (sm count, shared memory,
 * compute capability: read once by ot_cuda_context_init) and the tuning knobs, read from
 * the environment once per call (benchmarking and tests switch them at run time; unset in
 * normal use): OT_NORM_FWD_IMPL=old (the f46b949 kernels) | v2 (register rows, one block
 * per row or two; default) | v3 (persistent, cp.async ring), OT_NORM_FWD_MAXNV=16 (up to
 * 16 vectors per thread in forward v2, default 8), OT_NORM_FWD_STAGES=S (v3 ring depth,
 * default: automatic), OT_NORM_PDL=0 (forward v2 and the partials' sum launched
 * plainly; default: as programmatic dependents on sm_90), OT_NORM_BWD_IMPL=old | v2 | v3
 * (RMSNorm's default) | tma (LayerNorm only, its default), OT_NORM_BWD_NV=1 (v2 with one
 * vector per thread, D = 6), OT_NORM_BWD_V3NV=2 | 4 (v3 vectors per thread),
 * OT_NORM_BWD_STAGES=S (v3 ring depth; 0 = automatic), OT_NORM_BWD_TMA_STAGES=S (tma ring
 * depth, default 3; 0 = automatic), OT_NORM_REDUCE=old (the partials' sum by the 32 x 32 kernel of
 * 4-byte loads; default: norm_reduce_partials_v2_kernel where cols % 4 == 0),
 * OT_NORM_RMS_FWD_CUT=1 (RMSNorm forward v2 with kNormFwdCut for 16-bit rows of <= 4096
 * elements, the default; =0 the plain row work; =2: its 8-vector instances without the
 * residual also held to 56 registers, kNormFwdHold56). */
enum { kNormImplDefault = 0, kNormImplOld, kNormImplV2, kNormImplV3, kNormImplTma };
struct norm_cfg {
  ot_context *ctx;    /* the call's context: its temporaries (norm_temp_alloc) */
  const char *op;     /* the API function, for the temporaries' errors */
  ot_status *temp_st; /* where norm_temp_alloc / norm_temp_free leave a failure's status */
  const ot_cuda_state *cs;
  int fwd_impl;       /* kNormImplDefault (v2), Old or V3 */
  int fwd_maxnv;      /* 8 or 16 */
  int fwd_stages;     /* v3 ring depth, 0 automatic */
  bool pdl;
  int bwd_impl;       /* kNormImpl*: Default, Old, V2, Tma; any other value V3 */
  int bwd_nv;         /* OT_NORM_BWD_NV, 0 unset */
  int bwd_v3nv;       /* -1 unset */
  int bwd_stages;     /* -1 unset */
  int bwd_tma_stages; /* default 3; 0 automatic */
  bool reduce_v2;     /* the partials' sum: v2 (default) or the 32 x 32 kernel (=old) */
  int rms_fwd_cut;    /* OT_NORM_RMS_FWD_CUT: 1 (default) RMSNorm forward v2 with kNormFwdCut,
                       * 2 also kNormFwdHold56; 0 the plain row work */
};
static inline norm_cfg norm_cfg_of(ot_context *ctx, const char *op, ot_status *temp_st) {
  norm_cfg c;
  c.ctx = ctx;
  c.op = op;
  c.temp_st = temp_st;
  c.cs = ot_cuda_state_of(ctx);
  /* Whether any OT_NORM_* variable is set: one pass over the environment (~20 ns for a few
   * dozen variables, against ~0.4 us for the eleven getenv calls below, x86 CPU of the CI
   * machine); when none is, every knob reads as unset without a getenv, so the defaults
   * below are the only ones. */
  const bool any = ot_env_any("OT_NORM_");
  auto env = [any](const char *name) -> const char * { return any ? getenv(name) : nullptr; };
  auto env_int = [&env](const char *name, int dflt) {
    const char *s = env(name);
    return s && *s ? atoi(s) : dflt;
  };
  const char *f = env("OT_NORM_FWD_IMPL");
  c.fwd_impl = !f ? kNormImplDefault
               : strcmp(f, "old") == 0 ? kNormImplOld
               : strcmp(f, "v3") == 0 ? kNormImplV3 : kNormImplDefault;
  c.fwd_maxnv = env_int("OT_NORM_FWD_MAXNV", 8) == 16 ? 16 : 8;
  c.fwd_stages = env_int("OT_NORM_FWD_STAGES", 0);
  c.pdl = env_int("OT_NORM_PDL", 1) != 0;
  const char *b = env("OT_NORM_BWD_IMPL");
  c.bwd_impl = !b || !*b ? kNormImplDefault
               : strcmp(b, "old") == 0 ? kNormImplOld
               : strcmp(b, "v2") == 0 ? kNormImplV2
               : strcmp(b, "tma") == 0 ? kNormImplTma : kNormImplV3;
  c.bwd_nv = env_int("OT_NORM_BWD_NV", 0);
  c.bwd_v3nv = env_int("OT_NORM_BWD_V3NV", -1);
  c.bwd_stages = env_int("OT_NORM_BWD_STAGES", -1);
  c.bwd_tma_stages = env_int("OT_NORM_BWD_TMA_STAGES", 3);
  const char *r = env("OT_NORM_REDUCE");
  c.reduce_v2 = !(r && strcmp(r, "old") == 0);
  c.rms_fwd_cut = env_int("OT_NORM_RMS_FWD_CUT", 1);
  if (c.rms_fwd_cut != 2) c.rms_fwd_cut = c.rms_fwd_cut != 0;
  return c;
}

/* The backward's temporaries: the op's (ot_cuda_temp_alloc / ot_cuda_temp_free, on the
 * context's stream). A failure leaves its status (its message already set) in
 * *c.temp_st, which norm_cuda_status returns as it is, and answers
 * cudaErrorMemoryAllocation (alloc) / cudaErrorUnknown (free) to the launch code. */
static inline cudaError_t norm_temp_alloc(const norm_cfg &c, size_t bytes, const char *what,
                                          void **ptr) {
  const ot_status st = ot_cuda_temp_alloc(c.ctx, bytes, c.op, what, ptr);
  if (st == OT_OK) return cudaSuccess;
  if (*c.temp_st == OT_OK) *c.temp_st = st;
  return cudaErrorMemoryAllocation;
}
static inline cudaError_t norm_temp_free(const norm_cfg &c, void *ptr) {
  const ot_status st = ot_cuda_temp_free(c.ctx, ptr, c.op);
  if (st == OT_OK) return cudaSuccess;
  if (*c.temp_st == OT_OK) *c.temp_st = st;
  return cudaErrorUnknown;
}

/* Whether the norm kernels may be launched as programmatic dependents on cs's device
 * (pdl.cuh's rule; all norm kernels are compiled alike, so one answer per device). */
static inline bool norm_pdl_ok(const ot_cuda_state *cs, const void *probe) {
  static std::atomic<int> cached[16] = {}; /* "= {}": constant-initialized, as in pdl.cuh */
  return ot_pdl_ok(cs, probe, cached);
}

/* kernel<<<grid, block, 0, stream>>>(args...) (no dynamic shared memory: none of the
 * kernels launched so asks for any), as a programmatic dependent of the previous kernel
 * on the stream (pdl.cuh) when c.pdl and the device runs the kernels' sm_90 code. */
template <typename... P, typename... A>
static inline cudaError_t norm_launch_ex(const norm_cfg &c, void (*kernel)(P...), dim3 grid,
                                         dim3 block, cudaStream_t stream, A... args) {
  if (c.pdl && norm_pdl_ok(c.cs, reinterpret_cast<const void *>(kernel)))
    return ot_launch_pdl(true, kernel, grid, block, stream, args...);
  kernel<<<grid, block, 0, stream>>>(args...);
  return cudaGetLastError();
}

/* Forward v2 shape (aligned rows only): the narrowest row group (32, 64, 128, 256
 * threads) whose threads hold the row in NV <= budget vectors each; budget 32 vectors
 * of x (16 with the residual, whose vectors are held too). nv = 0: not covered. */
static inline norm_launch norm_pick_fwd_v2(const norm_cfg &c, int64_t cols, int vec) {
  norm_launch L = {0, 32, 1};
  if (c.fwd_impl == kNormImplOld) return L;
  /* The budget is the same with and without the residual, so the fused forward and
   * the unfused one over residual_out reduce in the same order (same bits). */
  /* Measured (H200, 16k rows bf16, f607cff): budget 8 beats 16 everywhere, most for
   * LayerNorm (4096: 3.60 vs 2.95 TB/s; 8192: 3.81 vs 3.08): the smaller register
   * footprint gives more warps per SM to cover the reductions' latency. */
  const int budget = c.fwd_maxnv;
  const int64_t nvec = cols / vec;
  for (int tpr = 32; tpr <= 256; tpr *= 2) {
    const int64_t need = (nvec + tpr - 1) / tpr;
    int nv = 1;
    while (nv < need) nv *= 2;
    if (nv <= budget) {
      if (tpr > 32) nv = budget; /* the instantiations of the wider groups */
      L.nv = nv;
      L.threads = tpr;
      L.rows = L.threads >= 128 ? 1 : 128 / L.threads;
      return L;
    }
  }
  return L;
}

/* The forward v2 instance of shape L (nv, threads) and options F, or NULL; LayerNorm's
 * instances without the residual at 8 vectors a thread with kNormFwdRegs, and its 16-bit ones
 * with the residual at 8 vectors and 64 / 128 threads with kNormFwdLdPlain. */
template <typename T, bool LAYER, bool RES, int F>
static inline void (*norm_fwd_v2_pick(const norm_launch &L))(norm_fwd_params) {
  constexpr int F8 = LAYER && !RES ? (F | kNormFwdRegs) : F;
  constexpr int F8L = LAYER && RES && sizeof(T) == 2 ? (F8 | kNormFwdLdPlain) : F8;
  if (L.threads <= 32) {
    switch (L.nv) {
      case 1: return norm_fwd_v2_kernel<T, LAYER, 1, RES, 32, F>;
      case 2: return norm_fwd_v2_kernel<T, LAYER, 2, RES, 32, F>;
      case 4: return norm_fwd_v2_kernel<T, LAYER, 4, RES, 32, F>;
      case 8: return norm_fwd_v2_kernel<T, LAYER, 8, RES, 32, F8>;
      case 16: return norm_fwd_v2_kernel<T, LAYER, 16, RES, 32, F>;
      default: return nullptr;
    }
  }
  /* wider groups only when a warp's budget is not enough: NV is then the budget */
  if (L.nv != 8 && L.nv != 16) return nullptr;
  const bool n16 = L.nv == 16;
  switch (L.threads) {
    case 64: return n16 ? norm_fwd_v2_kernel<T, LAYER, 16, RES, 64, F> : norm_fwd_v2_kernel<T, LAYER, 8, RES, 64, F8L>;
    case 128: return n16 ? norm_fwd_v2_kernel<T, LAYER, 16, RES, 128, F> : norm_fwd_v2_kernel<T, LAYER, 8, RES, 128, F8L>;
    default: return n16 ? norm_fwd_v2_kernel<T, LAYER, 16, RES, 256, F> : norm_fwd_v2_kernel<T, LAYER, 8, RES, 256, F8>;
  }
}

/* The instance a call takes. Without the residual: plain loads and stores (kNormFwdLdPlain,
 * no evict-first hints) since 2026-12-04 evening. The evict-first out stores and loads kept
 * since the run of 718ecab (+2-5% then) had been measured against builds whose plain loads
 * left lines of the same x in L2, which evict-first misses do not displace; measured with an
 * L2 scrub before each entry (bench_fused_ops.py --l2-scrub-mb 256, H200, 16k rows bf16, 6
 * balanced rounds, bench/results/fused_ops_norm_nores_hints_ab.json): LayerNorm 4096 3.92 vs
 * 3.79 TB/s, 8192 4.03 vs 3.87, RMSNorm 8192 4.06 vs 3.91 (its rows of <= 4096 take the cut
 * instances, unchanged); plain stores with evict-first loads 3.76 / 3.86 / 3.85. The same
 * values: the same bits. The choice depends on the shape only, so a fused forward, an
 * unfused one over its residual_out and the backward's recomputed statistics take the same
 * statistics code (the same bits). */
template <typename T, bool LAYER>
static inline void (*norm_fwd_v2_select(bool res, const norm_launch &L))(norm_fwd_params) {
  return res ? norm_fwd_v2_pick<T, LAYER, true, 0>(L)
             : norm_fwd_v2_pick<T, LAYER, false, kNormFwdLdPlain>(L);
}

/* RMSNorm's forward v2 instance with kNormFwdCut (OT_NORM_RMS_FWD_CUT=1; hold, =2: with
 * kNormFwdHold56) for shape L and the same store option as norm_fwd_v2_select, or NULL (the
 * default instance is taken): 16-bit
 * rows of <= 4096 elements at the default budget -- one warp a row at 1-8 vectors a thread
 * (<= 2048 elements), two at 8 (<= 4096); rows wider than 4096 keep the default (the cut
 * with 4-chain sums lost 2.9% at 16k x 8192 with the residual). */
template <typename T>
static inline void (*norm_fwd_v2_cut_pick(bool res, bool hold, int64_t cols,
                                          const norm_launch &L))(norm_fwd_params) {
  if constexpr (sizeof(T) != 2) {
    return nullptr;
  } else {
    constexpr int C = kNormFwdCut, CS = kNormFwdCut | kNormFwdCs, CH = CS | kNormFwdHold56;
    if (cols > 4096 || L.nv == 0) return nullptr;
    if (L.nv == 8 && (L.threads == 32 || L.threads == 64)) {
      if (res) return L.threads == 32 ? norm_fwd_v2_kernel<T, false, 8, true, 32, C> : norm_fwd_v2_kernel<T, false, 8, true, 64, C>;
      if (hold) return L.threads == 32 ? norm_fwd_v2_kernel<T, false, 8, false, 32, CH> : norm_fwd_v2_kernel<T, false, 8, false, 64, CH>;
      return L.threads == 32 ? norm_fwd_v2_kernel<T, false, 8, false, 32, CS> : norm_fwd_v2_kernel<T, false, 8, false, 64, CS>;
    }
    if (L.threads != 32) return nullptr;
    switch (L.nv) {
      case 1: return res ? norm_fwd_v2_kernel<T, false, 1, true, 32, C> : norm_fwd_v2_kernel<T, false, 1, false, 32, CS>;
      case 2: return res ? norm_fwd_v2_kernel<T, false, 2, true, 32, C> : norm_fwd_v2_kernel<T, false, 2, false, 32, CS>;
      case 4: return res ? norm_fwd_v2_kernel<T, false, 4, true, 32, C> : norm_fwd_v2_kernel<T, false, 4, false, 32, CS>;
      default: return nullptr;
    }
  }
}

/* Forward v2: one block per row group(s), as many blocks as rows / rows per block;
 * launched as a programmatic dependent of the previous kernel (c.pdl): measured, run of
 * 718ecab, 16k rows bf16, back-to-back calls: +1-3% without the residual, +0.5-1% with. */
template <typename T, bool LAYER>
cudaError_t norm_fwd_v2_launch(const norm_cfg &c, const norm_fwd_params &p, const norm_launch &L,
                               cudaStream_t stream) {
  const dim3 block(L.threads, L.rows);
  const int64_t blocks = (p.rows + L.rows - 1) / L.rows;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  void (*kernel)(norm_fwd_params) = norm_fwd_v2_select<T, LAYER>(p.residual != nullptr, L);
  if constexpr (!LAYER) {
    if (c.rms_fwd_cut) {
      void (*cut)(norm_fwd_params) =
          norm_fwd_v2_cut_pick<T>(p.residual != nullptr, c.rms_fwd_cut == 2, p.cols, L);
      if (cut) kernel = cut;
    }
  }
  if (!kernel) return cudaErrorInvalidConfiguration;
  return norm_launch_ex(c, kernel, dim3((unsigned)blocks), block, stream, p);
}

/* Launch facts of a kernel on a device, cached: the dynamic shared memory limit raised
 * (norm_raise_smem_limit) and blocks per SM (norm_occupancy), so that a backward call
 * after the first makes no CUDA query and takes no lock (the first one per key makes
 * them). Slots are claimed in index order by a compare-and-swap and published by a release
 * store, so the claimed slots are a prefix and a lookup stops at the first free one; two
 * threads filling the same key at once leave two equal entries. Failures are not cached
 * (the next call asks again); a full table computes uncached. The key is everything the
 * answer depends on (kernel, device, kind, threads, bytes), so the run-time knobs
 * (OT_NORM_*: the tests switch them) only choose among keys. */
struct norm_fact_slot {
  std::atomic<int> state; /* 0 free, 1 being written, 2 ready */
  const void *kernel;
  int dev, kind, threads, value;
  size_t bytes;
};
constexpr int kNormFacts = 128;
template <typename F>
static inline int norm_fact(const void *kernel, int dev, int kind, int threads, size_t bytes,
                            F compute) {
  static norm_fact_slot table[kNormFacts]; /* zero-initialized: all free */
  int i = 0;
  for (; i < kNormFacts; i++) {
    const norm_fact_slot &e = table[i];
    const int st = e.state.load(std::memory_order_acquire);
    if (st == 0) break;
    if (st == 2 && e.kernel == kernel && e.dev == dev && e.kind == kind &&
        e.threads == threads && e.bytes == bytes)
      return e.value;
  }
  const int v = compute();
  if (v <= 0) return v;
  for (; i < kNormFacts; i++) {
    int expect = 0;
    norm_fact_slot &e = table[i];
    if (e.state.compare_exchange_strong(expect, 1, std::memory_order_relaxed)) {
      e.kernel = kernel, e.dev = dev, e.kind = kind, e.threads = threads, e.bytes = bytes;
      e.value = v;
      e.state.store(2, std::memory_order_release);
      break;
    }
  }
  return v;
}

/* Raise a kernel's dynamic shared memory limit to what the device's opt-in maximum
 * leaves beside its static shared memory, once per (device, kernel): the attribute
 * belongs to the current device, so a second GPU needs its own call. Returns that limit
 * in bytes, 0 on failure. */
static inline int norm_raise_smem_limit(const ot_cuda_state *cs, const void *kernel) {
  return norm_fact(kernel, cs->device, 0, 0, 0, [&]() -> int {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
      (void)cudaGetLastError(); /* the caller falls back to another kernel */
      return 0;
    }
    const int dyn = (int)cs->smem_optin - (int)fa.sharedSizeBytes;
    if (dyn <= 0) return 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return dyn;
  });
}

/* Blocks of `threads` threads with `smem` bytes of dynamic shared memory that fit an SM
 * at once; 0 when the query fails or none fits. */
template <typename K>
static inline int norm_occupancy(const ot_cuda_state *cs, K kernel, int threads, size_t smem) {
  const int v = norm_fact(reinterpret_cast<const void *>(kernel), cs->device, 1, threads, smem,
                          [&]() -> int {
                            int b = 0;
                            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, threads,
                                                                              smem) != cudaSuccess) {
                              (void)cudaGetLastError();
                              return 0;
                            }
                            return b;
                          });
  return v > 0 ? v : 0;
}

/* Launch geometry of a ring kernel (v3, tma): S stages of stage_bytes each of dynamic
 * shared memory per block, as many blocks per SM as registers and shared memory allow.
 * S = env_stages when in [2, smax]; else S fills the shared memory that the blocks which
 * registers allow per SM leave each (1 KB per block is the driver's), clamped to [2,
 * smax]: more stages in flight or more blocks, the same bytes per SM. The kernel's
 * dynamic shared memory limit is raised to the device's opt-in maximum first. ok =
 * false: the ring does not fit or an occupancy query failed (the caller takes another
 * kernel). Grid: blocks per SM x SMs, at most one block per row. */
struct norm_ring {
  bool ok;
  int stages;
  size_t smem;
  int64_t grid;
};
template <typename K>
static inline norm_ring norm_ring_config(const ot_cuda_state *cs, K kernel, int threads,
                                         size_t stage_bytes, int64_t rows, int env_stages,
                                         int smax) {
  norm_ring R = {false, 0, 0, 0};
  const int limit = norm_raise_smem_limit(cs, reinterpret_cast<const void *>(kernel));
  if (limit <= 0 || stage_bytes * 2 > (size_t)limit) return R;
  int S = env_stages;
  if (S < 2 || S > smax) {
    const int b0 = norm_occupancy(cs, kernel, threads, 0);
    if (b0 < 1) return R;
    size_t per_block = cs->smem_per_sm / (size_t)b0;
    per_block = per_block > 1024 ? per_block - 1024 : 0;
    S = (int)(per_block / stage_bytes);
    S = S < 2 ? 2 : (S > smax ? smax : S);
  }
  while (S > 2 && (size_t)S * stage_bytes > (size_t)limit) S--;
  R.stages = S;
  R.smem = (size_t)S * stage_bytes;
  const int per_sm = norm_occupancy(cs, kernel, threads, R.smem);
  if (per_sm < 1) return R;
  const int64_t g = (int64_t)per_sm * cs->sm_count;
  R.grid = g < rows ? g : rows;
  R.ok = R.grid > 0;
  return R;
}

/* ---- bulk-copy (TMA) launch configuration -------------------------------------------------
 * Eligible: LayerNorm, rows of 4-16 KB (bf16 / fp16 2048-8192 columns, fp32 1024-4096;
 * below, the rows per block of the other kernels suit better and were not measured
 * against it), a device and a build that run the sm_90 code, OT_NORM_BWD_IMPL unset or
 * "tma". */
static inline bool norm_tma_rows_ok(int64_t cols, size_t elem) {
  const int64_t rb = cols * (int64_t)elem;
  return rb % 16 == 0 && rb >= 4096 && rb <= 16384;
}

/* Once per device whether the bulk-copy kernels run their sm_90 code (probe: one of them;
 * all are compiled the same). */
template <typename K>
static inline bool norm_tma_device_ok(const ot_cuda_state *cs, K probe) {
  /* 1 yes, -1 no, 0 not probed yet; several host threads may probe at once (each writes
   * the same answer: relaxed atomics, no lock). "= {}": constant-initialized (GCC
   * otherwise guards an array of atomics' initialization, a check on every call). */
  static std::atomic<int> cached[16] = {};
  if (cs->cc_major < 9) return false;
  const int dev = cs->device;
  if (dev >= 0 && dev < 16) {
    const int c = cached[dev].load(std::memory_order_relaxed);
    if (c) return c > 0;
  }
  const bool ok = ot_bulk_kernel_ok(reinterpret_cast<const void *>(probe));
  if (dev >= 0 && dev < 16) cached[dev].store(ok ? 1 : -1, std::memory_order_relaxed);
  return ok;
}

/* Forward v3 on v2's shape L (one row per block here). Returns cudaErrorNotSupported
 * when the ring does not fit, for the caller to take v2. */
template <typename T, bool LAYER>
cudaError_t norm_fwd_v3_launch(const norm_cfg &c, const norm_fwd_params &p, const norm_launch &L,
                               cudaStream_t stream) {
  const bool res = p.residual != nullptr;
  const size_t stage = (size_t)(res ? 2 : 1) * L.nv * L.threads * 16;
  auto go = [&](auto kernel) -> cudaError_t {
    const norm_ring R = norm_ring_config(c.cs, kernel, L.threads, stage, p.rows, c.fwd_stages, 8);
    if (!R.ok) return cudaErrorNotSupported;
    kernel<<<(unsigned)R.grid, L.threads, R.smem, stream>>>(p, R.stages);
    return cudaGetLastError();
  };
#define OT_NORM_FWD3(NV, TPR)                                                            \
  (res ? go(norm_fwd_v3_kernel<T, LAYER, NV, true, TPR>)                                 \
       : go(norm_fwd_v3_kernel<T, LAYER, NV, false, TPR>))
  if (L.threads <= 32) {
    switch (L.nv) {
      case 1: return OT_NORM_FWD3(1, 32);
      case 2: return OT_NORM_FWD3(2, 32);
      case 4: return OT_NORM_FWD3(4, 32);
      case 8: return OT_NORM_FWD3(8, 32);
      default: return cudaErrorNotSupported;
    }
  }
  if (L.nv != 8) return cudaErrorNotSupported;
  switch (L.threads) {
    case 64: return OT_NORM_FWD3(8, 64);
    case 128: return OT_NORM_FWD3(8, 128);
    default: return OT_NORM_FWD3(8, 256);
  }
#undef OT_NORM_FWD3
}

/* The aligned forward: v2, or v3 with OT_NORM_FWD_IMPL=v3 (v2 where its ring does not
 * fit). Both give the same bits (same thread-to-vector map and summation order).
 * Measured (H200, 16k rows bf16, run of 179a3ae, TB/s, copy 4.29): v2 / v3 with the
 * automatic ring / v3 S=3 / v3 S=4 -- RMSNorm 4096 3.78 / 3.28 / 3.06 / 2.84, 8192
 * 3.91 / 3.61 / 3.39 / 3.36; LayerNorm 4096 3.62 / 2.89 / 2.64 / 2.34, 8192 3.83 /
 * 3.19 / 2.87 / 2.77; with the residual v2 also ahead by 0.3-0.6. The ring adds a
 * shared-memory round trip per vector and a persistent block loses v2's many short
 * blocks in flight per SM; v3 stays opt-in. */
template <typename T, bool LAYER>
cudaError_t norm_fwd_fast_launch(const norm_cfg &c, const norm_fwd_params &p, const norm_launch &L,
                                 cudaStream_t stream) {
  if (c.fwd_impl == kNormImplV3) {
    const cudaError_t e = norm_fwd_v3_launch<T, LAYER>(c, p, L, stream);
    if (e != cudaErrorNotSupported) return e;
  }
  return norm_fwd_v2_launch<T, LAYER>(c, p, L, stream);
}

template <typename T, bool LAYER>
cudaError_t norm_forward_launch(const norm_cfg &c, const norm_fwd_params &p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  constexpr int V = vec_width<T>::value;
  const bool aligned = p.cols % V == 0 && ot_rows_aligned16(p.x, p.x_stride, sizeof(T), p.rows) &&
                       ot_rows_aligned16(p.residual, p.residual_stride, sizeof(T), p.rows) &&
                       ot_rows_aligned16(p.out, p.out_stride, sizeof(T), p.rows) &&
                       (!p.residual ||
                        ot_rows_aligned16(p.residual_out, p.residual_out_stride, sizeof(T), p.rows)) &&
                       ot_rows_aligned16(p.weight, 0, sizeof(T), 1) &&
                       ot_rows_aligned16(LAYER ? p.bias : nullptr, 0, sizeof(T), 1);
  if (aligned) {
    const norm_launch L2 = norm_pick_fwd_v2(c, p.cols, V);
    if (L2.nv) return norm_fwd_fast_launch<T, LAYER>(c, p, L2, stream);
  }
  const norm_launch L =
      norm_pick_launch(p.cols, V, (p.cols + V - 1) / V > 512 ? 512 : 256, 8);
  const dim3 block(L.threads, L.rows);
  const int64_t blocks = (p.rows + L.rows - 1) / L.rows;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const dim3 grid((unsigned)blocks);
#define OT_NORM_FWD(NV)                                                                  \
  (aligned ? norm_fwd_kernel<T, LAYER, NV, true><<<grid, block, 0, stream>>>(p)          \
           : norm_fwd_kernel<T, LAYER, NV, false><<<grid, block, 0, stream>>>(p))
  switch (L.nv) {
    case 1: OT_NORM_FWD(1); break;
    case 2: OT_NORM_FWD(2); break;
    case 4: OT_NORM_FWD(4); break;
    case 8: OT_NORM_FWD(8); break;
    default:
      if (aligned) norm_fwd_loop_kernel<T, LAYER, true><<<grid, block, 0, stream>>>(p);
      else norm_fwd_loop_kernel<T, LAYER, false><<<grid, block, 0, stream>>>(p);
  }
#undef OT_NORM_FWD
  return cudaGetLastError();
}

/* Persistent grid: as many blocks as fit on the device at once (at most one per row
 * group's worth of rows). */
template <typename K>
static inline int64_t norm_bwd_grid(const ot_cuda_state *cs, K kernel, const norm_launch &L,
                                    int64_t rows) {
  int per_sm = norm_occupancy(cs, kernel, L.threads * L.rows, 0);
  if (per_sm < 1) per_sm = 1;
  int64_t g = (int64_t)per_sm * cs->sm_count;
  const int64_t need = (rows + L.rows - 1) / L.rows;
  return g < need ? g : (need > 0 ? need : 1);
}

/* dw / db: [cols] outputs of storage T or NULL. The workspace is allocated and freed
 * stream-ordered on `stream`. */
template <typename T, bool LAYER>
cudaError_t norm_backward_launch_impl(const norm_cfg &c, norm_bwd_params p, T *dw, T *db,
                                      cudaStream_t stream);

/* The backward entry. Without saved statistics, and where the forward takes v2, the
 * statistics are first computed by the forward v2 kernel itself (statistics-only
 * mode, one extra read of h), so that the backward that recomputes them gives the same
 * bits as the one that is given the forward's. */
template <typename T, bool LAYER>
cudaError_t norm_backward_launch(const norm_cfg &c, norm_bwd_params p, T *dw, T *db,
                                 cudaStream_t stream) {
  if (p.cols == 0) return cudaSuccess;
  constexpr int V = vec_width<T>::value;
  float *stats = nullptr;
  if (!p.rstd && p.rows > 0 && p.cols % V == 0 &&
      ot_rows_aligned16(p.h, p.h_stride, sizeof(T), p.rows)) {
    const norm_launch L = norm_pick_fwd_v2(c, p.cols, V);
    if (L.nv) {
      cudaError_t e = norm_temp_alloc(c, (size_t)p.rows * 2 * sizeof(float),
                                      "the recomputed statistics",
                                      reinterpret_cast<void **>(&stats));
      if (e != cudaSuccess) return e;
      norm_fwd_params f;
      memset(&f, 0, sizeof f);
      f.rows = p.rows;
      f.cols = p.cols;
      f.x = p.h;
      f.x_stride = p.h_stride;
      f.mean = LAYER ? stats : nullptr;
      f.rstd = stats + p.rows;
      f.eps = p.eps;
      e = norm_fwd_fast_launch<T, LAYER>(c, f, L, stream);
      if (e != cudaSuccess) {
        (void)norm_temp_free(c, stats);
        return e;
      }
      p.rstd = stats + p.rows;
      p.mean = LAYER ? stats : nullptr;
    }
  }
  cudaError_t e = norm_backward_launch_impl<T, LAYER>(c, p, dw, db, stream);
  if (stats) {
    cudaError_t f = norm_temp_free(c, stats);
    if (e == cudaSuccess) e = f;
  }
  return e;
}

/* dw / db (either may be NULL) = the sums over parts of the [parts, cols] partials. */
template <typename T>
cudaError_t norm_reduce_partials_launch(const norm_cfg &c, const float *dw_part,
                                        const float *db_part, int64_t parts, int64_t cols, T *dw,
                                        T *db, cudaStream_t stream) {
  /* v2 reads the partials' rows with 16-byte loads: cols % 4 == 0 keeps every row on a
   * 16-byte boundary once the buffer's start is (ot_cuda_temp_alloc gives 256). */
  const bool parts16 = (!dw || ot_is_aligned16(dw_part)) && (!db || ot_is_aligned16(db_part));
  if (c.reduce_v2 && cols % 4 == 0 && parts16 && (dw || db)) {
    const dim3 g((unsigned)((cols + 15) / 16)), b(512);
    if (dw && db)
      return norm_launch_ex(c, norm_reduce_partials_v2_kernel<T, 2>, g, b, stream, dw_part,
                            db_part, parts, cols, dw, db);
    const float *pa = dw ? dw_part : db_part;
    return norm_launch_ex(c, norm_reduce_partials_v2_kernel<T, 1>, g, b, stream, pa,
                          (const float *)nullptr, parts, cols, dw ? dw : db, (T *)nullptr);
  }
  const dim3 rg((unsigned)((cols + 31) / 32)), rb(32, 32);
  return norm_launch_ex(c, norm_reduce_partials_kernel<T>, rg, rb, stream, dw_part, db_part,
                        parts, cols, dw, db);
}

/* Run `launch(q)` with q = p plus [parts, cols] fp32 dweight / dbias partial workspaces
 * (the op's temporaries), then sum the partials into dw / db. */
template <typename T, bool LAYER, typename F>
cudaError_t norm_bwd_with_partials(const norm_cfg &c, norm_bwd_params p, T *dw, T *db,
                                   int64_t parts, cudaStream_t stream, F launch) {
  const bool want_dw = dw != nullptr, want_db = LAYER && db != nullptr;
  float *ws = nullptr;
  if (want_dw || want_db) {
    const size_t bytes = (size_t)parts * (size_t)p.cols * sizeof(float) * (want_dw + want_db);
    cudaError_t e = norm_temp_alloc(c, bytes, "the dweight / dbias partials",
                                    reinterpret_cast<void **>(&ws));
    if (e != cudaSuccess) return e;
  }
  p.dw_part = want_dw ? ws : nullptr;
  p.db_part = want_db ? ws + (want_dw ? parts * p.cols : 0) : nullptr;
  cudaError_t e = launch(p);
  if (e == cudaSuccess && (want_dw || want_db))
    e = norm_reduce_partials_launch<T>(c, p.dw_part, p.db_part, parts, p.cols,
                                       want_dw ? dw : nullptr, want_db ? db : nullptr, stream);
  if (ws) {
    cudaError_t f = norm_temp_free(c, ws);
    if (e == cudaSuccess) e = f;
  }
  return e;
}

/* Backward with bulk-copy rings (LayerNorm's only): 2 vectors per thread (TPR = nvec / 2
 * rounded to a warp, at most 512 for the 16 KB rows; 4 vectors ran slower at 4096: run of
 * a342519, removed), S slots per block (OT_NORM_BWD_TMA_STAGES = 2..4, default 3; 0: what
 * the blocks that registers allow per SM leave of shared memory, at most 4), as many blocks
 * as fit per SM. 3 slots against the automatic depth (4 at 4096 / 8192 bf16), H200, 16k rows
 * bf16, TB/s, same process: with dx stored evict-first (the kernel since 4cdbb62) 3.53 vs
 * 3.36 / 3.47 at 4096 (run of 4cdbb62), and in the earlier builds with evict-first dx 3.40 /
 * 3.44 vs 3.29-3.40 at 4096, 3.59 / 3.68 vs 3.50-3.63 at 8192 (runs for 465d8ee); with plain
 * stores no gain (3.34 vs 3.35, run of 1d1bbbc; 3.39 vs 3.38 and 3.60 vs 3.63, run of
 * ef875c3) -- docs/PERFORMANCE.md. */
template <typename T, bool LAYER>
cudaError_t norm_bwd_tma_launch(const norm_cfg &c, const norm_bwd_params &p, T *dw, T *db,
                                cudaStream_t stream) {
  constexpr int V = vec_width<T>::value, NV = 2;
  const auto kernel = norm_bwd_tma_kernel<T, LAYER, NV>;
  if (!norm_tma_device_ok(c.cs, kernel)) return cudaErrorNotSupported;
  const int64_t nvec = p.cols / V;
  if (nvec > 512 * NV) return cudaErrorNotSupported;
  const int threads = (int)(((nvec + NV - 1) / NV + 31) / 32 * 32);
  const size_t stage = (size_t)(p.dres ? 3 : 2) * (size_t)p.cols * sizeof(T);
  const norm_ring R =
      norm_ring_config(c.cs, kernel, threads, stage, p.rows, c.bwd_tma_stages, kNormTmaMaxStages);
  if (!R.ok) return cudaErrorNotSupported;
  return norm_bwd_with_partials<T, LAYER>(c, p, dw, db, R.grid, stream, [&](const norm_bwd_params &q) {
    kernel<<<(unsigned)R.grid, threads, R.smem, stream>>>(q, R.stages);
    return cudaGetLastError();
  });
}

template <typename T, bool LAYER>
cudaError_t norm_backward_launch_impl(const norm_cfg &c, norm_bwd_params p, T *dw, T *db,
                                      cudaStream_t stream) {
  if (p.cols == 0) return cudaSuccess;
  constexpr int V = vec_width<T>::value;
  const bool aligned = p.cols % V == 0 && ot_rows_aligned16(p.dy, p.dy_stride, sizeof(T), p.rows) &&
                       ot_rows_aligned16(p.dres, p.dres_stride, sizeof(T), p.rows) &&
                       ot_rows_aligned16(p.h, p.h_stride, sizeof(T), p.rows) &&
                       ot_rows_aligned16(p.dx, p.dx_stride, sizeof(T), p.rows) &&
                       ot_rows_aligned16(p.weight, 0, sizeof(T), 1);
  const int64_t nvec = p.cols / V;
  /* Measured (H200, 16k rows bf16, f607cff): at 4096, v2 with NV = 2 (256 threads, 2
   * blocks per SM) 2.70 TB/s (RMS) against 2.04 with NV = 1 (512 threads, 1 block) and
   * 1.98 for the f46b949 kernel; at 8192 (NV = 2, 512 threads, 1 block per SM) 2.53 /
   * 2.44 (RMS / LayerNorm) against 2.51 / 2.25.
   * v3 (run of 179a3ae, TB/s at 4096 / 8192; v2 2.73 / 2.56 RMS, 2.56 / 2.47 LN):
   *   RMSNorm   NV=2 S=2 3.25 / 3.51, NV=2 automatic S (3) 3.18 / 3.44, S=6 2.81 / 2.83,
   *             NV=4 2.99 / 3.26;
   *   LayerNorm NV=4 automatic S 2.81 / 3.10, NV=2 S=2 2.83 / 2.99, NV=2 automatic
   *             2.55 / 2.30, S=6 2.71 / 2.75.
   * So: RMSNorm NV = 2 with a 2-row ring (more blocks, fewer rows each: the bytes in
   * flight stopped being the limit, the per-row work did), LayerNorm NV = 4 (its db
   * partials double the accumulators; 4 vectors per thread halve the threads that
   * repeat the per-row reduction) with the automatic ring. */
  /* The bulk-copy kernel: LayerNorm's default (run of a342519, TB/s at 4096 / 8192: 3.06
   * / 3.26 against v3's 2.81 / 3.10). Not instantiated for RMSNorm (3.21 / 3.34 against
   * v3's 3.26 / 3.52: no gain where v3's partials already fit the registers; removed). */
  if constexpr (LAYER) {
    const bool bwd_tma = c.bwd_impl == kNormImplDefault || c.bwd_impl == kNormImplTma;
    if (aligned && p.rows > 0 && p.rstd && p.mean && norm_tma_rows_ok(p.cols, sizeof(T)) &&
        bwd_tma) {
      const cudaError_t e = norm_bwd_tma_launch<T, LAYER>(c, p, dw, db, stream);
      if (e != cudaErrorNotSupported) return e;
    }
  }
  if (aligned && p.rows > 0 && p.rstd && (!LAYER || p.mean) && nvec <= 2048 &&
      c.bwd_impl != kNormImplOld && c.bwd_impl != kNormImplV2) {
    const int env_nv = c.bwd_v3nv >= 0 ? c.bwd_v3nv : (LAYER ? 4 : 2);
    const int nv = nvec > 1024 || env_nv == 4 ? 4 : 2;
    const int threads = (int)(((nvec + nv - 1) / nv + 31) / 32 * 32);
    const size_t stage = (size_t)(p.dres ? 3 : 2) * nv * threads * 16;
    const int env_s = c.bwd_stages >= 0 ? c.bwd_stages : (LAYER ? 0 : 2);
    auto go = [&](auto kernel) -> cudaError_t {
      const norm_ring R = norm_ring_config(c.cs, kernel, threads, stage, p.rows, env_s, 8);
      if (!R.ok) return cudaErrorNotSupported;
      return norm_bwd_with_partials<T, LAYER>(c, p, dw, db, R.grid, stream, [&](const norm_bwd_params &q) {
        kernel<<<(unsigned)R.grid, threads, R.smem, stream>>>(q, R.stages);
        return cudaGetLastError();
      });
    };
    /* the weight in fp32 registers (WF) at NV = 2 in blocks of <= 256 threads: RMSNorm
     * 16k x 4096 bf16 3.73 vs 3.40 TB/s (71 registers, 3 blocks of 256 per SM instead of
     * 4), but 3.20 vs 3.54 at 8192 (512 threads: 1 block per SM instead of 2), run of
     * ef875c3; NV = 4 would pass 128 registers. Since 1d1bbbc (dres no longer in local
     * memory) the 16-bit instance takes 92-97 registers, 2 blocks of 256 per SM: 3.80 at
     * 16k x 4096, and held to 80 (3 blocks) it ran 3.73 (run of 1d1bbbc) */
    const cudaError_t e = nv == 4          ? go(norm_bwd_v3_kernel<T, LAYER, 4, false>)
                          : threads <= 256 ? go(norm_bwd_v3_kernel<T, LAYER, 2, true>)
                                           : go(norm_bwd_v3_kernel<T, LAYER, 2, false>);
    if (e != cudaErrorNotSupported) return e;
  }
  const int vmax = 1024;
  if (aligned && p.rows > 0 && nvec <= vmax && c.bwd_impl != kNormImplOld) {
    /* LayerNorm's db partials leave the 16-bit NV = 2 kernel room for D = 2 only
     * within 128 registers (D = 3 spills) */
    constexpr int kD2 = (LAYER && sizeof(T) == 2) ? 2 : 3;
    int nv = 2;
    if (c.bwd_nv == 1 && nvec <= 512) nv = 1;
    const int threads = (int)(((nvec + nv - 1) / nv + 31) / 32 * 32);
    const norm_launch L2 = {nv, threads, 1};
    const int64_t grid2 = nv == 1 ? norm_bwd_grid(c.cs, norm_bwd_v2_kernel<T, LAYER, 1, 6>, L2, p.rows)
                                  : norm_bwd_grid(c.cs, norm_bwd_v2_kernel<T, LAYER, 2, kD2>, L2, p.rows);
    return norm_bwd_with_partials<T, LAYER>(c, p, dw, db, grid2, stream, [&](const norm_bwd_params &q) {
      if (nv == 1) norm_bwd_v2_kernel<T, LAYER, 1, 6><<<(unsigned)grid2, threads, 0, stream>>>(q);
      else norm_bwd_v2_kernel<T, LAYER, 2, kD2><<<(unsigned)grid2, threads, 0, stream>>>(q);
      return cudaGetLastError();
    });
  }
  const norm_launch L = norm_pick_launch(p.cols, V, 512, sizeof(T) == 4 ? 4 : 2);
  const dim3 block(L.threads, L.rows);
  int64_t grid = 1;
#define OT_NORM_BWD_KERNEL(NV, AL) norm_bwd_kernel<T, LAYER, NV, AL>
#define OT_NORM_BWD_CASE(NV)                                                              \
  case NV:                                                                                \
    grid = aligned ? norm_bwd_grid(c.cs, OT_NORM_BWD_KERNEL(NV, true), L, p.rows)         \
                   : norm_bwd_grid(c.cs, OT_NORM_BWD_KERNEL(NV, false), L, p.rows);       \
    break;
  switch (L.nv) {
    OT_NORM_BWD_CASE(1)
    OT_NORM_BWD_CASE(2)
    OT_NORM_BWD_CASE(4)
    default:
      grid = aligned ? norm_bwd_grid(c.cs, norm_bwd_loop_kernel<T, LAYER, true>, L, p.rows)
                     : norm_bwd_grid(c.cs, norm_bwd_loop_kernel<T, LAYER, false>, L, p.rows);
  }
#undef OT_NORM_BWD_CASE
  const bool want_dw = dw != nullptr, want_db = LAYER && db != nullptr;
  const int64_t parts = grid * L.rows;
  float *ws = nullptr;
  if ((want_dw || want_db) && p.rows > 0) {
    const size_t bytes = (size_t)parts * (size_t)p.cols * sizeof(float) * (want_dw + want_db);
    cudaError_t e = norm_temp_alloc(c, bytes, "the dweight / dbias partials",
                                    reinterpret_cast<void **>(&ws));
    if (e != cudaSuccess) return e;
  }
  p.dw_part = want_dw ? ws : nullptr;
  p.db_part = want_db ? ws + (want_dw ? parts * p.cols : 0) : nullptr;
  if (p.rows > 0) {
    const dim3 g((unsigned)grid);
#define OT_NORM_BWD_RUN(NV)                                                               \
  case NV:                                                                                \
    if (aligned) OT_NORM_BWD_KERNEL(NV, true)<<<g, block, 0, stream>>>(p);                \
    else OT_NORM_BWD_KERNEL(NV, false)<<<g, block, 0, stream>>>(p);                       \
    break;
    switch (L.nv) {
      OT_NORM_BWD_RUN(1)
      OT_NORM_BWD_RUN(2)
      OT_NORM_BWD_RUN(4)
      default:
        if (aligned) norm_bwd_loop_kernel<T, LAYER, true><<<g, block, 0, stream>>>(p);
        else norm_bwd_loop_kernel<T, LAYER, false><<<g, block, 0, stream>>>(p);
    }
#undef OT_NORM_BWD_RUN
#undef OT_NORM_BWD_KERNEL
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
      if (ws) (void)norm_temp_free(c, ws);
      return e;
    }
  }
  if (want_dw || want_db) {
    /* rows == 0: parts is 1 and no partials exist; reduce over zero parts (writes 0). */
    const int64_t nparts = p.rows > 0 ? parts : 0;
    cudaError_t e = norm_reduce_partials_launch<T>(c, p.dw_part, p.db_part, nparts, p.cols,
                                                   want_dw ? dw : nullptr, want_db ? db : nullptr,
                                                   stream);
    if (ws) {
      cudaError_t f = norm_temp_free(c, ws);
      if (e == cudaSuccess) e = f;
    }
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

} /* namespace ot */

#endif /* OT_CUDA_NORM_CUH */
