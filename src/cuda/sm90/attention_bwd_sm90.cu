/*
 * attention_bwd_sm90.cu -- Hopper (sm_90a) flash attention backward, dense BSHD, bf16/fp16,
 * head dim 64 / 96 / 128 / 256, non-causal or causal (bottom-right), GQA / MQA, any Sq / Sk.
 *
 * The FlashAttention-3 backward's structure, written from the PTX ISA with the forward's
 * building blocks (sm90_common.cuh):
 *  - prep kernel: Dsum = rowsum(dO * O) and lse2 = lse * log2(e) (+inf for rows with no
 *    visible key and for the padding rows up to a multiple of 64), fp32, [B][Hq][Sq_pad];
 *    the fp32 dQ accumulator [B][Hq][Sq_pad][D] is zeroed (all in context scratch);
 *  - main kernel: one CTA per (block of 128 keys, kv head, batch) -- a unit; the units of a
 *    non-causal call's last partial wave are split along the query walk (bwd_order) --,
 *    3 warpgroups:
 *    WG0 = producer (one thread: K and V of the block once, then Q, dO tiles of 64 queries
 *    by TMA and their lse2 / Dsum by bulk copies into a 2-stage ring on mbarriers; a second
 *    thread, the dQ writer, see below; the WG gives registers back with setmaxnreg.dec 24),
 *    WG1 / WG2 = consumers of 64 keys each
 *    (setmaxnreg.inc 240) holding dK and dV in fp32 registers across every query tile of
 *    every query head of the GQA group (the group sum is in registers: deterministic,
 *    except in split units, whose parts add their fp32 sums with atomics);
 *    per query tile:
 *        S^T = K Q^T, dP^T = V dO^T               (wgmma SS, both K-major; D = 64: RS, K / V
 *                                                 as register A operands, kXKvRs)
 *        P^T = exp2(S^T scale log2e - lse2),  dS^T = P^T (dP^T - Dsum)
 *        dV += P^T dO,  dK += dS^T Q              (wgmma RS: P^T / dS^T from registers,
 *                                                 dO / Q MN-major through the descriptor)
 *        dS^T -> shared memory (bf16/fp16, 128B swizzle, double-buffered), then
 *        dQ_part = dS K                           (wgmma SS, A and B MN-major): D = 128 splits
 *                                                 the 128 columns between the two WGs, and
 *                                                 D = 64 too since 2026-12-03 (kXDqHalf; the
 *                                                 128 keys before); at D = 128 (kXDqRed, the
 *                                                 default there since run 16) each consumer
 *                                                 adds its fp32 partial into the accumulator
 *                                                 with red.global.add.v4.f32 straight from
 *                                                 the registers, and at D = 64 too since
 *                                                 2026-12-03 (with kXKvRs); before, and
 *                                                 under OT_ATTN_BWD_SM90_KVRS=0 / 1, the
 *                                                 D = 64 partial goes to a double-buffered
 *                                                 shared staging tile, and the dQ writer adds
 *                                                 it into the accumulator with one bulk
 *                                                 reduce-add (cp.reduce.async.bulk.add.f32),
 *                                                 off the consumers' path;
 *    issue order at D = 128: dV as soon as P^T is packed (under dP^T), then after the dS^T
 *    barrier dQ before dK, so that dS^T's math runs under dV and the dQ reductions under
 *    dK; at D = 64 dV and dK before the barrier, then dQ (the D = 128 order was 4-5% slower
 *    there);
 *    D = 256 (HALF): dK and dV of 128 keys x 256 columns would need 256 accumulators a
 *    thread, so a CTA holds 64 keys, which both consumers share: each computes the whole
 *    S^T and dP^T (the same values; 7 GEMMs of the tile's size where 5 are needed) and keeps
 *    dK / dV of its 128 columns (64 + 64 registers), writes the whole dS^T into shared
 *    buffers of its own (no barrier between the consumers: DSOWN) and adds dQ's 128 columns
 *    in two chunks of 64 by red.global (the second after dK), the D = 128 issue order;
 *    2 x 32 KB K / V, 2 stages of 2 x 32 KB Q / dO, 4 x 8 KB dS^T: 226 KB of shared memory;
 *    D = 96 (kXPad): the D = 128 kernel on columns 96..127 zero-filled by TMA (a 4-D map,
 *    two boxes of 64 columns per operand tile), storing columns < 96; S^T / dP^T skip the
 *    zero k-steps, dK / dV accumulate 96 columns (kXN96), consumer 1's dQ 32 (kXDq32);
 *  - dq kernel: dQ = scale * accumulator, converted to the storage dtype (one block per
 *    accumulator tile, 64-byte reads, 16-byte stores).
 * The reduce-adds make dQ's summation order vary between runs (not bitwise repeatable), and
 * the split units' atomics that of their keys' dK / dV (a non-causal call's last partial
 * wave): params.deterministic = 1 routes to the portable backward instead (attention_bwd.cu).
 *
 * Not covered here (handled = false; the portable kernel runs): windows other than causal,
 * softcap, varlen, head dims other than 64 / 96 / 128 / 256, fp32, strides TMA cannot express,
 * devices other than cc 9.0, deterministic = 1, and calls whose scratch cannot be had
 * (the portable backward needs a (D + 2)-th of it; unless OT_ATTN_IMPL=sm90: OT_ERR_OOM).
 * Switches: OT_ATTN_SM90=0 (also turns the Hopper forward off), OT_ATTN_IMPL=portable (the
 * dispatcher in attention_bwd.cu). Experiment builds (-DOT_ATTN_SM90_EXPERIMENTS, never CI)
 * add the other value of the dQ bit below for each head dim (kXDqRed at D = 64, the staged
 * dQ at D = 128), chosen per call by OT_ATTN_BWD_SM90_DQ=red / stage. dK and dV are stored 16
 * bytes a lane after a transpose within each row quad (kXSt16, the default where their
 * pointers and strides allow it; OT_ATTN_BWD_SM90_ST16=0 the 4-byte stores).
 */
#include <cuda.h>
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "../attention_sm90.h"
#include "../bulk_copy.cuh"
#include "../common.cuh"
#include "../cuda_state.h"
#include "sm90_common.cuh"
#include "wgmma_ops.cuh"

