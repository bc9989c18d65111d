/*
 * attention_fwd.cu -- CUDA flash attention forward, the portable path (sm_80+:
 * mma.sync m16n8k16 bf16 / fp16 with fp32 accumulation, ldmatrix, a two-stage cp.async
 * pipeline over key / value tiles), and the forward dispatcher: on sm_90 devices the
 * Hopper kernel (sm90/attention_fwd_sm90.cu) is asked first unless OT_ATTN_IMPL=portable.
 *
 * One block = BM = 16 * MT * NW query rows of one (sequence, query head); warp w owns MT
 * m16 tiles of consecutive rows. Per key tile of BN keys:  S = Q K^T (registers), scale / softcap /
 * mask, online softmax in the log2 domain, O += P V with P converted in registers to
 * the A operand. Small problems (fewer blocks than SMs) split the key range over
 * blocks (split-KV): each split writes a normalized fp32 partial and its lse, a second
 * kernel merges them. Design notes, limits and measurements: docs/ATTENTION.md.
 *
 * Storage: bf16 and fp16. float32 storage returns OT_ERR_UNSUPPORTED (no fp32 tensor
 * core path here; the CPU context computes it). Head dims 1..256: the kernels exist for
 * D = 64, 96, 128, 256 and smaller head dims run zero-padded in the next one.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "attention_sm90.h"
#include "cuda_state.h"

namespace ot {
namespace attn {

/* A forward tile shape: NW warps of MT m16 tiles (BM = 16 MT NW query rows), BN keys a
 * key tile. */
template <int NW_, int MT_, int BN_> struct fcfg {
  static constexpr int NW = NW_, MT = MT_, BN = BN_, BM = 16 * MT_ * NW_;
};
/* The shapes used per padded head dim. D = 128: 4 warps of one m16 tile, 32 keys (128
 * registers, 4 blocks an SM) measured fastest of six shapes on the H200 (222 TFLOP/s
 * against 187 for 2 m16 tiles a warp at 255 registers; docs/ATTENTION.md). D = 64 / 96
 * keep the 2-tile shape they were validated with on the device. */
template <int D> struct fwd_cfg : fcfg<4, (D == 64 || D == 96 ? 2 : 1), (D <= 64 ? 64 : 32)> {};

