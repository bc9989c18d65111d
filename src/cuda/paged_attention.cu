/*
 * paged_attention.cu -- ot_paged_attention on CUDA: decode, speculative decode and
 * chunked prefill over the paged KV cache (HND pages, a CSR page table on the device).
 *
 * Main kernel (bf16 / fp16, head_dim 64 or 128): tensor cores (mma.sync m16n8k16) with
 * the rows of one GQA group as the M dimension, split-KV (flash-decoding).
 *   - Work item = (row tile, kv head, key split). A sequence's rows are its (query token,
 *     head of the group) pairs, token-major (row = token * group + head); a tile is 16 of
 *     them, so the group's heads (and a few speculative tokens) share every K / V load.
 *     The 1-D grid enumerates (tile slot, kv head, split), the slot slowest, over at most
 *     (T_q * group + 15 * batch) / 16 slots (the host does not know the tiles: the slots
 *     past them, dispatched last, exit at once); each CTA finds its sequence with a
 *     warp-wide prefix sum over cu_seqlens_q, each lane summing a contiguous run of
 *     sequences (the host never reads the device tables, so the launch is
 *     graph-capturable and needs no synchronization).
 *   - A CTA has 4 warps; the key range of its split is cut into 16-key steps, warp w
 *     taking steps w, w + 4, w + 8, ... Each warp streams its steps through its own ring
 *     of S shared-memory stages with cp.async (16 B per copy, a half-warp per
 *     256-byte key row, K and V of a step = 8 KB at D 128): while it computes step t,
 *     steps t + 1 .. t + S - 1 are in flight (2 x 8 KB per warp, 128 KB per SM
 *     at 2 CTAs per SM for D 128). Warp-private stages need only __syncwarp. The page ids
 *     of a step are loaded kPaPidAhead (4) steps before its copies are issued (lane l: the
 *     page of key l of the step) and handed to the copying lanes with shuffles: under a
 *     saturated memory system a load takes microseconds, and page ids loaded one step
 *     ahead paced the loop (1.5-2 us per step); keys past the split's end are
 *     zero-filled (no read).
 *   - Shared layout: a stage is 16 K rows then 16 V rows of D elements; 16-byte chunk c of
 *     key row k sits at chunk c ^ f(k), f(k) = ((k & 1) << 2) ^ (k & 6) (low 3 bits), so
 *     each quarter-warp's 128-bit reads below touch 8 distinct 4-bank groups.
 *       QK^T: the head_dim axis is permuted so a thread's 16-byte run of a key (8 features)
 *             is the B fragment of two k-steps, with q loaded through the same permutation;
 *             the 4 threads of a quad read 64 contiguous bytes of one key.
 *       PV:   output column n of n-tile j is feature (j / 8) * 64 + n * 8 + j % 8, so a
 *             thread's B fragment is 16-byte runs of 4 keys (one __byte_perm per pair).
 *   - Online softmax in fp32 (base 2, scale folded in), P rounded to the input type for
 *     the PV mma (the FA2 register trick: the S accumulators of two key blocks are the A
 *     fragment of P). The 4 warps' (m, l, O) merge through shared memory (the ring's
 *     space) at the end: O rows padded to D + 2 floats, each row's warp weights, lse and
 *     output offset computed once by one thread (H200: 1 x 2k 17.0 -> 12.8 us per call,
 *     16 x 4k 79.2 -> 74.7, docs/PERFORMANCE.md Decode round 5); only the tile's rows
 *     (a decode tile has `group` of 16) are stored and combined (1 x 512 10.91 -> 10.23
 *     us, 1 x 2k 12.79 -> 12.43, round 6).
 *   - One split: out and lse are written directly. Several: normalized O_s (fp32) and
 *     lse_s go to context scratch and a merge kernel (one CTA per (token, q head), the
 *     splits spread over its 4 warps) combines them (O = sum_s exp(lse_s - lse) O_s):
 *     pa_merge1_kernel, every load issued at once after its PDL wait (one dependent
 *     round trip; the same bits as pa_merge_kernel, which OT_PAGED_MERGE=0 keeps: same
 *     process 1 x 2k 11.44 -> 10.62 us, with paged_kv_ready 10.17 -> 10.00, 1 x 8k
 *     15.66 -> 13.65 with it, docs/PERFORMANCE.md);
 *     on sm_90 it is launched as a programmatic dependent of the main kernel (PDL), whose
 *     CTAs signal after their key loop, so its launch overlaps the main kernel's tail, and
 *     signals its own dependents at once. A merge fused into the last CTA of each unit (a
 *     counter per unit, zeroed by a memset) measured slower on the H200 and was removed:
 *     with its code in the kernel the key loop ran ~12% slower even where it was not taken
 *     (16 x 4k 2.92 vs 3.39 TB/s), and where it ran it added ~3-12 us per call. Tried
 *     again (decode round 6: per-context counters that the last CTA resets, no memset, in
 *     a kernel instance of its own, a warp per row): 1 x 2k 18.96 vs 12.60 us, 1 x 64k
 *     92.9 vs 76.2, 16 x 4k 86.5 vs 75.6; removed again. A third form (2026-12-07, commit
 *     c145db7, OT_PAGED_CLUSTER): a unit's splits as one thread-block cluster, merged
 *     through distributed shared memory after a cluster barrier, in an instance of its own
 *     (the other instances' SASS unchanged); correct (69 cases, memcheck / racecheck clean)
 *     but slower at every shape, same process on an H100 (bench/results/
 *     decode_cluster_ab_h100.json, us, default / clusters of 16 / of 8): 1 x 2k 10.84 /
 *     14.23 / 12.92, 1 x 8k 15.64 / 22.53 / 23.55, 1 x 64k 101.1 / 123.2 / 122.7, 4 x 2k
 *     (8 splits either way) 15.61 / 26.14 / 26.12 -- the cluster's co-scheduling and
 *     barrier cost more than the merge kernel that PDL overlaps; removed.
 *   - The main kernels (this and the stream kernel) are launched as programmatic dependents
 *     of whatever precedes them on the stream (OT_PAGED_PDL=0: not): their CTAs may become
 *     resident while that kernel drains and wait (griddepcontrol.wait) before their first
 *     global access. H200: 0-2% per call (docs/PERFORMANCE.md).
 *   - Early start (ot_attention_params.paged_kv_ready, head_dim 128: the XT instance of this
 *     kernel): the caller promises that the tables and every key / value but each
 *     sequence's last nq (its query tokens', which the previous kernel may append) are
 *     complete when that kernel lets its dependents start; the CTA then reads the tables
 *     and page ids and issues the copies of its first stages that hold none of those keys
 *     before its griddepcontrol.wait, and q, the rest and every write after it. H200,
 *     same process, back-to-back calls: 1 x 2k 10.54 vs 12.43 us, 1 x 512 9.05 vs 10.23,
 *     1 x 64k / 16 x 4k -1 to -1.5%, 64 x 4k and 1 x 8k level (decode round 6). A separate
 *     instance because code added to this kernel has slowed its key loop even where it did
 *     not run (the fused merges above).
 *   - Keys of a split are indexed in int32 relative to the split's first page; with more
 *     than 2^30 keys in the table the plan takes at least keys / 2^30 splits (pa_min_splits),
 *     so sequences of 2^31 keys and more are split, never wrapped.
 *   - Splits: chosen on the host from the estimated tiles (batch, T_q, group), heads_kv,
 *     the context estimated from the size of kv.indices, and SMs x CTAs per SM (occupancy
 *     queried once): the fewest splits within 2% of the best wave-quantized time
 *     (waves x keys per chunk, chunks a multiple of 64, >= 64 keys in a launch of one wave
 *     and >= 256 in more, launching only the splits that chunk leaves non-empty). Batch 1 x
 *     64k with 8 kv heads gets 32 splits of 2048 keys on 132 SMs x 2 CTAs, 1 x 2k 32 of 64.
 *     The grid's tile slots are at most (T_q group + 15 batch) / 16 and T_q ceil(group /
 *     16): none past the tiles of a decode or of a batch-1 call. At batch 1, and at batch
 *     > 1 where kv.indices and the queries divide evenly among the sequences, a CTA loads
 *     its first page ids with the tables (a guessed first entry and first key, checked;
 *     see pa_mma_kernel and pa_params.chunk1).
 *   - Ring depth: 3 stages at D 128 (2 CTAs per SM), 5 at D 64. A 7-stage ring at D 128
 *     (224 KB, 1 CTA per SM: 192 KB in flight per SM instead of 128) measured slower at
 *     every shape (docs/PERFORMANCE.md) and was removed.
 *   - Aligned pages (AL instances, D 128, block_size a multiple of 16; OT_PAGED_ALIGNED=0:
 *     the general instance): ncu on the H200 (decode round 7) showed the key loop bound by
 *     its issued instructions, not by memory (16 x 4k: 4.5 cycles per issued instruction at
 *     2 warps per scheduler, long-scoreboard stalls 0.22 per issue, DRAM 72% busy; cuDNN's
 *     kernel 85% busy), ~930 instructions per 16-key step, a third of them the copies'
 *     per-row page shuffles, slot and 64-bit offset arithmetic and zero-fill tests. With
 *     pages of 16 x m keys and steps starting at multiples of 16 keys, a whole step is one
 *     4 KB run of K and one of V: one base address per step, 16 copies with immediate
 *     offsets (pa_fc_copy); the partial last step keeps the general copies. Steps that
 *     every row of the tile sees whole skip the mask tests (a warp vote), and exp2 is
 *     ex2.approx.ftz. Same process, page 16: 16 x 4k 74.3 -> 70.5 us (with 8 warps, below),
 *     64 x 4k 259.2 -> 248.7, 64 x 1k (stream kernel) 79.9 -> 74.4, 1 x 8k 18.0 -> 15.6.
 *   - 8-warp CTAs (AL, no early start; OT_PAGED_WARPS=4 / 8 forces a size): one CTA of 8
 *     warps per SM, the same 8 warps and ring bytes per SM as 2 x 4, used where the 8-warp
 *     plan is one wave over at least 90% of the SMs with one split per unit and the 4-warp
 *     plan splits the keys to fill the GPU: 16 x 4k then runs one split (no merge kernel, no
 *     partials): 3.80 vs 3.66 TB/s with 4 warps. (Where both plans merge splits -- 1 x 2k,
 *     1 x 8k, 1 x 64k -- 4 warps since 2026-12-02: pa_launch_mma.)
 *   - The AL instances' step (pa_step's CR and LB; decode round 9, default since round
 *     10): O rescaled only in steps where a row of the warp raised its max, and the
 *     fragment reads from four per-lane offsets plus immediates; issued instructions per
 *     16-key step on the common path 453 -> 331 (scripts/pa_sass_count.py), the same bits.
 *     Same process on the H200 (round 9, as the opt-in OT_PAGED_VARIANT=lds, now removed
 *     with "rescale", CR alone, which lost at 1 x 2k and 64 x 4k): 16 x 4k 70.58 -> 69.92
 *     us, 64 x 4k 248.9 -> 248.2, 1 x 64k 72.99 -> 72.46, 1 x 2k 10.79 -> 10.61, 64 x 1k
 *     (stream kernel) 74.00 -> 73.99; outputs the same bits at each.
 * Stream kernel (head_dim 128, no left window): a persistent wave of warps, each taking an
 * even share of all 16-key steps and streaming them through the same per-warp ring across
 * unit boundaries; cut units merged by a second (PDL) kernel; its K / V copies carry an L2
 * evict-first policy (pa_cp16). The default at batch > 1 for short contexts (<= 1024 keys,
 * <= 8 pieces per unit), see ps_auto and the comment at the kernel. It has an AL instance
 * too (a unit's steps start at key 0 of its sequence).
 * TMA ring (experiment builds only, -DOT_PA_TMA with OT_PAGED_TMA=1): one tensor copy of K
 * and one of V per step (128-byte swizzle, a key permutation that keeps the fragment reads
 * conflict-free, pa_kperm), an mbarrier per stage. Faster alone under ncu (16 x 4k 75.8 vs
 * 78.8 us) but 5-7% slower back to back at the large shapes (decode round 7), so not built
 * by default.
 * Bulk ring (decode round 11, the opt-in OT_PAGED_LOAD=bulk / bulk2: each step's K and V
 * moved by one lane's 1-D cp.async.bulk copies): slower than the cp.async ring at every
 * shape on the H200 (16 x 4k 71.44 vs 77.66 / 76.41 us, 1 x 64k 74.14 vs 83.62 / 84.17;
 * 2026-12-01, docs/PERFORMANCE.md), removed.
 * V fragments by ldmatrix.trans (decode round 12, the AL instances' opt-ins OT_PAGED_PV=ldsm
 * and ldsm2, the latter with an 8-value stage swizzle free of the ldmatrix bank conflicts;
 * code in 8608a7f / 417d2aa): 331 -> 300 issued instructions per step (stream kernel 467 ->
 * 429 / 432), the same bits, but level in time on the H200 (same process, 2026-12-01: 16 x
 * 4k 70.16 vs 70.06 / 69.69 us, 64 x 4k 248.29 vs 248.25 / 247.72), short of the 1.01x
 * their keep rule asked (docs/MEMORY.md), removed.
 * Masks (causal bottom-right, windows), softcap and empty rows as ot_attention_forward.
 *
 * Fallback kernel (float32, other head dims, misaligned q): one warp per (token, q head),
 * all keys of the sequence, lanes over the head dim, fp32 online softmax. Correct for
 * every case the API allows; not tuned.
 *
 * OT_DEBUG=1: device bound checks of the tables, see paged_common.cuh.
 * -DOT_PA_TRACE (a diagnostic build): per-CTA %globaltimer stamps, see PA_TR.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <type_traits>

#include "../core/paged_attention.h"
#include "attention.cuh"
#include "common.cuh"
#include "cuda_state.h"
#include "mma.cuh"
#include "paged_common.cuh"
#include "pdl.cuh"
#include "sm90/sm90_common.cuh" /* CUtensorMap, the driver's tensor-map encoder */

namespace ot {

constexpr int kPaWarps = 4; /* the stream kernel's, and the split kernel's but 8-warp CTAs */
constexpr int kPaThreads = 32 * kPaWarps;
constexpr int kPaStep = 16;       /* keys per warp step */
constexpr int kPaMinChunk = kPaStep * kPaWarps; /* fewest keys of a split: one step per warp */
constexpr int kPaWaveChunk = 256; /* fewest keys of a split when the launch has several waves */
constexpr int kPaPidAhead = 4;    /* steps between a page-id load and its use */
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

/* Ring stages per warp S: 3 at D 128 (96 KB of K / V per CTA, 2 CTAs per SM), 5 at D 64
 * (80 KB). */
template <int D, int S> struct pa_cfg {
  static constexpr int kStages = S;
  static constexpr size_t kStageBytes = 2 * kPaStep * D * 2; /* K + V, 16-bit elements */
  static constexpr size_t kSmem = kPaWarps * kStages * kStageBytes;
  static constexpr int kOS = D + 2; /* epilogue: s_o row stride in floats (see pa_mma_kernel) */
  static_assert(kSmem >= (size_t)kPaWarps * 16 * kOS * sizeof(float), "epilogue fits the ring");
};

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
  /* The page-id guess (pa_mma_kernel's `spec`), where the host can make one (chunk1 0:
   * none): every sequence taken to hold num_indices / batch entries of kv.indices (a
   * whole number) and 2^spec_tshift tiles (T_q / batch queries each), so tile slot x is
   * sequence x >> spec_tshift, its first entry (x >> spec_tshift) * spec_pps, and split s
   * starts at key s * chunk1, chunk1 the chunk of `splits` at num_indices / batch x
   * block_size keys (pa_chunk). Batch 1: spec_pps = 0, spec_tshift = 0 (the first entry
   * 0, the CSR table's rule indptr[0] = 0, for every tile). A shift and a multiply, no
   * 64-bit division and its branch in front of the guessed loads (48 SASS instructions
   * more there); the two forms time the same (H200, 2026-12-06, decode_guess_confirm.json:
   * within 0.1% at 16 x 4k / 64 x 1k / 32 x 2k, the guess itself worth 1.0-1.6% there). */
  int64_t chunk1, spec_pps;
  int spec_tshift;
  /* the XT kernel (pa_mma_kernel<..., true>) only: the caller's promise that the tables
   * and every key / value but each sequence's last n_b (its query tokens') are complete
   * when the previous kernel may start its dependents (ot_attention_params.paged_kv_ready) */
  int early;
  float *part_o;      /* [splits][tq * hq][d] */
  float *part_lse;    /* [splits][tq * hq] */
  /* stream kernel: per warp w, pieces (w, slot 0 / 1) of 16 rows: normalized O, lse; and
   * the merge descriptor of the unit whose last piece w holds */
  float *sp_o;        /* [warps][2][16][d] */
  float *sp_lse;      /* [warps][2][16] */
  int4 *desc;         /* [warps][2] */
  int *err;           /* OT_DEBUG flag or NULL */
};

/* Whether pa_mma_kernel takes the page-id guess: the host made one (chunk1 > 0), no OT_DEBUG
 * error flag, and pages of 2^k keys (the shifts of the guessed entries). One test for the
 * kernel and the host's plan record (pa_plan_rec flag 2048). A macro, not a function: as a
 * __forceinline__ function (by reference or by value) it changed the kernels' SASS (register
 * and predicate allocation, up to 8 instructions more or less; checked with
 * scripts/sass_same.py), the macro leaves them as the inline test had them. */
#define PA_GUESS_ON(p) ((p).chunk1 > 0 && !(p).err && (p).bs_shift >= 0)

