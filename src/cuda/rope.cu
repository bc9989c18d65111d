/*
 * rope.cu -- rotary position embedding on CUDA: q and k of a token rotated in one
 * launch, in place or out of place, forward (angle) and backward (-angle).
 *
 * One block per token (grid-strided when tokens exceed the grid limit):
 *   1. the block makes the token's rd/2 (cos, sin) pairs once, in shared memory: read
 *      from the cos_sin_cache row, or computed as the CPU backend does -- pos *
 *      inv_freq[i] in float64, reduced modulo 2*pi in float64, then float32 cosf /
 *      sinf of the reduced angle (inv_freq from ot_rope_inv_freq on the host, passed
 *      by value in the kernel parameters);
 *   2. its threads walk the items of every q head then every k head. An item is one
 *      16-byte vector of pairs: NeoX loads x1 = x[i..i+V) and x2 = x[half+i..half+i+V)
 *      (two 128-bit loads, two stores); GPT-J loads x[i..i+V) holding V/2 adjacent
 *      pairs. Features [rd, D) are copied when the output is another tensor.
 * When a head row is not 16-byte aligned (odd strides, rd/2 not a multiple of the
 * vector width, ...) the scalar kernel does one pair per item.
 *
 * The default for aligned rows with 4, 8 or 16 items per head and no pass-through copy
 * (head_dim 64-256 in 16-bit types) is rope_warp3_kernel: a warp per token, cos / sin
 * once per warp, up to kRopeWarpU head-passes of loads in flight per lane, no block
 * barrier and no 64-bit division per item, the head loads issued before the token's cos /
 * sin are made (a cache's values before the head loads) -- 86-88% of copy bandwidth on the
 * H200 (16k tokens x (32 + 8 | 64 + 8) heads x 128 bf16, 2026-11-30) against 83-86% for
 * its shape before (run of 4005b7c), 82-86% for the first warp kernel (v2, since removed)
 * and 76-82% for the block-per-token kernel (OT_ROPE_IMPL=v1); docs/PERFORMANCE.md. A
 * bulk-copy (TMA, sm_90) kernel staging each token's heads in shared memory ran 4-11%
 * slower than v3 (run of a342519): removed. OT_ROPE_IMPL=w4 | w4o: rope_warp4_kernel, v3's
 * work in ~25% fewer instructions (16-bit types; opt-in, prepared 2026-11-30 night for the
 * next same-process A/B; measured in the run of a092c77: not the default). A cross-token
 * software pipeline of w4's work on a persistent grid (OT_ROPE_IMPL=pipe | pipe6) was measured
 * on 2026-12-01 (run of ac70494) 5-7% behind the default at every shape: removed
 * (docs/PERFORMANCE.md). Build A/Bs of 2026-12-04 (f7754b0's hooks, not kept): blocks of 32
 * or 64 threads instead of 128 (+0.5-1% with computed cos / sin at 32 + 8 heads, level with the
 * cache and at 64 + 8), the head loads with the L2::256B prefetch hint (-0.5 to -1%).
 * Build A/Bs of 2026-12-05: the head loads plain instead of evict-first (__ldcs) with the
 * cache read evict-last (rope_cache_ld), the default since: +1.3% / +2.6% at 32 + 8 / 64 + 8
 * heads; plain stores instead of evict-first (__stcs): -1 to -3%, not kept.
 *
 * A position outside the cache (not validated on the host for device tensors)
 * yields NaN outputs rather than an out-of-bounds read.
 */
#include <stdlib.h>
#include <string.h>

#include "../core/rope.h"
#include "common.cuh"
#include "rope.cuh"
#include "unpack_fast.cuh"