namespace ot {
namespace sm90 {
namespace bwd {

/* Keys per CTA: D = 64 / 128, 2 consumer WGs x 64 keys; D = 256 (HALF in the kernel), 64
 * keys that both consumers share, each accumulating half of dK's and dV's columns. */
template <int D> struct bwd_tile {
  static constexpr int bk = D == 256 ? 64 : 128;
  static constexpr bool half = D == 256;
};
constexpr int kBq = 64;         /* queries per tile */
constexpr int kThreads = 384;   /* producer WG + 2 consumer WGs */
constexpr int kStages = 2;
constexpr int kDqTile = 64 * 64;  /* floats of one consumer's dQ partial (64 queries x 64) */

template <int D> struct bwd_smem {
  static constexpr int kBk = bwd_tile<D>::bk;
  static constexpr int kv_bytes = kBk * D * 2;   /* K or V of the block */
  static constexpr int q_bytes = kBq * D * 2;    /* one Q or dO stage */
  static constexpr int ds_bytes = kBk * kBq * 2; /* one dS^T buffer */
  static constexpr int k_off = 0;
  static constexpr int v_off = kv_bytes;
  static constexpr int q_off = 2 * kv_bytes;
  static constexpr int do_off = q_off + kStages * q_bytes;
  static constexpr int ds_off = do_off + kStages * q_bytes;
  /* dQ staging: [consumer][buffer] tiles of kDqTile floats (64 KB; X = 0 only: kXDqRed,
   * the D = 128 default, leaves it allocated and unused -- one CTA an SM by registers either
   * way, docs/ATTENTION.md "Next lever"; D = 256 runs only kXDqRed and has no room for it) */
  static constexpr int dqs_off = ds_off + (D == 256 ? 4 : 2) * ds_bytes; /* D256: 2 a consumer */
  static constexpr int lse_off = dqs_off + (D == 256 ? 0 : 4 * kDqTile * 4);
  static constexpr int dsum_off = lse_off + kStages * kBq * 4;
  static constexpr int bar_off = dsum_off + kStages * kBq * 4;
  static constexpr int bytes = bar_off + 128 + 1024; /* barriers + alignment slack */
  static_assert(kv_bytes % 1024 == 0 && q_bytes % 1024 == 0, "swizzle atoms are 1024 B");
  static_assert(bytes <= kSmemOptin, "shared memory opt-in limit"); /* D128: 231552 B,
                                                                      * D256: the same */
};

/* Barrier slots (8 bytes each): the K / V load, the Q / dO ring, and per consumer c and
 * buffer u the dQ staging's full (BAR_DQF + 2 c + u) and empty (BAR_DQE + 2 c + u). */
enum { BAR_KV = 0, BAR_FULL = 1, BAR_EMPTY = 1 + kStages, BAR_DQF = 1 + 2 * kStages,
       BAR_DQE = BAR_DQF + 4, BAR_COUNT = BAR_DQE + 4 };
static_assert(BAR_COUNT * 8 <= 120, "barrier area (byte 120: the split flag)");

/* The kernel's X bits. Every build compiles default_x<D> (kXDqRed at D = 128 and 256, 0 at
 * D = 64) with and without kXSt16 (with: the default; without: dK / dV whose pointers or
 * strides are not 16-byte multiples, and OT_ATTN_BWD_SM90_ST16=0); builds with
 * -DOT_ATTN_SM90_EXPERIMENTS (never CI) also the other dQ form (not at D = 256: no room for
 * the staging tiles), without kXSt16, chosen per
 * call by OT_ATTN_BWD_SM90_DQ (red: kXDqRed, stage: 0) (see launch_x):
 *  kXDqRed: the consumers add their dQ partial into the accumulator straight from the
 *    wgmma's registers with red.global.add.v4.f32 (8 a thread, 512 contiguous bytes a warp
 *    instruction: the accumulator tile is in fragment order), at D = 128 while dK runs;
 *    no shared staging tile, no dQ writer (its 64 KB of shared-memory traffic a 64-query
 *    tile: docs/ATTENTION.md, "Shared-memory bytes per tile"). The summation order of dQ
 *    is no more repeatable than the bulk reduce-adds' (this kernel runs only for
 *    deterministic = 0: the same semantics). docs/ATTENTION.md, runs 15 and 16: +1.3-3.7%
 *    fwd+bwd at D = 128 (the default there since run 16), mixed at D = 64 (not kept then;
 *    the D = 64 default with kXKvRs since 2026-12-03, see the dispatch).
 *  kXSt16: the epilogue's dK / dV stores 16 bytes a lane, as the forward's kFlSt16 stores O:
 *    the four lanes of a row quad trade their packed pairs (sm90_common.cuh's quad_transpose,
 *    two xor shuffles a 4 x 4 block, before the key-row test: all 32 lanes) so that each holds
 *    8 consecutive columns, one STG.128 per 8 columns instead of four STG.32 (4 / 16 a thread
 *    and tensor at D = 64, 8 / 32 at D = 128). The same values and bits; the split units' fp32
 *    sums unchanged. Only where dK's and dV's pointers and strides are 16-byte multiples
 *    (checked on the host). From the forward's kFlSt16 (LSU queue throttling in its
 *    epilogue); the default since 2026-12-01: +1.5-7% fwd+bwd (docs/ATTENTION.md "kXSt16"). */
/* enumerators: no unused-variable warning where no kernel uses them */
enum { kXDqRed = 1, kXSt16 = 2, kXPad = 4, kXN96 = 8, kXDq32 = 16, kXKvRs = 32, kXDqHalf = 64,
       kXPers = 128, kXPersSt = 256 };
template <int D> struct default_x {
  enum { value = D >= 128 ? kXDqRed : 0 };
};

struct bwd_params {
  void *dk, *dv;
  int64_t dk_bs, dk_ts, dk_hs, dv_bs, dv_ts, dv_hs; /* elements */
  const float *lse2, *dsum;                         /* [B][Hq][sq_pad] */
  float *dq_acc;                                    /* [B][Hq][sq_pad][D] */
  int sq, sk, sq_pad, hq, group, causal;
  float scale, scale_log2;
  /* Work order (bwd_order): units (key block, kv head, batch), hb = kvh + hkv b. The first
   * nhb - tail_heads heads' units come head by head (key blocks fastest), the last
   * tail_heads heads' key block by key block (causal: the heaviest first). Units from
   * n_full on are split into nsplit CTAs each (parts of the query walk), whose dK / dV
   * partials are added into split_acc [unit - n_full][dk | dv][kBk D] and counted in
   * split_cnt; the last part of a unit stores dK / dV. */
  int nkb, hkv, nhb, tail_heads, n_full, nsplit;
  float *split_acc;
  int *split_cnt;
  /* kXPers: the CTAs of the order above (n_ctas: n_full + the split units' parts) walked
   * by a grid of at most one CTA an SM, CTA i taking i first, then the next by an atomic
   * add on *work_ctr (zeroed with the split counters); pers_grid: the grid's size
   * where > 0 (tests: long walks on a small grid), else the SMs (host only) */
  int n_ctas, pers_grid;
  int *work_ctr;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int kEmptyCount = 256;  /* every consumer thread releases a stage */
constexpr int kDsBar = 1;       /* named barrier: both consumers' dS^T are in shared memory */

/* global[dst .. + bytes) += shared[src ..) (fp32, by the TMA unit), one bulk group. */
__device__ __forceinline__ void bulk_reduce_add(float *dst, uint32_t src, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"((uint64_t)dst), "r"(src), "r"(bytes)
      : "memory");
}
/* global[dst .. + 4) += v (fp32, relaxed, gpu scope; no result returned). */
__device__ __forceinline__ void red_add_v4(float *dst, float a, float b, float c, float d) {
  asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(a),
               "f"(b), "f"(c), "f"(d)
               : "memory");
}
/* Named barrier of one consumer warpgroup (ids 2, 3; 1 is kDsBar). */
__device__ __forceinline__ void wg_sync(int c) {
  if (c == 0)
    named_sync(kDsBar + 1, 128);
  else
    named_sync(kDsBar + 2, 128);
}
/* Generic-proxy shared-memory writes (dS^T) made visible to the async proxy (wgmma). */
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* One CTA's work (bwd_params' order): unit w of the grid -- for a split unit, its part --
 * as key block kb of kv head kvh of batch b, the query walk [it0, it0 + n_loc) over query
 * tiles m_lo .. m_hi - 1 (nm of them) x the group's heads, rotated by rot. */
struct bwd_unit {
  int unit, part, kvh, b, kbi, kb, m_lo, m_hi, nm, it0, n_loc, rot;
  bool split;
  /* The key blocks of a head start their query-tile walk at different tiles, so that the
   * CTAs running together add into different rows of the dQ accumulator. */
  __device__ __forceinline__ int tile_of(int it) const {
    const int r = it % nm + rot;
    return m_lo + (r >= nm ? r - nm : r);
  }
};
__device__ __forceinline__ bwd_unit bwd_decode(const bwd_params &p, int w, int kBk) {
  bwd_unit u;
  u.unit = w;
  u.part = 0;
  u.split = w >= p.n_full;
  if (u.split) {
    u.part = (w - p.n_full) % p.nsplit;
    u.unit = p.n_full + (w - p.n_full) / p.nsplit;
  }
  int hb;
  const int n_head_major = (p.nhb - p.tail_heads) * p.nkb;
  if (u.unit < n_head_major) {
    hb = u.unit / p.nkb;
    u.kbi = u.unit % p.nkb;
  } else {
    u.kbi = (u.unit - n_head_major) / p.tail_heads;
    hb = p.nhb - p.tail_heads + (u.unit - n_head_major) % p.tail_heads;
  }
  u.kvh = hb % p.hkv;
  u.b = hb / p.hkv;
  u.kb = u.kbi * kBk;
  const int off = p.sk - p.sq;        /* bottom-right alignment of the causal mask */
  u.m_hi = p.sq_pad / kBq;
  u.m_lo = 0;
  if (p.causal) {                     /* queries i < kb - off see no key of the block */
    const int imin = u.kb - off;
    u.m_lo = imin <= 0 ? 0 : min(imin / kBq, u.m_hi);
  }
  u.nm = u.m_hi - u.m_lo;
  const int n_it = u.nm * p.group;    /* query tiles x query heads of the group */
  /* This CTA's part of the walk: [it0, it0 + n_loc) (all of it unless split). */
  u.it0 = u.split ? (int)((int64_t)u.part * n_it / p.nsplit) : 0;
  u.n_loc = u.split ? (int)((int64_t)(u.part + 1) * n_it / p.nsplit) - u.it0 : n_it;
  u.rot = u.nm > 0 ? u.kbi % u.nm : 0;
  return u;
}

/* dQ partials: at D = 128 the 64 columns of a consumer over all 128 keys, after a barrier of
 * both consumers; at D = 64 all columns over the consumer's own keys. X = 0: each goes to a
 * shared staging tile, from which the dQ writer (one thread of the producer warpgroup) adds
 * it into the accumulator with one bulk reduce-add; kXDqRed: the consumers add it with
 * red.global.add.v4.f32 (fire and forget: no result waited for). */
template <typename T, int D, int X>
__global__ void __launch_bounds__(kThreads, 1)
    attn_bwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q,
                         const __grid_constant__ CUtensorMap tm_k,
                         const __grid_constant__ CUtensorMap tm_v,
                         const __grid_constant__ CUtensorMap tm_do, const bwd_params p) {
  using L = bwd_smem<D>;
  constexpr int kBk = L::kBk;
  constexpr bool F16 = is_half<T>::value;
  /* HALF (D = 256): the two consumers share the CTA's 64 keys; each computes the whole S^T
   * and dP^T (the same values: 2 of the tile's 7 GEMMs are this duplication) and keeps dK
   * and dV of its half of the columns (DW = 128), the largest accumulators that fit its 240
   * registers beside P^T / dS^T (2 x 64 against 2 x 128 for all columns of 64 keys). */
  constexpr bool HALF = bwd_tile<D>::half;
  constexpr int DW = HALF ? D / 2 : D;   /* dK / dV columns of a consumer */
  /* kXN96 (with kXPad, kXSt16): dV += P^T dO and dK += dS^T Q over the first 96 columns of
   * dO and Q only (wgmma N = 96, as the forward's kFlN96: the B operand ends inside its
   * second 64-column swizzle atom), 48 accumulators each instead of 64. With kXDq32 the
   * default for head dim 96 with the 16-byte stores since 2026-12-03 (see the dispatch;
   * OT_ATTN_BWD_SM90_N96=0 off) */
  constexpr bool N96 = (X & kXN96) != 0;
  /* kXDq32 (with kXN96, kXDqRed): consumer 1's dQ chunk -- columns 64..127, of which 96..127
   * are K's zero columns -- runs wgmma N = 32 over columns 64..95 and adds 4 float4 a thread
   * instead of 8 (a quarter of the tile's dQ reductions and an eighth of its dQ MACs fewer).
   * The default with kXN96 since 2026-12-03 (OT_ATTN_BWD_SM90_DQ32=0 off) */
  constexpr bool DQ32 = (X & kXDq32) != 0;
  static_assert(!DQ32 || (N96 && (X & kXDqRed)), "kXDq32: with kXN96 and kXDqRed");
  constexpr int NKV = N96 ? 96 : DW;   /* dK / dV columns accumulated */
  constexpr int NA = NKV / 2;  /* dK, dV accumulators per thread */
  /* dQ over the consumer's own keys (D = 64). At D = 128 the same in two 64-column chunks
   * (no dS^T barrier between the consumers, twice the dQ reductions; kXOwnK, 2026-12-03)
   * lost 3.6-7.6% fwd+bwd (bench/results/attention_grid_bwd256.json, "ownk"): removed. */
  /* kXDqHalf (D = 64 with kXKvRs | kXDqRed; the D = 64 default since 2026-12-03, twenty-sixth
   * session, 1.00-1.03x fwd+bwd over the form without it): dQ as at D = 128 --
   * consumer c adds columns 32 c .. 32 c + 31 over all 128 keys of the CTA (wgmma N = 32, the
   * B operand starting mid-atom at byte 64 c of K's 128-byte rows), after the 256-thread dS^T
   * barrier -- instead of all 64 columns over its own 64 keys: half the red.global bytes a
   * tile (16 KB instead of 32). Why: at S 4k the D = 64 default adds ~2.4 TB/s of fp32
   * reductions into L2 (16.8 GB in ~7 ms of backward), 1.5x D = 128's rate for the same
   * kernel shape; if that rate is the L2's reduction ceiling, halving it is the lever
   * (docs/ATTENTION.md, "Head dim 64: K and V as register operands"). */
  constexpr bool DQH = (X & kXDqHalf) != 0;
  static_assert(!DQH || (D == 64 && (X & kXKvRs) && (X & kXDqRed)),
                "kXDqHalf: D = 64 with kXKvRs and kXDqRed");
  constexpr bool OWN = D == 64 && !DQH;
  constexpr int NQ = DQH ? 32 : 64;  /* dQ columns of a chunk: all (D = 64), a consumer's half
                                      * (D = 128, kXDqHalf); D = 256: two chunks, a
                                      * consumer's 128 */
  constexpr int NCH = HALF ? 2 : 1;
  /* D >= 128: dV issued under dP^T, dQ before dK, the dQ partial's stores under dK (see the
   * tile loop); D = 64 keeps dV, dK before dQ (the D = 128 order ran 4-5% slower there). */
  constexpr bool DV_EARLY = D >= 128;
  constexpr bool RED = (X & kXDqRed) != 0;   /* dQ by red.global from the consumers */
  static_assert(RED || !HALF, "D = 256: no room for the dQ staging tiles");
  constexpr bool ST16 = (X & kXSt16) != 0;   /* dK / dV stored 16 bytes a lane */
  /* kXPad (D = 128 running a head dim of 96): Q, K, V, dO loaded by a 4-D map twice per
   * operand (columns 0 and 64), the columns from 96 on zero-filled by TMA; the kernel runs
   * the D = 128 tile unchanged (the zero columns add nothing to S^T or dP^T, and their dQ /
   * dK / dV come out zero); only columns < 96 of dK / dV are stored */
  constexpr bool PAD = (X & kXPad) != 0;
  static_assert(!PAD || D == 128, "kXPad: a head dim of 96 on the D = 128 tile");
  static_assert(!N96 || (PAD && ST16), "kXN96: with kXPad and kXSt16");
  constexpr int DST = PAD ? 96 : DW;   /* the columns a consumer stores */
  /* S^T's and dP^T's k-steps: with kXPad the last two (columns 96..127 of K / V and Q / dO,
   * zeros) are not issued -- their products are exact zeros */
  constexpr int KST = PAD ? 96 / 16 : D / 16;
  /* DSOWN (= HALF): each consumer writes the whole dS^T (it holds all of it) into two buffers
   * of its own and reads only those, so that the two consumers meet at no barrier of the
   * tile, only through the Q / dO ring. Measured on the H200 (2026-12-03, fwd+bwd, against
   * each writing half of one shared dS^T and both waiting for the other's half at a named
   * barrier): 1.19x S 1k, 1.11x S 1k causal, 1.11x / 1.16x S 4k, 1.04x / 1.08x S 16k;
   * consumers taking turns to issue S^T / dP^T on top of it (named-barrier pingpong) lost
   * 2-10% against it (bench/results/attention_bwd256_dsown.json). */
  constexpr bool DSOWN = HALF;
  /* kXKvRs (D = 64): S^T = K Q^T and dP^T = V dO^T take K and V from registers (wgmma RS
   * with a K-major B), loaded once per CTA by ldmatrix from the swizzled K / V tiles: 16
   * registers each a thread. Their 4 KB a k-step (16 KB of the tile's shared-memory operand
   * reads per consumer and tile, a seventh of its shared-memory bytes: docs/ATTENTION.md,
   * "Shared-memory bytes per tile") are not read again per tile. */
  constexpr bool KVRS = (X & kXKvRs) != 0;
  static_assert(!KVRS || D == 64, "kXKvRs: head dim 64 (the registers of larger D are taken)");
  extern __shared__ uint8_t smem_raw[];
  /* Aligned by offsetting smem_raw (not by casting through an integer), so that the
   * compiler still knows every access through smem is to shared memory: LDS / STS with
   * 32-bit addresses. The integer round trip made them generic LD.E / ST.E with 64-bit
   * address registers (ncu of 14a9972: 5% of the warps' stall samples on their 'lg'
   * latency, 5% on the fence after the dQ staging stores). */
  uint8_t *smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const uint32_t s_base = smem_u32(smem);
  const uint32_t s_bar = s_base + L::bar_off;
  auto bar = [&](int i) { return s_bar + 8u * (uint32_t)i; };

  /* kXPers (D = 64 / 128 with kXDqRed; the D = 64 default since 2026-12-03, 1.03-1.08x
   * fwd+bwd, a loss of 2-7% at D = 128): a persistent grid of at most one CTA an SM, each
   * walking CTAs of the order (bwd_unit) one after another -- its first blockIdx.x, the
   * next claimed by the producer with an atomic add while the consumers run the one
   * before -- with two K / V buffers (the second in the dQ staging tiles, unused with
   * kXDqRed): the producer loads unit j's K / V while the consumers run unit j - 1, the
   * Q / dO ring and the dS^T buffers run on across units, and the consumers' start of a
   * unit (barrier set-up, K / V latency, the CTA launch) leaves the tensor pipe idle no
   * more. The unit's number goes to the consumers in a shared slot per buffer, published by
   * the K / V barrier's arrival; -1 ends the walk. Barriers: BAR_KV / BAR_DQF the K / V of
   * buffer 0 / 1, BAR_DQF + 1 + u their release (every consumer thread arrives once its
   * unit's last wgmma is done). */
  constexpr bool PERS = (X & kXPers) != 0;
  static_assert(!PERS || RED, "kXPers: with kXDqRed");
  /* K / V buffers of the walk: D = 256 (HALF) has no room for a second one (no staging
   * tiles), so there the producer loads unit j's K / V once the consumers are done with unit
   * j - 1 -- their dK / dV stores then run under that load -- after issuing unit j's first
   * Q / dO stages (2026-12-03: the D256 walk with it is level with one CTA a unit in the
   * steady state, 0.98-1.00x; docs/ATTENTION.md) */
  constexpr int NKVB = HALF ? 1 : 2;
  /* kXPersSt (with kXPers; the D = 64 default of non-causal calls, OT_ATTN_BWD_SM90_PERS=s
   * elsewhere): CTA i walks units i, i + grid, i + 2 grid, ... (no counter; every unit value
   * derives from blockIdx and the loop count, uniform registers where the slot's value is a
   * per-thread one). 1.01-1.07x the atomic walk on non-causal calls, also with the claim
   * made a unit ahead (so not the atomic's latency; why, not known); on causal ones the
   * heaviest-first order dealt round-robin leaves SMs idle (0.86-0.97x). */
  constexpr bool PST = (X & kXPersSt) != 0;
  static_assert(!PST || PERS, "kXPersSt: with kXPers");
  /* kXPers at D = 64: the producer keeps 40 registers (the consumers 232, of which D = 64
   * needs far fewer): with 24 it spilled its unit decode, and the claimed unit's register
   * with it right after the atomic, which made the claim wait for the atomic's round trip
   * there instead of under the current unit's loads */
  /* the two units' slots: bytes 104 .. 111 of the barrier area (the split flag at 120) */
  static_assert(BAR_COUNT * 8 <= 104, "barrier area: the kXPers unit slots at byte 104");
  volatile int *unit_slot = (volatile int *)(smem + L::bar_off + 104);
  auto kv_full = [&](int u) { return bar(u ? BAR_DQF : BAR_KV); };
  auto kv_free = [&](int u) { return bar(BAR_DQF + 1 + u); };
  auto kv_base = [&](int u) {
    return s_base + (NKVB == 2 && u ? (uint32_t)L::dqs_off : (uint32_t)L::k_off);
  };
  const int off = p.sk - p.sq;        /* bottom-right alignment of the causal mask */
  /* The CTA's (first) unit, decoded before the producer gives up its registers */
  const bwd_unit U0 = bwd_decode(p, (int)blockIdx.x, kBk);

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) {
    mbar_init(bar(BAR_KV), 1);
    for (int s = 0; s < kStages; s++) {
      mbar_init(bar(BAR_FULL + s), 1);
      mbar_init(bar(BAR_EMPTY + s), kEmptyCount);
    }
    if constexpr (PERS) {
      mbar_init(kv_full(1), 1);
      mbar_init(kv_free(0), 256);
      mbar_init(kv_free(1), 256);
    } else {
      for (int u = 0; u < 4; u++) {
        mbar_init(bar(BAR_DQF + u), 128);   /* every thread of the consumer arrives */
        mbar_init(bar(BAR_DQE + u), 1);
      }
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    /* ---------------- producer ---------------- */
    if constexpr (PERS && D == 64)   /* 40 / 232: see PST's comment at the kernel's top */
      asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    else
      asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (tid != 0 && (PERS || RED || tid != 32)) return;   /* RED: no dQ writer */
    /* unit U's K / V into the buffer at kv_dst (barrier kv_bar); its Q / dO / lse2 / Dsum
     * stages t0 .. t1 - 1, tile t of it the tb + t-th of this CTA's walk */
    auto load_kv = [&](const bwd_unit &U, uint32_t kv_bar, uint32_t kv_dst) {
      mbar_expect_tx(kv_bar, 2u * L::kv_bytes);
      tma_load_tile<PAD>(kv_dst, &tm_k, kv_bar, U.kb, kBk, U.kvh, U.b);
      tma_load_tile<PAD>(kv_dst + L::kv_bytes, &tm_v, kv_bar, U.kb, kBk, U.kvh, U.b);
    };
    auto load_tiles = [&](const bwd_unit &U, int tb, int t0, int t1) {
      auto load_tile = [&](uint32_t dst, const CUtensorMap *map, uint32_t br, int row, int rows,
                           int h) { tma_load_tile<PAD>(dst, map, br, row, rows, h, U.b); };
      for (int t = t0; t < t1; t++) {
        const int it = U.it0 + t, tt = tb + t, s = tt % kStages;
        mbar_wait(bar(BAR_EMPTY + s), ((tt / kStages) & 1) ^ 1);
        const int h = U.kvh * p.group + it / U.nm, m = U.tile_of(it);
        mbar_expect_tx(bar(BAR_FULL + s), 2u * L::q_bytes + 2u * kBq * 4);
        load_tile(s_base + L::q_off + s * L::q_bytes, &tm_q, bar(BAR_FULL + s), m * kBq, kBq, h);
        load_tile(s_base + L::do_off + s * L::q_bytes, &tm_do, bar(BAR_FULL + s), m * kBq, kBq,
                  h);
        const int64_t row = ((int64_t)U.b * p.hq + h) * p.sq_pad + (int64_t)m * kBq;
        bulk_load_sh(s_base + L::lse_off + s * kBq * 4, p.lse2 + row, kBq * 4,
                     bar(BAR_FULL + s));
        bulk_load_sh(s_base + L::dsum_off + s * kBq * 4, p.dsum + row, kBq * 4,
                     bar(BAR_FULL + s));
      }
    };
    auto load_unit = [&](const bwd_unit &U, uint32_t kv_bar, uint32_t kv_dst, int tb) {
      load_kv(U, kv_bar, kv_dst);
      load_tiles(U, tb, 0, U.n_loc);
    };
    /* The unit after the current one is claimed as the current one starts (its atomic's
     * round trip runs under the current unit's loads; claimed as each unit ended, it sat in
     * front of the next unit's K / V: the static walk was 1.06x faster at S 1k non-causal,
     * bench/results/attention_bwd_pers_static.json). claim: the static walk's unit, or the
     * counter's value; next: unit j's number (w) from the claim made at unit j - 1 (wn),
     * and the claim of unit j + 1 -- the claim's first use held here (volatile: not moved
     * up to the atomic, whose round trip it would then wait for) */
    auto claim = [&](int jn) {
      return PST ? (int)blockIdx.x + jn * (int)gridDim.x : atomicAdd(p.work_ctr, 1);
    };
    auto next = [&](int j, int &w, int &wn) {
      if constexpr (PST)
        w = wn;
      else
        asm volatile("add.s32 %0, %1, %2;" : "=r"(w) : "r"(wn), "r"((int)gridDim.x));
      if (w < p.n_ctas) wn = claim(j + 1);
    };
    if constexpr (PERS && NKVB == 1) {
      /* one K / V buffer (D = 256): unit j's first stages, then its K / V once unit j - 1
       * released the buffer */
      int w = (int)blockIdx.x, wn = claim(1), tb = 0;
      for (int j = 0;; j++) {
        if (j > 0) next(j, w, wn);
        const bool last = w >= p.n_ctas;
        const bwd_unit U = bwd_decode(p, last ? 0 : w, kBk);
        const int npre = last ? 0 : min(kStages, U.n_loc);
        load_tiles(U, tb, 0, npre);
        if (j >= 1) mbar_wait(kv_free(0), (j - 1) & 1);   /* unit j - 1 is done */
        unit_slot[0] = last ? -1 : w;   /* published by the arrival below */
        if (last) {
          mbar_arrive(kv_full(0));
          break;
        }
        if (U.n_loc == 0) {
          mbar_arrive(kv_full(0));
          continue;
        }
        load_kv(U, kv_full(0), kv_base(0));
        load_tiles(U, tb, npre, U.n_loc);
        tb += U.n_loc;
      }
      return;
    }
    if constexpr (PERS) {
      int w = (int)blockIdx.x, wn = claim(1), tb = 0;
      for (int j = 0;; j++) {
        const int u = j & 1;
        if (j >= 2) mbar_wait(kv_free(u), ((j >> 1) - 1) & 1);   /* unit j - 2 is done */
        if (j > 0) next(j, w, wn);
        unit_slot[u] = w < p.n_ctas ? w : -1;   /* published by the arrival below */
        if (w >= p.n_ctas) {
          mbar_arrive(kv_full(u));
          break;
        }
        const bwd_unit U = bwd_decode(p, w, kBk);
        if (U.n_loc == 0) {
          mbar_arrive(kv_full(u));
          continue;
        }
        load_unit(U, kv_full(u), kv_base(u), tb);
        tb += U.n_loc;
      }
      return;
    }
    const bwd_unit &U = U0;
    if (U.n_loc == 0) return;
    if (tid == 32) {
      /* ---- dQ writer: consumer c's partial of query tile it, buffer it & 1, into the
       * accumulator's tile [b][h][m][D / 64] in fragment order (see bwd_dq_kernel) ---- */
      for (int t = 0; t < U.n_loc; t++) {
        const int it = U.it0 + t;
        const int h = U.kvh * p.group + it / U.nm, m = U.tile_of(it), u = t & 1;
#pragma unroll
        for (int c = 0; c < 2; c++) {
          mbar_wait(bar(BAR_DQF + 2 * c + u), (t >> 1) & 1);
          const int64_t tile =
              (((int64_t)U.b * p.hq + h) * U.m_hi + m) * (D / 64) + (D == 128 ? c : 0);
          bulk_reduce_add(p.dq_acc + tile * kDqTile,
                          s_base + L::dqs_off + (2 * c + u) * kDqTile * 4, kDqTile * 4);
          asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
          mbar_arrive(bar(BAR_DQE + 2 * c + u));
        }
      }
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      return;
    }
    load_unit(U, bar(BAR_KV), kv_base(0), 0);
    return;
  }

  /* ---------------- consumers ---------------- */
  if constexpr (PERS && D == 64)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  else
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int c = wg - 1;   /* consumer 0 / 1: keys kb + 64 c .. + 63 (HALF: columns 128 c ..) */
  const int t128 = tid % 128;
  const int warp = t128 / 32, lane = t128 % 32, g = lane / 4, q4 = lane % 4;
  const float cl2 = p.scale_log2;
  int tb = 0;   /* tiles of the CTA's walk before this unit (kXPers; else 0) */
  for (int ju = 0; PERS || ju == 0; ju++) {   /* kXPers: unit after unit; else once */
    const int ub = PERS && NKVB == 2 ? (ju & 1) : 0;   /* the unit's K / V buffer */
    const int kvph = (NKVB == 2 ? ju >> 1 : ju) & 1;   /* its barrier's phase */
    int w = (int)blockIdx.x;
    if constexpr (PST) {
      w = (int)blockIdx.x + ju * (int)gridDim.x;
      if (w >= p.n_ctas) break;
      mbar_wait(kv_full(ub), kvph);
    } else if constexpr (PERS) {
      mbar_wait(kv_full(ub), kvph);
      w = unit_slot[ub];
      if (w < 0) break;
    }
    const bwd_unit U = PERS ? bwd_decode(p, w, kBk) : U0;
    const int unit = U.unit, kvh = U.kvh, b = U.b, kb = U.kb, m_hi = U.m_hi, nm = U.nm;
    const int it0 = U.it0, n_loc = U.n_loc;
    const bool split = U.split;
    (void)m_hi;
    const int key0 = kb + (HALF ? 0 : c * 64) + warp * 16 + g;   /* keys key0, key0 + 8 */
    float dk[NA], dv[NA];
#pragma unroll
    for (int i = 0; i < NA; i++) dk[i] = dv[i] = 0.f;

    if (!PERS && n_loc > 0) mbar_wait(bar(BAR_KV), 0);   /* kXPers: waited for above */
    const uint32_t k_base = kv_base(ub), v_base = k_base + L::kv_bytes;
    /* This WG's 64 rows of K / V as the K-major A operand of S^T / dP^T. */
    const uint32_t krow = HALF ? 0u : (uint32_t)c * 64 * 128;
    const uint64_t ka_desc = make_desc(k_base + krow, 16, 1024);
    const uint64_t va_desc = make_desc(v_base + krow, 16, 1024);
    /* kXKvRs: the A fragments of this warp's 16 keys (rows krow / 128 + 16 warp ..) over the 4
     * k-steps of 16 columns, kf[4 kk + r] as the m16n8k16 A fragment (r: rows + 8 (r & 1),
     * columns + 8 (r >> 1)); ldmatrix.x4 lane l addresses row l % 8 + 8 ((l >> 3) & 1) of
     * the warp's 16 and 16-byte chunk 2 kk + (l >> 4), stored at chunk ^ (row & 7) (128B
     * swizzle; the tile is 1024-byte aligned) */
    uint32_t kf[KVRS ? 16 : 1], vf[KVRS ? 16 : 1];
    if constexpr (KVRS) {
      if (n_loc > 0) {
        const uint32_t r = krow / 128 + warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
          const uint32_t o = r * 128 + (((2 * kk + (lane >> 4)) ^ (r & 7)) << 4);
          ldsm_x4(&kf[4 * kk], k_base + o);
          ldsm_x4(&vf[4 * kk], v_base + o);
        }
      }
    }
    /* HALF: the consumer's columns of dO / Q (B of dV / dK): 64-column blocks 2c, 2c + 1 */
    const uint32_t bcol = HALF ? (uint32_t)c * (DW / 64) * (kBq * 128) : 0u;

    /* The walk's position it0 + t as (it % nm, it / nm), advanced by one a tile rather than
     * divided by nm twice a tile (per thread under kXPers, whose unit values are not
     * uniform): 4.8-7.2% fewer instructions in the tile loop; fwd+bwd 1.045x at D64 causal,
     * 1.013-1.021x at D128 S4k, 0.99x at D256 S4k; the D128 walk 1.075x
     * (bench/results/attention_bwd_incr_tile.json, 2026-12-03) */
    int wr = nm > 0 ? it0 % nm : 0, wq = nm > 0 ? it0 / nm : 0;
    for (int t = 0; t < n_loc; t++) {
      const int tt = (PERS ? tb : 0) + t, s = tt % kStages;   /* the CTA's tt-th tile */
      const int rr = wr + U.rot;   /* = U.tile_of(it0 + t) - m_lo, before the wrap */
      const int i0 = (U.m_lo + (rr >= nm ? rr - nm : rr)) * kBq;
      const int hoff = wq;         /* (it0 + t) / nm: the query head within the group */
      (void)hoff;                  /* (read by kXDqRed's reductions only) */
      if (++wr == nm) {
        wr = 0;
        wq++;
      }
      const uint32_t q_base = s_base + L::q_off + s * L::q_bytes;
      const uint32_t do_base = s_base + L::do_off + s * L::q_bytes;
      mbar_wait(bar(BAR_FULL + s), (tt / kStages) & 1);

      /* S^T = K Q^T and dP^T = V dO^T: [64 keys x 64 queries], K-major operands. */
      float st[32], dpt[32];
      /* acc [64 x 64] = A B^T over D, A this WG's 64 rows of K or V, B a [64][D] stage. */
      auto gemm_kmajor = [&](float *acc, uint64_t a_desc, uint32_t *af, uint32_t b_base) {
        const uint64_t b_desc = make_desc(b_base, 16, 1024);
#pragma unroll
        for (int kk = 0; kk < KST; kk++) {
          const uint32_t oa = (kk / 4) * (kBk * 128) + (kk % 4) * 32;
          const uint32_t ob = (kk / 4) * (kBq * 128) + (kk % 4) * 32;
          if constexpr (KVRS)
            wgmma_rs_k<64, F16>::run(acc, &af[4 * kk], b_desc + (ob >> 4), kk > 0);
          else
            wgmma_ss<64, F16>::run(acc, a_desc + (oa >> 4), b_desc + (ob >> 4), kk > 0);
        }
        wgmma_commit();
      };
      wgmma_fence();
      gemm_kmajor(st, ka_desc, kf, q_base);
      gemm_kmajor(dpt, va_desc, vf, do_base);
      /* Accumulator element i: key key0 + 8 ((i >> 1) & 1), query i0 + 8 (i >> 2) + 2 q4 + (i & 1). */
      const float *lse_s = (const float *)(smem + L::lse_off + s * kBq * 4);
      const float *dsum_s = (const float *)(smem + L::dsum_off + s * kBq * 4);
      const bool mask = (p.causal && kb + kBk - 1 > i0 + off) || kb + kBk > p.sk;
      wgmma_wait<1>();
      reg_fence<32>(st);
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const float2 l = *(const float2 *)(lse_s + 8 * j + 2 * q4);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int i = 4 * j + e;
          st[i] = ex2(fmaf(st[i], cl2, -((e & 1) ? l.y : l.x)));
          if (mask) {
            const int key = key0 + 8 * (e >> 1), q = i0 + 8 * j + 2 * q4 + (e & 1);
            if (key >= p.sk || (p.causal && key > q + off)) st[i] = 0.f;
          }
        }
      }
      uint32_t pp[16], pds[16];
      /* dO as the MN-major B of dV += P^T dO, Q as that of dK += dS^T Q ([64 queries][D]). */
      const uint64_t dob = make_desc(do_base + bcol, kBq * 128, 1024);
      const uint64_t qb = make_desc(q_base + bcol, kBq * 128, 1024);
      auto issue_dv = [&] {
#pragma unroll
        for (int kk = 0; kk < kBq / 16; kk++)
          wgmma_rs<NKV, F16>::run(dv, &pp[4 * kk], dob + ((kk * 2048) >> 4), 1);
      };
      auto issue_dk = [&] {
#pragma unroll
        for (int kk = 0; kk < kBq / 16; kk++)
          wgmma_rs<NKV, F16>::run(dk, &pds[4 * kk], qb + ((kk * 2048) >> 4), 1);
      };
      if (DV_EARLY) {
        /* dV += P^T dO issued as soon as P^T is packed, under dP^T: the tensor pipe runs it
         * while this thread waits for dP^T and computes dS^T. */
#pragma unroll
        for (int i = 0; i < 16; i++) pp[i] = pack2<F16>(st[2 * i], st[2 * i + 1]);
        wgmma_fence();
        issue_dv();
        wgmma_commit();
        wgmma_wait<1>();   /* dP^T (dV may still run) */
      } else {
        wgmma_wait<0>();
      }
      reg_fence<32>(dpt);
      if constexpr (KVRS) {   /* S^T's and dP^T's register operands read by now */
        reg_fence<16>(kf);
        reg_fence<16>(vf);
      }
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const float2 dd = *(const float2 *)(dsum_s + 8 * j + 2 * q4);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int i = 4 * j + e;
          dpt[i] = st[i] * (dpt[i] - ((e & 1) ? dd.y : dd.x));
        }
      }