/* ---- OT_PA_TRACE (a diagnostic build, -DOT_PA_TRACE): per CTA %globaltimer stamps of the
 * main kernels (kernel 0) and the merge kernels (kernel 1), thread 0 (warp 0), CTAs < 4096:
 * 0 entry, 1 after the PDL wait, 2 tables read (before the first page-id loads), 3 first
 * stage landed, 4 key loop done, 5 end, 6 SM id, 7 steps of warp 0 (with -DOT_PA_TRACE_EPI
 * as well, the split kernel's 6 and 7 are absolute times: after its launch_dependents and
 * after its epilogue's first __syncthreads). Read back with ot_cuda_paged_trace
 * (bench_decode.py --trace). Other builds: no code. */
#ifdef OT_PA_TRACE
constexpr int kPaTrCtas = 4096;
__device__ unsigned long long pa_tr_buf[2][kPaTrCtas][8];
__device__ __forceinline__ unsigned long long pa_gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned pa_smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
#define PA_TR(k, i, v)                                                                   \
  do {                                                                                   \
    if (threadIdx.x == 0 && blockIdx.x < kPaTrCtas) pa_tr_buf[k][blockIdx.x][i] = (v); \
  } while (0)
#else
/* ((void)0), not do {} while (0) (nvcc warned "loop is not reachable" after an early return
 * in a kernel) */
#define PA_TR(k, i, v) ((void)0)
#endif

/* ---- fragment helpers -------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t u4_word(const uint4 &v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* Element (word e / 2, half e % 2) of two 16-byte runs, packed lo = a, hi = b. */
__device__ __forceinline__ uint32_t pair_of(const uint4 &a, const uint4 &b, int e) {
  return __byte_perm(u4_word(a, e >> 1), u4_word(b, e >> 1), (e & 1) ? 0x7632 : 0x5410);
}

/* The swizzle of a stage row: chunk c of key row k (0..15) sits at chunk c ^ pa_swz(k). */
__device__ __forceinline__ int pa_swz(int k) { return ((k & 1) << 2) ^ (k & 6); }

/* Tiles (of 16 rows) of sequence b with cu_seqlens_q[b] = c0, [b + 1] = c1; 0 when
 * cu_seqlens_q fails the debug check. */
__device__ __forceinline__ int64_t pa_tiles_of(const pa_params &p, int64_t b, int32_t c0,
                                               int32_t c1) {
  if (!paged_cu_ok(p.cu_q, b, p.batch, p.tq, p.err)) return 0;
  const int64_t n = (int64_t)c1 - c0;
  return n > 0 ? (n * p.group + 15) / 16 : 0;
}

/* A CTA's sequence b, its tile, and (when `have`) its table entries cu_seqlens_q[b],
 * [b + 1], indptr[b], [b + 1], last_page_len[b]. */
struct pa_seq {
  int64_t b, tile;
  int32_t cu0, cu1, ip0, ip1, lpl;
  bool have;
};

/* The tile slot x -> (sequence, tile within it) by a warp-wide prefix sum of
 * ceil(n_b * group / 16), lane l summing sequences [l * per, (l + 1) * per) so that all
 * loads of cu_seqlens_q are issued together. For batch <= 64 (per <= 2) the lanes load
 * their sequences' indptr / last_page_len entries in the same round, which saves the
 * kernel one dependent load before its page ids. Returns false when the slot has no tile. */
__device__ __forceinline__ bool pa_find_tile(const pa_params &p, int64_t x, pa_seq *q) {
  const int lane = threadIdx.x & 31;
  const int64_t per = (p.batch + 31) / 32;
  const int64_t b0 = lane * per;
  const int64_t b1 = b0 + per < p.batch ? b0 + per : p.batch;
  const bool small = per <= 2;
  int32_t c0[2] = {0, 0}, c1[2] = {0, 0}, i0[2] = {0, 0}, i1[2] = {0, 0}, ll[2] = {0, 0};
  int64_t mine = 0;
  if (small) {
#pragma unroll
    for (int j = 0; j < 2; j++)
      if (b0 + j < b1) {
        const int64_t b = b0 + j;
        c0[j] = p.cu_q[b], c1[j] = p.cu_q[b + 1];
        i0[j] = p.indptr[b], i1[j] = p.indptr[b + 1], ll[j] = p.lpl[b];
      }
#pragma unroll
    for (int j = 0; j < 2; j++)
      if (b0 + j < b1) mine += pa_tiles_of(p, b0 + j, c0[j], c1[j]);
  } else {
#pragma unroll 4
    for (int64_t b = b0; b < b1; b++) mine += pa_tiles_of(p, b, p.cu_q[b], p.cu_q[b + 1]);
  }
  int64_t incl = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  const int64_t total = __shfl_sync(0xffffffffu, incl, 31);
  if (x >= total) return false;
  const unsigned hit = __ballot_sync(0xffffffffu, x < incl);
  const int l = __ffs(hit) - 1;
  int64_t bsel = 0, tsel = 0;
  int32_t v[5] = {0, 0, 0, 0, 0};
  if (lane == l) {
    int64_t base = incl - mine;
    if (small) {
      bool found = false;
#pragma unroll
      for (int j = 0; j < 2; j++)
        if (!found && b0 + j < b1) {
          const int64_t nt = pa_tiles_of(p, b0 + j, c0[j], c1[j]);
          if (x < base + nt) {
            found = true;
            bsel = b0 + j, tsel = x - base;
            v[0] = c0[j], v[1] = c1[j], v[2] = i0[j], v[3] = i1[j], v[4] = ll[j];
          }
          base += nt;
        }
    } else {
      for (int64_t b = b0; b < b1; b++) {
        const int64_t nt = pa_tiles_of(p, b, p.cu_q[b], p.cu_q[b + 1]);
        if (x < base + nt) {
          bsel = b, tsel = x - base;
          break;
        }
        base += nt;
      }
    }
  }
  q->b = __shfl_sync(0xffffffffu, bsel, l);
  q->tile = __shfl_sync(0xffffffffu, tsel, l);
  q->cu0 = __shfl_sync(0xffffffffu, v[0], l);
  q->cu1 = __shfl_sync(0xffffffffu, v[1], l);
  q->ip0 = __shfl_sync(0xffffffffu, v[2], l);
  q->ip1 = __shfl_sync(0xffffffffu, v[3], l);
  q->lpl = __shfl_sync(0xffffffffu, v[4], l);
  q->have = small;
  return true;
}

/* ---- the per-step pieces both tensor-core kernels share ---------------------------------- */

/* Rows g and g + 8 of a 16-row tile (row R = token * group + head) of a sequence with nq
 * queries and len keys: whether they exist and their visible keys [r_lo, r_hi] (the
 * bottom-right masks; lo > hi when none). */
__device__ __forceinline__ void pa_row_ranges64(const pa_params &p, int64_t tile, int g,
                                                int64_t nq, int64_t len, bool (&r_ok)[2],
                                                int64_t (&r_lo)[2], int64_t (&r_hi)[2]) {
  const int64_t rows = nq * p.group;
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
    r_lo[rr] = lo, r_hi[rr] = hi;
  }
}
/* The same in int32, for the stream kernel (ps_wanted: its sequences have < 2^31 keys). */
__device__ __forceinline__ void pa_row_ranges(const pa_params &p, int64_t tile, int g, int64_t nq,
                                              int64_t len, bool (&r_ok)[2], int (&r_lo)[2],
                                              int (&r_hi)[2]) {
  int64_t lo[2], hi[2];
  pa_row_ranges64(p, tile, g, nq, len, r_ok, lo, hi);
#pragma unroll
  for (int rr = 0; rr < 2; rr++) r_lo[rr] = (int)lo[rr], r_hi[rr] = (int)hi[rr];
}

/* The q A-fragments of a tile: row g / g + 8, features c*32 + tq4*8 + [0, 8) per run c
 * (the QK head_dim permutation); rows past the tile's end are zero. */
template <typename T, int D>
__device__ __forceinline__ void pa_load_q(const pa_params &p, int64_t q0, int64_t tile, int kvh,
                                          int g, int tq4, const bool (&r_ok)[2],
                                          uint32_t (&qa)[D / 16][4]) {
#pragma unroll
  for (int rr = 0; rr < 2; rr++) {
    const int64_t R = tile * 16 + g + 8 * rr;
    const T *qrow = nullptr;
    if (r_ok[rr])
      qrow = static_cast<const T *>(p.q) + (q0 + R / p.group) * p.q_ts +
             (int64_t)(kvh * p.group + R % p.group) * p.q_hs;
#pragma unroll
    for (int c = 0; c < D / 32; c++) {
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (qrow) v = *reinterpret_cast<const uint4 *>(qrow + c * 32 + tq4 * 8);
      qa[2 * c][rr] = v.x;
      qa[2 * c][2 + rr] = v.y;
      qa[2 * c + 1][rr] = v.z;
      qa[2 * c + 1][2 + rr] = v.w;
    }
  }
}

/* A 16-byte cp.async; with EF (the stream kernel) carrying an L2 evict-first policy: K / V
 * bytes are read once, and marked so they leave L2 before the small tables, q and the
 * pieces that every call reads again (the stream kernel's start is three dependent table
 * rounds; behind a 269 MB call they miss L2). H200, same call: the stream kernel +0.8-2.8%
 * at every shape (64 x 1k 3.40 vs 3.33 TB/s), the split kernel -0.6 / -0.9% at 64 x 4k /
 * 16 x 4k, so only the stream kernel's copies carry it (docs/PERFORMANCE.md, round 3). */
template <bool EF>
__device__ __forceinline__ void pa_cp16(void *dst, const void *src, int n, uint64_t pol) {
  if constexpr (EF)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(
                     attn::smem_u32(dst)),
                 "l"(src), "r"(n), "l"(pol));
  else
    attn::cp_async16(dst, src, n);
}
template <bool EF> __device__ __forceinline__ uint64_t pa_copy_policy() {
  uint64_t pol = 0;
  if constexpr (EF) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}

/* The cp.async copies of one 16-key step into stage st (16 K rows, then 16 V rows, swizzled):
 * lane copies chunk lane % (D / 8) of rows lane / (D / 8) + j * 32 / (D / 8); off_of(row)
 * is that key row's element offset in both page arrays, or < 0 for a zero-filled row. */
template <typename T, int D, bool EF, typename OffOf>
__device__ __forceinline__ void pa_copy_step(T *st, const T *kp, const T *vp, int lane,
                                             OffOf off_of) {
  constexpr int CR = D / 8;
  constexpr int NJ = kPaStep * CR / 32;
  const int c = lane % CR;
  const uint64_t pol = pa_copy_policy<EF>();
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    const int kr = lane / CR + j * (32 / CR);
    const int64_t off = off_of(kr);
    const int n = off >= 0 ? 16 : 0;
    const int pc = (c ^ pa_swz(kr)) * 8;
    pa_cp16<EF>(st + kr * D + pc, n ? kp + off + c * 8 : kp, n, pol);
    pa_cp16<EF>(st + (kPaStep + kr) * D + pc, n ? vp + off + c * 8 : vp, n, pol);
  }
}

/* The TMA stage layout (TM, pa_tma_ok): a key row's 256 bytes as two 128-byte lines 2r
 * and 2r + 1 in the tensor copy's 128-byte swizzle: 16-byte chunk c16 of row r sits at
 * (c16 & 8) | ((c16 ^ (2r + c16 / 8)) & 7). The warp reads key slot pa_kperm(n) where the
 * cp.async layout reads n (n = 0..7 within each 8-key block; the S columns, masks and P V
 * follow it), which makes both read patterns conflict-free in this layout: the two rows of
 * a quarter-warp's K reads differ in bit 1, the four rows of its V reads in their low two
 * bits. */
__device__ __forceinline__ int pa_kperm(int n) { return (n >> 1) ^ (6 * (n & 1)); }
template <bool TM> __device__ __forceinline__ int pa_chunk_at(int r, int c16) {
  if constexpr (TM) return (c16 & 8) | ((c16 ^ (2 * r + (c16 >> 3))) & 7);
  else return c16 ^ pa_swz(r);
}
template <bool TM> __device__ __forceinline__ int pa_krow(int n) {
  if constexpr (TM) return (n & 8) | pa_kperm(n & 7);
  else return n;
}

/* The aligned-page copies of one whole step (AL instances, head_dim 128: pages of 16 x m
 * keys, steps starting at multiples of 16 keys, all 16 keys before the split's end): K and
 * V of the step are each one 4 KB run of the page, so a lane's 8 + 8 copies are one base
 * address plus immediates (rows lane / 16 + 2j, chunk lane % 16), and their shared-memory
 * places one of four per-lane offsets (the swizzle of row 2j + lane / 16 takes 4 values
 * over j) plus immediates: no per-row page shuffles, slot arithmetic or zero-fill tests
 * (the general path: pa_copy_step, ~300 issued instructions per step on the H200, ncu
 * decode round 7). sdst[m]: the stage's shared address of row lane / 16, chunk
 * c ^ swz(lane / 16 + 2m); gk / gv: this lane's first K / V element of the step. */
template <int J, bool EF = false>
__device__ __forceinline__ void pa_fc_copy(const uint32_t (&sdst)[4], const void *gk,
                                           const void *gv, uint64_t pol = 0) {
  if constexpr (J < 8) {
    constexpr int kRow = 2 * 128 * 2;                 /* bytes between rows 2j and 2j + 2 */
    constexpr int kV = 16 * 128 * 2;                  /* the stage's V rows */
    if constexpr (EF) { /* the stream kernel's evict-first copies (pa_cp16) */
      asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0+%2], [%1+%2], 16, %3;\n" ::"r"(
                       sdst[J & 3]),
                   "l"(gk), "n"(J * kRow), "l"(pol));
      asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0+%2], [%1+%3], 16, %4;\n" ::"r"(
                       sdst[J & 3]),
                   "l"(gv), "n"(J * kRow + kV), "n"(J * kRow), "l"(pol));
    } else {
      asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%2], 16;\n" ::"r"(sdst[J & 3]),
                   "l"(gk), "n"(J * kRow));
      asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%3], 16;\n" ::"r"(sdst[J & 3]),
                   "l"(gv), "n"(J * kRow + kV), "n"(J * kRow));
    }
    pa_fc_copy<J + 1, EF>(sdst, gk, gv, pol);
  }
}
/* A lane's four stage-0 shared offsets for pa_fc_copy (bytes from the warp's ring) and its
 * element offset in a step's 4 KB run. */
template <typename T>
__device__ __forceinline__ void pa_fc_offsets(const T *ring, int lane, uint32_t (&fc_s)[4],
                                              int &fc_g) {
  constexpr int D = 128;
  const int r0 = lane >> 4, c = lane & 15;
#pragma unroll
  for (int m = 0; m < 4; m++)
    fc_s[m] = attn::smem_u32(ring) +
              (uint32_t)(r0 * D + ((c ^ ((r0 << 2) ^ (2 * m))) * 8)) * (uint32_t)sizeof(T);
  fc_g = r0 * D + c * 8;
}

/* LB (the AL instances; head_dim 128, cp.async layout; decode round 9): pa_step's 16
 * fragment reads as one of four per-lane byte offsets plus the stage's shared address plus
 * immediates, where the compiler re-derived each read's swizzled address from the thread
 * index in every step (~60 integer instructions per step, decode round 9).
 * K read (nb, c): row nb * 8 + g, chunk (c * 4 + tq4) ^ swz(g) = (c >> 1) * 8 + (x ^ (c & 1) * 4)
 * with x = tq4 ^ swz(g); V read (e, h): row tq4 * 2 + (e & 1) + (e >> 1) * 8, whose swizzle is
 * (e & 1) * 4 ^ tq4 * 2, chunk h * 8 + (g ^ that). */
struct pa_lds_base {
  uint32_t k[2], v[2]; /* bytes from a stage's start: K of c even / odd, V of e even / odd */
};
__device__ __forceinline__ pa_lds_base pa_lds_offsets(int g, int tq4) {
  const uint32_t x = (uint32_t)(tq4 ^ pa_swz(g)), y = (uint32_t)(g ^ (tq4 * 2));
  pa_lds_base b;
  b.k[0] = (uint32_t)g * 256u + x * 16u;
  b.k[1] = (uint32_t)g * 256u + (x ^ 4u) * 16u;
  b.v[0] = 4096u + (uint32_t)tq4 * 512u + y * 16u;
  b.v[1] = 4096u + (uint32_t)tq4 * 512u + 256u + (y ^ 4u) * 16u;
  return b;
}
template <int IMM> __device__ __forceinline__ uint4 pa_lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4+%5];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr), "n"(IMM));
  return v;
}

/* The online softmax's exp2: FE (the AL instances) ex2.approx.ftz, else exp2f. */
template <bool FE> __device__ __forceinline__ float pa_exp2(float x) {
  if constexpr (FE) return attn::fast_exp2(x);
  else return exp2f(x);
}

/* One warp step over the 16 keys [kb, kb + 16) in stage st: S = q k^T, scale / softcap,
 * masks (a row's [r_lo, r_hi], keys >= kh), online softmax in base 2, O += P V. Ends with a
 * __syncwarp after the stage's last read, so the caller may refill it. TM: the stage in the
 * TMA layout (above), its rows past kh not zero-filled (the V fragments of those keys are
 * zeroed here: a page's slots past the sequence may hold anything, NaN included). CR (the AL
 * instances, with LB; decode round 9): O is multiplied by exp2(m_old - m_new) only in steps
 * where some row of the warp raised its max (a warp vote; FA4's trick without its
 * threshold): where none did, every row's factor is exp2(0) = 1 (or 0 on a row that has seen
 * no key yet, whose O is still 0), so the results are the same bits; the 64 FMULs (head_dim
 * 128) are skipped once the maxima settle. */