template <typename T, int D, class C>
__global__ void __launch_bounds__(C::NW * 32)
    fwd_kernel(const Params P) {
  constexpr int NW = C::NW, MT = C::MT, BN = C::BN, NTH = NW * 32;
  constexpr int BM = C::BM, DP = D + 8, WR = 16 * MT; /* rows a warp */
  constexpr int NT_S = BN / 8, KS_D = D / 16, NT_O = D / 8, KS_N = BN / 16;
  extern __shared__ uint4 smem_raw[];
  T *sQ = reinterpret_cast<T *>(smem_raw);
  T *sK = sQ + BM * DP; /* [2][BN][DP] */
  T *sV = sK + 2 * BN * DP;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int head = blockIdx.y;
  int b, tile, split;
  if (P.cu_q) {
    b = varlen_tile(P.cu_q, P.batch, BM, blockIdx.x, tile);
    if (b < 0) return;
    split = blockIdx.z;
  } else {
    b = blockIdx.z / P.nsplit;
    split = blockIdx.z % P.nsplit;
    tile = gridDim.x - 1 - blockIdx.x; /* last (heaviest under a causal mask) first */
  }
  int q0, sq, k0, sk;
  if (!seq_of(P, b, q0, sq, k0, sk)) return;
  const int m0 = tile * BM;
  if (m0 >= sq) return;
  const int nrows = min(BM, sq - m0);
  const int g = head / P.group;

  /* Keys seen by some row of the block: [lo(first row), hi(last row)] (both bounds
   * grow with the row). */
  int lo_f, hi_f, lo_l, hi_l;
  key_range(P, m0, sq, sk, lo_f, hi_f);
  key_range(P, m0 + nrows - 1, sq, sk, lo_l, hi_l);
  int t_lo = lo_f / BN, t_hi = hi_l < lo_f ? t_lo - 1 : hi_l / BN;
  if (P.nsplit > 1) {
    int nt = t_hi - t_lo + 1, per = (max(nt, 0) + P.nsplit - 1) / P.nsplit;
    t_lo = t_lo + split * per;
    t_hi = min(t_hi, t_lo + per - 1);
  }

  load_tile<T, BM, D, DP, NTH>(sQ, P.q, b, (int64_t)q0 + m0, head, nrows, P.d, P.vec, tid);
  if (t_lo <= t_hi) {
    int kb = t_lo * BN;
    load_tile<T, BN, D, DP, NTH>(sK, P.k, b, (int64_t)k0 + kb, g, sk - kb, P.d, P.vec, tid);
    load_tile<T, BN, D, DP, NTH>(sV, P.v, b, (int64_t)k0 + kb, g, sk - kb, P.d, P.vec, tid);
  }
  cp_async_commit();

  /* This thread's rows: g, g + 8 of each of the warp's m16 tiles (sequence frame). */
  const int gq = lane >> 2, tq = lane & 3;
  const int wrow0 = m0 + warp * WR; /* first row of the warp */
  float acc[MT][NT_O][4];
  float mrow[MT][2], lrow[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int j = 0; j < NT_O; j++) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.0f;
    mrow[mt][0] = mrow[mt][1] = -INFINITY;
    lrow[mt][0] = lrow[mt][1] = 0.0f;
  }
  const float cap = P.softcap, inv_cap = cap > 0.0f ? P.scale / cap : 0.0f;

  for (int t = t_lo; t <= t_hi; t++) {
    const int stage = (t - t_lo) & 1;
    kv_next_or_wait<T, BN, D, DP, NTH>(P, sK, sV, stage, t, t_hi, b, k0, sk, g, tid);

    float s[MT][NT_S][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int j = 0; j < NT_S; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
    mma_rows_nt_mt<T, MT, KS_D, NT_S, DP>(s, sQ + warp * WR * DP, sK + stage * BN * DP, lane);

    const int kb = t * BN;
    const bool masked = kb < lo_l || kb + BN - 1 > hi_f || kb + BN > sk;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < NT_S; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float dsm;
          float x = logit2(s[mt][j][e], cap, inv_cap, P.scale_log2, dsm);
          if (masked) { /* row ranges recomputed here: registers are scarce */
            int i = wrow0 + mt * 16 + gq + 8 * (e >> 1), col = kb + j * 8 + 2 * tq + (e & 1);
            int dd = col - i - (sk - sq);
            bool vis = i < sq && col < sk && (P.wl < 0 || dd >= -P.wl) && (P.wr < 0 || dd <= P.wr);
            if (!vis) x = -INFINITY;
          }
          s[mt][j][e] = x;
          mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
#pragma unroll
      for (int r = 0; r < 2; r++) {
        float mn = fmaxf(mrow[mt][r], quad_max(mx[r]));
        float base = mn == -INFINITY ? 0.0f : mn; /* no visible key yet: weights stay 0 */
        float alpha = fast_exp2(mrow[mt][r] - base);
        mrow[mt][r] = mn;
        mx[r] = base;
        lrow[mt][r] *= alpha;
#pragma unroll
        for (int j = 0; j < NT_O; j++) acc[mt][j][2 * r] *= alpha, acc[mt][j][2 * r + 1] *= alpha;
      }
#pragma unroll
      for (int j = 0; j < NT_S; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float p = fast_exp2(s[mt][j][e] - mx[e >> 1]);
          s[mt][j][e] = p;
          lrow[mt][e >> 1] += p;
        }
    }
    uint32_t pa[MT][KS_N][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) to_a_frags<T, KS_N>(pa[mt], s[mt]);
    mma_regs_nn_mt<T, MT, KS_N, NT_O, DP>(acc, pa, sV + stage * BN * DP, lane);
    __syncthreads(); /* the next iteration's prefetch overwrites this stage */
  }
  cp_async_wait<0>();
  __syncthreads(); /* other threads' copies into this warp's rows (loop skipped) have landed */

  const float LN2 = 0.6931471805599453f;
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    float inv[2], lse[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float l = quad_sum(lrow[mt][r]);
      inv[r] = l > 0.0f ? 1.0f / l : 0.0f;
      lse[r] = l > 0.0f ? (mrow[mt][r] + __log2f(l)) * LN2 : -INFINITY;
    }
    const int trow0 = wrow0 + mt * 16; /* first row of this m16 tile */
    const int trows = min(16, sq - trow0);
    if (trows <= 0) break;
    if (P.nsplit == 1) {
      T *stg = sQ + (warp * WR + mt * 16) * DP; /* the warp's own Q rows */
      __syncwarp();
      stage_acc<T, NT_O, DP>(stg, acc[mt], inv[0], inv[1], lane);
      __syncwarp();
      store_rows16<T, D, DP>(stg, P.o, b, (int64_t)q0 + trow0, head, trows, 0, P.d, P.vec, lane);
      if (P.lse && tq == 0)
#pragma unroll
        for (int r = 0; r < 2; r++) {
          int i = trow0 + gq + 8 * r;
          if (i < sq)
            P.lse[(int64_t)b * P.lse_bs + (int64_t)head * P.lse_hs + (int64_t)(q0 + i) * P.lse_ts] = lse[r];
        }
    } else {
      /* Partial of this split: rows indexed like the compact [rows][hq] layout. */
      const int64_t rows_total = P.cu_q ? P.tq : (int64_t)P.batch * P.sq;
      const int64_t rbase = P.cu_q ? q0 : (int64_t)b * P.sq;
#pragma unroll
      for (int r = 0; r < 2; r++) {
        int i = trow0 + gq + 8 * r;
        if (i >= sq) continue;
        int64_t idx = ((int64_t)split * rows_total + rbase + i) * P.hq + head;
        float *po = P.part_o + idx * P.part_dpad;
#pragma unroll
        for (int j = 0; j < NT_O; j++) {
          int c = j * 8 + 2 * tq;
          *reinterpret_cast<float2 *>(po + c) =
              make_float2(acc[mt][j][2 * r] * inv[r], acc[mt][j][2 * r + 1] * inv[r]);
        }
        if (tq == 0) P.part_lse[idx] = lse[r];
      }
    }
  }
}