#pragma unroll
      for (int i = 0; i < 16; i++) {
        if (!DV_EARLY) pp[i] = pack2<F16>(st[2 * i], st[2 * i + 1]);
        pds[i] = pack2<F16>(dpt[2 * i], dpt[2 * i + 1]);
      }
      /* dS^T into buffer it & 1: [kBk keys][64 queries], 128 B rows, 128B swizzle (16-byte
       * chunk j of row r at chunk j ^ (r & 7)). pds[2 j + hh]: key row 8 hh, queries 8 j + 2 q4.
       * DSOWN: into the consumer's own pair of buffers (2 c + (it & 1)). */
      {
        uint8_t *dsb = smem + L::ds_off + ((DSOWN ? 2 * c : 0) + (tt & 1)) * L::ds_bytes;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
          for (int hh = 0; hh < 2; hh++) {
            const int r = (HALF ? 0 : c * 64) + warp * 16 + g + 8 * hh;
            *(uint32_t *)(dsb + r * 128 + ((j ^ (r & 7)) << 4) + 4 * q4) = pds[2 * j + hh];
          }
      }
      if (!DV_EARLY) {
        /* dV += P^T dO, dK += dS^T Q: B = dO / Q [64 queries][D], MN-major. */
        wgmma_fence();
        issue_dv();
        issue_dk();
        wgmma_commit();
      }
      fence_proxy_async();
      if (!OWN && !DSOWN) {
        named_sync(kDsBar, 256);
      } else {   /* only this WG's rows (OWN) or copy (DSOWN) of dS^T are read, by this WG */
        wg_sync(c);
      }
      /* dQ_part [64 queries x NQ columns] = dS K: A = dS^T buffer (MN-major), B = K (MN-major):
       * the WG's 64 columns over all 128 keys, or (OWN) all columns over its 64 keys, or
       * (HALF) its 128 columns over the 64 keys in two chunks of 64 (the second after dK: the
       * first chunk's registers are free by then; 192 live accumulators at most). */
      /* The dQ staging buffer of this tile is free once the writer has read its previous
       * contents (waited for here, before dq is live: fewer registers across the wait). */
      if constexpr (!RED) mbar_wait(bar(BAR_DQE + 2 * c + (t & 1)), ((t >> 1) & 1) ^ 1);
      /* One chunk of dQ at NQC columns (kXDq32: consumer 1's is 32, see the enum). */
      auto dq_chunk = [&](const int ch, auto nqc) {
        constexpr int NQC = decltype(nqc)::value;
        /* the 64-column block of dQ this chunk adds to */
        const int cb = HALF ? 2 * c + ch : (OWN || DQH) ? 0 : c;
        float dq[NQC / 2];
        {
          const uint32_t ds_base =
              s_base + L::ds_off + ((DSOWN ? 2 * c : 0) + (tt & 1)) * L::ds_bytes;
          constexpr int NK = OWN ? 64 / 16 : kBk / 16;
          const int k16_0 = OWN ? c * 4 : 0;
          /* (kXDqHalf: consumer c's 32 columns start 64 c bytes into the 128-byte rows) */
          const uint32_t kcol = (uint32_t)cb * (kBk * 128) + (DQH ? (uint32_t)c * 64u : 0u);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < NK; kk++) {
            const uint32_t o = (uint32_t)(k16_0 + kk) * 2048;
            wgmma_ss_t<NQC, F16>::run(dq, make_desc(ds_base + o, kBk * 128, 1024),
                                     make_desc(k_base + kcol + o, kBk * 128, 1024), kk > 0);
          }
          wgmma_commit();
        }
        if (DV_EARLY) {
          if (ch == 0) {
            /* dK += dS^T Q after dQ: the dQ partial's stores (or reductions) below run under
             * it. */
            issue_dk();
            wgmma_commit();
            wgmma_wait<1>();   /* dV and dQ (dK may still run) */
          } else {
            wgmma_wait<0>();   /* HALF's second chunk (and dK) */
          }
          reg_fence<NQC / 2>(dq);
        } else {
          wgmma_wait<0>();
          reg_fence<NA>(dk);
          reg_fence<NA>(dv);
          reg_fence<NQC / 2>(dq);
          reg_fence<16>(pp);
          reg_fence<16>(pds);
          /* Release the stage (Q, dO, lse2, Dsum; D >= 128: after dK, below): every consumer
           * thread arrives, since an arrive releases only the executing thread's own prior
           * accesses (its lse2 / Dsum reads of the stage) to the producer's next bulk copy.
           * Lane 0 of each warp arriving after a __syncwarp, or thread 0 of each warpgroup
           * after its named barrier, left compute-sanitizer racecheck reporting WAR hazards
           * between those reads and the bulk copy (run of 2026-11-30). */
          mbar_arrive(bar(BAR_EMPTY + s));
        }
        /* The partial in fragment order (float4 j of thread t at [j][t]: conflict-free) into
         * staging buffer it & 1 (free: waited for above); the fence makes the generic-proxy
         * writes visible to the bulk reduce-add (async proxy). */
        if constexpr (RED) {
          /* kXDqRed: the same fragment order straight into the accumulator's tile (as the dQ
           * writer's, see there): float4 j of thread t128 at float 512 j + 4 t128. */
          const int h = kvh * p.group + hoff;
          float *acc =
              p.dq_acc +
              ((((int64_t)b * p.hq + h) * m_hi + i0 / kBq) * (D / 64) + cb) * kDqTile + 4 * t128;
#pragma unroll
          for (int j = 0; j < NQC / 8; j++)
            /* (kXDqHalf: consumer c's columns 32 c .. are float4 chunks 4 c .. of the tile) */
            red_add_v4(acc + 512 * (j + (DQH ? 4 * c : 0)), dq[4 * j], dq[4 * j + 1], dq[4 * j + 2],
                       dq[4 * j + 3]);
        } else {
          const int u = 2 * c + (t & 1);
          float4 *stg = (float4 *)(smem + L::dqs_off + u * kDqTile * 4);
#pragma unroll
          for (int j = 0; j < 8; j++)
            stg[j * 128 + t128] =
                make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
          fence_proxy_async();
          mbar_arrive(bar(BAR_DQF + u));
        }
      };