template <typename T, int D, bool TM = false, bool FE = false, bool CR = false, bool LB = false>
__device__ __forceinline__ void pa_step(const T *st, const uint32_t (&qa)[D / 16][4], int kb,
                                        int kh, const int (&r_lo)[2], const int (&r_hi)[2],
                                        float qk_scale, float softcap, float cap2, int g, int tq4,
                                        float (&m_run)[2], float (&l_run)[2],
                                        float (&acc)[D / 8][4], bool nomask = false,
                                        const pa_lds_base &lb = pa_lds_base{}) {
  constexpr int KC = D / 32, NT = D / 8, VH = D / 64;
  static_assert(!LB || (D == 128 && !TM), "the LB reads are laid out for head_dim 128");
  uint4 kr[2][KC], vr[4][VH];
  if constexpr (LB) {
    const uint32_t sb = attn::smem_u32(st);
    const uint32_t k0 = sb + lb.k[0], k1 = sb + lb.k[1], v0 = sb + lb.v[0], v1 = sb + lb.v[1];
    kr[0][0] = pa_lds128<0>(k0), kr[0][1] = pa_lds128<0>(k1);
    kr[0][2] = pa_lds128<128>(k0), kr[0][3] = pa_lds128<128>(k1);
    kr[1][0] = pa_lds128<2048>(k0), kr[1][1] = pa_lds128<2048>(k1);
    kr[1][2] = pa_lds128<2048 + 128>(k0), kr[1][3] = pa_lds128<2048 + 128>(k1);
    vr[0][0] = pa_lds128<0>(v0), vr[0][1] = pa_lds128<128>(v0);
    vr[1][0] = pa_lds128<0>(v1), vr[1][1] = pa_lds128<128>(v1);
    vr[2][0] = pa_lds128<2048>(v0), vr[2][1] = pa_lds128<2048 + 128>(v0);
    vr[3][0] = pa_lds128<2048>(v1), vr[3][1] = pa_lds128<2048 + 128>(v1);
  }
#pragma unroll
  for (int nb = 0; nb < 2 && !LB; nb++) {
    const int r = pa_krow<TM>(nb * 8 + g);
#pragma unroll
    for (int c = 0; c < KC; c++)
      kr[nb][c] = *reinterpret_cast<const uint4 *>(st + r * D + pa_chunk_at<TM>(r, c * 4 + tq4) * 8);
  }
#pragma unroll
  for (int e = 0; e < 4 && !LB; e++) {
    const int r = pa_krow<TM>(tq4 * 2 + (e & 1) + (e >> 1) * 8);
#pragma unroll
    for (int h = 0; h < VH; h++)
      vr[e][h] = *reinterpret_cast<const uint4 *>(st + (kPaStep + r) * D +
                                                  pa_chunk_at<TM>(r, g + 8 * h) * 8);
    if constexpr (TM) {
      if (kb + kPaStep > kh && kb + r >= kh) {
#pragma unroll
        for (int h = 0; h < VH; h++) vr[e][h] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
  __syncwarp(); /* every lane has read the stage before a later issue overwrites it */
  /* S = q k^T for the 16 keys: two n-blocks of 8 */
  float s[2][4], s2[2][4]; /* two accumulators per n-block: half-length mma chains */
#pragma unroll
  for (int nb = 0; nb < 2; nb++) {
#pragma unroll
    for (int i = 0; i < 4; i++) s[nb][i] = s2[nb][i] = 0.f;
#pragma unroll
    for (int c = 0; c < KC; c++) {
      mma_m16n8k16<T>::run(s[nb], qa[2 * c], kr[nb][c].x, kr[nb][c].y);
      mma_m16n8k16<T>::run(s2[nb], qa[2 * c + 1], kr[nb][c].z, kr[nb][c].w);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) s[nb][i] += s2[nb][i];
  }
  /* scale, softcap, mask (not in a step that every row sees whole: nomask, AL), online
   * softmax (base 2; FE: ex2.approx.ftz, the AL instances) */
  uint32_t pa[4];
  float sv[2][4];
  bool grow = true; /* CR: some row of the warp raises its max in this step */
  /* one test of softcap for the 8 scores, the tanh path out of line: tested per score, the
   * common path jumped over each score's tanhf code -- 8 taken branches, each a fetch
   * redirect in code that a batch-1 decode runs once a warp (ncu, H100: ~1% of the split
   * kernel's warp samples at each of their targets, 2026-12-07) */
  if (__builtin_expect(softcap > 0, 0)) {
#pragma unroll
    for (int rr = 0; rr < 2; rr++)
#pragma unroll
      for (int nb = 0; nb < 2; nb++)
#pragma unroll
        for (int e = 0; e < 2; e++) sv[rr][nb * 2 + e] = cap2 * tanhf(s[nb][2 * rr + e] * qk_scale);
  } else {
#pragma unroll
    for (int rr = 0; rr < 2; rr++)
#pragma unroll
      for (int nb = 0; nb < 2; nb++)
#pragma unroll
        for (int e = 0; e < 2; e++) sv[rr][nb * 2 + e] = s[nb][2 * rr + e] * qk_scale;
  }
  if (!nomask) {
#pragma unroll
    for (int rr = 0; rr < 2; rr++)
#pragma unroll
      for (int nb = 0; nb < 2; nb++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int key = kb + pa_krow<TM>(nb * 8 + tq4 * 2 + e);
          if (key < r_lo[rr] || key > r_hi[rr] || key >= kh) sv[rr][nb * 2 + e] = -INFINITY;
        }
  }
#pragma unroll
  for (int rr = 0; rr < 2; rr++) {
    float *v = sv[rr];
    float mx = fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3]));
    mx = quad_max(mx);
    if constexpr (CR) {
      if (rr == 0) {
        const float mx1 = quad_max(fmaxf(fmaxf(sv[1][0], sv[1][1]), fmaxf(sv[1][2], sv[1][3])));
        grow = __any_sync(0xffffffffu, mx > m_run[0] || mx1 > m_run[1]);
      }
    }
    const float m_new = fmaxf(m_run[rr], mx);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = pa_exp2<FE>(m_run[rr] - m_use);
    float ps = 0.f;
#pragma unroll
    for (int e = 0; e < 4; e++) {
      v[e] = pa_exp2<FE>(v[e] - m_use);
      ps += v[e];
    }
    l_run[rr] = l_run[rr] * alpha + ps;
    m_run[rr] = m_new;
    if (!CR || grow) {
#pragma unroll
      for (int j = 0; j < NT; j++) {
        acc[j][2 * rr] *= alpha;
        acc[j][2 * rr + 1] *= alpha;
      }
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

/* ---- TMA stages (the TM instance of the split kernel, head_dim 128, sm_90) -------------- *
 * K and V of one kv head in one page are [block_size][128] rows of 256 bytes, rows of all
 * (page, kv head) pairs 256 bytes apart: tensor maps {64, 2, pages x heads_kv x block_size}
 * (strides 128 and 256 bytes), box {64, 2, 16} = one 16-key step of K (or V), 4 KB, in the
 * 128-byte swizzle (pa_chunk_at<true>). One copy each for K and V per step, issued by lane
 * 0 of the warp on its stage's mbarrier; block_size a multiple of 16, so a step (16-key
 * aligned) never crosses a page. */
struct pa_params_tm : pa_params {
  CUtensorMap tk, tv;
};
template <typename P> struct pa_is_tm { static constexpr bool value = false; };
template <> struct pa_is_tm<pa_params_tm> { static constexpr bool value = true; };


__device__ __forceinline__ void pa_tma_step(uint32_t dst_k, uint32_t dst_v, const CUtensorMap *tk,
                                            const CUtensorMap *tv, uint32_t bar, int row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
               "r"((uint32_t)(2 * kPaStep * 256))
               : "memory");
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst_k),
      "l"((uint64_t)tk), "r"(0), "r"(0), "r"(row), "r"(bar)
      : "memory");
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst_v),
      "l"((uint64_t)tv), "r"(0), "r"(0), "r"(row), "r"(bar)
      : "memory");
#else
  (void)dst_k, (void)dst_v, (void)tk, (void)tv, (void)bar, (void)row;
  __trap(); /* never launched without sm_90 code (pa_tma_kernel_ok) */
#endif
}
/* mbarrier.cuh's helpers, compiled out below sm_90 (the TM instances never run there) */
__device__ __forceinline__ void pa_mbar_init(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  mbar_init(bar, 1);
#endif
}
__device__ __forceinline__ void pa_mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  mbar_init_fence();
#endif
}
__device__ __forceinline__ void pa_mbar_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  mbar_wait(bar, parity);
#endif
}

/* The TM ring's S mbarriers of a warp (one arrival each per phase: lane 0's expect_tx),
 * initialized by lane 0; the first one's shared address. */
template <int S> __device__ __forceinline__ uint32_t pa_ring_bars(uint64_t *bars, int lane) {
  const uint32_t b0 = attn::smem_u32(bars);
  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < S; s++) pa_mbar_init(b0 + 8 * s);
    pa_mbar_init_fence();
  }
  __syncwarp();
  return b0;
}

/* A warp's ring (S stages; TM: from the first 1024-byte boundary of the dynamic shared
 * memory) and, AL, its pa_fc_copy offsets. */
template <typename T, int D, int S, bool TM, bool AL>
__device__ __forceinline__ T *pa_warp_ring(unsigned char *smem, int warp, int lane,
                                           uint32_t (&fc_s)[4], int &fc_g) {
  unsigned char *base = smem;
  if constexpr (TM) base += (1024u - (attn::smem_u32(smem) & 1023u)) & 1023u;
  T *ring = reinterpret_cast<T *>(base) + (size_t)warp * S * 2 * kPaStep * D;
  fc_s[0] = fc_s[1] = fc_s[2] = fc_s[3] = 0;
  fc_g = 0;
  if constexpr (AL) pa_fc_offsets(ring, lane, fc_s, fc_g);
  return ring;
}

/* ---- the tensor-core kernel ------------------------------------------------------------- */

/* P = pa_params: the cp.async ring; P = pa_params_tm (D 128): the TMA ring (TM), whose
 * stages start at a 1024-byte boundary of the dynamic shared memory (1 KB more of it).
 * AL (D 128, cp.async ring; pages of 16 x m keys, pa_al_ok): whole steps copied by
 * pa_fc_copy, the masks skipped in steps that every row of the tile sees whole, exp2 as
 * ex2.approx.ftz. */
template <typename T, int D, int S, bool XT, typename P = pa_params, bool AL = false,
          int NW = kPaWarps>