/* Merge the split-KV partials: one warp per (row, head). */
template <typename T>
__global__ void fwd_combine_kernel(const Params P) {
  int64_t rows_total, row, tok;
  int head, b;
  if (!warp_row_head(P, rows_total, row, head, b, tok)) return;
  const int lane = threadIdx.x & 31;
  float mx = -INFINITY;
  for (int s = 0; s < P.nsplit; s++) mx = fmaxf(mx, P.part_lse[(s * rows_total + row) * P.hq + head]);
  float wsum = 0.0f;
  for (int s = 0; s < P.nsplit; s++) {
    float l = P.part_lse[(s * rows_total + row) * P.hq + head];
    wsum += mx == -INFINITY ? 0.0f : expf(l - mx);
  }
  T *o = row_ptr_w<T>(P.o, b, tok, head);
  for (int c = lane; c < P.d; c += 32) {
    float acc = 0.0f;
    for (int s = 0; s < P.nsplit; s++) {
      int64_t idx = (s * rows_total + row) * P.hq + head;
      float l = P.part_lse[idx];
      float wt = mx == -INFINITY ? 0.0f : expf(l - mx) / wsum;
      acc += wt * P.part_o[idx * P.part_dpad + c];
    }
    o[c] = from_f32<T>(acc);
  }
  if (lane == 0 && P.lse)
    P.lse[(int64_t)b * P.lse_bs + (int64_t)head * P.lse_hs + tok * P.lse_ts] =
        wsum > 0.0f ? mx + logf(wsum) : -INFINITY;
}

/* Split-KV choice, scratch, launches for tile shape C. Split-KV when the (sequence,
 * head, query tile) blocks fill less than one wave: enough splits for ~1 wave, at least 2
 * key tiles per split. For varlen the mean key length Tk / batch stands for the
 * sequences' lengths (cu_seqlens stay on the device). */