#pragma unroll
      for (int ch = 0; ch < NCH; ch++) {
        if constexpr (DQ32) {
          if (c == 1)
            dq_chunk(ch, std::integral_constant<int, 32>{});
          else
            dq_chunk(ch, std::integral_constant<int, NQ>{});
        } else {
          dq_chunk(ch, std::integral_constant<int, NQ>{});
        }
      }
      if (DV_EARLY) {
        wgmma_wait<0>();
        reg_fence<NA>(dk);
        reg_fence<NA>(dv);
        reg_fence<16>(pp);
        reg_fence<16>(pds);
        mbar_arrive(bar(BAR_EMPTY + s));   /* as in the D = 64 branch above */
      }
    }

    /* kXPers: this unit's K / V buffer is free (every wgmma reading it is done) */
    if constexpr (PERS) {
      mbar_arrive(kv_free(ub));
      tb += n_loc;
    }

    /* ---------------- epilogue: dK = scale dS^T Q, dV ---------------- */
    if (split) {
      /* Add this part's dK / dV into the unit's fp32 sums ([dk | dv][c][NA / 4][128] float4,
       * coalesced), count the part; the last part to arrive reads the sums back and stores.
       * Ordering (PTX memory model, as CUTLASS's semaphore): the barrier orders every
       * consumer's adds before the counting thread's fence, and that fence with the counter
       * add is a release, cumulative over them; the counter add with the fence after it is
       * the acquire, which the second barrier orders before every consumer's reads (a fence
       * in each thread instead makes no release / acquire pattern with another thread's
       * counter add). Sums and counters: zeroed by the accumulator's memset before every
       * call (graph replays included). */
      float4 *acc = (float4 *)(p.split_acc + (int64_t)(unit - p.n_full) * (2 * kBk * D));
      float4 *ak = acc + c * (NA / 4) * 128 + t128, *av = ak + kBk * D / 4;
#pragma unroll
      for (int j = 0; j < NA / 4; j++) {
        atomicAdd(ak + j * 128, make_float4(dk[4 * j], dk[4 * j + 1], dk[4 * j + 2], dk[4 * j + 3]));
        atomicAdd(av + j * 128, make_float4(dv[4 * j], dv[4 * j + 1], dv[4 * j + 2], dv[4 * j + 3]));
      }
      named_sync(kDsBar, 256);
      volatile int *last = (volatile int *)(smem + L::bar_off + 120);
      if (t128 == 0 && c == 0) {
        __threadfence();
        const int before = atomicAdd(p.split_cnt + (unit - p.n_full), 1);
        __threadfence();
        *last = before == p.nsplit - 1;
      }
      named_sync(kDsBar, 256);
      if (!*last) continue;
#pragma unroll
      for (int j = 0; j < NA / 4; j++) {
        const float4 x = __ldcg(ak + j * 128), y = __ldcg(av + j * 128);
        dk[4 * j] = x.x, dk[4 * j + 1] = x.y, dk[4 * j + 2] = x.z, dk[4 * j + 3] = x.w;
        dv[4 * j] = y.x, dv[4 * j + 1] = y.y, dv[4 * j + 2] = y.z, dv[4 * j + 3] = y.w;
      }
    }
    if constexpr (ST16) {
      /* kXSt16: sm90_common.cuh's quad_transpose_row / store_row16 (the transpose before the
       * key test: every lane) */
      const int col0 = HALF ? c * DW : 0;   /* the consumer's first column */
      T *dkp = (T *)p.dk + (int64_t)b * p.dk_bs + (int64_t)kvh * p.dk_hs + col0;
      T *dvp = (T *)p.dv + (int64_t)b * p.dv_bs + (int64_t)kvh * p.dv_hs + col0;
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        uint32_t wk[DW / 8], wv[DW / 8];
#pragma unroll
        for (int j = 0; j < DW / 8; j++) {   /* (N96: the groups past 96 columns are 0) */
          const int i = (4 * j + 2 * hh) % NA;
          wk[j] = 4 * j < NA ? pack2<F16>(dk[i] * p.scale, dk[i + 1] * p.scale) : 0u;
          wv[j] = 4 * j < NA ? pack2<F16>(dv[i], dv[i + 1]) : 0u;
        }
        quad_transpose_row(wk, q4);
        quad_transpose_row(wv, q4);
        const int key = key0 + 8 * hh;
        if (key >= p.sk) continue;
        store_row16<DST>(dkp + (int64_t)key * p.dk_ts, wk, q4);
        store_row16<DST>(dvp + (int64_t)key * p.dv_ts, wv, q4);
      }
    } else {
      const int col0 = (HALF ? c * DW : 0) + 2 * q4;
      T *dkp = (T *)p.dk + (int64_t)b * p.dk_bs + (int64_t)kvh * p.dk_hs + col0;
      T *dvp = (T *)p.dv + (int64_t)b * p.dv_bs + (int64_t)kvh * p.dv_hs + col0;
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const int key = key0 + 8 * hh;
        if (key >= p.sk) continue;
        T *kr = dkp + (int64_t)key * p.dk_ts, *vr = dvp + (int64_t)key * p.dv_ts;
#pragma unroll
        for (int j = 0; j < DST / 8; j++) {
          *(uint32_t *)(kr + 8 * j) =
              pack2<F16>(dk[4 * j + 2 * hh] * p.scale, dk[4 * j + 2 * hh + 1] * p.scale);
          *(uint32_t *)(vr + 8 * j) = pack2<F16>(dv[4 * j + 2 * hh], dv[4 * j + 2 * hh + 1]);
        }
      }
    }
  }
}
#else
template <typename T, int D, int X>
__global__ void attn_bwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q,
                                     const __grid_constant__ CUtensorMap tm_k,
                                     const __grid_constant__ CUtensorMap tm_v,
                                     const __grid_constant__ CUtensorMap tm_do,
                                     const bwd_params p) {}