__global__ void __launch_bounds__(32 * NW, S <= 3 && NW == 4 ? 2 : 1)
    pa_mma_kernel(const __grid_constant__ P p) {
  constexpr int KS = D / 16;   /* k-steps of QK */
  constexpr int NT = D / 8;    /* n-tiles of PV */
  constexpr bool TM = pa_is_tm<P>::value;
  static_assert(!TM || D == 128, "the TMA ring is laid out for head_dim 128");
  static_assert(!AL || (D == 128 && !TM), "the aligned copies are laid out for head_dim 128");
  __shared__ float s_m[NW][16], s_l[NW][16], s_wt[NW][16];
  __shared__ int64_t s_off[16];
  __shared__ __align__(8) uint64_t s_bar[TM ? NW : 1][TM ? S : 1];
  extern __shared__ __align__(16) unsigned char pa_smem[]; /* rings; [warps][16][D + 2] floats at the end */
  PA_TR(0, 0, pa_gtime());

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq4 = lane & 3;
  uint32_t bar0 = 0; /* TM: this warp's stage-0 mbarrier (stage s: bar0 + 8 s) */
  if constexpr (TM) bar0 = pa_ring_bars<S>(&s_bar[warp][0], lane);
  /* block id -> (tile slot, kv head, split), the slot slowest: slots past the real tiles
   * (the grid's upper bound) are dispatched last */
  const int64_t bid = blockIdx.x;
  const int split = (int)(bid % p.splits);
  const int kvh = (int)((bid / p.splits) % p.hkv);
  const int64_t slot_x = bid / ((int64_t)p.splits * p.hkv);
  /* launched as a programmatic dependent (pa_launch_main): the previous kernel's writes
   * (q, the tables, the pages; its reads of part_o / out) are done after this. With
   * `early` (XT only) the wait comes after the tables, the page ids and the copies of the
   * first steps that hold none of the sequence's last nq keys (written by that kernel
   * when it appends the query tokens): q, those keys and every write come after it. */
  const bool early = XT && p.early;
  if (!early) ot_pdl_wait();
  PA_TR(0, 1, pa_gtime());

  /* The page-id guess (chunk1 > 0, no OT_DEBUG; the host's, pa_params): guess this
   * CTA's sequence first entry, (slot >> spec_tshift) * spec_pps -- 0 at batch 1 (indptr[0] =
   * 0, the CSR table's rule), the sequence's when every sequence has as many entries and
   * queries -- and this split's first key, split * chunk1 (the chunk when the sequence
   * fills its entries), and load the page ids of the first S - 1 + A steps from there in
   * the same round as the table entries, instead of one dependent round after them
   * (entries past kv.indices read as 0; ids of keys past the split are never used). Taken
   * below when the tables agree (that first entry, the split starting at the guessed key),
   * else the ids are loaded again: the ids depend only on those two. */
  constexpr int A = kPaPidAhead;
  int pq[S - 1 + A];
  const bool spec = PA_GUESS_ON(p);
  const int64_t spec_k0 = (int64_t)split * p.chunk1;
  const int64_t spec_ip0 = (slot_x >> p.spec_tshift) * p.spec_pps;
  if (spec) {
    const int64_t sp = spec_ip0 + (spec_k0 >> p.bs_shift);
    const int rel0 = (int)(spec_k0 - ((spec_k0 >> p.bs_shift) << p.bs_shift));
#pragma unroll
    for (int s = 0; s < S - 1 + A; s++) {
      const int key = rel0 + (s * NW + warp) * kPaStep + (lane & 15);
      const int64_t e = sp + (key >> p.bs_shift);
      pq[s] = e < p.num_indices ? __ldg(p.indices + e) : 0;
    }
  }

  pa_seq sq;
  if (!pa_find_tile(p, slot_x, &sq)) return;
  const int64_t b = sq.b, tile = sq.tile;
  if (!sq.have) {
    sq.cu0 = p.cu_q[b], sq.cu1 = p.cu_q[b + 1];
    sq.ip0 = p.indptr[b], sq.ip1 = p.indptr[b + 1], sq.lpl = p.lpl[b];
  }
  const int64_t len = paged_seq_len_of(sq.ip0, sq.ip1, sq.lpl, b, p.bs, p.num_indices, p.err);
  if (len < 0) return;
  const int64_t q0 = sq.cu0, nq = (int64_t)sq.cu1 - q0;
  const int64_t rows = nq * p.group;
  const int64_t page0 = sq.ip0;

  /* this thread's two rows (g, g + 8): validity and visible key range */
  int64_t r_lo64[2], r_hi64[2];
  bool r_ok[2];
  pa_row_ranges64(p, tile, g, nq, len, r_ok, r_lo64, r_hi64);
  /* the tile's key range within this split: union of its rows' ranges */
  const int64_t tok_first = tile * 16 / p.group;
  int64_t tok_last = (tile * 16 + 15) / p.group;
  if (tok_last > nq - 1) tok_last = nq - 1;
  /* this split's keys: the sequence cut into `splits` chunks of >= (NW * kPaStep) keys (a
   * multiple of 64; pa_chunk on the host), so splits past the end of a short sequence are
   * empty */
  int64_t chunk = (len + p.splits - 1) / p.splits;
  chunk = chunk < (NW * kPaStep) ? (NW * kPaStep) : (chunk + 63) / 64 * 64;
  int64_t k_lo = split * chunk, k_hi = k_lo + chunk;
  {
    const int64_t dfirst = tok_first + len - nq, dlast = tok_last + len - nq;
    const int64_t lo = p.wl >= 0 ? dfirst - p.wl : 0;
    const int64_t hi = p.wr >= 0 ? dlast + p.wr + 1 : len;
    if (k_lo < lo) k_lo = lo;
    if (k_hi > hi) k_hi = hi;
    if (k_hi > len) k_hi = len;
    if (k_hi < k_lo) k_hi = k_lo;
  }
  /* keys from here on relative to key0, the split's first key rounded down to its page:
   * a sequence may have 2^31 keys or more, a split at most 2^30 (pa_min_splits), and key0
   * is less than a page below k_lo: relative keys stay below 2^30 + 256 */
  const int64_t kpage = p.bs_shift >= 0 ? k_lo >> p.bs_shift : k_lo / p.bs;
  const int64_t key0 = kpage * p.bs;
  /* TM / AL: steps start at a multiple of 16 keys (of a page of 16 x m keys); the keys
   * that adds in front (a left window's) are masked by every row's r_lo */
  const int kl = TM || AL ? (int)(k_lo - key0) & ~(kPaStep - 1) : (int)(k_lo - key0);
  const int kh = (int)(k_hi - key0);
  int r_lo[2], r_hi[2]; /* relative, clamped to [-1, INT_MAX] (keys are >= 0) */
#pragma unroll
  for (int rr = 0; rr < 2; rr++) {
    const int64_t lo = r_lo64[rr] - key0, hi = r_hi64[rr] - key0;
    r_lo[rr] = lo < -1 ? -1 : lo > 0x7fffffff ? 0x7fffffff : (int)lo;
    r_hi[rr] = hi < -1 ? -1 : hi > 0x7fffffff ? 0x7fffffff : (int)hi;
  }
  const int steps = kh > kl ? (kh - kl + kPaStep - 1) / kPaStep : 0;
  const int nst = steps > warp ? (steps - warp + NW - 1) / NW : 0; /* this warp's */

  const int64_t head_stride = (int64_t)p.bs * D; /* elements between kv heads of a page */
  const T *kbase = static_cast<const T *>(p.k_pages) + (int64_t)kvh * head_stride;
  const T *vbase = static_cast<const T *>(p.v_pages) + (int64_t)kvh * head_stride;
  const int64_t page_stride = (int64_t)p.hkv * head_stride;

  /* page id of key (lane & 15) of this warp's step t (0 past the split's end); TM: of the
   * step's first key in every lane (one page per step) */
  auto load_pid = [&](int t) -> int {
    const int key = kl + (t * NW + warp) * kPaStep + (TM ? 0 : (lane & 15));
    if (t >= nst || key >= kh) return 0;
    const int64_t e = page0 + kpage + (p.bs_shift >= 0 ? key >> p.bs_shift : key / p.bs);
    int pg = __ldg(p.indices + e);
    if (p.err && (pg < 0 || pg >= p.num_pages)) {
      paged_flag(p.err, kPagedBadIndex, b, e, pg);
      pg = 0;
    }
    return pg;
  };
  /* AL: this lane's shared offsets (bytes, in stage 0) of rows lane / 16 + 2m, chunk
   * lane % 16, and its element offset in a step's 4 KB run */
  uint32_t fc_s[4];
  int fc_g;
  T *ring = pa_warp_ring<T, D, S, TM, AL>(pa_smem, warp, lane, fc_s, fc_g);
  /* step t's K and V rows into stage t % S: lane copies chunk lane % CR of rows
   * lane / CR + j * 32 / CR; pid = this lane's page id register for step t. TM: lane 0
   * copies the step's K and V boxes (a whole step is in the page of its first key). */
  auto issue = [&](int t, int pid) {
    const int kb = kl + (t * NW + warp) * kPaStep;
    T *st = ring + (size_t)(t % S) * 2 * kPaStep * D;
    if constexpr (AL) {
      if (kb + kPaStep <= kh) { /* a whole step: one page (every lane's pid is its id) */
        const int slot = p.bs_shift >= 0 ? kb & (p.bs - 1) : kb % p.bs;
        const int64_t off = (int64_t)pid * page_stride + (int64_t)slot * D + fc_g;
        const uint32_t so = (uint32_t)((t % S) * 2 * kPaStep * D * sizeof(T));
        const uint32_t sd[4] = {fc_s[0] + so, fc_s[1] + so, fc_s[2] + so, fc_s[3] + so};
        pa_fc_copy<0>(sd, kbase + off, vbase + off);
        return;
      }
    }
    if constexpr (TM) {
      if (lane == 0) {
        const int slot = p.bs_shift >= 0 ? kb & (p.bs - 1) : kb % p.bs;
        const int row = (pid * p.hkv + kvh) * p.bs + slot; /* < 2^31 (pa_tma_ok) */
        pa_tma_step(attn::smem_u32(st), attn::smem_u32(st + kPaStep * D), &p.tk, &p.tv,
                    bar0 + 8 * (t % S), row);
      }
      return;
    }
    pa_copy_step<T, D, false>(st, kbase, vbase, lane, [&](int kr) -> int64_t {
      const int pg = __shfl_sync(0xffffffffu, pid, kr);
      const int key = kb + kr;
      const int slot = p.bs_shift >= 0 ? key & (p.bs - 1) : key % p.bs;
      return key < kh ? (int64_t)pg * page_stride + (int64_t)slot * D : -1;
    });
  };

  /* start the ring: page ids of steps 0 .. S-2+A (independent loads; A = kPaPidAhead),
   * unless loaded above with the tables, copies of steps 0 .. S-2 */
  if (!(spec && sq.ip0 == spec_ip0 && k_lo == spec_k0)) {
#pragma unroll
    for (int s = 0; s < S - 1 + A; s++) pq[s] = load_pid(s);
  }
  PA_TR(0, 2, pa_gtime());

  /* q is loaded and the wait passed before stage s_wait's copies: 0 without `early`; with
   * it the first stage holding one of the sequence's last nq keys (relative key new_rel
   * on), S - 1 when none does (the stages past this warp's steps copy nothing) */
  int s_wait = 0;
  if (early) {
    const int64_t nr = len - nq - key0;
    const int new_rel = nr < 0 ? 0 : nr > 0x7fffffff ? 0x7fffffff : (int)nr;
    s_wait = S - 1;
#pragma unroll
    for (int s = S - 2; s >= 0; s--)
      if (s < nst && kl + (s * NW + warp) * kPaStep + kPaStep > new_rel) s_wait = s;
  }
  uint32_t qa[KS][4];
#pragma unroll
  for (int s = 0; s < S; s++) {
    if (s == s_wait) {
      if (early) ot_pdl_wait();
      pa_load_q<T, D>(p, q0, tile, kvh, g, tq4, r_ok, qa);
    }
    if (s < S - 1) {
      if (s < nst) issue(s, pq[s]);
      if constexpr (!TM) attn::cp_async_commit();
    }
  }
  int pw[A]; /* page ids of steps t + S - 1 .. t + S - 2 + A */
#pragma unroll
  for (int i = 0; i < A; i++) pw[i] = pq[S - 1 + i];

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const float qk_scale = p.softcap > 0 ? p.scale / p.softcap : p.scale * kLog2e;
  const float cap2 = p.softcap * kLog2e;
  /* AL: the fragment reads' per-lane offsets (pa_lds_offsets, pa_step's LB) */
  const pa_lds_base lb = AL ? pa_lds_offsets(g, tq4) : pa_lds_base{};

#pragma unroll 1
  for (int t = 0; t < nst; t++) {
    /* keep S - 1 steps in flight: issue step t + S - 1 (its page ids were loaded A steps
     * ago: under a saturated memory system a load takes microseconds, so a page id
     * loaded one step ahead would pace the loop), load those of step t + S - 1 + A, then
     * wait for step t */
    if (t + S - 1 < nst) issue(t + S - 1, pw[0]);
    if constexpr (!TM) attn::cp_async_commit();
#pragma unroll
    for (int i = 0; i < A - 1; i++) pw[i] = pw[i + 1];
    pw[A - 1] = load_pid(t + S - 1 + A);
    if constexpr (TM) {
      pa_mbar_wait(bar0 + 8 * (t % S), (uint32_t)(t / S) & 1u);
    } else {
      attn::cp_async_wait<S - 1>();
      __syncwarp();
    }
#ifdef OT_PA_TRACE
    if (t == 0) PA_TR(0, 3, pa_gtime());
#endif
    const int kb = kl + (t * NW + warp) * kPaStep;
    bool nomask = false;
    if constexpr (AL) { /* every (real) row of the tile sees the whole step */
      /* (bitwise, not short-circuit: no branches in code a batch-1 decode runs once) */
      bool whole = kb + kPaStep <= kh;
#pragma unroll
      for (int rr = 0; rr < 2; rr++)
        whole = whole & (!r_ok[rr] | ((kb >= r_lo[rr]) & (kb + kPaStep - 1 <= r_hi[rr])));
      nomask = __all_sync(0xffffffffu, whole);
    }
    pa_step<T, D, TM, AL, AL, AL>(
        ring + (size_t)(t % S) * 2 * kPaStep * D, qa, kb, kh, r_lo, r_hi, qk_scale, p.softcap,
        cap2, g, tq4, m_run, l_run, acc, nomask, lb);
  }
  if constexpr (!TM) attn::cp_async_wait<0>(); /* (only empty groups can be left) */
  PA_TR(0, 4, pa_gtime());
#ifndef OT_PA_TRACE_EPI
  PA_TR(0, 7, (unsigned long long)nst);
#endif
  /* the merge kernel (a programmatic dependent when splits > 1) may start launching */
  ot_pdl_launch_dependents();
#ifdef OT_PA_TRACE_EPI
  PA_TR(0, 6, pa_gtime());
#endif

  /* merge the warps: row sums over the quad, then (m, l, O) through shared memory */
#pragma unroll
  for (int rr = 0; rr < 2; rr++) {
    l_run[rr] = quad_sum(l_run[rr]);
  }
  __syncthreads(); /* every warp is done with its ring: the space becomes s_o */
#ifdef OT_PA_TRACE_EPI
  PA_TR(0, 7, pa_gtime());
#endif
  /* the warps' O through shared memory, rows kOS = D + 2 floats apart: a store instruction
   * below writes rows g (8) x features tq4 * 16 + c (4), which with rows D apart fell into
   * 2 banks (16-way conflicts) and with D + 2 into 16 (2-way) */
  constexpr int OS = pa_cfg<D, S>::kOS;
  static_assert((size_t)NW * S * pa_cfg<D, S>::kStageBytes >= (size_t)NW * 16 * OS * sizeof(float),
                "epilogue fits the ring");
  float *s_o = reinterpret_cast<float *>(pa_smem); /* [warps][16][OS] */
  if (tq4 == 0) {
    s_m[warp][g] = m_run[0], s_m[warp][g + 8] = m_run[1];
    s_l[warp][g] = l_run[0], s_l[warp][g + 8] = l_run[1];
  }
  /* (rows past the tile's end are neither stored nor read: a decode tile has `group` of
   * its 16) */
  float *ow = s_o + (size_t)warp * 16 * OS;
#pragma unroll
  for (int j = 0; j < NT; j++) {
    const int d0 = (j >> 3) * 64 + (tq4 * 2) * 8 + (j & 7), d1 = d0 + 8;
    if (r_ok[0]) {
      ow[g * OS + d0] = acc[j][0];
      ow[g * OS + d1] = acc[j][1];
    }
    if (r_ok[1]) {
      ow[(g + 8) * OS + d0] = acc[j][2];
      ow[(g + 8) * OS + d1] = acc[j][3];
    }
  }
  __syncthreads();
  /* per row, once (thread r < 16): the warps' weights exp2(m_w - M) / L, the lse (written
   * here) and the row's first output element (-1: no row); the element loop below is then
   * 4 shared loads, 4 FMAs and a store, where it computed all of this per element (two
   * 64-bit divisions among it: 4.4-6.4 us per CTA after the key loop on the H200, trace of
   * a1778f4; ~2.4 us after, docs/PERFORMANCE.md Decode round 5). A row's offset is >= 0: a
   * negative stride is allowed only on an extent of 1 (ot_view_of), whose index is 0. */
  if (threadIdx.x < 16) {
    const int r = threadIdx.x;
    const int64_t R = tile * 16 + r;
    int64_t off = -1;
    if (R < rows) {
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < NW; w++) M = fmaxf(M, s_m[w][r]);
      float L = 0.f, f[NW];
#pragma unroll
      for (int w = 0; w < NW; w++) {
        f[w] = M != -INFINITY ? exp2f(s_m[w][r] - M) : 0.f;
        L += s_l[w][r] * f[w];
      }
      const float inv = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
      for (int w = 0; w < NW; w++) s_wt[w][r] = f[w] * inv;
      const float lse = L > 0.f ? (M + log2f(L)) * kLn2 : -INFINITY;
      const int64_t tok = q0 + R / p.group, head = (int64_t)kvh * p.group + R % p.group;
      if (p.splits == 1) {
        off = tok * p.o_ts + head * p.o_hs;
        if (p.lse) p.lse[head * p.lse_hs + tok * p.lse_ts] = lse;
      } else {
        const int64_t row = (int64_t)split * p.tq * p.hq + tok * p.hq + head;
        off = row * D;
        p.part_lse[row] = lse;
      }
    }
    s_off[r] = off;
  }
  __syncthreads();
  const int tile_rows = rows - tile * 16 < 16 ? (int)(rows - tile * 16) : 16;
  for (int idx = threadIdx.x; idx < tile_rows * D; idx += blockDim.x) {
    const int r = idx / D, dd = idx - r * D;
    const int64_t off = s_off[r];
    if (off < 0) continue;
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) o += s_o[((size_t)w * 16 + r) * OS + dd] * s_wt[w][r];
    if (p.splits == 1) static_cast<T *>(p.out)[off + dd] = from_f32<T>(o);
    else p.part_o[off + dd] = o;
  }
  PA_TR(0, 5, pa_gtime());
#ifndef OT_PA_TRACE_EPI
  PA_TR(0, 6, (unsigned long long)pa_smid());
#endif
}

/* The merge kernels' O accumulation (acc += w o_s, lane's V features) and their end: the
 * warps' partial sums through shared memory, summed in warp order, out and lse stored. */
template <int V, typename VT>
__device__ __forceinline__ void pa_merge_add(float *acc, float w, const VT &o) {
  if constexpr (V == 4) {
    acc[0] += w * o.x, acc[1] += w * o.y, acc[2] += w * o.z, acc[3] += w * o.w;
  } else {
    acc[0] += w * o.x, acc[1] += w * o.y;
  }
}
template <typename T, int D>
__device__ __forceinline__ void pa_merge_store(const pa_params &p, int64_t row,
                                               float (*s_acc)[D], const float *acc, float lse) {
  constexpr int V = D / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int v = 0; v < V; v++) s_acc[warp][lane * V + v] = acc[v];
  __syncthreads();
  const int64_t tok = row / p.hq, head = row - tok * p.hq;
  T *o = static_cast<T *>(p.out) + tok * p.o_ts + head * p.o_hs;
  for (int dd = threadIdx.x; dd < D; dd += kPaThreads) {
    float a = 0.f;
#pragma unroll
    for (int w = 0; w < kPaWarps; w++) a += s_acc[w][dd];
    o[dd] = from_f32<T>(a);
  }
  if (p.lse && threadIdx.x == 0) p.lse[head * p.lse_hs + tok * p.lse_ts] = lse;
}

/* ---- merge of the splits: one CTA per (token, q head) row -------------------------------- *
 * (OT_PAGED_MERGE=0; the default is pa_merge1_kernel, below, the same results in one
 * round trip.) lse = log sum_s exp(lse_s) (a block reduction over the splits), then warp w
 * sums exp(lse_s - lse) O_s over splits s = w, w + 4, ... (lane: D / 32 features, the weights
 * of 32 splits at a time loaded by the lanes and broadcast with shuffles, the O_s loads
 * independent), and the 4 partial sums add through shared memory. */
template <typename T, int D>
__global__ void __launch_bounds__(kPaThreads) pa_merge_kernel(const __grid_constant__ pa_params p) {
  constexpr int V = D / 32; /* features per lane */
  __shared__ float s_red[kPaWarps];
  __shared__ float s_acc[kPaWarps][D];
  PA_TR(1, 0, pa_gtime());
  ot_pdl_wait(); /* the main kernel's partials */
  PA_TR(1, 1, pa_gtime());
  /* the next kernel (the next call's main kernel, itself waiting) may start launching */
  ot_pdl_launch_dependents();
  const int64_t row = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t rs = p.tq * p.hq;
  const float *pl = p.part_lse + row;
  /* M = max_s lse_s */
  float m = -INFINITY;
  for (int s = threadIdx.x; s < p.splits; s += kPaThreads) m = fmaxf(m, pl[s * rs]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) s_red[warp] = m;
  __syncthreads();
  float M = s_red[0];
#pragma unroll
  for (int w = 1; w < kPaWarps; w++) M = fmaxf(M, s_red[w]);
  __syncthreads();
  /* L = sum_s exp(lse_s - M) */
  float l = 0.f;
  if (M != -INFINITY)
    for (int s = threadIdx.x; s < p.splits; s += kPaThreads) {
      const float ls = pl[s * rs];
      if (ls != -INFINITY) l += expf(ls - M);
    }
  l = warp_sum(l);
  if (lane == 0) s_red[warp] = l;
  __syncthreads();
  float L = 0.f;
#pragma unroll
  for (int w = 0; w < kPaWarps; w++) L += s_red[w];
  const float lse = M != -INFINITY ? M + logf(L) : -INFINITY;
  /* warp w: splits w, w + 4, ...; 32 of them per round */
  float acc[V];
#pragma unroll
  for (int v = 0; v < V; v++) acc[v] = 0.f;
  if (M != -INFINITY) {
    const float *po = p.part_o + row * D + lane * V;
    for (int s0 = warp; s0 < p.splits; s0 += 32 * kPaWarps) {
      const int sl = s0 + lane * kPaWarps;
      float wl = 0.f;
      if (sl < p.splits) {
        const float ls = pl[(int64_t)sl * rs];
        wl = ls != -INFINITY ? expf(ls - lse) : 0.f;
      }
      const int n = (p.splits - s0 + kPaWarps - 1) / kPaWarps; /* splits of this round */
#pragma unroll 8
      for (int i = 0; i < 32; i++) {
        if (i >= n) break;
        const float w = __shfl_sync(0xffffffffu, wl, i);
        const float *src = po + (int64_t)(s0 + i * kPaWarps) * rs * D;
        if constexpr (V == 4) pa_merge_add<V>(acc, w, *reinterpret_cast<const float4 *>(src));
        else pa_merge_add<V>(acc, w, *reinterpret_cast<const float2 *>(src));
      }
    }
  }
  pa_merge_store<T, D>(p, row, s_acc, acc, lse);
  PA_TR(1, 5, pa_gtime());
  PA_TR(1, 6, (unsigned long long)pa_smid());
}