template <typename T, int D, class C>
static ot_status launch_fwd(ot_context *ctx, const ot_attention_args *a, Params &P,
                            int64_t rows_total, const char *op) {
  constexpr int NW = C::NW, BM = C::BM, BN = C::BN;
  const bool varlen = a->cu_q != NULL;
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  int64_t blocks = varlen ? (a->tq + BM - 1) / BM * a->hq : (a->sq + BM - 1) / BM * a->hq * a->batch;
  if (varlen && blocks < a->batch * a->hq) blocks = a->batch * a->hq;
  int64_t klen = varlen ? a->tk / (a->batch > 0 ? a->batch : 1) : a->sk;
  int sms = st ? st->sm_count : 132;
  int nsplit = 1;
  if (blocks < sms && klen >= 4 * BN) {
    int64_t by_sm = (sms + blocks - 1) / blocks, by_len = klen / (2 * BN);
    int64_t n = by_sm < by_len ? by_sm : by_len;
    nsplit = (int)(n > 64 ? 64 : n);
    if (nsplit < 1) nsplit = 1;
  }
  const char *ns = getenv("OT_ATTN_SPLITS"); /* testing: force a split count */
  if (ns && atoi(ns) > 0) nsplit = atoi(ns) > 64 ? 64 : atoi(ns);
  if (!varlen && a->batch * nsplit > 65535) nsplit = 1;
  P.nsplit = nsplit;
  if (nsplit > 1) {
    size_t n_o = (size_t)nsplit * rows_total * a->hq;
    size_t bytes = n_o * D * sizeof(float) + n_o * sizeof(float) + 256;
    char *scr = (char *)ot_cuda_scratch(ctx, bytes, op);
    if (!scr) return OT_ERR_OOM;
    P.part_o = (float *)scr;
    P.part_lse = (float *)(scr + ((n_o * D * sizeof(float) + 255) & ~(size_t)255));
    P.part_dpad = D;
  }
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  constexpr size_t smem = (size_t)(BM + 4 * BN) * (D + 8) * 2;
  cudaError_t e = cudaFuncSetAttribute(fwd_kernel<T, D, C>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e == cudaSuccess) {
    dim3 grid;
    if (P.cu_q) grid = dim3((unsigned)(P.tq / BM + P.batch + 1), (unsigned)P.hq, (unsigned)P.nsplit);
    else grid = dim3((unsigned)((P.sq + BM - 1) / BM), (unsigned)P.hq, (unsigned)(P.batch * P.nsplit));
    fwd_kernel<T, D, C><<<grid, NW * 32, smem, stream>>>(P);
    if (P.nsplit > 1) {
      int64_t warps = rows_total * P.hq;
      fwd_combine_kernel<T><<<(unsigned)((warps + 7) / 8), 256, 0, stream>>>(P);
    }
    e = cudaGetLastError();
  }
  if (e != cudaSuccess)
    return ot_error(OT_ERR_BACKEND, op, "flash attention forward launch: %s", cudaGetErrorString(e));
  return OT_OK;
}

#ifdef OT_ATTN_TUNING
/* Tuning builds (-DOT_ATTN_TUNING, never in CI): OT_ATTN_FWD_CFG=k picks another tile shape
 * for D = 128 bf16, for scripts/device_attention.sh's sweep. */
static int tuning_choice(const char *var) {
  const char *v = getenv(var);
  return v ? atoi(v) : 0;
}
#endif

template <typename T>
static ot_status launch_fwd_d(ot_context *ctx, const ot_attention_args *a, Params &P, int dpad,
                              int64_t rows_total, const char *op) {
  switch (dpad) {
    case 64: return launch_fwd<T, 64, fwd_cfg<64>>(ctx, a, P, rows_total, op);
    case 96: return launch_fwd<T, 96, fwd_cfg<96>>(ctx, a, P, rows_total, op);
    case 128:
#ifdef OT_ATTN_TUNING
      switch (tuning_choice("OT_ATTN_FWD_CFG")) {
        case 1: return launch_fwd<T, 128, fcfg<4, 2, 64>>(ctx, a, P, rows_total, op);
        case 2: return launch_fwd<T, 128, fcfg<8, 1, 64>>(ctx, a, P, rows_total, op);
        case 3: return launch_fwd<T, 128, fcfg<4, 1, 64>>(ctx, a, P, rows_total, op);
        case 4: return launch_fwd<T, 128, fcfg<8, 2, 32>>(ctx, a, P, rows_total, op);
        case 5: return launch_fwd<T, 128, fcfg<4, 2, 32>>(ctx, a, P, rows_total, op);
        default: break;
      }
#endif
      return launch_fwd<T, 128, fwd_cfg<128>>(ctx, a, P, rows_total, op);
    default: return launch_fwd<T, 256, fwd_cfg<256>>(ctx, a, P, rows_total, op);
  }
}

} /* namespace attn */
} /* namespace ot */

using namespace ot::attn;