#endif

/* lse2 and Dsum per (batch, query head, row < sq_pad): one warp a row (any alignment). */
template <typename T>
__global__ void bwd_prep_kernel(const ot_attn_operand o, const ot_attn_operand dout,
                                const ot_attn_operand lse, float *lse2, float *dsum, int sq,
                                int sq_pad, int hq, int d, int64_t rows) {
  const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const int i = (int)(r % sq_pad), h = (int)((r / sq_pad) % hq);
  const int64_t b = r / ((int64_t)sq_pad * hq);
  float s = 0.f, l2 = INFINITY;
  if (i < sq) {
    const T *orow = (const T *)o.data + b * o.batch_stride + (int64_t)i * o.tok_stride +
                    (int64_t)h * o.head_stride;
    const T *drow = (const T *)dout.data + b * dout.batch_stride + (int64_t)i * dout.tok_stride +
                    (int64_t)h * dout.head_stride;
    for (int cc = lane; cc < d; cc += 32) s += to_f32(orow[cc]) * to_f32(drow[cc]);
#pragma unroll
    for (int w = 16; w > 0; w >>= 1) s += __shfl_xor_sync(0xffffffffu, s, w);
    const float x = ((const float *)lse.data)[b * lse.batch_stride + (int64_t)h * lse.head_stride +
                                             (int64_t)i * lse.tok_stride];
    l2 = x == -INFINITY ? INFINITY : x * 1.4426950408889634f;
  }
  if (lane == 0) {
    lse2[r] = l2;
    dsum[r] = s;
  }
}