/* ---- the one-round merge (the default; OT_PAGED_MERGE=0: pa_merge_kernel): its results bit
 * for bit with one dependent round trip after the PDL wait instead of four. Each warp
 * issues at once every load the first 128 splits need: lane l's lse of splits l + 32 k
 * (k < 4: thread 32 k + l of pa_merge_kernel's reductions), its weight lse (split
 * warp + 4 l) and the O rows of the warp's first kPaMergeAhead splits (warp + 4 i); then
 * reduces M and L on registers (every warp the whole block's reductions, in
 * pa_merge_kernel's order: thread sums, warp_sum per virtual warp k, then k = 0..3; the
 * xor-butterfly gives every lane the same bits) while the O loads are in flight, and
 * weights and sums the O rows in pa_merge_kernel's order. One barrier (the warps' partial
 * sums) instead of three. More splits (> 4 x kPaMergeAhead per warp or > 128) take further
 * loads in chunks of kPaMergeAhead, still in the same summation order. */
constexpr int kPaMergeAhead = 8; /* O rows per lane loaded before the reductions */
/* NA: kPaMergeAhead, or 16 (OT_PAGED_MERGE=2; not measured standalone, the engine's 8B
 * step 4.666 vs 4.695 ms once): one round trip up to 64 splits (the engine's
 * over-provisioned 2080-key table plans 33 at 1 x 2k, and with 8 ahead warp 0's ninth O
 * row is loaded after the reductions). */
template <typename T, int D, int NA = kPaMergeAhead>
__global__ void __launch_bounds__(kPaThreads) pa_merge1_kernel(const __grid_constant__ pa_params p) {
  constexpr int V = D / 32; /* features per lane */
  constexpr int NL = kPaThreads / 32; /* lse per lane of the first 128 splits */
  using VT = typename std::conditional<V == 4, float4, float2>::type;
  __shared__ float s_acc[kPaWarps][D];
  PA_TR(1, 0, pa_gtime());
  ot_pdl_wait(); /* the main kernel's partials */
  PA_TR(1, 1, pa_gtime());
  ot_pdl_launch_dependents();
  const int64_t row = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t rs = p.tq * p.hq;
  const int S = p.splits;
  const float *pl = p.part_lse + row;
  const float *po = p.part_o + row * D + lane * V;
  /* every load of the first round, issued before any of them is used */
  float ls[NL];
#pragma unroll
  for (int k = 0; k < NL; k++) {
    const int s = lane + 32 * k;
    ls[k] = s < S ? pl[(int64_t)s * rs] : -INFINITY;
  }
  const int sw = warp + lane * kPaWarps; /* this lane's weight split of round 0 */
  const float lw0 = sw < S ? pl[(int64_t)sw * rs] : -INFINITY;
  VT oa[NA];
#pragma unroll
  for (int i = 0; i < NA; i++) {
    const int s = warp + i * kPaWarps;
    if (s < S) oa[i] = *reinterpret_cast<const VT *>(po + (int64_t)s * rs * D);
  }
  /* M = max_s lse_s */
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < NL; k++) m = fmaxf(m, ls[k]);
  for (int s = lane + kPaThreads; s < S; s += 32) m = fmaxf(m, pl[(int64_t)s * rs]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const float M = m;
  /* L = sum_s exp(lse_s - M): pa_merge_kernel's thread 32 k + lane, then its warp k */
  float L = 0.f;
#pragma unroll
  for (int k = 0; k < NL; k++) {
    float l = 0.f;
    if (M != -INFINITY) {
      if (ls[k] != -INFINITY) l += expf(ls[k] - M);
      for (int s = lane + 32 * k + kPaThreads; s < S; s += kPaThreads) {
        const float x = pl[(int64_t)s * rs];
        if (x != -INFINITY) l += expf(x - M);
      }
    }
    L += warp_sum(l);
  }
  const float lse = M != -INFINITY ? M + logf(L) : -INFINITY;
  float acc[V];
#pragma unroll
  for (int v = 0; v < V; v++) acc[v] = 0.f;
  const auto add = [&](float w, const VT &o) { pa_merge_add<V>(acc, w, o); };
  if (M != -INFINITY) {
    for (int s0 = warp; s0 < S; s0 += 32 * kPaWarps) {
      float lw = lw0;
      if (s0 != warp) {
        const int sl = s0 + lane * kPaWarps;
        lw = sl < S ? pl[(int64_t)sl * rs] : -INFINITY;
      }
      const float wl = lw != -INFINITY ? expf(lw - lse) : 0.f;
      const int n = (S - s0 + kPaWarps - 1) / kPaWarps; /* splits of this round */
      int i0 = 0;
      if (s0 == warp) { /* the rows already loaded */
#pragma unroll
        for (int i = 0; i < NA; i++)
          if (i < n) add(__shfl_sync(0xffffffffu, wl, i), oa[i]);
        i0 = NA;
      }
      for (; i0 < 32 && i0 < n; i0 += NA) {
        VT ob[NA];
#pragma unroll
        for (int i = 0; i < NA; i++)
          if (i0 + i < n)
            ob[i] = *reinterpret_cast<const VT *>(po + (int64_t)(s0 + (i0 + i) * kPaWarps) * rs * D);
#pragma unroll
        for (int i = 0; i < NA; i++)
          if (i0 + i < n) add(__shfl_sync(0xffffffffu, wl, i0 + i), ob[i]);
      }
    }
  }
  pa_merge_store<T, D>(p, row, s_acc, acc, lse);
  PA_TR(1, 5, pa_gtime());
  PA_TR(1, 6, (unsigned long long)pa_smid());
}

/* ---- the stream kernel: persistent warps over an even cut of all key steps ---------------- *
 * Work = units (sequence b, tile, kv head), each of ceil(len_b / 16) steps of 16 keys (one
 * step for an empty sequence: its rows get 0 and lse -inf), laid out in order (b, then
 * tile * heads_kv + kv head, then key) as N global steps. The grid is one wave (SMs x CTAs
 * per SM) of 4-warp CTAs and warp w takes the P = ceil(N / warps) steps [w P, (w + 1) P): a
 * warp streams its steps through its own S-stage cp.async ring across unit boundaries
 * (page ids kPaPidAhead steps ahead, as the split kernel), so no SM waits for a second wave
 * and no ring drains between units. Every warp finds its place itself: a warp-wide prefix
 * sum of the work of each sequence (cu_seqlens_q, indptr, last_page_len), then a window of
 * 32 sequences (lane l: sequence base + l) that the loader slides when it passes its end.
 * The loader writes the metadata of each unit it enters into a warp-private ring in shared
 * memory (8 entries: it runs at most S - 1 + A steps ahead) for the consumer.
 * A unit inside one warp's range is normalized and written directly. A unit cut by range
 * ends leaves a piece in each warp it touches (normalized O and lse, slot 0 for the unit
 * holding the warp's first step, else slot 1); the warp holding its last step writes a
 * descriptor and the merge kernel (one CTA per descriptor, a warp per row, a programmatic
 * dependent on sm_90) combines the pieces as the split merge does. */
constexpr int kPsMeta = 8;      /* unit-metadata entries per warp (> S - 1 + A) */
constexpr int kPsMinSteps = 4;  /* fewest steps per warp */

/* A window of 32 sequences: lane l holds sequence base + l. */
struct ps_win {
  int incl;          /* global step where the sequence's work ends */
  int len, page0, q0, nq;
  int64_t base;      /* first sequence (uniform) */
  int end;           /* incl of lane 31 (uniform) */
};

__device__ __forceinline__ int ps_steps(int len) {
  return len > 0 ? (len + kPaStep - 1) / kPaStep : 1;
}

__device__ __forceinline__ int ps_scan(int v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += x;
  }
  return v;
}

/* Steps of sequence b from its table entries (0 without rows or after a failed debug
 * check); its length and queries. */
__device__ __forceinline__ int ps_work(const pa_params &p, int64_t b, int32_t c0, int32_t c1,
                                       int32_t i0, int32_t i1, int32_t l, int *len, int *nq) {
  const int64_t tiles = pa_tiles_of(p, b, c0, c1);
  const int64_t n = paged_seq_len_of(i0, i1, l, b, p.bs, p.num_indices, p.err);
  *len = 0, *nq = 0;
  if (n < 0 || tiles == 0) return 0;
  *len = (int)n, *nq = c1 - c0;
  return (int)(tiles * p.hkv * ps_steps((int)n));
}

/* The window at sequence `base`, whose work starts at global step excl0. */
__device__ __forceinline__ void ps_win_load(const pa_params &p, ps_win &w, int64_t base, int excl0) {
  const int lane = threadIdx.x & 31;
  const int64_t b = base + lane;
  int len = 0, nq = 0, work = 0, c0 = 0, i0 = 0;
  if (b < p.batch) {
    c0 = p.cu_q[b], i0 = p.indptr[b];
    work = ps_work(p, b, c0, p.cu_q[b + 1], i0, p.indptr[b + 1], p.lpl[b], &len, &nq);
  }
  w.incl = excl0 + ps_scan(work, lane);
  w.len = len, w.page0 = i0, w.q0 = c0, w.nq = nq;
  w.base = base;
  w.end = __shfl_sync(0xffffffffu, w.incl, 31);
}

/* PP = pa_params_tm (D 128): the TMA ring of the split kernel's TM instance (one K and one V
 * box per step; a unit's steps start at multiples of 16 keys, so a step is in one page of
 * 16 x m keys) in place of the evict-first cp.async copies. */
template <typename T, int D, int S, typename PP = pa_params, bool AL = false>
__global__ void __launch_bounds__(kPaThreads, 2) ps_kernel(const __grid_constant__ PP p) {
  constexpr int KS = D / 16, NT = D / 8, VH = D / 64;
  constexpr int A = kPaPidAhead;
  constexpr bool TM = pa_is_tm<PP>::value;
  static_assert(!TM || D == 128, "the TMA ring is laid out for head_dim 128");
  static_assert(!AL || (D == 128 && !TM), "the aligned copies are laid out for head_dim 128");
  static_assert(kPsMeta > S - 1 + A, "the metadata ring holds every unit in flight");
  extern __shared__ __align__(16) unsigned char pa_smem[];
  __shared__ int s_meta[kPaWarps][kPsMeta][8];
  __shared__ __align__(8) uint64_t s_bar[TM ? kPaWarps : 1][TM ? S : 1];
  PA_TR(0, 0, pa_gtime());

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq4 = lane & 3;
  uint32_t bar0 = 0; /* TM: this warp's stage-0 mbarrier (stage s: bar0 + 8 s) */
  if constexpr (TM) bar0 = pa_ring_bars<S>(&s_bar[warp][0], lane);
  const int wg = blockIdx.x * kPaWarps + warp, wtot = gridDim.x * kPaWarps;
  ot_pdl_wait(); /* a programmatic dependent: see pa_mma_kernel */
  PA_TR(0, 1, pa_gtime());

  /* the total N, this warp's range and the window holding its first step */
  ps_win W;
  int N, rs = 0, re = 0;
  const int64_t per = (p.batch + 31) / 32;
  if (per == 1) {
    ps_win_load(p, W, 0, 0);
    N = W.end;
  } else {
    const int64_t b0 = lane * per, b1 = b0 + per < p.batch ? b0 + per : p.batch;
    int mine = 0, ln, nq;
    for (int64_t b = b0; b < b1; b++)
      mine += ps_work(p, b, p.cu_q[b], p.cu_q[b + 1], p.indptr[b], p.indptr[b + 1], p.lpl[b],
                      &ln, &nq);
    const int incl = ps_scan(mine, lane);
    N = __shfl_sync(0xffffffffu, incl, 31);
    W.base = 0, W.end = 0, W.incl = 0; /* loaded below */
    const int P0 = (N + wtot - 1) / wtot;
    const int64_t r0 = (int64_t)wg * (P0 > kPsMinSteps ? P0 : kPsMinSteps);
    if (r0 < N) {
      const int L = __ffs(__ballot_sync(0xffffffffu, (int)r0 < incl)) - 1;
      ps_win_load(p, W, L * per, __shfl_sync(0xffffffffu, incl - mine, L));
    }
  }
  int P = (N + wtot - 1) / wtot;
  if (P < kPsMinSteps) P = kPsMinSteps;
  if ((int64_t)wg * P < N) {
    rs = wg * P;
    re = N - rs > P ? rs + P : N;
  }
  const int n = re - rs;
  int dflag = 0, dwa = 0, dq0 = 0, dnq = 0, dtile = 0, dkvh = 0; /* this warp's descriptor */
  if (n > 0) {
    const int64_t head_stride = (int64_t)p.bs * D;
    const T *kp = static_cast<const T *>(p.k_pages), *vp = static_cast<const T *>(p.v_pages);
    unsigned char *ring_base = pa_smem;
    if constexpr (TM) ring_base += (1024u - (attn::smem_u32(pa_smem) & 1023u)) & 1023u;
    T *ring = reinterpret_cast<T *>(ring_base) + (size_t)warp * S * 2 * kPaStep * D;
    /* AL (pages of 16 x m keys): a unit's steps start at multiples of 16 keys of its
     * sequence, so a whole step is one 4 KB run of a page (pa_fc_copy). (Not through
     * pa_warp_ring, which the split kernel uses: here it compiled to other SASS than the
     * measured build's.) */
    uint32_t fc_s[4] = {0, 0, 0, 0};
    int fc_g = 0;
    if constexpr (AL) pa_fc_offsets(ring, lane, fc_s, fc_g);
    PA_TR(0, 2, pa_gtime());
    int *meta = &s_meta[warp][0][0];
    int lu = 0; /* unit entries written */
    /* step t of the range: lanes 0-15 return the slab (page * heads_kv + kv head) of key
     * lane, lanes 16-31 the slot of key lane - 16 (-1: past the sequence); on entering a
     * unit, its metadata goes to the ring and its q rows are prefetched to L2 */
    auto load_step = [&](int t) -> int {
      if (t >= n) return -1;
      const int gs = rs + t;
      while (gs >= W.end) ps_win_load(p, W, W.base + 32, W.end);
      const int sl = __ffs(__ballot_sync(0xffffffffu, gs < W.incl)) - 1;
      const int incl = __shfl_sync(0xffffffffu, W.incl, sl);
      const int len = __shfl_sync(0xffffffffu, W.len, sl);
      const int page0 = __shfl_sync(0xffffffffu, W.page0, sl);
      const int nq = __shfl_sync(0xffffffffu, W.nq, sl);
      const int q0 = __shfl_sync(0xffffffffu, W.q0, sl);
      const int steps = ps_steps(len), tiles = (nq * p.group + 15) / 16;
      const int off = gs - (incl - tiles * p.hkv * steps), unit = off / steps;
      const int s = off - unit * steps, kvh = unit % p.hkv;
      if (s == 0 || t == 0) {
        const int tile = unit / p.hkv;
        if (lane == 0) {
          int *m = meta + (lu & (kPsMeta - 1)) * 8;
          m[0] = q0, m[1] = nq, m[2] = len, m[3] = tile, m[4] = kvh, m[5] = gs - s;
          m[6] = gs - s + steps;
        }
        lu++;
        const int R = tile * 16 + (lane & 15);
        if (R < nq * p.group) {
          const T *qrow = static_cast<const T *>(p.q) + (int64_t)(q0 + R / p.group) * p.q_ts +
                          (int64_t)(kvh * p.group + R % p.group) * p.q_hs + (lane >> 4) * (D / 2);
          asm volatile("prefetch.global.L2 [%0];\n" ::"l"(qrow));
        }
      }
      const int key = s * kPaStep + (lane & 15);
      if (key >= len) return -1;
      if (lane >= 16) return p.bs_shift >= 0 ? key & (p.bs - 1) : key % p.bs;
      const int64_t e = page0 + (p.bs_shift >= 0 ? key >> p.bs_shift : key / p.bs);
      int pg = __ldg(p.indices + e);
      if (p.err && (pg < 0 || pg >= p.num_pages)) {
        paged_flag(p.err, kPagedBadIndex, W.base + sl, e, pg);
        pg = 0;
      }
      return pg * p.hkv + kvh;
    };
    auto issue = [&](int t, int e) {
      if constexpr (AL) {
        /* lane 0: the slab of the step's first key, lane 16 its slot; lane 15 >= 0: the
         * step's last key is in the sequence (a whole step) */
        const int slab = __shfl_sync(0xffffffffu, e, 0);
        const int slot = __shfl_sync(0xffffffffu, e, 16);
        const int last = __shfl_sync(0xffffffffu, e, 15);
        if (last >= 0) {
          const int64_t off = (int64_t)slab * head_stride + (int64_t)slot * D + fc_g;
          const uint32_t so = (uint32_t)((t % S) * 2 * kPaStep * D * sizeof(T));
          const uint32_t sd[4] = {fc_s[0] + so, fc_s[1] + so, fc_s[2] + so, fc_s[3] + so};
          pa_fc_copy<0, true>(sd, kp + off, vp + off, pa_copy_policy<true>());
          return;
        }
      }
      if constexpr (TM) {
        /* lane 0: the slab of the step's first key; lane 16: its slot */
        const int slot = __shfl_sync(0xffffffffu, e, 16);
        if (lane == 0) {
          T *st = ring + (size_t)(t % S) * 2 * kPaStep * D;
          pa_tma_step(attn::smem_u32(st), attn::smem_u32(st + kPaStep * D), &p.tk, &p.tv,
                      bar0 + 8 * (t % S), e * p.bs + slot);
        }
        return;
      }
      pa_copy_step<T, D, true>(ring + (size_t)(t % S) * 2 * kPaStep * D, kp, vp, lane,
                         [&](int kr) -> int64_t {
                           const int slab = __shfl_sync(0xffffffffu, e, kr);
                           const int slot = __shfl_sync(0xffffffffu, e, kr + 16);
                           return slab >= 0 ? (int64_t)slab * head_stride + (int64_t)slot * D : -1;
                         });
    };

    int pq[S - 1 + A];
#pragma unroll
    for (int s = 0; s < S - 1 + A; s++) pq[s] = load_step(s);
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
      if (s < n) issue(s, pq[s]);
      if constexpr (!TM) attn::cp_async_commit();
    }
    int pw[A];
#pragma unroll
    for (int i = 0; i < A; i++) pw[i] = pq[S - 1 + i];

    const float qk_scale = p.softcap > 0 ? p.scale / p.softcap : p.scale * kLog2e;
    const float cap2 = p.softcap * kLog2e;
    /* AL: the fragment reads' per-lane offsets (pa_lds_offsets, pa_step's LB) */
    const pa_lds_base lb = AL ? pa_lds_offsets(g, tq4) : pa_lds_base{};
    float acc[NT][4], m_run[2], l_run[2];
    uint32_t qa[KS][4];
    int r_lo[2], r_hi[2];
    bool r_ok[2];
    int cu = 0, u_q0 = 0, u_nq = 0, u_len = 0, u_tile = 0, u_kvh = 0, u_s0 = 0, u_s1 = rs;

    /* the unit's rows: whole -> out / lse; cut -> a piece (+ the descriptor when this warp
     * holds the unit's last step) */
    auto flush = [&]() {
      const bool whole = u_s0 >= rs && u_s1 <= re;
      const int slot = u_s0 <= rs ? 0 : 1;
      const int64_t rows = (int64_t)u_nq * p.group;
#pragma unroll
      for (int rr = 0; rr < 2; rr++) {
        const float l = quad_sum(l_run[rr]);
        const int row = g + 8 * rr;
        const int64_t R = (int64_t)u_tile * 16 + row;
        if (R >= rows) continue;
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const float lse = l > 0.f ? (m_run[rr] + log2f(l)) * kLn2 : -INFINITY;
        if (whole) {
          const int64_t tok = u_q0 + R / p.group, head = (int64_t)u_kvh * p.group + R % p.group;
          T *o = static_cast<T *>(p.out) + tok * p.o_ts + head * p.o_hs + tq4 * 16;
#pragma unroll
          for (int h = 0; h < VH; h++) {
            uint32_t w[8];
#pragma unroll
            for (int e = 0; e < 4; e++) {
              w[e] = mma_m16n8k16<T>::pack(acc[8 * h + 2 * e][2 * rr] * inv,
                                           acc[8 * h + 2 * e + 1][2 * rr] * inv);
              w[4 + e] = mma_m16n8k16<T>::pack(acc[8 * h + 2 * e][2 * rr + 1] * inv,
                                               acc[8 * h + 2 * e + 1][2 * rr + 1] * inv);
            }
            *reinterpret_cast<uint4 *>(o + h * 64) = make_uint4(w[0], w[1], w[2], w[3]);
            *reinterpret_cast<uint4 *>(o + h * 64 + 8) = make_uint4(w[4], w[5], w[6], w[7]);
          }
          if (p.lse && tq4 == 0) p.lse[head * p.lse_hs + tok * p.lse_ts] = lse;
        } else {
          const int64_t pidx = ((int64_t)wg * 2 + slot) * 16 + row;
          float *o = p.sp_o + pidx * D + tq4 * 16;
#pragma unroll
          for (int h = 0; h < VH; h++)
#pragma unroll
            for (int c = 0; c < 2; c++)
#pragma unroll
              for (int e = 0; e < 8; e += 4)
                *reinterpret_cast<float4 *>(o + h * 64 + c * 8 + e) =
                    make_float4(acc[8 * h + e][2 * rr + c] * inv, acc[8 * h + e + 1][2 * rr + c] * inv,
                                acc[8 * h + e + 2][2 * rr + c] * inv,
                                acc[8 * h + e + 3][2 * rr + c] * inv);
          if (tq4 == 0) p.sp_lse[pidx] = lse;
        }
      }
      if (!whole && u_s0 < rs && u_s1 <= re) {
        dwa = u_s0 / P;
        dflag = 1 | (u_s0 == dwa * P ? 0 : 2);
        dq0 = u_q0, dnq = u_nq, dtile = u_tile, dkvh = u_kvh;
      }
    };

#pragma unroll 1
    for (int t = 0; t < n; t++) {
      if (t + S - 1 < n) issue(t + S - 1, pw[0]);
      if constexpr (!TM) attn::cp_async_commit();
#pragma unroll
      for (int i = 0; i < A - 1; i++) pw[i] = pw[i + 1];
      pw[A - 1] = load_step(t + S - 1 + A);
      if constexpr (TM) {
        pa_mbar_wait(bar0 + 8 * (t % S), (uint32_t)(t / S) & 1u);
      } else {
        attn::cp_async_wait<S - 1>();
        __syncwarp();
      }
#ifdef OT_PA_TRACE
      if (t == 0) PA_TR(0, 3, pa_gtime());
#endif
      const int gs = rs + t;
      if (gs >= u_s1) { /* a new unit (its metadata was written S - 1 + A steps ago) */
        if (t > 0) flush();
        const int *m = meta + (cu & (kPsMeta - 1)) * 8;
        cu++;
        u_q0 = m[0], u_nq = m[1], u_len = m[2], u_tile = m[3], u_kvh = m[4], u_s0 = m[5];
        u_s1 = m[6];
        pa_row_ranges(p, u_tile, g, u_nq, u_len, r_ok, r_lo, r_hi);
        pa_load_q<T, D>(p, u_q0, u_tile, u_kvh, g, tq4, r_ok, qa);
#pragma unroll
        for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
        m_run[0] = m_run[1] = -INFINITY;
        l_run[0] = l_run[1] = 0.f;
      }
      bool nomask = false;
      if constexpr (AL) { /* as the split kernel's */
        const int kb = (gs - u_s0) * kPaStep;
        bool whole = kb + kPaStep <= u_len;
#pragma unroll
        for (int rr = 0; rr < 2; rr++)
          whole = whole && (!r_ok[rr] || (kb >= r_lo[rr] && kb + kPaStep - 1 <= r_hi[rr]));
        nomask = __all_sync(0xffffffffu, whole);
      }
      pa_step<T, D, TM, AL, AL, AL>(
          ring + (size_t)(t % S) * 2 * kPaStep * D, qa, (gs - u_s0) * kPaStep, u_len, r_lo, r_hi,
          qk_scale, p.softcap, cap2, g, tq4, m_run, l_run, acc, nomask, lb);
    }
    if constexpr (!TM) attn::cp_async_wait<0>();
    PA_TR(0, 4, pa_gtime());
    PA_TR(0, 7, (unsigned long long)n);
    ot_pdl_launch_dependents();
    flush();
  }
  if (lane == 0) {
    p.desc[2 * wg] = make_int4(dflag, dwa, dq0, dnq);
    p.desc[2 * wg + 1] = make_int4(dtile, dkvh, 0, 0);
  }
  PA_TR(0, 5, pa_gtime());
  PA_TR(0, 6, (unsigned long long)pa_smid());
}

