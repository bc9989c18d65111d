/*
 * attention_bwd.cu -- CUDA flash attention backward, the portable path (sm_80+,
 * mma.sync m16n8k16, bf16 / fp16 storage, fp32 accumulation). From the saved lse the
 * probabilities P = exp(S - lse) are recomputed tile by tile; three kernels:
 *
 *   pre:  delta = rowsum(dO * O) per (row, query head), float32 in context scratch;
 *   dkdv: one block per (sequence, kv head, BK keys); warp w owns 16 keys and keeps
 *         their dK and dV in registers while it walks the query tiles of every query
 *         head of the GQA group (so the group sum needs no atomics):
 *             S^T = K Q^T, dP^T = V dO^T, P^T = exp(S^T - lse), dS^T = P^T (dP^T - delta)
 *             dV += P^T dO,  dK += dS^T Q        (P^T and dS^T stay in registers);
 *   dq:   one block per (sequence, query head, BM queries); warp w owns 16 queries:
 *             S = Q K^T, dP = dO V^T, dS = P (dP - delta),  dQ += dS K.
 *
 * On a 9.0 device the Hopper backward (sm90/attention_bwd_sm90.cu) is asked first, unless
 * OT_ATTN_IMPL=portable or params.deterministic (it accumulates dq with atomics).
 *
 * Every output element has exactly one owner, so this backward is bitwise deterministic
 * and needs no fp32 dQ accumulator nor atomics. The price is recomputing S and dP in the
 * dq kernel: 7 tile products instead of the 5 of an atomic-dQ backward (~1.4x the
 * tensor-core work). Head dims above 128 split the accumulated columns over two blocks
 * (DA = 128 columns each, S and dP recomputed per half) to stay inside 255 registers.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "attention_sm90.h"
#include "cuda_state.h"

namespace ot {
namespace attn {

/* Tile shapes. dK/dV kernel: NW warps (16 NW keys a block), BQ queries a tile. dQ kernel:
 * NW warps (16 NW queries a block), BN keys a tile. DA = accumulated columns a block. */
template <int NW_, int BQ_> struct kvcfg {
  static constexpr int NW = NW_, BQ = BQ_;
};
template <int NW_, int BN_> struct qcfg {
  static constexpr int NW = NW_, BN = BN_;
};
template <int D> struct bwd_da {
  static constexpr int DA = D <= 128 ? D : 128;
};
/* D = 128 (and 96): 64-query tiles for dK/dV and 32-key tiles for dQ measured ~4% faster
 * than 32 / 64 on the H200 (docs/ATTENTION.md). */
template <int D> struct dkdv_cfg : kvcfg<4, (D <= 128 ? 64 : 32)> {};
template <int D> struct dq_cfg : qcfg<4, (D <= 64 ? 64 : 32)> {};

/* Compact index of (sequence b, query head h, row i of the sequence) in delta. */
__device__ __forceinline__ int64_t delta_idx(const Params &P, int b, int h, int q0, int i) {
  return P.cu_q ? (int64_t)h * P.tq + q0 + i : ((int64_t)b * P.hq + h) * P.sq + i;
}

__device__ __forceinline__ float lse_at(const Params &P, int b, int h, int64_t tok) {
  return P.lse[(int64_t)b * P.lse_bs + (int64_t)h * P.lse_hs + tok * P.lse_ts];
}

/* delta = rowsum(dO * O): one warp per (token row, head). */
template <typename T>
__global__ void bwd_pre_kernel(const Params P) {
  int64_t rows_total, row, tok;
  int head, b;
  if (!warp_row_head(P, rows_total, row, head, b, tok)) return;
  const int lane = threadIdx.x & 31;
  const T *o = row_ptr<T>(P.o, b, tok, head), *dout = row_ptr<T>(P.dout, b, tok, head);
  float s = 0.0f;
  for (int c = lane; c < P.d; c += 32) s += to_f32(o[c]) * to_f32(dout[c]);
  s = warp_sum(s);
  if (lane == 0)
    P.delta[P.cu_q ? (int64_t)head * P.tq + tok : ((int64_t)b * P.hq + head) * P.sq + tok] = s;
}

/* ---- dK, dV ---------------------------------------------------------------------------- */