/* The same for 16-byte aligned rows of O and dO: D / 8 lanes a row, one 16-byte load of
 * each per lane (the warp-a-row kernel reads 2 bytes a lane per load). */
template <typename T, int D>
__global__ void bwd_prep_vec_kernel(const ot_attn_operand o, const ot_attn_operand dout,
                                    const ot_attn_operand lse, float *lse2, float *dsum, int sq,
                                    int sq_pad, int hq, int64_t rows) {
  constexpr int LPR = D / 8; /* lanes per row: 16 (D128) or 8 (D64) */
  const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / LPR;
  const int sub = threadIdx.x % LPR;
  /* rows is a multiple of 64 (sq_pad): every lane of a warp has a row or none has */
  if (r >= rows) return;
  const int i = (int)(r % sq_pad), h = (int)((r / sq_pad) % hq);
  const int64_t b = r / ((int64_t)sq_pad * hq);
  float s = 0.f;
  if (i < sq) {
    float fo[8], fd[8];
    load_vec_stream<T>(fo, (const T *)o.data + b * o.batch_stride + (int64_t)i * o.tok_stride +
                               (int64_t)h * o.head_stride + 8 * sub);
    load_vec_stream<T>(fd, (const T *)dout.data + b * dout.batch_stride +
                               (int64_t)i * dout.tok_stride + (int64_t)h * dout.head_stride +
                               8 * sub);
#pragma unroll
    for (int e = 0; e < 8; e++) s = fmaf(fo[e], fd[e], s);
  }
#pragma unroll
  for (int w = LPR / 2; w > 0; w >>= 1) s += __shfl_xor_sync(0xffffffffu, s, w);
  if (sub == 0) {
    float l2 = INFINITY;
    if (i < sq) {
      const float x = ((const float *)lse.data)[b * lse.batch_stride +
                                               (int64_t)h * lse.head_stride +
                                               (int64_t)i * lse.tok_stride];
      l2 = x == -INFINITY ? INFINITY : x * 1.4426950408889634f;
    }
    lse2[r] = l2;
    dsum[r] = s;
  }
}

/* dQ = scale * accumulator, one 256-thread block per accumulator tile (grid-stride over
 * tiles). The accumulator holds [b][h][m][D / 64] tiles of 64 queries x 64 columns in the
 * main kernel's fragment order: float4 j of thread t = 32 warp + 4 g + q4 holds rows
 * 16 warp + g (+ 8), columns 8 j + 2 q4 (+ 1) as {r c, r c+1, r+8 c, r+8 c+1}. So the 4
 * consecutive float4 j * 128 + 4 grp + (0..3), grp = 8 warp + g, are columns 8 j .. 8 j + 7
 * of rows r = 16 (grp / 8) + grp % 8 and r + 8: thread (grp, j) reads those 64 bytes and
 * writes 8 elements to each of the two rows (j fastest: 8 threads write a row's 64
 * columns together). V16: dq's rows are 16-byte aligned (one 16-byte store a row). */
template <typename T, bool V16>
__global__ void bwd_dq_kernel(const float *acc, ot_attn_operand dq, int sq, int sq_pad, int hq,
                              int d, int cols, float scale, int64_t tiles) {
  const int j = threadIdx.x % 8, grp = threadIdx.x / 8;
  const int r0 = 16 * (grp / 8) + grp % 8;
  const int ct_n = d / 64, mt_n = sq_pad / 64;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const float4 *src = (const float4 *)(acc + tile * kDqTile) + j * 128 + 4 * grp;
    float4 v[4];
#pragma unroll
    for (int q = 0; q < 4; q++) v[q] = __ldcs(src + q);
    int64_t u = tile;
    const int ct = (int)(u % ct_n);
    u /= ct_n;
    const int m = (int)(u % mt_n);
    u /= mt_n;
    const int h = (int)(u % hq);
    const int64_t b = u / hq;
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int i = m * 64 + r0 + 8 * hh;
      if (i >= sq || 64 * ct + 8 * j >= cols) continue;   /* cols < d: kXPad's padding */
      float f[8];
#pragma unroll
      for (int q = 0; q < 4; q++) {
        f[2 * q] = (hh ? v[q].z : v[q].x) * scale;
        f[2 * q + 1] = (hh ? v[q].w : v[q].y) * scale;
      }
      T *dst = (T *)dq.data + b * dq.batch_stride + (int64_t)i * dq.tok_stride +
               (int64_t)h * dq.head_stride + 64 * ct + 8 * j;
      if (V16) {
        store_vec<T>(dst, f);
      } else {
#pragma unroll
        for (int q = 0; q < 4; q++) {
          const T lo = from_f32<T>(f[2 * q]), hi = from_f32<T>(f[2 * q + 1]);
          *(uint32_t *)(dst + 2 * q) =
              (uint32_t)*(const uint16_t *)&lo | (uint32_t)*(const uint16_t *)&hi << 16;
        }
      }
    }
  }
}

/* The CTAs' work order (bwd_params). Every unit of a non-causal call has the same walk, so
 * the grid ends in a partial wave (4096 units on 132 SMs: 31.03 waves, 3% of the time with
 * 4 SMs busy): the units of that last wave (r = N mod SMs of them, when r <= SMs / 2) are
 * split into nsplit parts of at least 4 query tiles each. Causal units get lighter with the
 * key block; head by head (key blocks fastest, the heaviest first) keeps a few heads' Q /
 * dO and dQ rows in L2, but the last heads' heavy units then start late: the last
 * tail_heads heads (about two waves of units) go key block by key block. */
static void bwd_order(bwd_params *p, int sms, size_t l2_bytes, int d) {
  const int n = p->nkb * p->nhb;
  p->tail_heads = 0;
  p->n_full = n;
  p->nsplit = 1;
  if (p->causal) {
    /* Only where the tail heads' Q, dO and dQ accumulator rows fit in 3/4 of L2; else
     * head by head throughout (S 16k D128: 3 heads of 16 MB, 1.1-1.5% slower fwd+bwd in
     * two runs on the H200; S 4k D128: 9 heads of 4 MB, 1.5-1.8% faster). */
    const double head_bytes = (double)p->sq_pad * d * 8 * p->group; /* Q, dO 2 + 2, dQ 4 */
    int t = (2 * sms + p->nkb - 1) / p->nkb;
    if (t > p->nhb) t = p->nhb;
    p->tail_heads = t * head_bytes <= 0.75 * (double)l2_bytes ? t : 0;
    return;
  }
  const int n_it = p->sq_pad / kBq * p->group, r = n % sms;
  if (r == 0 || 2 * r > sms || n_it < 8) return;
  const int ps = sms / r, pt = n_it / 4;
  p->nsplit = ps < pt ? ps : pt;
  p->n_full = n - r;
}

/* Rows of 16-byte vectors: the data 16-byte aligned, every stride a multiple of 8 elements. */
static bool vec16_ok(const ot_attn_operand *x) {
  return ((uintptr_t)x->data & 15) == 0 && !(x->tok_stride & 7) && !(x->head_stride & 7) &&
         !(x->batch_stride & 7);
}