/* Merge of the stream kernel's cut units: CTA w takes descriptor w's unit (pieces of warps
 * wa .. w), warp r its rows r, r + 4, ...: the pieces' lse in lanes (one load round for up
 * to 32 pieces), lse = log sum_i exp(lse_i), then O = sum_i exp(lse_i - lse) O_i with the
 * O_i loads independent (lane: D / 32 features). */
template <typename T, int D>
__global__ void __launch_bounds__(kPaThreads) ps_merge_kernel(const __grid_constant__ pa_params p) {
  constexpr int V = D / 32;
  PA_TR(1, 0, pa_gtime());
  ot_pdl_wait();
  PA_TR(1, 1, pa_gtime());
  ot_pdl_launch_dependents(); /* as pa_merge_kernel */
  const int lane = threadIdx.x & 31, w = blockIdx.x;
  const int4 d0 = p.desc[2 * w];
  if (!(d0.x & 1)) return;
  const int4 d1 = p.desc[2 * w + 1];
  const int wa = d0.y, n = w - wa + 1;
  /* piece i of row r sits at (wa + i) * 32 + r (slot 0), piece 0 in slot d0.x >> 1 & 1; int:
   * the pieces are 32 x the warps of one wave */
  const int first = wa * 32 + ((d0.x >> 1) & 1) * 16;
  const int64_t rows = (int64_t)d0.w * p.group;
  const int64_t tok0 = d0.z, R0 = (int64_t)d1.x * 16, head0 = (int64_t)d1.y * p.group;
  for (int r = threadIdx.x >> 5; r < 16 && R0 + r < rows; r += kPaWarps) {
    /* lane i's pieces i, i + 32, ...: M, then L (weights of round 0 kept in wl0) */
    float M = -INFINITY;
    for (int i = lane; i < n; i += 32) {
      const int pi = i == 0 ? first + r : (wa + i) * 32 + r;
      M = fmaxf(M, __ldcg(p.sp_lse + pi));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float L = 0.f;
    if (M != -INFINITY)
      for (int i = lane; i < n; i += 32) {
        const int pi = i == 0 ? first + r : (wa + i) * 32 + r;
        const float ls = __ldcg(p.sp_lse + pi);
        if (ls != -INFINITY) L += expf(ls - M);
      }
    L = warp_sum(L);
    const float lse = M != -INFINITY ? M + logf(L) : -INFINITY;
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; v++) acc[v] = 0.f;
    if (M != -INFINITY)
      for (int i0 = 0; i0 < n; i0 += 32) {
        const int i = i0 + lane;
        const int pi = i == 0 ? first + r : (wa + i) * 32 + r;
        const float ls = i < n ? __ldcg(p.sp_lse + pi) : -INFINITY;
        const float wl = ls != -INFINITY ? expf(ls - lse) : 0.f;
        const int cnt = n - i0 < 32 ? n - i0 : 32;
        for (int j = 0; j < cnt; j++) {
          const float wt = __shfl_sync(0xffffffffu, wl, j);
          const int pj = i0 + j == 0 ? first + r : (wa + i0 + j) * 32 + r;
          const float *src = p.sp_o + (int64_t)pj * D + lane * V;
          if constexpr (V == 4) {
            const float4 o = __ldcg(reinterpret_cast<const float4 *>(src));
            acc[0] += wt * o.x, acc[1] += wt * o.y, acc[2] += wt * o.z, acc[3] += wt * o.w;
          } else {
#pragma unroll
            for (int v = 0; v < V; v++) acc[v] += wt * __ldcg(src + v);
          }
        }
      }
    const int64_t R = R0 + r;
    const int64_t tok = tok0 + R / p.group, head = head0 + R % p.group;
    T *o = static_cast<T *>(p.out) + tok * p.o_ts + head * p.o_hs + lane * V;
#pragma unroll
    for (int v = 0; v < V; v++) o[v] = from_f32<T>(acc[v]);
    if (p.lse && lane == 0) p.lse[head * p.lse_hs + tok * p.lse_ts] = lse;
  }
  PA_TR(1, 5, pa_gtime());
  PA_TR(1, 6, (unsigned long long)pa_smid());
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

/* Dynamic shared memory of a split-kernel instance: the rings (the TMA ones aligned to
 * 1024 bytes inside it, hence 1 KB more). */
template <int D, int S, typename P, int NW = kPaWarps> constexpr size_t pa_smem_of() {
  return (size_t)NW * S * pa_cfg<D, S>::kStageBytes + (pa_is_tm<P>::value ? 1024 : 0);
}

/* The kernel's shared-memory attributes (dynamic size past 48 KB, the largest carveout so
 * that 2 CTAs fit an SM) and its CTAs per SM on the context's device, both once per
 * device (first 16 devices: occupancy differs between GPU models). 0 on failure. Host
 * threads may ask at once: an entry is stored (release) after the attributes are set and
 * read with acquire, so a thread that finds it launches after the attributes. */
template <typename K>
static int pa_kernel_ctas_per_sm(K kernel, size_t smem, int dev, std::atomic<int> *cached,
                                 int threads = kPaThreads) {
  if (dev >= 0 && dev < 16) {
    const int c = cached[dev].load(std::memory_order_acquire);
    if (c != 0) return c > 0 ? c : 0;
  }
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
          cudaSuccess ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           (int)cudaSharedmemCarveoutMaxShared) != cudaSuccess) {
    (void)cudaGetLastError();
    if (dev >= 0 && dev < 16) cached[dev].store(-1, std::memory_order_release);
    return 0;
  }
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) !=
          cudaSuccess || n < 1) {
    (void)cudaGetLastError();
    n = 1;
  }
  if (dev >= 0 && dev < 16) cached[dev].store(n, std::memory_order_release);
  return n;
}
template <typename T, int D, int S, bool XT, typename P = pa_params, bool AL = false,
          int NW = kPaWarps>
static int pa_ctas_per_sm(int dev) {
  /* > 0: CTAs per SM; -1: the shared memory is not available ("= {}": see pdl.cuh) */
  static std::atomic<int> cached[16] = {};
  return pa_kernel_ctas_per_sm(pa_mma_kernel<T, D, S, XT, P, AL, NW>, pa_smem_of<D, S, P, NW>(),
                               dev, cached, 32 * NW);
}
template <typename T, int D, int S, typename P = pa_params, bool AL = false>
static int ps_ctas_per_sm(int dev) {
  static std::atomic<int> cached[16] = {};
  return pa_kernel_ctas_per_sm(ps_kernel<T, D, S, P, AL>, pa_smem_of<D, S, P>(), dev, cached);
}

#ifdef OT_PA_TMA /* experiment builds: the TMA ring (decode round 7: slower back to back) */
/* Whether the TMA instances may run on cs's device: built with sm_90a code (the instances
 * of the sm_80 pass trap), a 9.0 device, the kernel's binary for it (ptx >= 90), and the
 * driver's tensor-map encoder. Once per device. */
template <typename T>
static bool pa_tma_kernel_ok(const ot_cuda_state *cs) {
#ifdef OT_HAVE_SM90A
  static std::atomic<int> cached[16] = {};
  return ot_per_device(cs, cached, [cs]() {
           bool ok = cs->cc_major == 9 && cs->cc_minor == 0 && sm90::encode_fn() != NULL;
           if (ok) {
             cudaFuncAttributes fa;
             if (cudaFuncGetAttributes(&fa, pa_mma_kernel<T, 128, 3, false, pa_params_tm>) ==
                 cudaSuccess)
               ok = fa.ptxVersion >= 90 && fa.binaryVersion >= 90;
             else
               ok = false, (void)cudaGetLastError();
           }
           return ok ? 1 : -1;
         }) > 0;
#else
  (void)cs;
  return false;
#endif
}

/* The tensor map of k_pages or v_pages for the TMA instance (pa_params_tm): {64, 2, rows}
 * elements, rows = pages x heads_kv x block_size of 256 bytes, box {64, 2, 16}, 128-byte
 * swizzle. False when the driver refuses it. */