namespace ot {

/* A cos / sin cache value, read with an L2 evict-last policy: the cache (positions x
 * rotary_dim fp32, 4 MB for 8192 positions x 128) is read again by every token at the same
 * position, while the head rows stream past it with the L2's default policy. Measured with
 * the head loads plain (H200, 16k x (32 + 8 | 64 + 8) x 128 bf16, build A/B of 2026-12-05,
 * docs/PERFORMANCE.md): plain head loads 3.86 / 3.91 TB/s with the cache against 3.81 / 3.82
 * for the evict-first loads (__ldcs) before; with the cache read evict-last on top 3.86 /
 * 3.93 (in an earlier call of the same day the plain loads alone read 3.75 at 32 + 8 heads:
 * the cache pushed out of the L2 by the streamed rows is the suspect this guards against). */
__device__ __forceinline__ float rope_cache_ld(const float *p) {
  uint64_t pol;
  float v;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  asm("ld.global.L2::cache_hint.f32 %0, [%1], %2;" : "=f"(v) : "l"(p), "l"(pol));
  return v;
}

struct rope_heads_dev {
  void *in;
  void *out;
  int64_t heads;
  int64_t in_sb, in_ss, in_sh;
  int64_t out_sb, out_ss, out_sh;
};

struct rope_params {
  rope_heads_dev t[2]; /* q, k (k.heads == 0 when absent) */
  int64_t batch, seq, head_dim, rotary_dim;
  const void *positions;
  int pos_is_i64;
  int inverse;
  int64_t pos_sb, pos_ss;
  const float *cache;
  int64_t max_position;
  int64_t half;
  /* device recomputation when half > kRopeMaxHalfByValue */
  double theta, l3_factor, l3_low, l3_high, l3_orig;
  double inv_freq[kRopeMaxHalfByValue];
};

/* Elements per load: VEC -> a 16-byte vector; scalar -> 1 (NeoX) or 2 (GPT-J pair). */
template <typename T, bool VEC, ot_rope_mode MODE>
struct rope_shape {
  static constexpr int V = vec_width<T>::value;
  static constexpr int W = VEC ? V : (MODE == OT_ROPE_GPTJ ? 2 : 1);
};

template <typename T, int W, bool VEC>
__device__ __forceinline__ void rope_load(float *f, const T *p) {
  if (VEC) load_vec(f, p);
  else {
#pragma unroll
    for (int j = 0; j < W; j++) f[j] = to_f32(p[j]);
  }
}
template <typename T, int W, bool VEC>
__device__ __forceinline__ void rope_store(T *p, const float *f) {
  if (VEC) store_vec(p, f);
  else {
#pragma unroll
    for (int j = 0; j < W; j++) p[j] = from_f32<T>(f[j]);
  }
}

/* The token's cos / sin into cs: cs[i] = cos, cs[half + i] = sin (negated for the
 * inverse rotation) for the pairs i = first, first + step, ... < half; from the cache row
 * of position pos (NaN for a position outside the cache) or computed (rope.cuh). Shared
 * by the block-per-token and the warp kernels (the caller synchronizes around it). */
__device__ __forceinline__ void rope_fill_cs(const rope_params &p, int64_t pos, int64_t half,
                                             int64_t rd, float *cs, int64_t first,
                                             int64_t step) {
  for (int64_t i = first; i < half; i += step) {
    float c, sn;
    if (p.cache) {
      if (pos >= 0 && pos < p.max_position) {
        const float *row = p.cache + pos * rd;
        c = row[i];
        sn = row[half + i];
      } else {
        c = sn = __int_as_float(0x7fc00000);
      }
    } else {
      rope_cos_sin(p, pos, i, &c, &sn);
    }
    cs[i] = c;
    cs[half + i] = p.inverse ? -sn : sn;
  }
}

template <typename T, bool VEC, ot_rope_mode MODE>
__global__ void __launch_bounds__(256) rope_kernel(const __grid_constant__ rope_params p) {
  constexpr int W = rope_shape<T, VEC, MODE>::W;
  extern __shared__ float cs[]; /* cos [half], sin [half] */
  const int64_t half = p.half, rd = p.rotary_dim, D = p.head_dim;
  const int64_t tokens = p.batch * p.seq;
  /* items per head: rotated, then pass-through (out of place only) */
  const int64_t rot_items = MODE == OT_ROPE_NEOX ? half / W : rd / W;
  const int64_t pass = D - rd;
  const int64_t pass_items = VEC ? pass / W : pass;

  for (int64_t tok = blockIdx.x; tok < tokens; tok += gridDim.x) {
    const int64_t b = tok / p.seq, s = tok - b * p.seq;
    const int64_t pi = b * p.pos_sb + s * p.pos_ss;
    const int64_t pos = p.pos_is_i64 ? static_cast<const int64_t *>(p.positions)[pi]
                                     : (int64_t) static_cast<const int32_t *>(p.positions)[pi];
    __syncthreads(); /* the previous token's readers are done with cs */
    rope_fill_cs(p, pos, half, rd, cs, threadIdx.x, blockDim.x);
    __syncthreads();

#pragma unroll 1
    for (int which = 0; which < 2; which++) {
      const rope_heads_dev &hd = p.t[which];
      if (hd.heads == 0) continue;
      const bool in_place = hd.in == hd.out && hd.in_sb == hd.out_sb && hd.in_ss == hd.out_ss &&
                            hd.in_sh == hd.out_sh;
      const int64_t per_head = rot_items + (in_place ? 0 : pass_items);
      const int64_t total = hd.heads * per_head;
      const T *in0 = static_cast<const T *>(hd.in) + b * hd.in_sb + s * hd.in_ss;
      T *out0 = static_cast<T *>(hd.out) + b * hd.out_sb + s * hd.out_ss;
      for (int64_t it = threadIdx.x; it < total; it += blockDim.x) {
        const int64_t h = it / per_head, k = it - h * per_head;
        const T *in = in0 + h * hd.in_sh;
        T *out = out0 + h * hd.out_sh;
        if (k < rot_items) {
          if (MODE == OT_ROPE_NEOX) {
            const int64_t i = k * W;
            float x1[W], x2[W], y1[W], y2[W];
            rope_load<T, W, VEC>(x1, in + i);
            rope_load<T, W, VEC>(x2, in + half + i);
#pragma unroll
            for (int j = 0; j < W; j++) {
              rope_rotate(x1[j], x2[j], cs[i + j], cs[half + i + j], &y1[j], &y2[j]);
            }
            rope_store<T, W, VEC>(out + i, y1);
            rope_store<T, W, VEC>(out + half + i, y2);
          } else {
            const int64_t e = k * W;
            float x[W], y[W];
            rope_load<T, W, VEC>(x, in + e);
#pragma unroll
            for (int j = 0; j < W; j += 2) {
              rope_rotate(x[j], x[j + 1], cs[e / 2 + j / 2], cs[half + e / 2 + j / 2], &y[j],
                          &y[j + 1]);
            }
            rope_store<T, W, VEC>(out + e, y);
          }
        } else {
          /* pass-through copy of features [rd, D) */
          const int64_t q = k - rot_items;
          if (VEC) {
            *reinterpret_cast<uint4 *>(out + rd + q * W) =
                *reinterpret_cast<const uint4 *>(in + rd + q * W);
          } else {
            out[rd + q] = in[rd + q];
          }
        }
      }
    }
  }
}

template <typename T>
static bool rope_can_vectorize(const rope_params &p, ot_rope_mode mode) {
  constexpr int V = vec_width<T>::value;
  const int64_t half = p.half;
  if (mode == OT_ROPE_NEOX ? half % V : p.rotary_dim % V) return false;
  if ((p.head_dim - p.rotary_dim) % V) return false;
  for (int w = 0; w < 2; w++) {
    const rope_heads_dev &h = p.t[w];
    if (h.heads == 0) continue;
    if (!ot_is_aligned16(h.in) || !ot_is_aligned16(h.out)) return false;
    const int64_t st[6] = {h.in_sb, h.in_ss, h.in_sh, h.out_sb, h.out_ss, h.out_sh};
    for (int i = 0; i < 6; i++)
      if (st[i] % V) return false;
  }
  return true;
}

/* Store f rounded to T at p (16-byte aligned) with the evict-first hint (st.global.cs):
 * the rotated rows are not read again by this kernel. Measured (H200, NeoX, q [16k, 32,
 * 128] + k [16k, 8, 128] bf16, run of 2026-11-30 15:44 UTC, same process): 3.82-3.83 vs
 * 3.69-3.70 TB/s with the cos / sin cache, 3.76-3.87 vs 3.69-3.70 computed (the warp
 * kernel's plain stores), 89% of copy (bench/results/fused_ops.json); the same helper as
 * norm.cuh's store_vec_cs (evict-first out stores), which rope.cu does not include. */
template <typename T>
__device__ __forceinline__ void rope_store_cs(T *p, const float *f) {
  raw16 r;
  pack<T>(r, f);
  __stcs(reinterpret_cast<uint4 *>(p), r.u);
}

/* The lane's NP cos / sin of pairs i0.. from the warp's cs ([cos 0..half) [sin 0..half)). */
template <typename T, ot_rope_mode MODE>
__device__ __forceinline__ void rope_lane_cs(const float *cs, int64_t half, int64_t i0, float *c,
                                             float *sn) {
  constexpr int V = vec_width<T>::value;
  constexpr int NP = MODE == OT_ROPE_NEOX ? V : V / 2; /* pairs per item */
  if (NP % 4 == 0) { /* 16-byte shared loads: i0 and half are multiples of 4 */
#pragma unroll
    for (int j = 0; j < NP; j += 4) {
      const float4 cv = *reinterpret_cast<const float4 *>(cs + i0 + j);
      const float4 sv = *reinterpret_cast<const float4 *>(cs + half + i0 + j);
      c[j] = cv.x, c[j + 1] = cv.y, c[j + 2] = cv.z, c[j + 3] = cv.w;
      sn[j] = sv.x, sn[j + 1] = sv.y, sn[j + 2] = sv.z, sn[j + 3] = sv.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < NP; j++) c[j] = cs[i0 + j], sn[j] = cs[half + i0 + j];
  }
}

/* The rotation of one item x1 (NeoX: and its partner x2 at + half) with the lane's cos / sin
 * and the stores at out; FAST: bf16 unpacked by unpack_fast (the same values). */
template <typename T, ot_rope_mode MODE, bool FAST>
__device__ __forceinline__ void rope_rotate_item(const raw16 &x1, const raw16 &x2, const float *c,
                                                 const float *sn, T *out, int64_t half) {
  constexpr int V = vec_width<T>::value;
  float a[V], y1[V];
  if (FAST) unpack_fast<T>(a, x1);
  else unpack<T>(a, x1);
  if (MODE == OT_ROPE_NEOX) {
    float bv[V], y2[V];
    if (FAST) unpack_fast<T>(bv, x2);
    else unpack<T>(bv, x2);
#pragma unroll
    for (int j = 0; j < V; j++) rope_rotate(a[j], bv[j], c[j], sn[j], &y1[j], &y2[j]);
    rope_store_cs(out, y1);
    rope_store_cs(out + half, y2);
  } else {
#pragma unroll
    for (int j = 0; j < V; j += 2)
      rope_rotate(a[j], a[j + 1], c[j / 2], sn[j / 2], &y1[j], &y1[j + 1]);
    rope_store_cs(out, y1);
  }
}

/* One item of the warp kernel (v3): the lane's cos / sin from the warp's cs, the rotation,
 * the stores. */
template <typename T, ot_rope_mode MODE>
__device__ __forceinline__ void rope_warp_item(const float *cs, int64_t half, int64_t i0,
                                               const raw16 &x1, const raw16 &x2, T *out) {
  constexpr int V = vec_width<T>::value;
  constexpr int NP = MODE == OT_ROPE_NEOX ? V : V / 2; /* pairs per item */
  float c[NP], sn[NP];
  rope_lane_cs<T, MODE>(cs, half, i0, c, sn);
  rope_rotate_item<T, MODE, false>(x1, x2, c, sn, out, half);
}

/* The warp kernel's shape: U passes of head loads in flight per batch, blocks of
 * kRopeWarpThreads. U = 10 in blocks of 128 (bf16 NeoX D=128 sm_90a: 167 registers, 3
 * blocks = 12 warps per SM: 12 x 32 lanes x 10 passes x 32 bytes = 120 KB of loads in
 * flight per SM, one batch for the 40 heads of 32 + 8 at head_dim 128) replaced U = 8 in
 * blocks of 256 (held to 128 registers, 16 warps: 2 batches of 5 passes for those 40
 * heads, 80 KB). H200, 16k tokens bf16, TB/s against the old shape in the same process
 * (docs/PERFORMANCE.md, 2026-11-30), 32 + 8 / 64 + 8 heads: with the cache read before
 * the head loads 3.70 / 3.76 vs 3.55 / 3.65 (cache), 3.70 / 3.78 vs 3.63 / 3.69
 * (computed); the new shape without that reorder: cache 3.44 / 3.71 vs 3.51 / 3.63 (the
 * cache reads queued behind 20 head loads); the reorder in the old shape (over its 128
 * registers): 3.49 / 3.58 (cache), 3.51 / 3.58 (computed). */
constexpr int kRopeWarpU = 10, kRopeWarpThreads = 128;

/* ---- token-parallel kernel: a warp per token -------------------------------------------
 * For 16-byte-aligned rows whose rotated part has IPH = (NeoX: half, GPT-J: rd) / VEC
 * items per head, IPH a power of two <= 32 (head_dim 64..256 in 16-bit types), and no
 * pass-through copy (rd == head_dim, or in place). Lane = hl * IPH + item: the lane
 * owns item `item` of every HPW = 32 / IPH-th head of the token (q heads, then k heads,
 * one list); the token's cos / sin are made once per warp into the warp's slice of
 * shared memory ([cos 0..half) [sin 0..half), ordered by __syncwarp only) and reused for
 * all its heads; a warp pass covers HPW whole head rows, contiguous. No block barrier
 * and no 64-bit division per item (the v1 kernel's costs). Against the first warp kernel
 * (v2, removed after the run of 4005b7c measured it 0-3% slower) the per-token chain
 * position -> cos / sin -> head loads -> rotation -> stores is shortened:
 *   - the token's first batch of head loads is issued before its cos / sin are made
 *     (the loads depend on the token only), so the cache reads overlap them;
 *   - the next token's position is loaded one token ahead;
 *   - the passes are split into equal batches of at most U (kRopeWarpU; 72 heads at 4 per
 *     pass, 18 passes: two batches of 9 rather than 10 + 8), so no batch is a short tail.
 * Same cos / sin (rope_fill_cs) and rotation (rope.cuh) as v1: the same bits. */
template <typename T, ot_rope_mode MODE, int IPH, int U>
__global__ void __launch_bounds__(kRopeWarpThreads, 1)
    rope_warp3_kernel(const __grid_constant__ rope_params p) {
  constexpr int V = vec_width<T>::value;
  constexpr int HPW = 32 / IPH;
  constexpr int NP = MODE == OT_ROPE_NEOX ? V : V / 2; /* pairs per item */
  const int lane = threadIdx.x & 31, item = lane % IPH, hl = lane / IPH;
  const int64_t half = p.half, rd = p.rotary_dim;
  const int64_t tokens = p.batch * p.seq;
  const int64_t hq = p.t[0].heads, hall = hq + p.t[1].heads;
  const int64_t i0 = (int64_t)item * NP;
  const int64_t e0 = (int64_t)item * V;
  const int wpb = blockDim.x >> 5;
  extern __shared__ float rope_cs[]; /* [warps][rd] */
  float *cs = rope_cs + (threadIdx.x >> 5) * rd;
  const int passes = (int)((hall + HPW - 1) / HPW);
  const int nb = (passes + U - 1) / U;
  const int ub = (passes + nb - 1) / nb; /* passes per batch, <= U */
  const int64_t tstep = (int64_t)gridDim.x * wpb;
  auto position = [&](int64_t t) -> int64_t {
    const int64_t b = t / p.seq, s = t - b * p.seq;
    const int64_t pi = b * p.pos_sb + s * p.pos_ss;
    return p.pos_is_i64 ? static_cast<const int64_t *>(p.positions)[pi]
                        : (int64_t) static_cast<const int32_t *>(p.positions)[pi];
  };
  /* With a cache, the lane's CPL cos / sin of the token are loaded before its head loads,
   * so that they are not queued behind them (half = IPH * NP; NaN outside the cache:
   * rope_fill_cs's values, so the same bits). */
  constexpr int CPL = (IPH * NP + 31) / 32;
  int64_t tok = (int64_t)blockIdx.x * wpb + (threadIdx.x >> 5);
  int64_t pos = tok < tokens ? position(tok) : 0;
  for (; tok < tokens; tok += tstep) {
    const int64_t b = tok / p.seq, s = tok - b * p.seq;
    float cpre[CPL], spre[CPL];
    if (p.cache) {
      const bool okp = pos >= 0 && pos < p.max_position;
      const float *crow = p.cache + (okp ? pos : 0) * rd;
#pragma unroll
      for (int j = 0; j < CPL; j++) {
        const int i = lane + 32 * j;
        cpre[j] = spre[j] = __int_as_float(0x7fc00000);
        if (okp && i < IPH * NP)
          cpre[j] = rope_cache_ld(crow + i), spre[j] = rope_cache_ld(crow + IPH * NP + i);
      }
    }
    auto head = [&](int64_t h, const T **in, T **out) {
      const bool isk = h >= hq;
      const rope_heads_dev &hd = p.t[isk ? 1 : 0];
      const int64_t hh = isk ? h - hq : h;
      *in = static_cast<const T *>(hd.in) + b * hd.in_sb + s * hd.in_ss + hh * hd.in_sh + e0;
      *out = static_cast<T *>(hd.out) + b * hd.out_sb + s * hd.out_ss + hh * hd.out_sh + e0;
    };
    int64_t npos = 0;
    for (int bi = 0; bi < nb; bi++) {
      const int64_t hb = hl + (int64_t)bi * ub * HPW; /* this lane's first head of the batch */
      const int cnt = ub < passes - bi * ub ? ub : passes - bi * ub;
      raw16 x1[U], x2[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t h = hb + u * HPW;
        if (u < cnt && h < hall) {
          const T *in;
          T *out;
          head(h, &in, &out);
          x1[u].u = *reinterpret_cast<const uint4 *>(in);
          if (MODE == OT_ROPE_NEOX) x2[u].u = *reinterpret_cast<const uint4 *>(in + half);
        }
      }
      if (bi == 0) {
        /* the next token's position, then this token's cos / sin, while the loads fly */
        if (tok + tstep < tokens) npos = position(tok + tstep);
        __syncwarp(); /* the previous token's readers are done */
        if (p.cache) {
#pragma unroll
          for (int j = 0; j < CPL; j++) {
            const int i = lane + 32 * j;
            if (i < IPH * NP) cs[i] = cpre[j], cs[IPH * NP + i] = p.inverse ? -spre[j] : spre[j];
          }
        } else {
          rope_fill_cs(p, pos, half, rd, cs, lane, 32);
        }
        __syncwarp();
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t h = hb + u * HPW;
        if (u >= cnt || h >= hall) break;
        const T *in;
        T *out;
        head(h, &in, &out);
        rope_warp_item<T, MODE>(cs, half, i0, x1[u], x2[u], out);
      }
    }
    pos = npos;
  }
}

/* ---- opt-in (OT_ROPE_IMPL=w4 | w4o; prepared 2026-11-30 night, not yet measured) ------------
 * rope_warp3_kernel's work with its per-pass instructions cut. SASS of the default (sm_90a,
 * bf16 NeoX, IPH 8, U 10: the 16k x (32 + 8) x 128 bench case, one batch of 10 passes a
 * token): ~1470 instructions a lane per token with a cache (the shortest path through the
 * token loop that issues every head load and store), ~97 a pass in the store loop and ~36
 * in the load loop, of which ~60 are addressing -- head() takes the q / k fields through a
 * dynamically indexed p.t[isk] (4 LDC of the constant bank per pointer), three 64-bit
 * products per pointer, the partner x2 at a run-time + half -- and the high bf16 of each
 * word unpacked by PRMT + IMAD.U32; the token's batch / sequence index by a 64-bit
 * division (twice: this token's, the next one's position). Here ~1110 (~75 + ~17 a pass):
 *   - the lane's q / k base pointers of the token are formed once per token (b, s and
 *     the lane's element offset), a pass adds hh * stride with the q / k choice made by
 *     selects on registers; half (= IPH * NP for every call this kernel takes) and the
 *     cache row length 2 * half are compile-time constants, so x2 is at an immediate
 *     offset;
 *   - bf16 words unpacked by (w << 16, w & 0xffff0000): one integer op per element;
 *   - batch 1 (q as [tokens, heads, head_dim]): the token is its sequence index, no division;
 *   - with a cache, the lane's NP cos / sin are read from the cache row straight into
 *     registers (float4 loads, issued before the head loads as before; 16-byte aligned
 *     caches only, rope_launch checks), not through the warp's shared slice and two
 *     __syncwarp: the computed cos / sin still go through it (rope_fill_cs).
 * The same values, rounding and order (rope_rotate): the same bits as rope_warp3_kernel.
 * MINB: __launch_bounds__'s blocks per SM -- 1 (w4: ptxas's own count, sm_90a NeoX 162-168
 * registers, 3 blocks = 12 warps per SM as the default's 167; GPT-J 108-120, 4 blocks) or 4
 * (w4o: held to 128 registers, 16 warps per SM, 33% more loads in flight; NeoX spills 64-96
 * bytes a thread there, per-token scalars: ptxas -v; the default held to 3-4 blocks spilled
 * and lost in the run of ecdf3b4). 16-bit types only (float32 takes the default). */
template <int NP>
__device__ __forceinline__ void rope_w4_cs(const float *row, float *v) {
  static_assert(NP % 4 == 0, "float4 loads");
#pragma unroll
  for (int j = 0; j < NP; j += 4) {
    const float4 t = __ldg(reinterpret_cast<const float4 *>(row + j));
    v[j] = t.x, v[j + 1] = t.y, v[j + 2] = t.z, v[j + 3] = t.w;
  }
}

template <typename T, ot_rope_mode MODE, int IPH, int U, int MINB>
__global__ void __launch_bounds__(kRopeWarpThreads, MINB)
    rope_warp4_kernel(const __grid_constant__ rope_params p) {
  constexpr int V = vec_width<T>::value;
  static_assert(V == 8, "16-bit types only");
  constexpr int HPW = 32 / IPH;
  constexpr int NP = MODE == OT_ROPE_NEOX ? V : V / 2; /* pairs per item */
  constexpr int HALF = IPH * NP;                       /* p.half; the cache row: 2 * HALF */
  const int lane = threadIdx.x & 31, item = lane % IPH, hl = lane / IPH;
  const int64_t tokens = p.batch * p.seq;
  const int hq = (int)p.t[0].heads, hall = hq + (int)p.t[1].heads;
  const int e0 = item * V, i0 = item * NP;
  const int wpb = blockDim.x >> 5;
  extern __shared__ float rope_cs[]; /* [warps][2 * HALF], computed cos / sin only */
  float *cs = rope_cs + (threadIdx.x >> 5) * (2 * HALF);
  const int passes = (hall + HPW - 1) / HPW;
  const int nb = (passes + U - 1) / U;
  const int ub = (passes + nb - 1) / nb; /* passes per batch, <= U */
  const int64_t tstep = (int64_t)gridDim.x * wpb;
  const int64_t qis = p.t[0].in_sh, qos = p.t[0].out_sh, kis = p.t[1].in_sh, kos = p.t[1].out_sh;
  /* token t's batch and sequence index: no 64-bit division for one sequence (batch 1,
   * the [tokens, heads, head_dim] layout) */
  auto split = [&](int64_t t, int64_t &b, int64_t &s) {
    b = p.batch == 1 ? 0 : t / p.seq;
    s = t - b * p.seq;
  };
  auto position = [&](int64_t t) -> int64_t {
    int64_t b, s;
    split(t, b, s);
    const int64_t pi = b * p.pos_sb + s * p.pos_ss;
    return p.pos_is_i64 ? static_cast<const int64_t *>(p.positions)[pi]
                        : (int64_t) static_cast<const int32_t *>(p.positions)[pi];
  };
  int64_t tok = (int64_t)blockIdx.x * wpb + (threadIdx.x >> 5);
  int64_t pos = tok < tokens ? position(tok) : 0;
  for (; tok < tokens; tok += tstep) {
    int64_t b, s;
    split(tok, b, s);
    float c[NP], sn[NP];
    if (p.cache) { /* NaN outside the cache: rope_fill_cs's values */
      if (pos >= 0 && pos < p.max_position) {
        const float *crow = p.cache + pos * (2 * HALF) + i0;
        rope_w4_cs<NP>(crow, c);
        rope_w4_cs<NP>(crow + HALF, sn);
      } else {
#pragma unroll
        for (int j = 0; j < NP; j++) c[j] = sn[j] = __int_as_float(0x7fc00000);
      }
      if (p.inverse)
#pragma unroll
        for (int j = 0; j < NP; j++) sn[j] = -sn[j];
    }
    /* the lane's element of head 0 of q and of k in this token */
    const T *qi = static_cast<const T *>(p.t[0].in) + b * p.t[0].in_sb + s * p.t[0].in_ss + e0;
    T *qo = static_cast<T *>(p.t[0].out) + b * p.t[0].out_sb + s * p.t[0].out_ss + e0;
    const T *ki = static_cast<const T *>(p.t[1].in) + b * p.t[1].in_sb + s * p.t[1].in_ss + e0;
    T *ko = static_cast<T *>(p.t[1].out) + b * p.t[1].out_sb + s * p.t[1].out_ss + e0;
    int64_t npos = 0;
    for (int bi = 0; bi < nb; bi++) {
      const int hb = hl + bi * ub * HPW; /* this lane's first head of the batch */
      const int cnt = ub < passes - bi * ub ? ub : passes - bi * ub;
      raw16 x1[U], x2[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int h = hb + u * HPW;
        if (u < cnt && h < hall) {
          const bool isk = h >= hq;
          const int hh = isk ? h - hq : h;
          const T *in = (isk ? ki : qi) + (int64_t)hh * (isk ? kis : qis);
          x1[u].u = *reinterpret_cast<const uint4 *>(in);
          if (MODE == OT_ROPE_NEOX) x2[u].u = *reinterpret_cast<const uint4 *>(in + HALF);
        }
      }
      if (bi == 0) {
        /* the next token's position, then (computed) this token's cos / sin, while the
         * loads fly */
        if (tok + tstep < tokens) npos = position(tok + tstep);
        if (!p.cache) {
          __syncwarp(); /* the previous token's readers are done */
          rope_fill_cs(p, pos, HALF, 2 * HALF, cs, lane, 32);
          __syncwarp();
          rope_lane_cs<T, MODE>(cs, HALF, i0, c, sn);
        }
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int h = hb + u * HPW;
        if (u >= cnt || h >= hall) break;
        const bool isk = h >= hq;
        const int hh = isk ? h - hq : h;
        T *out = (isk ? ko : qo) + (int64_t)hh * (isk ? kos : qos);
        rope_rotate_item<T, MODE, true>(x1[u], x2[u], c, sn, out, HALF);
      }
    }
    pos = npos;
  }
}

/* The warp kernel's items per head for this call, or 0 when it does not apply (impl: the
 * value of OT_ROPE_IMPL, or NULL). */
template <typename T>
static int rope_warp_iph(const rope_params &p, ot_rope_mode mode, const char *impl) {
  constexpr int V = vec_width<T>::value;
  if (!rope_can_vectorize<T>(p, mode)) return 0;
  const int64_t iph = (mode == OT_ROPE_NEOX ? p.half : p.rotary_dim) / V;
  if (iph != 4 && iph != 8 && iph != 16) return 0;
  if (p.rotary_dim != p.head_dim) {
    for (int w = 0; w < 2; w++) {
      const rope_heads_dev &h = p.t[w];
      if (h.heads && !(h.in == h.out && h.in_sb == h.out_sb && h.in_ss == h.out_ss &&
                       h.in_sh == h.out_sh))
        return 0; /* out of place: features [rd, D) must be copied (v1 does) */
    }
  }
  if (impl && strcmp(impl, "v1") == 0) return 0;
  return (int)iph;
}

/* OT_ROPE_IMPL (impl) = w4 (1) | w4o (2): rope_warp4_kernel for the calls the warp kernel
 * takes in 16-bit types, with a cache only when it is 16-byte aligned (its float4 loads) and
 * heads counted in int; else 0. */
static int rope_w4_choice(const rope_params &p, const char *impl) {
  if (!impl) return 0;
  const int w = strcmp(impl, "w4") == 0 ? 1 : strcmp(impl, "w4o") == 0 ? 2 : 0;
  const bool ok = (!p.cache || ot_is_aligned16(p.cache)) && p.t[0].heads + p.t[1].heads < (1 << 30);
  return ok ? w : 0;
}

template <typename T>
static cudaError_t rope_launch(const rope_params &p, ot_rope_mode mode, cudaStream_t stream) {
  const int64_t tokens = p.batch * p.seq;
  if (tokens == 0) return cudaSuccess;
  const char *impl = getenv("OT_ROPE_IMPL");
  const int iph = rope_warp_iph<T>(p, mode, impl);
  if (iph) {
    constexpr int wpb = kRopeWarpThreads / 32;
    const int64_t blocks = (tokens + wpb - 1) / wpb;
    const dim3 g2((unsigned)(blocks < 0x7fffffff ? blocks : 0x7fffffff)), b2(kRopeWarpThreads);
    const size_t sm2 = wpb * (size_t)p.rotary_dim * sizeof(float); /* rd <= 256: 4 KB */
    if constexpr (sizeof(T) == 2) {
      const int w4 = rope_w4_choice(p, impl);
      if (w4) {
#define OT_ROPE_WARP4(M, MB)                                                             \
  (iph == 4 ? rope_warp4_kernel<T, M, 4, kRopeWarpU, MB><<<g2, b2, sm2, stream>>>(p)     \
            : iph == 8 ? rope_warp4_kernel<T, M, 8, kRopeWarpU, MB><<<g2, b2, sm2, stream>>>(p) \
                       : rope_warp4_kernel<T, M, 16, kRopeWarpU, MB><<<g2, b2, sm2, stream>>>(p))
        if (mode == OT_ROPE_NEOX) w4 == 2 ? OT_ROPE_WARP4(OT_ROPE_NEOX, 4) : OT_ROPE_WARP4(OT_ROPE_NEOX, 1);
        else w4 == 2 ? OT_ROPE_WARP4(OT_ROPE_GPTJ, 4) : OT_ROPE_WARP4(OT_ROPE_GPTJ, 1);
#undef OT_ROPE_WARP4
        return cudaGetLastError();
      }
    }
#define OT_ROPE_WARP3(M, U)                                                              \
  (iph == 4 ? rope_warp3_kernel<T, M, 4, U><<<g2, b2, sm2, stream>>>(p)                  \
            : iph == 8 ? rope_warp3_kernel<T, M, 8, U><<<g2, b2, sm2, stream>>>(p)       \
                       : rope_warp3_kernel<T, M, 16, U><<<g2, b2, sm2, stream>>>(p))
    if (mode == OT_ROPE_NEOX) OT_ROPE_WARP3(OT_ROPE_NEOX, kRopeWarpU);
    else OT_ROPE_WARP3(OT_ROPE_GPTJ, kRopeWarpU);
#undef OT_ROPE_WARP3
    return cudaGetLastError();
  }
  const bool vec = rope_can_vectorize<T>(p, mode);
  const size_t smem = (size_t)p.rotary_dim * sizeof(float);
  const int64_t grid = tokens < 0x7fffffff ? tokens : 0x7fffffff;
  const dim3 g((unsigned)grid), blk(128);
  auto pick = [&](auto kernel) -> cudaError_t {
    if (smem > 48 * 1024) {
      cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      if (e != cudaSuccess) return e;
    }
    kernel<<<g, blk, smem, stream>>>(p);
    return cudaGetLastError();
  };
  if (mode == OT_ROPE_NEOX)
    return vec ? pick(rope_kernel<T, true, OT_ROPE_NEOX>) : pick(rope_kernel<T, false, OT_ROPE_NEOX>);
  return vec ? pick(rope_kernel<T, true, OT_ROPE_GPTJ>) : pick(rope_kernel<T, false, OT_ROPE_GPTJ>);
}

static rope_heads_dev rope_heads(const ot_rope_heads &in, const ot_rope_heads &out) {
  rope_heads_dev h;
  h.in = in.data;
  h.out = out.data;
  h.heads = in.data ? in.heads : 0;
  h.in_sb = in.stride_b;
  h.in_ss = in.stride_s;
  h.in_sh = in.stride_h;
  h.out_sb = out.stride_b;
  h.out_ss = out.stride_s;
  h.out_sh = out.stride_h;
  return h;
}

} /* namespace ot */