template <typename T, int D, int X>
static ot_status launch(ot_context *ctx, const ot_attention_args *a, const CUtensorMap *maps,
                        const bwd_params &p, int64_t rows, size_t zero_bytes, unsigned grid) {
  static const char *op = "ot_attention_backward";
  using L = bwd_smem<D>;
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  /* Host-side and not stream-ordered: first, so that a failure enqueues nothing. Once per
   * device and instance (sm90_common.cuh's smem_attr_once, as the forward). */
  auto kern = attn_bwd_sm90_kernel<T, D, X>;
  static std::atomic<uint64_t> attr_done{0};
  OT_TRY(smem_attr_once(kern, L::bytes, ctx, attr_done, op));
  /* The dQ accumulator, the split sums and their counters (contiguous) */
  OT_CUDA_CHECK(op, cudaMemsetAsync(p.dq_acc, 0, zero_bytes, stream));
  if (vec16_ok(&a->out) && vec16_ok(&a->dout) && a->d == D) {
    const int64_t threads = rows * (D / 8); /* rows: a multiple of 64, so of 256 / (D / 8) */
    bwd_prep_vec_kernel<T, D><<<(unsigned)(threads / 256), 256, 0, stream>>>(
        a->out, a->dout, a->lse, (float *)p.lse2, (float *)p.dsum, p.sq, p.sq_pad, p.hq, rows);
  } else {
    bwd_prep_kernel<T><<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(
        a->out, a->dout, a->lse, (float *)p.lse2, (float *)p.dsum, p.sq, p.sq_pad, p.hq,
        (int)a->d, rows);
  }
  OT_CUDA_CHECK_LAUNCH(op);
  if constexpr ((X & kXPers) != 0) {
    /* kXPers: the grid's CTAs walked by at most one CTA an SM (bwd_params.n_ctas) */
    bwd_params pp = p;
    pp.n_ctas = (int)grid;
    const unsigned sms =
        p.pers_grid > 0 ? (unsigned)p.pers_grid : (unsigned)ot_cuda_state_of(ctx)->sm_count;
    kern<<<grid < sms ? grid : sms, kThreads, L::bytes, stream>>>(maps[0], maps[1], maps[2],
                                                                  maps[3], pp);
  } else {
    kern<<<grid, kThreads, L::bytes, stream>>>(maps[0], maps[1], maps[2], maps[3], p);
  }
  OT_CUDA_CHECK_LAUNCH(op);
  const int64_t tiles = rows / 64 * (D / 64);
  const unsigned blocks = (unsigned)(tiles < (1 << 20) ? tiles : (1 << 20));
  if (vec16_ok(&a->dq))
    bwd_dq_kernel<T, true><<<blocks, 256, 0, stream>>>(p.dq_acc, a->dq, p.sq, p.sq_pad, p.hq, D,
                                                       (int)a->d, p.scale, tiles);
  else
    bwd_dq_kernel<T, false><<<blocks, 256, 0, stream>>>(p.dq_acc, a->dq, p.sq, p.sq_pad, p.hq, D,
                                                        (int)a->d, p.scale, tiles);
  OT_CUDA_CHECK_LAUNCH(op);
  return OT_OK;
}

/* The kernel of dQ form dq (kXDqRed or 0; -1: the head dim's default_x) and, with st16,
 * kXSt16 (the caller checked dK's and dV's alignment). Every build compiles the default dQ
 * form with and without kXSt16 (the default, and the 4-byte stores for dK / dV whose
 * pointers or strides are not 16-byte multiples); builds with -DOT_ATTN_SM90_EXPERIMENTS
 * also the other dQ form, without kXSt16 (st16 is ignored there). Head dim 96 (kXPad): with
 * n96 and st16 the kXN96 instance (dK / dV at N = 96); n96 == 2: kXN96 | kXDq32. */
template <typename T, int D>
static ot_status launch_x(ot_context *ctx, const ot_attention_args *a, const CUtensorMap *maps,
                          const bwd_params &p, int64_t rows, size_t zero_bytes, unsigned grid,
                          int dq, bool st16, int n96, int kvrs, int pers) {
  constexpr int X0 = default_x<D>::value;
  (void)pers;  /* D = 64 / 128 / 256 */
  (void)n96;   /* D = 128 only */
  (void)kvrs;  /* D = 64 only */
#ifdef OT_ATTN_SM90_EXPERIMENTS
  if constexpr (D != 256) {   /* D = 256: kXDqRed only (no room for the staging tiles) */
    if (dq >= 0 && dq != X0 && a->d == D)   /* not with kXPad (D = 96) */
      return launch<T, D, X0 ^ kXDqRed>(ctx, a, maps, p, rows, zero_bytes, grid);
  }
#else
  (void)dq;
#endif
  if constexpr (D == 64) {
    /* kXKvRs with the 16-byte stores: 1 with the staged dQ, 2 with kXDqRed, 3 with kXDqRed and
     * kXDqHalf (the default) */
    if (st16 && kvrs == 1)
      return launch<T, D, X0 | kXSt16 | kXKvRs>(ctx, a, maps, p, rows, zero_bytes, grid);
    if (st16 && kvrs == 2)
      return launch<T, D, kXDqRed | kXSt16 | kXKvRs>(ctx, a, maps, p, rows, zero_bytes, grid);
    if (st16 && kvrs == 3 && pers == 2)
      return launch<T, D, kXDqRed | kXSt16 | kXKvRs | kXDqHalf | kXPers | kXPersSt>(
          ctx, a, maps, p, rows, zero_bytes, grid);
    if (st16 && kvrs == 3 && pers)
      return launch<T, D, kXDqRed | kXSt16 | kXKvRs | kXDqHalf | kXPers>(ctx, a, maps, p, rows,
                                                                         zero_bytes, grid);
    if (st16 && kvrs == 3)
      return launch<T, D, kXDqRed | kXSt16 | kXKvRs | kXDqHalf>(ctx, a, maps, p, rows,
                                                                zero_bytes, grid);
  }
  if constexpr (D == 128) {
    if (a->d == 96) {
      if (st16 && n96 == 2)
        return launch<T, D, X0 | kXSt16 | kXPad | kXN96 | kXDq32>(ctx, a, maps, p, rows,
                                                                  zero_bytes, grid);
      if (st16 && n96)
        return launch<T, D, X0 | kXSt16 | kXPad | kXN96>(ctx, a, maps, p, rows, zero_bytes, grid);
      return st16 ? launch<T, D, X0 | kXSt16 | kXPad>(ctx, a, maps, p, rows, zero_bytes, grid)
                  : launch<T, D, X0 | kXPad>(ctx, a, maps, p, rows, zero_bytes, grid);
    }
  }
  if constexpr (D == 256) {   /* experiment: one K / V buffer */
    if (st16 && pers == 2)
      return launch<T, D, X0 | kXSt16 | kXPers | kXPersSt>(ctx, a, maps, p, rows, zero_bytes,
                                                          grid);
    if (st16 && pers)
      return launch<T, D, X0 | kXSt16 | kXPers>(ctx, a, maps, p, rows, zero_bytes, grid);
  }
  if constexpr (D == 128) {
    if (st16 && pers == 2)
      return launch<T, D, X0 | kXSt16 | kXPers | kXPersSt>(ctx, a, maps, p, rows, zero_bytes,
                                                          grid);
    if (st16 && pers)
      return launch<T, D, X0 | kXSt16 | kXPers>(ctx, a, maps, p, rows, zero_bytes, grid);
  }
  if (st16) return launch<T, D, X0 | kXSt16>(ctx, a, maps, p, rows, zero_bytes, grid);
  return launch<T, D, X0>(ctx, a, maps, p, rows, zero_bytes, grid);
}

/* Written in 2-element (4-byte) words from registers. */
static bool words_ok(const ot_attn_operand *x) {
  return ((uintptr_t)x->data & 3) == 0 && !(x->tok_stride & 1) && !(x->head_stride & 1) &&
         !(x->batch_stride & 1);
}

}  // namespace bwd
}  // namespace sm90
}  // namespace ot