template <typename T, int D, class C>
__global__ void __launch_bounds__(C::NW * 32)
    bwd_dkdv_kernel(const Params P) {
  constexpr int NW = C::NW, BQ = C::BQ, DA = bwd_da<D>::DA, NTH = NW * 32;
  constexpr int BK = 16 * NW, DP = D + 8;
  constexpr int NT_Q = BQ / 8, KS_D = D / 16, KS_Q = BQ / 16, NT_A = DA / 8;
  constexpr int NCOL = D / DA;
  extern __shared__ uint4 smem_raw[];
  T *sK = reinterpret_cast<T *>(smem_raw);
  T *sV = sK + BK * DP;
  T *sQ = sV + BK * DP;      /* [2][BQ][DP] */
  T *sdO = sQ + 2 * BQ * DP; /* [2][BQ][DP] */
  float *sL = reinterpret_cast<float *>(sdO + 2 * BQ * DP); /* [2][BQ]: lse * log2(e), +inf if none */
  float *sD = sL + 2 * BQ;                                  /* [2][BQ]: delta */

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = blockIdx.y / NCOL, c0 = (blockIdx.y % NCOL) * DA;
  int b, tile;
  if (P.cu_k) {
    b = varlen_tile(P.cu_k, P.batch, BK, blockIdx.x, tile);
    if (b < 0) return;
  } else {
    b = blockIdx.z;
    tile = blockIdx.x;
  }
  int q0, sq, k0, sk;
  if (!seq_of(P, b, q0, sq, k0, sk)) return;
  const int kb = tile * BK;
  if (kb >= sk) return;
  const int nkeys = min(BK, sk - kb);
  const int off = sk - sq;

  /* Queries that see a key of [kb, kb + BK - 1]: hi(i) >= kb and lo(i) <= kb + BK - 1. */
  int imin = P.wr < 0 ? 0 : kb - off - P.wr;
  int imax = P.wl < 0 ? sq - 1 : kb + BK - 1 - off + P.wl;
  imin = max(imin, 0);
  imax = min(imax, sq - 1);
  const int nqt = imax >= imin ? (imax - imin + BQ) / BQ : 0;
  const int nit = nqt * P.group;

  load_tile<T, BK, D, DP, NTH>(sK, P.k, b, (int64_t)k0 + kb, g, nkeys, P.d, P.vec, tid);
  load_tile<T, BK, D, DP, NTH>(sV, P.v, b, (int64_t)k0 + kb, g, nkeys, P.d, P.vec, tid);

  const float LOG2E = 1.4426950408889634f;
  auto load_q = [&](int it, int stage) {
    const int h = g * P.group + it / nqt;
    const int i0 = imin + (it % nqt) * BQ;
    const int n = min(BQ, sq - i0);
    load_tile<T, BQ, D, DP, NTH>(sQ + stage * BQ * DP, P.q, b, (int64_t)q0 + i0, h, n, P.d, P.vec, tid);
    load_tile<T, BQ, D, DP, NTH>(sdO + stage * BQ * DP, P.dout, b, (int64_t)q0 + i0, h, n, P.d, P.vec, tid);
    for (int r = tid; r < BQ; r += NTH) {
      float l = INFINITY, dl = 0.0f;
      if (r < n) {
        float x = lse_at(P, b, h, (int64_t)q0 + i0 + r);
        l = x == -INFINITY ? INFINITY : x * LOG2E;
        dl = P.delta[delta_idx(P, b, h, q0, i0 + r)];
      }
      sL[stage * BQ + r] = l;
      sD[stage * BQ + r] = dl;
    }
  };
  if (nit > 0) load_q(0, 0);
  cp_async_commit();

  const int gq = lane >> 2, tq = lane & 3;
  const int krow0 = kb + warp * 16 + gq; /* this thread's keys: krow0, krow0 + 8 */
  float dk[1][NT_A][4], dv[1][NT_A][4];
#pragma unroll
  for (int j = 0; j < NT_A; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[0][j][e] = dv[0][j][e] = 0.0f;
  const float cap = P.softcap, inv_cap = cap > 0.0f ? P.scale / cap : 0.0f;

  for (int it = 0; it < nit; it++) {
    const int stage = it & 1;
    if (it + 1 < nit) {
      load_q(it + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T *q_s = sQ + stage * BQ * DP, *do_s = sdO + stage * BQ * DP;
    const float *l_s = sL + stage * BQ, *d_s = sD + stage * BQ;
    const int i0 = imin + (it % nqt) * BQ;

    float s[1][NT_Q][4], dp[1][NT_Q][4];
#pragma unroll
    for (int j = 0; j < NT_Q; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[0][j][e] = dp[0][j][e] = 0.0f;
    mma_rows_nt_mt<T, 1, KS_D, NT_Q, DP>(s, sK + warp * 16 * DP, q_s, lane);
    mma_rows_nt_mt<T, 1, KS_D, NT_Q, DP>(dp, sV + warp * 16 * DP, do_s, lane);

    /* Whole tile visible: every (key, query) pair inside the window and the bounds. */
    const bool masked = i0 + BQ > sq || kb + BK > sk ||
                        (P.wr >= 0 && kb + BK - 1 - i0 - off > P.wr) ||
                        (P.wl >= 0 && kb - (i0 + BQ - 1) - off < -P.wl);
#pragma unroll
    for (int j = 0; j < NT_Q; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int c = j * 8 + 2 * tq + (e & 1);
        float dsm;
        float p = fast_exp2(logit2(s[0][j][e], cap, inv_cap, P.scale_log2, dsm) - l_s[c]);
        if (masked) {
          const int kr = krow0 + 8 * (e >> 1), i = i0 + c;
          const int dd = kr - i - off;
          bool vis = i < sq && kr < sk && (P.wl < 0 || dd >= -P.wl) && (P.wr < 0 || dd <= P.wr);
          if (!vis) p = 0.0f;
        }
        s[0][j][e] = p;
        dp[0][j][e] = p * (dp[0][j][e] - d_s[c]) * dsm;
      }
    uint32_t pa[1][KS_Q][4];
    to_a_frags<T, KS_Q>(pa[0], s[0]);
    mma_regs_nn_mt<T, 1, KS_Q, NT_A, DP>(dv, pa, do_s + c0, lane);
    to_a_frags<T, KS_Q>(pa[0], dp[0]);
    mma_regs_nn_mt<T, 1, KS_Q, NT_A, DP>(dk, pa, q_s + c0, lane);
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads(); /* other threads' copies into this warp's rows (loop skipped) have landed */

  const int wk0 = kb + warp * 16;
  const int wrows = min(16, sk - wk0);
  if (wrows <= 0) return;
  T *stk = sK + warp * 16 * DP, *stv = sV + warp * 16 * DP; /* the warp's own rows */
  __syncwarp();
  stage_acc<T, NT_A, DP>(stk, dk[0], P.scale, P.scale, lane);
  stage_acc<T, NT_A, DP>(stv, dv[0], 1.0f, 1.0f, lane);
  __syncwarp();
  store_rows16<T, DA, DP>(stk, P.dk, b, (int64_t)k0 + wk0, g, wrows, c0, P.d, P.vec, lane);
  store_rows16<T, DA, DP>(stv, P.dv, b, (int64_t)k0 + wk0, g, wrows, c0, P.d, P.vec, lane);
}

/* ---- dQ -------------------------------------------------------------------------------- */

template <typename T, int D, class C>
__global__ void __launch_bounds__(C::NW * 32)
    bwd_dq_kernel(const Params P) {
  constexpr int NW = C::NW, BN = C::BN, DA = bwd_da<D>::DA, NTH = NW * 32;
  constexpr int BM = 16 * NW, DP = D + 8;
  constexpr int NT_N = BN / 8, KS_D = D / 16, KS_N = BN / 16, NT_A = DA / 8;
  constexpr int NCOL = D / DA;
  extern __shared__ uint4 smem_raw[];
  T *sQ = reinterpret_cast<T *>(smem_raw);
  T *sdO = sQ + BM * DP;
  T *sK = sdO + BM * DP; /* [2][BN][DP] */
  T *sV = sK + 2 * BN * DP;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int head = blockIdx.y / NCOL, c0 = (blockIdx.y % NCOL) * DA;
  int b, tile;
  if (P.cu_q) {
    b = varlen_tile(P.cu_q, P.batch, BM, blockIdx.x, tile);
    if (b < 0) return;
  } else {
    b = blockIdx.z;
    tile = gridDim.x - 1 - blockIdx.x;
  }
  int q0, sq, k0, sk;
  if (!seq_of(P, b, q0, sq, k0, sk)) return;
  const int m0 = tile * BM;
  if (m0 >= sq) return;
  const int nrows = min(BM, sq - m0);
  const int g = head / P.group;

  int lo_f, hi_f, lo_l, hi_l;
  key_range(P, m0, sq, sk, lo_f, hi_f);
  key_range(P, m0 + nrows - 1, sq, sk, lo_l, hi_l);
  const int t_lo = lo_f / BN, t_hi = hi_l < lo_f ? t_lo - 1 : hi_l / BN;

  load_tile<T, BM, D, DP, NTH>(sQ, P.q, b, (int64_t)q0 + m0, head, nrows, P.d, P.vec, tid);
  load_tile<T, BM, D, DP, NTH>(sdO, P.dout, b, (int64_t)q0 + m0, head, nrows, P.d, P.vec, tid);
  if (t_lo <= t_hi) {
    int kb = t_lo * BN;
    load_tile<T, BN, D, DP, NTH>(sK, P.k, b, (int64_t)k0 + kb, g, sk - kb, P.d, P.vec, tid);
    load_tile<T, BN, D, DP, NTH>(sV, P.v, b, (int64_t)k0 + kb, g, sk - kb, P.d, P.vec, tid);
  }
  cp_async_commit();

  const int gq = lane >> 2, tq = lane & 3;
  const float LOG2E = 1.4426950408889634f;
  int lo[2], hi[2];
  float lrow[2], drow[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int i = m0 + warp * 16 + gq + 8 * r;
    lrow[r] = INFINITY, drow[r] = 0.0f;
    if (i < sq) {
      key_range(P, i, sq, sk, lo[r], hi[r]);
      float x = lse_at(P, b, head, (int64_t)q0 + i);
      lrow[r] = x == -INFINITY ? INFINITY : x * LOG2E;
      drow[r] = P.delta[delta_idx(P, b, head, q0, i)];
    } else {
      lo[r] = 1, hi[r] = 0;
    }
  }
  float dq[1][NT_A][4];
#pragma unroll
  for (int j = 0; j < NT_A; j++) dq[0][j][0] = dq[0][j][1] = dq[0][j][2] = dq[0][j][3] = 0.0f;
  const float cap = P.softcap, inv_cap = cap > 0.0f ? P.scale / cap : 0.0f;

  for (int t = t_lo; t <= t_hi; t++) {
    const int stage = (t - t_lo) & 1;
    kv_next_or_wait<T, BN, D, DP, NTH>(P, sK, sV, stage, t, t_hi, b, k0, sk, g, tid);
    const T *k_s = sK + stage * BN * DP, *v_s = sV + stage * BN * DP;
    float s[1][NT_N][4], dp[1][NT_N][4];
#pragma unroll
    for (int j = 0; j < NT_N; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[0][j][e] = dp[0][j][e] = 0.0f;
    mma_rows_nt_mt<T, 1, KS_D, NT_N, DP>(s, sQ + warp * 16 * DP, k_s, lane);
    mma_rows_nt_mt<T, 1, KS_D, NT_N, DP>(dp, sdO + warp * 16 * DP, v_s, lane);

    const int kb = t * BN;
    const bool masked = kb < lo_l || kb + BN - 1 > hi_f || kb + BN > sk;
#pragma unroll
    for (int j = 0; j < NT_N; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int r = e >> 1;
        float dsm;
        float p = fast_exp2(logit2(s[0][j][e], cap, inv_cap, P.scale_log2, dsm) - lrow[r]);
        if (masked) {
          int col = kb + j * 8 + 2 * tq + (e & 1);
          if (col < lo[r] || col > hi[r]) p = 0.0f;
        }
        s[0][j][e] = p * (dp[0][j][e] - drow[r]) * dsm;
      }
    uint32_t da[1][KS_N][4];
    to_a_frags<T, KS_N>(da[0], s[0]);
    mma_regs_nn_mt<T, 1, KS_N, NT_A, DP>(dq, da, k_s + c0, lane);
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads(); /* other threads' copies into this warp's rows (loop skipped) have landed */

  const int wrow0 = m0 + warp * 16;
  const int wrows = min(16, sq - wrow0);
  if (wrows <= 0) return;
  T *stg = sQ + warp * 16 * DP;
  __syncwarp();
  stage_acc<T, NT_A, DP>(stg, dq[0], P.scale, P.scale, lane);
  __syncwarp();
  store_rows16<T, DA, DP>(stg, P.dq, b, (int64_t)q0 + wrow0, head, wrows, c0, P.d, P.vec, lane);
}

template <typename T, int D, class CK, class CQ>
static cudaError_t launch_bwd(const Params &P, int64_t rows_total, cudaStream_t stream) {
  constexpr int NCOL = D / bwd_da<D>::DA, BK = 16 * CK::NW, BM = 16 * CQ::NW;
  int64_t warps = rows_total * P.hq;
  if (warps > 0) bwd_pre_kernel<T><<<(unsigned)((warps + 7) / 8), 256, 0, stream>>>(P);
  constexpr size_t s1 = (size_t)(2 * BK + 4 * CK::BQ) * (D + 8) * 2 + (size_t)4 * CK::BQ * sizeof(float);
  constexpr size_t s2 = (size_t)(2 * BM + 4 * CQ::BN) * (D + 8) * 2;
  cudaError_t e = cudaFuncSetAttribute(bwd_dkdv_kernel<T, D, CK>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s1);
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(bwd_dq_kernel<T, D, CQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s2);
  if (e != cudaSuccess) return e;
  dim3 g1, g2;
  if (P.cu_q) {
    g1 = dim3((unsigned)(P.tk / BK + P.batch + 1), (unsigned)(P.hkv * NCOL), 1);
    g2 = dim3((unsigned)(P.tq / BM + P.batch + 1), (unsigned)(P.hq * NCOL), 1);
  } else {
    g1 = dim3((unsigned)((P.sk + BK - 1) / BK), (unsigned)(P.hkv * NCOL), (unsigned)P.batch);
    g2 = dim3((unsigned)((P.sq + BM - 1) / BM), (unsigned)(P.hq * NCOL), (unsigned)P.batch);
  }
  if (g1.x > 0) bwd_dkdv_kernel<T, D, CK><<<g1, CK::NW * 32, s1, stream>>>(P);
  if (g2.x > 0) bwd_dq_kernel<T, D, CQ><<<g2, CQ::NW * 32, s2, stream>>>(P);
  return cudaGetLastError();
}

template <typename T>
static cudaError_t launch_bwd_d(const Params &P, int dpad, int64_t rows_total, cudaStream_t s) {
  switch (dpad) {
    case 64: return launch_bwd<T, 64, dkdv_cfg<64>, dq_cfg<64>>(P, rows_total, s);
    case 96:
    case 128: {
#ifdef OT_ATTN_TUNING
      /* Tuning builds only (-DOT_ATTN_TUNING): OT_ATTN_BWD_CFG=k picks other tile shapes. */
      const char *v = getenv("OT_ATTN_BWD_CFG");
      switch (v ? atoi(v) : 0) {
        case 1: return launch_bwd<T, 128, kvcfg<4, 32>, qcfg<4, 64>>(P, rows_total, s);
        case 2: return launch_bwd<T, 128, kvcfg<8, 32>, qcfg<8, 64>>(P, rows_total, s);
        case 3: return launch_bwd<T, 128, kvcfg<8, 16>, qcfg<8, 32>>(P, rows_total, s);
        case 4: return launch_bwd<T, 128, kvcfg<4, 16>, qcfg<2, 64>>(P, rows_total, s);
        default: break;
      }
#endif
      return launch_bwd<T, 128, dkdv_cfg<128>, dq_cfg<128>>(P, rows_total, s);
    }
    default: return launch_bwd<T, 256, dkdv_cfg<256>, dq_cfg<256>>(P, rows_total, s);
  }
}

} /* namespace attn */
} /* namespace ot */

using namespace ot::attn;

extern "C" ot_status ot_cuda_attention_backward(ot_context *ctx, const ot_attention_args *a) {
  static const char *op = "ot_attention_backward";
  /* The Hopper backward first (not deterministic: atomics for dq), unless
   * OT_ATTN_IMPL=portable; it declines (handled = false) what it does not cover. */
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  const ot_attn_impl impl = ot_cuda_attention_impl();
  if (impl != OT_ATTN_IMPL_PORTABLE && !a->deterministic && st && st->cc_major == 9) {
    bool handled = false;
    ot_status s = ot_cuda_attention_backward_sm90(ctx, a, &handled);
    if (s != OT_OK || handled) return s;
  }
  if (impl == OT_ATTN_IMPL_SM90) return ot_cuda_attention_sm90_refusal(ctx, op, "backward", a);
  Params P;
  int dpad;
  OT_TRY(ot_cuda_attention_params(ctx, a, op, &P, &dpad));
  const bool varlen = a->cu_q != NULL;
  const int64_t rows_total = varlen ? a->tq : a->batch * a->sq;
  const int64_t keys_total = varlen ? a->tk : a->batch * a->sk;
  if (a->batch == 0 || (rows_total == 0 && keys_total == 0)) return OT_OK;
  if (P.hkv * (dpad > 128 ? 2 : 1) > 65535 || P.hq * (dpad > 128 ? 2 : 1) > 65535)
    return ot_error(OT_ERR_UNSUPPORTED, op, "q: too many heads for the CUDA attention backward");
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  size_t bytes = (size_t)(rows_total > 0 ? rows_total : 1) * a->hq * sizeof(float);
  P.delta = (float *)ot_cuda_scratch(ctx, bytes, op);
  if (!P.delta) return OT_ERR_OOM;
  cudaError_t e = a->dtype == OT_BF16 ? launch_bwd_d<__nv_bfloat16>(P, dpad, rows_total, stream)
                                      : launch_bwd_d<__half>(P, dpad, rows_total, stream);
  if (e != cudaSuccess)
    return ot_error(OT_ERR_BACKEND, op, "flash attention backward launch: %s", cudaGetErrorString(e));
  return OT_OK;
}