extern "C" ot_status ot_cuda_rope(ot_context *ctx, const ot_rope_args *a) {
  const char *op = a->inverse ? "ot_rope_backward" : "ot_rope_forward";
  ot::rope_params p;
  memset(&p, 0, sizeof p);
  p.t[0] = ot::rope_heads(a->q, a->q_out);
  p.t[1] = ot::rope_heads(a->k, a->k_out);
  /* batch == 1 views leave stride_b unused: make it harmless. */
  if (a->batch == 1)
    for (int w = 0; w < 2; w++) p.t[w].in_sb = p.t[w].out_sb = 0;
  p.batch = a->batch;
  p.seq = a->seq;
  p.head_dim = a->head_dim;
  p.rotary_dim = a->rotary_dim;
  p.half = a->rotary_dim / 2;
  p.positions = a->positions;
  p.pos_is_i64 = a->pos_dtype == OT_I64;
  p.pos_sb = a->batch == 1 ? 0 : a->pos_stride_b;
  p.pos_ss = a->pos_stride_s;
  p.inverse = a->inverse ? 1 : 0;
  p.cache = a->cos_sin_cache;
  p.max_position = a->max_position;
  p.theta = a->theta;
  p.l3_factor = a->llama3_factor;
  p.l3_low = a->llama3_low_freq_factor;
  p.l3_high = a->llama3_high_freq_factor;
  p.l3_orig = a->llama3_original_max_position;
  if (!p.cache && p.half <= ot::kRopeMaxHalfByValue) ot_rope_inv_freq(a, p.inv_freq);
  if (p.t[0].heads == 0 && p.t[1].heads == 0) return OT_OK;

  cudaStream_t s = static_cast<cudaStream_t>(ctx->stream);
  cudaError_t e;
  switch (a->dtype) {
    case OT_F32: e = ot::rope_launch<float>(p, a->mode, s); break;
    case OT_F16: e = ot::rope_launch<__half>(p, a->mode, s); break;
    case OT_BF16: e = ot::rope_launch<__nv_bfloat16>(p, a->mode, s); break;
    default: return ot_error(OT_ERR_INTERNAL, op, "unexpected storage dtype %d", (int)a->dtype);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return ot_error(OT_ERR_BACKEND, op, "CUDA: %s", cudaGetErrorString(e));
  }
  return OT_OK;
}