extern "C" ot_status ot_cuda_attention_backward_sm90(ot_context *ctx, const ot_attention_args *a,
                                                     bool *handled) {
  using namespace ot::sm90;
  using namespace ot::sm90::bwd;
  static const char *op = "ot_attention_backward";
  *handled = false;
  if (!sm90_attention_enabled(ctx) || a->deterministic) return OT_OK;
  if (a->dtype != OT_BF16 && a->dtype != OT_F16) return OT_OK;
  /* D = 96 runs the D = 128 tile on zero-padded columns (kXPad) */
  if (a->d != 64 && a->d != 96 && a->d != 128 && a->d != 256) return OT_OK;
  const int dk_ = a->d == 96 ? 128 : (int)a->d;   /* the kernel's head dim */
  if (a->cu_q || a->cu_k || a->softcap != 0.f) return OT_OK;
  /* No window, or causal (window_right 0, window_left unbounded). */
  if (a->window_left >= 0 || a->window_right > 0) return OT_OK;
  if (a->sq <= 0 || a->sk <= 0 || a->batch <= 0) return OT_OK;
  if (a->sq > (1 << 28) || a->sk > (1 << 28) || a->hq > 65535 || a->hkv > 65535 ||
      a->batch > 65535)
    return OT_OK;
  if (a->hkv <= 0 || a->hq % a->hkv != 0) return OT_OK;
  if (!tma_ok(&a->q, a->batch, a->hq) || !tma_ok(&a->k, a->batch, a->hkv) ||
      !tma_ok(&a->v, a->batch, a->hkv) || !tma_ok(&a->dout, a->batch, a->hq))
    return OT_OK;
  if (!words_ok(&a->dq) || !words_ok(&a->dk) || !words_ok(&a->dv)) return OT_OK;
  const int64_t sq_pad = (a->sq + kBq - 1) / kBq * kBq;
  const int64_t rows = a->batch * a->hq * sq_pad;
  const int kBk = dk_ == 256 ? bwd_tile<256>::bk : bwd_tile<128>::bk; /* keys per CTA */
  const int64_t nkb = (a->sk + kBk - 1) / kBk;
  if (nkb * a->hkv * a->batch > (1 << 30)) return OT_OK; /* the 1-D grid's units (int) */
  CUtensorMap maps[4];
  auto enc = a->d == 96 ? encode_map_pad : encode_map;
  if (!enc(&maps[0], &a->q, a->dtype, a->batch, a->sq, a->hq, a->d, kBq) ||
      !enc(&maps[1], &a->k, a->dtype, a->batch, a->sk, a->hkv, a->d, kBk) ||
      !enc(&maps[2], &a->v, a->dtype, a->batch, a->sk, a->hkv, a->d, kBk) ||
      !enc(&maps[3], &a->dout, a->dtype, a->batch, a->sq, a->hq, a->d, kBq))
    return OT_OK;
  bwd_params p;
  memset(&p, 0, sizeof p);
  p.sq = (int)a->sq;
  p.sk = (int)a->sk;
  p.sq_pad = (int)sq_pad;
  p.hq = (int)a->hq;
  p.group = (int)(a->hq / a->hkv);
  p.causal = a->window_right == 0;
  p.nkb = (int)nkb;
  p.hkv = (int)a->hkv;
  p.nhb = (int)(a->hkv * a->batch);
  bwd_order(&p, ot_cuda_state_of(ctx)->sm_count, ot_cuda_state_of(ctx)->l2_bytes, dk_);
  const int n_units = p.nkb * p.nhb, n_split = n_units - p.n_full;
  const unsigned grid = (unsigned)(p.n_full + n_split * p.nsplit);
  /* Scratch: the dQ accumulator, the split units' dK / dV sums and counters (zeroed with
   * it), then lse2 and Dsum (each a multiple of 256 bytes). Where it cannot be had, the
   * portable backward runs: it needs 4 bytes a query row and head against 4 (D + 2) here
   * (OT_ATTN_IMPL=sm90 asks for this kernel: the OOM stands). */
  const size_t acc_bytes = (size_t)rows * dk_ * sizeof(float);   /* D = 96: 128 columns */
  const size_t split_bytes = (size_t)n_split * 2 * kBk * dk_ * sizeof(float);
  /* (+1: kXPers's work counter) */
  const size_t cnt_bytes = ((size_t)(n_split + 1) * sizeof(int) + 255) / 256 * 256;
  const size_t zero_bytes = acc_bytes + split_bytes + cnt_bytes;
  const size_t vec_bytes = (size_t)rows * sizeof(float);
  void *wsp = NULL;
  const ot_status sst = ot_cuda_scratch_try(ctx, zero_bytes + 2 * vec_bytes, op, &wsp);
  if (sst != OT_OK) {   /* a failure other than the memory not being there: recorded */
    *handled = true;
    return sst;
  }
  if (!wsp) {           /* not there: the try recorded nothing */
    if (ot_cuda_attention_impl() != OT_ATTN_IMPL_SM90) return OT_OK; /* declined */
    *handled = true;    /* asked for this kernel: the reporting allocation's OOM stands */
    wsp = ot_cuda_scratch(ctx, zero_bytes + 2 * vec_bytes, op);
    if (!wsp) return OT_ERR_OOM;
  }
  uint8_t *ws = (uint8_t *)wsp;
  *handled = true;
  p.dk = a->dk.data;
  p.dk_bs = a->dk.batch_stride;
  p.dk_ts = a->dk.tok_stride;
  p.dk_hs = a->dk.head_stride;
  p.dv = a->dv.data;
  p.dv_bs = a->dv.batch_stride;
  p.dv_ts = a->dv.tok_stride;
  p.dv_hs = a->dv.head_stride;
  p.dq_acc = (float *)ws;
  p.split_acc = (float *)(ws + acc_bytes);
  p.split_cnt = (int *)(ws + acc_bytes + split_bytes);
  p.work_ctr = p.split_cnt + n_split;
  p.lse2 = (const float *)(ws + zero_bytes);
  p.dsum = (const float *)(ws + zero_bytes + vec_bytes);
  /* dQ partials: D = 128 by red.global.add.v4.f32 from the consumers (kXDqRed), D = 64 too
   * with kXKvRs (the default; under OT_ATTN_BWD_SM90_KVRS=0 / 1 and with the 4-byte dK / dV
   * stores by bulk reduce-adds from a dedicated writer thread; docs/ATTENTION.md has the
   * measured alternatives: float2 atomics from the consumers, the consumers issuing the bulk
   * reduce-add themselves (00d0a38), D = 128 dQ over each consumer's own keys). */
  p.scale = a->scale;
  p.scale_log2 = a->scale * 1.4426950408889634f;
  /* kXSt16 (dK / dV stored 16 bytes a lane) where dK's and dV's pointers and strides are
   * 16-byte multiples, else the 4-byte stores: the default since 2026-12-01 (H200,
   * bench/results/attention_bwd_st16.json, 8 balanced rounds, fwd+bwd TFLOP/s against the
   * same build without it, bf16: D128 S 1k full 1.058x, causal 1.072x, S 4k full 1.008x,
   * causal 1.030x; D64 S 1k 1.049x / 1.046x, S 4k 1.015x / 1.021x; the backward alone at
   * S 1k causal 1.076x (D128) and 1.071x (D64); fp16 takes the same store change).
   * OT_ATTN_BWD_SM90_ST16=0 forces the 4-byte stores. Experiment builds only:
   * OT_ATTN_BWD_SM90_DQ=red / stage, kXDqRed / the staged dQ at either head dim (the
   * non-default form without kXSt16); elsewhere not read: D = 128 runs kXDqRed, D = 64 the
   * staged dQ. The environment is scanned once per call, and read only where some
   * OT_ATTN_BWD_SM90_ switch is set. */
  const bool knobs = ot_env_any("OT_ATTN_BWD_SM90_");
  const char *xst = knobs ? getenv("OT_ATTN_BWD_SM90_ST16") : NULL;
  const bool st16 = !(xst && xst[0] == '0') && vec16_ok(&a->dk) && vec16_ok(&a->dv);
  /* kXN96 (head dim 96, with kXSt16: dK / dV accumulated over 96 columns, wgmma N = 96)
   * and kXDq32 (consumer 1's dQ over columns 64..95 at N = 32) */
  const char *xn96 = knobs && a->d == 96 ? getenv("OT_ATTN_BWD_SM90_N96") : NULL;
  const char *xdq32 = knobs && a->d == 96 ? getenv("OT_ATTN_BWD_SM90_DQ32") : NULL;
  /* 0: N = 128; 1: kXN96; 2: kXN96 with kXDq32 (consumer 1's dQ at N = 32): the default
   * since 2026-12-03 (H200, fwd+bwd paired with the N = 128 backward in one process, 8
   * rounds, bench/results/attention_d96_bwd_n96_dq32.json: S 1k 1.036x / causal 1.059x, S 4k
   * 1.038x / 1.043x, S 16k 1.036x / 1.041x; kXN96 alone 1.046x / 1.067x, 0.995x / 0.994x,
   * 1.008x / 1.008x). OT_ATTN_BWD_SM90_N96=0 the N = 128 kernel, OT_ATTN_BWD_SM90_DQ32=0
   * kXN96 alone. */
  const int n96 = xn96 && xn96[0] == '0' ? 0 : xdq32 && xdq32[0] == '0' ? 1 : 2;
  /* kXKvRs (head dim 64, with kXSt16: K and V as register A operands of S^T / dP^T), with
   * kXDqRed (dQ by red.global from the consumers) and kXDqHalf (dQ split by columns between
   * the consumers, half the red.global bytes): the D = 64 default since 2026-12-03
   * (twenty-sixth session; H200, fwd+bwd paired with kXKvRs | kXDqRed in one process, 8
   * rounds, bench/results/attention_bwd64_half.json: S 1k 1.009x, causal 0.999x; S 4k 1.014x
   * / 1.021x; S 16k 1.027x / 1.016x). kXKvRs | kXDqRed, the default before it, had gained
   * 1.074x / 1.046x, 1.057x / 1.032x, 1.027x / 1.041x over the SS kernel
   * (bench/results/attention_bwd64_kvrs.json). OT_ATTN_BWD_SM90_KVRS=0 the SS kernel with the
   * staged dQ, =1 kXKvRs with the staged dQ, =red kXKvRs | kXDqRed (dQ over each consumer's
   * own keys), unset or anything else the default. */
  const char *xkv = knobs && a->d == 64 ? getenv("OT_ATTN_BWD_SM90_KVRS") : NULL;
  const int kvrs = !xkv                   ? 3
                   : xkv[0] == '0'        ? 0
                   : xkv[0] == '1'        ? 1
                   : !strcmp(xkv, "red")  ? 2
                                          : 3;
#ifdef OT_ATTN_SM90_EXPERIMENTS
  const char *xdq = knobs ? getenv("OT_ATTN_BWD_SM90_DQ") : NULL;
  const int x = !xdq ? -1 : !strcmp(xdq, "red") ? kXDqRed : !strcmp(xdq, "stage") ? 0 : -1;
#else
  const int x = -1;
#endif
  /* kXPers (the persistent walk, K / V double-buffered; see the kernel): the head dim 64
   * default (with kXKvRs | kXDqRed | kXDqHalf and the 16-byte stores) since 2026-12-03
   * (twenty-sixth session; H200, fwd+bwd paired with one CTA a unit in one process, 8
   * rounds, bench/results/attention_bwd_pers.json: S 1k 1.069x / causal 1.079x, S 4k 1.041x /
   * 1.064x, S 16k 1.048x / 1.032x); non-causal calls take the static walk (kXPersSt: 1.065x /
   * 1.028x / 1.013x the atomic one at S 1k / 4k / 16k, bench/results/attention_bwd_pers_ahead.json),
   * causal ones the atomic walk (the static one leaves SMs idle there: 0.86-0.97x). Timed
   * again in the twenty-seventh session in a balanced order with 100 ms of warm-up per block
   * (bench/results/attention_order_ab.json): one CTA a unit 0.944x / 0.964x / 0.969x the
   * default at S 1k / 4k / 16k full, 0.999x / 1.003x / 0.979x causal. At D 128 (kXDqRed |
   * kXSt16) and D 256 (one K / V buffer) only on request: D 128 lost under both walks
   * (0.935x / 0.940x at S 4k full, the dQ red.global queue throttled ~10x as often: ncu)
   * until the tile loop lost its divisions (twenty-eighth session): since then its static
   * walk reads 1.026x one CTA a unit at S 4k full, 0.885x causal (one run, 8 rounds,
   * bench/results/attention_bwd_incr_tile.json), not confirmed by a second call (twenty-ninth
   * session, 8 rounds, A/A of the walk beside it: the backward alone 1.000x / 1.003x the
   * default at S 4k full, 0.999x-1.005x at S 1k, 0.987x-1.004x at S 16k; fwd+bwd 1.02x at S 4k
   * only; bench/results/attention_bwd_walk_d128.json), so one CTA a unit stays; D 256 is
   * level (one CTA a unit 0.979x / 1.005x the static walk at S 1k / 4k full, inside that
   * call's A/A spread; 0.970x the walk after the change).
   * OT_ATTN_BWD_SM90_PERS=0: one CTA a unit; =1 the atomic walk, =s the static one; =N / =sN
   * (N >= 2): on a grid of at most N CTAs (tests: many units a CTA). pers: 0 off, 1 kXPers,
   * 2 kXPersSt. */
  const char *xpers = knobs ? getenv("OT_ATTN_BWD_SM90_PERS") : NULL;
  const bool pst = xpers && xpers[0] == 's';
  const int npers = !xpers ? (a->d == 64 ? 1 : 0) : pst ? (xpers[1] ? atoi(xpers + 1) : 1)
                                                      : atoi(xpers);
  const int pers = npers < 1 ? 0 : (xpers ? pst : !p.causal) ? 2 : 1;
  p.pers_grid = npers >= 2 ? npers : 0;
  const bool bf = a->dtype == OT_BF16;
  if (a->d == 64)
    return bf ? launch_x<__nv_bfloat16, 64>(ctx, a, maps, p, rows, zero_bytes, grid, x, st16, n96,
                                            kvrs, pers)
              : launch_x<__half, 64>(ctx, a, maps, p, rows, zero_bytes, grid, x, st16, n96, kvrs,
                                     pers);
  if (a->d == 256)
    return bf ? launch_x<__nv_bfloat16, 256>(ctx, a, maps, p, rows, zero_bytes, grid, x, st16, n96,
                                             0, pers)
              : launch_x<__half, 256>(ctx, a, maps, p, rows, zero_bytes, grid, x, st16, n96, 0,
                                      pers);
  return bf ? launch_x<__nv_bfloat16, 128>(ctx, a, maps, p, rows, zero_bytes, grid, x, st16, n96, 0,
                                           pers)
            : launch_x<__half, 128>(ctx, a, maps, p, rows, zero_bytes, grid, x, st16, n96, 0,
                                    pers);
}