static bool pa_encode_pages(CUtensorMap *m, const void *base, bool bf16, int64_t rows) {
  PFN_cuTensorMapEncodeTiled_v12000 fn = sm90::encode_fn();
  if (!fn) return false;
  cuuint64_t dims[3] = {64, 2, (cuuint64_t)rows};
  cuuint64_t strides[2] = {128, 256};
  cuuint32_t box[3] = {64, 2, (cuuint32_t)kPaStep};
  cuuint32_t estr[3] = {1, 1, 1};
  return fn(m, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
            const_cast<void *>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* Whether a call may take the TMA ring: head_dim 128 (checked by the caller), pages of a
 * multiple of 16 keys, 16-byte aligned page arrays, and pages x heads_kv x block_size
 * rows within int32 (the copy's row coordinate). */
static bool pa_tma_shape_ok(const pa_params &p) {
  return p.bs % kPaStep == 0 && ((uintptr_t)p.k_pages & 15) == 0 &&
         ((uintptr_t)p.v_pages & 15) == 0 &&
         (double)p.num_pages * p.hkv * p.bs < 2147483647.0;
}

#endif

/* Whether the merge kernel may be launched as a programmatic dependent (PDL) of the main
 * kernel on this device (ot_pdl_ok, pdl.cuh: its sm_90 code waits for the partials). */
template <typename T, int D>
static bool pa_merge_pdl(const ot_cuda_state *cs) {
  static std::atomic<int> cached[16] = {}; /* 1: yes, -1: no */
  return ot_pdl_ok(cs, pa_merge_kernel<T, D>, cached);
}
template <typename T, int D, int NA>
static bool pa_merge1_pdl(const ot_cuda_state *cs) {
  static std::atomic<int> cached[16] = {};
  return ot_pdl_ok(cs, pa_merge1_kernel<T, D, NA>, cached);
}

/* The kernel's chunk for s splits of len keys (>= min_chunk: one step per warp, 64 keys
 * for 4-warp CTAs, 128 for 8-warp ones; a multiple of 64) and the splits that chunk leaves
 * non-empty. */
static int64_t pa_chunk(int64_t len, int64_t s, int64_t *nonempty, int64_t min_chunk = kPaMinChunk) {
  int64_t chunk = (len + s - 1) / s;
  chunk = chunk < min_chunk ? min_chunk : (chunk + 63) / 64 * 64;
  *nonempty = len > 0 ? (len + chunk - 1) / chunk : 1;
  return chunk;
}

/* Splits per sequence: among s = 1 .. ceil(len / min_chunk), the wave-quantized time
 * ceil(base * s' / slots) * chunk(s) (s' = the non-empty splits of that chunk), the fewest
 * splits within 2% of the best; returns s' (so no split is empty at the estimated len). */
static double pa_plan_cost(int64_t base, int64_t est_len, int64_t slots, int64_t s, int64_t *ne,
                           int64_t min_chunk) {
  const int64_t chunk = pa_chunk(est_len, s, ne, min_chunk);
  const int64_t waves = (base * *ne + slots - 1) / slots;
  /* chunks under kPaWaveChunk keys only in a launch of one wave: the model ignores each
   * CTA's fixed start, and with chunks of 64 it chose 32 splits of 128 keys (63 waves) at
   * 64 x 4k, 3.4x slower than one split (H200, docs/PERFORMANCE.md) */
  if (s > 1 && chunk < kPaWaveChunk && waves > 1) return 1e300;
  return (double)waves * (double)chunk;
}
static int pa_plan_splits(int64_t base, int64_t est_len, int64_t slots,
                          int64_t min_chunk = kPaMinChunk) {
  /* the plan depends on these four only, and they repeat from call to call (every layer
   * of a decode step; every step until the table grows): the last one per minimum chunk
   * (4- and 8-warp CTAs) is kept per host thread. The scan (up to 2 x 1024 chunks since s
   * reaches ceil(len / 64), three 64-bit divisions each) took 18-32 us of host time per
   * call at 128 x 32k / 1 x 64k. */
  static thread_local int64_t last_args[2][3] = {{-1, -1, -1}, {-1, -1, -1}};
  static thread_local int last_splits[2] = {1, 1};
  const int ci = min_chunk == kPaMinChunk ? 0 : 1;
  if (base == last_args[ci][0] && est_len == last_args[ci][1] && slots == last_args[ci][2])
    return last_splits[ci];
  /* rounded up: a table of 2080 keys (the engine's, sized for max_len) may take 33 chunks of
   * 64, which rounding down ruled out (17 of 128 instead) */
  int64_t max_s = (est_len + min_chunk - 1) / min_chunk;
  if (max_s < 1) max_s = 1;
  if (max_s > 1024) max_s = 1024;
  double best = 1e30;
  int64_t ne;
  for (int64_t s = 1; s <= max_s; s++) {
    const double c = pa_plan_cost(base, est_len, slots, s, &ne, min_chunk);
    if (c < best) best = c;
  }
  int splits = 1;
  for (int64_t s = 1; s <= max_s; s++)
    if (pa_plan_cost(base, est_len, slots, s, &ne, min_chunk) <= best * 1.02) {
      splits = (int)ne;
      break;
    }
  last_args[ci][0] = base, last_args[ci][1] = est_len, last_args[ci][2] = slots;
  last_splits[ci] = splits;
  return splits;
}

/* Context scratch for the OT_DEBUG flag (first 256 bytes, cleared) and the split
 * partials after it (part_o 256-byte aligned: the merge reads it in float4 / float2);
 * p.err / p.part_* point into it. */
static ot_status pa_scratch(ot_context *ctx, pa_params &p, bool debug, size_t partial_bytes,
                            const char *op) {
  if (!debug && partial_bytes == 0) return OT_OK;
  char *scr = (char *)ot_cuda_scratch(ctx, 256 + partial_bytes + (partial_bytes ? 256 : 0), op);
  if (!scr) return OT_ERR_OOM;
  if (debug) {
    p.err = (int *)scr;
    OT_CUDA_CHECK(op, cudaMemsetAsync(p.err, 0, 4 * sizeof(int), (cudaStream_t)ctx->stream));
  }
  if (partial_bytes) {
    const size_t rs = (size_t)p.tq * p.hq;
    const size_t lse_bytes = ((size_t)p.splits * rs * sizeof(float) + 255) / 256 * 256;
    p.part_lse = (float *)(scr + 256);
    p.part_o = (float *)(scr + 256 + lse_bytes);
  }
  return OT_OK;
}

/* The OT_* knobs of one call, read in one pass over the environment (ot_env_scan,
 * common.cuh): tests switch them at run time (setenv), so they are read at every call,
 * and six getenv calls scanned the environment six times. */
struct pa_env {
  bool debug;       /* OT_DEBUG set and not "0" (ot_paged_debug_on) */
  bool simple;      /* OT_PAGED_SIMPLE set */
  int kernel;       /* OT_PAGED_KERNEL: 1 split, 2 stream, 0 unset (or another value) */
  bool splits_set;  /* OT_PAGED_SPLITS set (any value keeps the split kernel) */
  int splits;       /* its value when > 0 (at most 65535), else 0 */
  int stream_ctas;  /* OT_PAGED_STREAM_CTAS when > 0, else 0 */
  bool pdl;         /* OT_PAGED_PDL not "0": main kernels launched as programmatic dependents */
  bool tma;         /* OT_PAGED_TMA (experiment builds, -DOT_PA_TMA): "1" the TMA ring where
                     * it can run (unset: OT_PA_TMA_DEFAULT) */
  bool aligned;     /* OT_PAGED_ALIGNED not "0": the AL instance for pages of 16 x m keys */
  int warps;        /* OT_PAGED_WARPS: 4 or 8 forces the split kernel's CTA size (8: AL
                     * calls without the early start), 0 the plan's choice */
  int merge;        /* OT_PAGED_MERGE: "0" pa_merge_kernel, "2" pa_merge1_kernel with 16
                     * O rows ahead, else 1: pa_merge1_kernel (8 ahead); unset:
                     * OT_PA_MERGE1_DEFAULT */
  int guess;        /* OT_PAGED_GUESS: "0" no page-id guess (pa_params.chunk1), "b1" at
                     * batch 1 only (the rule before 2026-12-05), else 2: at batch 1 and
                     * at batch > 1 with even shares */
};

#ifndef OT_PA_MERGE1_DEFAULT
#define OT_PA_MERGE1_DEFAULT 1
#endif

#ifndef OT_PA_TMA_DEFAULT
#define OT_PA_TMA_DEFAULT 0
#endif

static pa_env pa_read_env() {
  pa_env e;
  memset(&e, 0, sizeof e);
  e.pdl = true;
  e.tma = OT_PA_TMA_DEFAULT != 0;
  e.aligned = true;
  e.merge = OT_PA_MERGE1_DEFAULT != 0 ? 1 : 0;
  e.guess = 2;
  ot_env_scan("OT_", [&](const char *name, size_t n, const char *val) {
    const auto is = [&](const char *full) { return ot_env_name_is(name, n, full); };
    if (is("OT_DEBUG")) {
      e.debug = ot_paged_debug_on(val);
    } else if (is("OT_PAGED_SIMPLE")) {
      e.simple = true;
    } else if (is("OT_PAGED_KERNEL")) {
      e.kernel = strcmp(val, "split") == 0 ? 1 : strcmp(val, "stream") == 0 ? 2 : 0;
    } else if (is("OT_PAGED_SPLITS")) {
      const int x = atoi(val);
      e.splits_set = true;
      e.splits = x > 0 ? (x < 65535 ? x : 65535) : 0;
    } else if (is("OT_PAGED_STREAM_CTAS")) {
      const int x = atoi(val);
      e.stream_ctas = x > 0 ? x : 0;
    } else if (is("OT_PAGED_PDL")) {
      e.pdl = !ot_env_is_zero(val);
    } else if (is("OT_PAGED_TMA")) {
      e.tma = !ot_env_is_zero(val);
    } else if (is("OT_PAGED_ALIGNED")) {
      e.aligned = !ot_env_is_zero(val);
    } else if (is("OT_PAGED_WARPS")) {
      const int x = atoi(val);
      e.warps = x == 4 || x == 8 ? x : 0;
    } else if (is("OT_PAGED_MERGE")) {
      e.merge = ot_env_is_zero(val) ? 0 : strcmp(val, "2") == 0 ? 2 : 1;
    } else if (is("OT_PAGED_GUESS")) {
      e.guess = ot_env_is_zero(val) ? 0 : strcmp(val, "b1") == 0 ? 1 : 2;
    }
  });
  return e;
}

#ifdef OT_PA_TMA
/* The TMA instances' parameters (pa_params_tm: p and the two tensor maps) when the call
 * takes the TMA ring (OT_PAGED_TMA, pa_tma_shape_ok, pa_tma_kernel_ok, both maps encoded). */
template <typename T>
static bool pa_tma_params(const ot_cuda_state *cs, const pa_env &env, const pa_params &p,
                          pa_params_tm *tp) {
  if (!env.tma || p.d != 128 || !pa_tma_shape_ok(p) || !pa_tma_kernel_ok<T>(cs)) return false;
  memset(tp, 0, sizeof *tp);
  static_cast<pa_params &>(*tp) = p;
  const int64_t rows = p.num_pages * p.hkv * p.bs;
  const bool bf16 = std::is_same<T, __nv_bfloat16>::value;
  return pa_encode_pages(&tp->tk, p.k_pages, bf16, rows) &&
         pa_encode_pages(&tp->tv, p.v_pages, bf16, rows);
}
#endif

/* What the last call on this host thread launched: bench/decode_shim.c reports it, so the
 * benchmark checks that a forced kernel ran (kernel 1 split, 2 stream, 3 simple); flags:
 * 1 a programmatic dependent, 4 an early start (paged_kv_ready; 2 is unused: it marked a
 * merge fused into the split kernel, measured and removed), 8 the TMA ring (experiment
 * builds), 16 the aligned-page (AL) instance, 32 8-warp CTAs (64 marked the opt-in
 * OT_PAGED_VARIANT kernels of decode round 9, removed: the AL instances are round 9's "lds";
 * 128 / 256 the bulk ring of decode round 11, removed; 512 / 1024 the V fragments by
 * ldmatrix.trans of decode round 12, OT_PAGED_PV=ldsm / ldsm2, removed). */
struct pa_plan_rec {
  int kernel, splits, ctas, flags;
};
static thread_local pa_plan_rec pa_last_plan;

/* A main kernel (dynamic shared memory smem), as a programmatic dependent of the previous
 * kernel on st when pdl: its CTAs may become resident while that kernel drains, and wait
 * (griddepcontrol.wait, before their first global access) for its completion. */
template <typename K, typename P>
static cudaError_t pa_launch_main(bool pdl, K *f, unsigned grid, size_t smem, cudaStream_t st,
                                  const P &p, int threads = kPaThreads) {
  return ot_launch_pdl_smem(pdl, f, dim3(grid), dim3(threads), smem, st, p);
}

/* One instance of the split kernel (its shared memory attributes once per device), ctas
 * CTAs as a programmatic dependent when pdl. */
template <typename T, int D, int S, bool XT, typename P, bool AL, int NW = kPaWarps>
static ot_status pa_launch_inst(const ot_cuda_state *cs, bool pdl, int64_t ctas, cudaStream_t s,
                                const P &p, const char *op) {
  const size_t smem = pa_smem_of<D, S, P, NW>();
  if (pa_ctas_per_sm<T, D, S, XT, P, AL, NW>(cs->device) < 1)
    return ot_error(OT_ERR_BACKEND, op, "cannot give the decode kernel %zu bytes of shared memory",
                    smem);
  OT_CUDA_CHECK(op, pa_launch_main(pdl, pa_mma_kernel<T, D, S, XT, P, AL, NW>, (unsigned)ctas,
                                   smem, s, p, 32 * NW));
  return OT_OK;
}

/* Keys within one split must fit int32 (the kernel indexes them relative to the split's
 * first key): with more than 2^30 keys in the whole table (kv.indices x block_size, an
 * upper bound of every sequence's length) the plan takes at least that many / 2^30 splits,
 * so that no chunk exceeds 2^30 keys (ceil(len / splits) <= 2^30, rounded up to a
 * multiple of 64). */
static int pa_min_splits(const pa_params &p) {
  const double keys = (double)p.num_indices * p.bs;
  const double lim = 1073741824.0;
  return keys > lim ? (int)ceil(keys / lim) : 1;
}

template <typename T, int D, int S>
static ot_status pa_launch_mma(ot_context *ctx, pa_params &p, const pa_env &env, const char *op) {
  cudaStream_t s = (cudaStream_t)ctx->stream;
  /* tiles = sum_b ceil(n_b * group / 16): at most (T * group + 15 * batch) / 16 (each term
   * is at most (n_b group + 15) / 16; exact at batch 1), and at most T * ceil(group / 16)
   * (ceil(n g / 16) <= n ceil(g / 16)), which leaves a decode grid (one token per
   * sequence, group <= 16) no slot past its tiles either. batch + ceil(T group / 16) in
   * place of the first launched twice the CTAs at batch 1, half of them exiting after a
   * round of table reads (and, with T ceil(group / 16) beside it, still at batch-1
   * speculative calls: 2 slots for 1 tile at T 4, group 4). */
  int64_t tiles_upper = (p.tq * p.group + 15 * p.batch) / 16;
  if (p.tq * ((p.group + 15) / 16) < tiles_upper) tiles_upper = p.tq * ((p.group + 15) / 16);
  const ot_cuda_state *cs = ot_cuda_state_of(ctx);
  const int per_sm = pa_ctas_per_sm<T, D, S, false>(cs->device);
  if (per_sm < 1)
    return ot_error(OT_ERR_BACKEND, op, "cannot give the decode kernel %zu bytes of shared memory",
                    pa_cfg<D, S>::kSmem);
  /* estimates for the plan: equal queries per sequence, keys from the table's size */
  const int64_t qps = (p.tq + p.batch - 1) / p.batch;
  const int64_t tiles_est = p.batch * ((qps * p.group + 15) / 16);
  const int64_t est_len = p.num_indices * p.bs / p.batch;
  const int64_t slots = (int64_t)cs->sm_count * per_sm;
  int splits = pa_plan_splits(tiles_est * p.hkv, est_len, slots);
  /* The XT kernel (head_dim 128): the early start the caller allows (p.early; not under
   * OT_DEBUG, whose flag memset is no kernel); the other head dims ignore it */
#ifdef OT_PA_FORCE_EARLY /* A/B builds: every call as if the caller set paged_kv_ready */
  p.early = 1;
#endif
  if (D != 128 || env.debug) p.early = 0;
  const bool xt = p.early != 0;
  /* the AL instances: pages of 16 x m keys (OT_PAGED_ALIGNED not 0) */
  const bool al = D == 128 && env.aligned && p.bs % kPaStep == 0;
  /* 8-warp CTAs (AL, no early start; OT_PAGED_WARPS=8 / 4 forces them / the 4-warp ones):
   * one CTA per SM with the same 8 warps, so a launch that the 4-warp plan splits only to
   * fill the GPU takes half the splits: taken where the 8-warp plan is one wave filling at
   * least 90% of the SMs with one split (no merge) and the 4-warp plan has splits to merge
   * (16 x 4k: 3.80 vs 3.66 TB/s, decode round 7; 16 x 512 12.25 vs 15.04 us). Until
   * 2026-12-02 (twentieth session) also where both plans merge splits; measured then (H200,
   * 12 rounds, bench/results/decode_warps_ab.json, us, 8 / 4 warps): 1 x 2k 10.53 / 10.28,
   * 4 x 2k 15.15 / 14.87, 1 x 8k 14.28 / 14.34, 1 x 64k 73.78 / 73.77, 2 x 4k 14.94 / 14.94:
   * the 4-warp plan there. More warps an SM (twenty-ninth session, 2026-12-04; experiment
   * commit 8d40302, bench/results/decode_warps_wx.json): 6-warp CTAs with 2-stage rings two
   * an SM, 9 warps with 3 stages, 10 / 12 with 2, one an SM -- past 8 warps an SM a
   * scheduler holds 3 of them and ptxas gives 168 registers, spilling 88-96 bytes -- lost
   * at every shape (16 x 4k 0.80-0.98x, 64 x 1k 0.77-0.95x, 64 x 4k 0.80-0.96x): removed.
   * Fewer warps a CTA (forty-fifth session, 2026-12-07; experiment commit 752a564, H100,
   * bench/results/decode_w2_ab_h100.json): 2-warp CTAs four an SM, so that 64 x 1k's 512
   * units run one split each in one wave (the 4-warp plan's 512 CTAs are 1.94 waves):
   * 64 x 1k 98.95 vs 99.37 us, 64 x 2k 186.66 vs 185.95 (A/A 99.40 / 185.96) -- the second
   * wave costs nothing in a memory-bound launch -- and 32 x 2k / 16 x 4k 6% / 4% slower
   * (its plan split them): removed. */
  bool w8 = false;
  if constexpr (D == 128) {
    if (al && !xt && env.warps != 4) {
      const int per8 = pa_ctas_per_sm<T, D, S, false, pa_params, true, 8>(cs->device);
      if (per8 >= 1) {
        const int64_t slots8 = (int64_t)cs->sm_count * per8;
        const int s8 = pa_plan_splits(tiles_est * p.hkv, est_len, slots8, 8 * kPaStep);
        const int64_t ctas8 = tiles_upper * p.hkv * s8;
        w8 = env.warps == 8 ||
             (splits > 1 && s8 == 1 && ctas8 <= slots8 && ctas8 * 10 >= slots8 * 9);
        if (w8) splits = s8;
      }
    }
  }
  const int64_t min_chunk = w8 ? 8 * kPaStep : kPaMinChunk;
  if (splits > 65535) splits = 65535;
  if (env.splits > 0) splits = env.splits; /* benchmarking / tests: force a count */
  const int min_splits = pa_min_splits(p);
  if (splits < min_splits) splits = min_splits;
  p.splits = splits;
  /* The kernel's page-id guess (pa_params.chunk1): at batch 1, and at batch > 1 where
   * kv.indices and the queries divide evenly among the sequences (a batch of equal
   * lengths: the benchmarks', the engine's batched decode) into a power of two of tiles
   * each (a decode's 1 at groups <= 16). A wrong guess costs the
   * CTA its guessed loads (S - 1 + A per lane) and nothing else. */
  if (p.num_indices % p.batch == 0 && p.tq % p.batch == 0 && p.num_indices > 0 &&
      (env.guess == 2 || (env.guess == 1 && p.batch == 1))) {
    int64_t ne;
    const int64_t pps = p.num_indices / p.batch;
    const int64_t tps = (p.tq / p.batch * p.group + 15) / 16; /* tiles per sequence */
    int sh = 0;
    while (((int64_t)1 << sh) < tps) sh++;
    if (p.batch == 1 || ((int64_t)1 << sh) == tps) { /* else no guess */
      p.spec_pps = p.batch == 1 ? 0 : pps;
      p.spec_tshift = p.batch == 1 ? 0 : sh;
      p.chunk1 = pa_chunk(pps * p.bs, splits, &ne, min_chunk);
    }
  }
  const size_t partial = splits > 1 ? (size_t)splits * p.tq * p.hq * (D + 1) * sizeof(float) : 0;
  const double ctas_d = (double)tiles_upper * p.hkv * splits;
  const int64_t ctas = ctas_d <= 0x7fffffff ? tiles_upper * p.hkv * splits : 0;
  if (ctas_d > 0x7fffffff)
    return ot_error(OT_ERR_UNSUPPORTED, op, "grid too large (%lld tiles x %d kv heads x %d splits)",
                    (long long)tiles_upper, p.hkv, splits);
  OT_TRY(pa_scratch(ctx, p, env.debug, partial, op));
  /* not after the OT_DEBUG flag's memset: programmatic dependence is between kernels (asked
   * of the plain instance for both: the XT one is the same file's code, same PTX version) */
  static std::atomic<int> main_pdl[16] = {};
  const bool pdl = env.pdl && !env.debug && ot_pdl_ok(cs, pa_mma_kernel<T, D, S, false>, main_pdl);
  /* the instance: the TMA ring (OT_PAGED_TMA, experiment builds), the aligned-page ones
   * (AL, 4 or 8 warps), else the general one */
  bool tm = false;
#ifdef OT_PA_TMA
  pa_params_tm tp;
  if constexpr (D == 128) {
    tm = pa_tma_params<T>(cs, env, p, &tp);
    if (tm) {
      if (xt) OT_TRY((pa_launch_inst<T, D, S, true, pa_params_tm, false>(cs, pdl, ctas, s, tp, op)));
      else OT_TRY((pa_launch_inst<T, D, S, false, pa_params_tm, false>(cs, pdl, ctas, s, tp, op)));
    }
  }
#endif
  if (!tm) {
    if constexpr (D == 128) {
      if (w8) OT_TRY((pa_launch_inst<T, D, S, false, pa_params, true, 8>(cs, pdl, ctas, s, p, op)));
      else if (al && xt) OT_TRY((pa_launch_inst<T, D, S, true, pa_params, true>(cs, pdl, ctas, s, p, op)));
      else if (al) OT_TRY((pa_launch_inst<T, D, S, false, pa_params, true>(cs, pdl, ctas, s, p, op)));
      else if (xt) OT_TRY((pa_launch_inst<T, D, S, true, pa_params, false>(cs, pdl, ctas, s, p, op)));
      else OT_TRY((pa_launch_inst<T, D, S, false, pa_params, false>(cs, pdl, ctas, s, p, op)));
    } else {
      OT_TRY((pa_launch_inst<T, D, S, false, pa_params, false>(cs, pdl, ctas, s, p, op)));
    }
  }
  pa_last_plan = pa_plan_rec{1, splits, (int)ctas,
                             (pdl ? 1 : 0) | (p.early ? 4 : 0) | (tm ? 8 : 0) |
                                 (al && !tm ? 16 : 0) | (w8 && !tm ? 32 : 0) |
                                 (PA_GUESS_ON(p) ? 2048 : 0)};
  if (splits > 1) {
    const int64_t rows = p.tq * p.hq;
    if (rows > 0x7fffffff)
      return ot_error(OT_ERR_UNSUPPORTED, op, "merge grid too large (%lld rows)", (long long)rows);
    if (env.merge == 2)
      OT_CUDA_CHECK(op, ot_launch_pdl(pa_merge1_pdl<T, D, 16>(cs), pa_merge1_kernel<T, D, 16>,
                                      dim3((unsigned)rows), dim3(kPaThreads), s, p));
    else if (env.merge == 1)
      OT_CUDA_CHECK(op, ot_launch_pdl(pa_merge1_pdl<T, D, kPaMergeAhead>(cs),
                                      pa_merge1_kernel<T, D, kPaMergeAhead>,
                                      dim3((unsigned)rows), dim3(kPaThreads), s, p));
    else
      OT_CUDA_CHECK(op, ot_launch_pdl(pa_merge_pdl<T, D>(cs), pa_merge_kernel<T, D>,
                                      dim3((unsigned)rows), dim3(kPaThreads), s, p));
  }
  return OT_OK;
}

/* The stream kernel: one wave of CTAs, scratch for the pieces (2 x 16 rows per warp) and
 * the descriptors, then the merge kernel over the descriptors. */
template <typename T, int D, int S>
static ot_status ps_launch(ot_context *ctx, pa_params &p, const pa_env &env, const char *op) {
  cudaStream_t s = (cudaStream_t)ctx->stream;
  const ot_cuda_state *cs = ot_cuda_state_of(ctx);
  const int per_sm = ps_ctas_per_sm<T, D, S>(cs->device);
  if (per_sm < 1)
    return ot_error(OT_ERR_BACKEND, op, "cannot give the decode kernel %zu bytes of shared memory",
                    pa_cfg<D, S>::kSmem);
  int ctas = cs->sm_count * per_sm;
  if (env.stream_ctas > 0 && env.stream_ctas < ctas) ctas = env.stream_ctas; /* tests: smaller */
  const int wtot = ctas * kPaWarps;
  const size_t desc_b = (size_t)wtot * 2 * sizeof(int4), lse_b = (size_t)wtot * 32 * sizeof(float);
  const size_t o_b = (size_t)wtot * 32 * D * sizeof(float);
  char *scr = (char *)ot_cuda_scratch(ctx, 256 + desc_b + lse_b + o_b, op);
  if (!scr) return OT_ERR_OOM;
  if (env.debug) {
    p.err = (int *)scr;
    OT_CUDA_CHECK(op, cudaMemsetAsync(p.err, 0, 4 * sizeof(int), s));
  }
  p.desc = (int4 *)(scr + 256);
  p.sp_lse = (float *)(scr + 256 + desc_b);
  p.sp_o = (float *)(scr + 256 + desc_b + lse_b);
  static std::atomic<int> main_pdl[16] = {};
  const bool pdl = env.pdl && !env.debug && ot_pdl_ok(cs, ps_kernel<T, D, S>, main_pdl);
  bool tm = false;
#ifdef OT_PA_TMA /* the TMA ring (OT_PAGED_TMA) as the split kernel's */
  pa_params_tm tp;
  tm = pa_tma_params<T>(cs, env, p, &tp) &&
       ps_ctas_per_sm<T, D, S, pa_params_tm>(cs->device) == per_sm;
  if (tm)
    OT_CUDA_CHECK(op, pa_launch_main(pdl, ps_kernel<T, D, S, pa_params_tm>, (unsigned)ctas,
                                     pa_smem_of<D, S, pa_params_tm>(), s, tp));
#endif
  /* the AL instance (pages of 16 x m keys, OT_PAGED_ALIGNED not 0) where it fits the same
   * grid */
  const bool al = !tm && D == 128 && env.aligned && p.bs % kPaStep == 0 &&
                  ps_ctas_per_sm<T, D, S, pa_params, true>(cs->device) == per_sm;
  if (al) {
    OT_CUDA_CHECK(op, pa_launch_main(pdl, ps_kernel<T, D, S, pa_params, true>, (unsigned)ctas,
                                     pa_cfg<D, S>::kSmem, s, p));
  } else if (!tm)
    OT_CUDA_CHECK(op, pa_launch_main(pdl, ps_kernel<T, D, S>, (unsigned)ctas, pa_cfg<D, S>::kSmem,
                                     s, p));
  pa_last_plan = pa_plan_rec{2, 1, ctas, (pdl ? 1 : 0) | (tm ? 8 : 0) | (al ? 16 : 0)};
  static std::atomic<int> pdl_cached[16] = {};
  OT_CUDA_CHECK(op, ot_launch_pdl(ot_pdl_ok(cs, ps_merge_kernel<T, D>, pdl_cached),
                                  ps_merge_kernel<T, D>, dim3((unsigned)wtot), dim3(kPaThreads), s,
                                  p));
  return OT_OK;
}

/* Whether the stream kernel can take a call: no left window, 16-byte aligned out rows, slab
 * ids, sequence lengths (at most entries of kv.indices x block_size; the kernel keeps them
 * in int) and step counts within int32. */
static bool ps_wanted(const pa_params &p, bool out_aligned, int per_sm) {
  if (per_sm < 1) return false;
  const int64_t tiles_upper = p.batch + (p.tq * p.group + 15) / 16;
  const double steps_upper =
      (double)tiles_upper * p.hkv * ((double)p.num_indices * p.bs / kPaStep + 1.0);
  if (p.wl >= 0 || !out_aligned || (double)p.num_pages * p.hkv >= 2147483647.0 ||
      (double)p.num_indices * p.bs >= 2147483647.0 || steps_upper >= 1073741824.0)
    return false;
  return true;
}

template <typename T>
static ot_status pa_launch_simple(ot_context *ctx, pa_params &p, bool debug, const char *op) {
  OT_TRY(pa_scratch(ctx, p, debug, 0, op));
  const int64_t rows = p.tq * p.hq;
  pa_simple_kernel<T><<<(unsigned)((rows + 3) / 4), 128, 0, (cudaStream_t)ctx->stream>>>(p);
  OT_CUDA_CHECK_LAUNCH(op);
  pa_last_plan = pa_plan_rec{3, 1, (int)((rows + 3) / 4), 0};
  return OT_OK;
}

/* Whether it should (no OT_PAGED_KERNEL): at most 8 queries per sequence, short contexts
 * (<= 1024 keys per sequence, estimated from the table's size) cut into <= 8 pieces per
 * unit, and more units than two waves of the split kernel's 4-warp CTAs. There it saves the
 * split kernel's waves of short CTAs. H200, 2026-12-02 (twentieth session; bench_decode.py
 * --ab, 10 rounds, us per call, stream / split): 128 x 256 43.25 / 57.60, 256 x 512 144.46 /
 * 153.19, 128 x 1k 140.93 / 141.68 (3.9-7.8 waves); but at two waves or fewer the split
 * kernel: 64 x 16 16.70 / 13.18, 64 x 128 18.96 / 17.24, 16 x 128 14.21 / 8.16, 16 x 512
 * 19.13 / 12.32, 32 x 512 28.61 / 23.46, 32 x 1k 44.55 / 39.53, 64 x 512 and 64 x 1k level
 * (44.92 / 44.87, 74.56 / 74.30). (Until then the stream kernel took every short batch: it
 * was chosen in 2026-11-30's run, 64 x 1k 3.21 vs 3.02 TB/s, before the split kernel's
 * aligned-page step and 8-warp CTAs.) With longer contexts the split kernel was 1-5% faster
 * (16 x 4k, 64 x 4k), and with few units (1 x 64k: 132 pieces each) much faster; at batch 1
 * too once its splits could be 64 keys (below). OT_PAGED_SPLITS (a forced split count)
 * keeps the split kernel. */
static bool ps_auto(const ot_cuda_state *cs, const pa_params &p, const pa_env &env, int per_sm) {
  if (env.splits_set) return false;
  const int64_t qps = (p.tq + p.batch - 1) / p.batch;
  /* Decode and speculative decode only: a chunked prefill's causal tiles are trimmed at
   * their diagonal by the split kernel, while the stream kernel runs every tile over all
   * keys (up to 2x the work; not measured). */
  if (qps > 8) return false;
  /* batch 1: the split kernel (64-key splits, one wave; H200, same run: 1 x 512 13.1 vs
   * 15.7 us per call), which reads its tables in one round where the stream kernel takes
   * two and loads q after its first stage */
  if (p.batch == 1) return false;
  const int64_t units = p.batch * ((qps * p.group + 15) / 16) * p.hkv;
  const int64_t est_len = p.num_indices * p.bs / p.batch;
  if (est_len > 1024 || units < 1) return false;
  const int64_t unit_steps = est_len > 0 ? (est_len + kPaStep - 1) / kPaStep : 1;
  /* two waves of the split kernel's one-split 4-warp CTAs (a unit each; per_sm is the
   * stream kernel's CTAs per SM, the same 4-warp size) */
  if (units <= 2 * (int64_t)cs->sm_count * per_sm) return false;
  const int64_t wtot = (int64_t)cs->sm_count * per_sm * kPaWarps;
  int64_t P = (units * unit_steps + wtot - 1) / wtot;
  if (P < kPsMinSteps) P = kPsMinSteps;
  return (unit_steps + P - 1) / P <= 8;
}

template <typename T>
static ot_status pa_dispatch(ot_context *ctx, pa_params &p, bool mma_ok, bool out_aligned,
                             const pa_env &env, const char *op) {
  if constexpr (sizeof(T) == 2) {
    if (mma_ok && p.d == 64) return pa_launch_mma<T, 64, 5>(ctx, p, env, op);
    if (mma_ok && p.d == 128) {
      /* OT_PAGED_KERNEL=split / stream forces a kernel (the stream one where it can run) */
      if (env.kernel != 1) {
        const ot_cuda_state *cs = ot_cuda_state_of(ctx);
        const int per_sm = ps_ctas_per_sm<T, 128, 3>(cs->device);
        if (ps_wanted(p, out_aligned, per_sm) && (env.kernel == 2 || ps_auto(cs, p, env, per_sm)))
          return ps_launch<T, 128, 3>(ctx, p, env, op);
      }
      return pa_launch_mma<T, 128, 3>(ctx, p, env, op);
    }
  }
  return pa_launch_simple<T>(ctx, p, env.debug, op);
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
  p.early = a->kv_ready ? 1 : 0;
  const ot::pa_env env = ot::pa_read_env();
  const bool debug = env.debug;
  /* the tensor-core path: 16-bit types, head_dim 64 / 128, 16-byte aligned q rows and
   * pages (the pages are contiguous, so their base decides) */
  const size_t es = ot_dtype_size(a->dtype);
  const bool aligned = ot_rows_aligned16(a->q, a->q_tok_stride, es, a->tokens) &&
                       ((a->q_head_stride * (int64_t)es) & 15) == 0 &&
                       ot_is_aligned16(t->k_pages) && ot_is_aligned16(t->v_pages);
  const bool mma_ok = aligned && (a->dtype == OT_BF16 || a->dtype == OT_F16) && !env.simple;
  const bool out_aligned = ot_rows_aligned16(a->out, a->out_tok_stride, es, a->tokens) &&
                           ((a->out_head_stride * (int64_t)es) & 15) == 0;
  ot_status st;
  switch (a->dtype) {
    case OT_F32: st = ot::pa_dispatch<float>(ctx, p, false, false, env, op); break;
    case OT_F16: st = ot::pa_dispatch<__half>(ctx, p, mma_ok, out_aligned, env, op); break;
    case OT_BF16: st = ot::pa_dispatch<__nv_bfloat16>(ctx, p, mma_ok, out_aligned, env, op); break;
    default: return ot_error(OT_ERR_INTERNAL, op, "unexpected dtype %d", (int)a->dtype);
  }
  if (st != OT_OK || !debug) return st;
  return ot_paged_debug_report(ctx, op, p.err, "cu_seqlens_q");
}

/* The kernel the last ot_paged_attention call on this host thread launched (benchmarks:
 * bench/decode_shim.c): out[0] 1 split, 2 stream, 3 simple (0: none yet); out[1] splits;
 * out[2] CTAs of the main kernel; out[3] flags (pa_plan_rec): 1 launched as a programmatic
 * dependent, 4 an early start (paged_kv_ready), 8 the TMA ring (experiment builds), 16 the
 * aligned-page (AL) instance, 32 8-warp CTAs, 2048 the page-id guess (pa_params.chunk1; the
 * kernel takes it where the tables agree). */
extern "C" void ot_cuda_paged_last_plan(int out[4]) {
  out[0] = ot::pa_last_plan.kernel;
  out[1] = ot::pa_last_plan.splits;
  out[2] = ot::pa_last_plan.ctas;
  out[3] = ot::pa_last_plan.flags;
}

#ifdef OT_PA_TRACE
/* OT_PA_TRACE builds: clear (clear != 0) the stamps of both kernels, or copy kernel k's
 * [4096][8] stamps to dst (bench_decode.py --trace; exported from the shared library too,
 * for bench/engine_pa_trace.py). 0 on success. */
extern "C" __attribute__((visibility("default"))) int ot_cuda_paged_trace(unsigned long long *dst, int k, int clear) {
  void *a = nullptr;
  if (cudaGetSymbolAddress(&a, ot::pa_tr_buf) != cudaSuccess) return -1;
  const size_t per = sizeof(ot::pa_tr_buf) / 2;
  if (clear) return cudaMemset(a, 0, sizeof(ot::pa_tr_buf)) == cudaSuccess ? 0 : -1;
  if (k < 0 || k > 1) return -1;
  return cudaMemcpy(dst, (char *)a + k * per, per, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}
#endif