ot_status ot_cuda_attention_params(ot_context *ctx, const ot_attention_args *a, const char *op,
                                   Params *P, int *dpad) {
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  if (a->dtype != OT_BF16 && a->dtype != OT_F16)
    return ot_error(OT_ERR_UNSUPPORTED, op,
                    "q: float32 storage has no CUDA attention kernel (the tensor-core kernels "
                    "take bfloat16 / float16; convert, or use a CPU context)");
  if (a->d > 256)
    return ot_error(OT_ERR_UNSUPPORTED, op,
                    "q: head_dim %lld is larger than 256, the largest the CUDA attention "
                    "kernels support", (long long)a->d);
  if (st && st->cc_major < 8)
    return ot_error(OT_ERR_UNSUPPORTED, op,
                    "the CUDA attention kernels need compute capability 8.0 or newer (device "
                    "has %d.%d)", st->cc_major, st->cc_minor);
  if (a->hq > 65535 || a->batch > 65535 || a->sq > INT32_MAX / 2 || a->sk > INT32_MAX / 2 ||
      a->tq > INT32_MAX / 2 || a->tk > INT32_MAX / 2)
    return ot_error(OT_ERR_UNSUPPORTED, op,
                    "q: shape beyond the CUDA attention kernels' limits (heads and batch <= "
                    "65535, tokens < 2^30)");
  memset(P, 0, sizeof *P);
  P->q = op_of(a->q), P->k = op_of(a->k), P->v = op_of(a->v), P->o = op_of(a->out);
  P->dout = op_of(a->dout), P->dq = op_of(a->dq), P->dk = op_of(a->dk), P->dv = op_of(a->dv);
  P->lse = (float *)a->lse.data;
  P->lse_bs = a->lse.batch_stride, P->lse_ts = a->lse.tok_stride, P->lse_hs = a->lse.head_stride;
  P->cu_q = a->cu_q, P->cu_k = a->cu_k;
  P->batch = (int)a->batch, P->hq = (int)a->hq, P->hkv = (int)a->hkv;
  P->group = (int)(a->hq / a->hkv), P->d = (int)a->d;
  P->sq = (int)a->sq, P->sk = (int)a->sk, P->tq = (int)a->tq, P->tk = (int)a->tk;
  P->scale = a->scale;
  P->softcap = a->softcap > 0 ? a->softcap : 0.0f;
  P->scale_log2 = a->scale * 1.4426950408889634f;
  P->wl = a->window_left < 0 ? -1 : (int)(a->window_left > INT32_MAX / 2 ? INT32_MAX / 2 : a->window_left);
  P->wr = a->window_right < 0 ? -1 : (int)(a->window_right > INT32_MAX / 2 ? INT32_MAX / 2 : a->window_right);
  const ot_attn_operand *ops[] = {&a->q, &a->k, &a->v, &a->out, &a->dout, &a->dq, &a->dk, &a->dv};
  bool vec = a->d % 8 == 0;
  for (int i = 0; i < 8; i++) vec = vec && op_vec_ok(*ops[i], 2);
  P->vec = vec;
  P->nsplit = 1;
  *dpad = a->d <= 64 ? 64 : a->d <= 96 ? 96 : a->d <= 128 ? 128 : 256;
  return OT_OK;
}

extern "C" ot_status ot_cuda_attention_forward(ot_context *ctx, const ot_attention_args *a) {
  static const char *op = "ot_attention_forward";
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  const ot_attn_impl impl = ot_cuda_attention_impl();
  if (impl != OT_ATTN_IMPL_PORTABLE && st && st->cc_major == 9) {
    bool handled = false;
    ot_status s = ot_cuda_attention_forward_sm90(ctx, a, &handled);
    if (s != OT_OK || handled) return s;
  }
  if (impl == OT_ATTN_IMPL_SM90) return ot_cuda_attention_sm90_refusal(ctx, op, "forward", a);
  Params P;
  int dpad;
  OT_TRY(ot_cuda_attention_params(ctx, a, op, &P, &dpad));
  const bool varlen = a->cu_q != NULL;
  const int64_t rows_total = varlen ? a->tq : a->batch * a->sq;
  if (rows_total == 0 || a->batch == 0) return OT_OK;
  return a->dtype == OT_BF16 ? launch_fwd_d<__nv_bfloat16>(ctx, a, P, dpad, rows_total, op)
                              : launch_fwd_d<__half>(ctx, a, P, dpad, rows_total, op);
}
