/*
 * attention_fwd_sm90.cu -- Hopper (sm_90a) flash attention forward, dense BSHD, bf16/fp16,
 * head dim 64 / 128 / 256, causal and sliding-window masks (bottom-right), GQA, lse.
 *
 * The FlashAttention-3 recipe, written from the PTX ISA (notes: shared/notes/hopper-attention.md):
 *  - work unit: a (64 * NC-query tile, query head, batch); a CTA of NC + 1 warpgroups
 *    (128 threads each) walks such tiles (persistent, one CTA per SM; see launch for the
 *    order): WG0 = producer (one thread issues TMA loads; the WG gives registers back with
 *    setmaxnreg.dec 24), WG1..WGNC = consumers, 64 query rows each. NC = 2 (setmaxnreg.inc
 *    240) everywhere but head dim 64, which uses NC = 3 (160 registers, 128-key tiles;
 *    FA3's 192-row shape) except for masked calls of at most 64 query tiles;
 *  - Q (64 * NC rows) once, then K and V tiles of Bc keys into 2-stage shared-memory rings
 *    (separate K and V rings, V one tile behind K), each stage completed on an mbarrier
 *    by the TMA transaction count and released by the consumers through an "empty" mbarrier;
 *  - S = Q K^T with wgmma SS (both operands in smem, 128B swizzle, K-major), O += P V with
 *    wgmma RS (P converted in registers from the S accumulators, V MN-major);
 *  - intra-warpgroup overlap: step j issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} back to
 *    back, then does the softmax of S_j while the P V wgmma runs (so the source says; in
 *    the SASS of every default kernel ptxas puts the P V's wait first: kFlPin);
 *  - pingpong between the consumer WGs (named barriers 8 + c, a turn passed round
 *    0 -> 1 (-> 2) -> 0): a WG issues its GEMMs only when the one before it has issued its
 *    own, so one WG's softmax (MUFU bound) runs under the others' GEMMs.
 * Key tiles are visited from the last (diagonal) one down, so the masked tiles come first;
 * only tiles that cross the sequence end or a mask edge pay for the element mask.
 * kFlNarrow (bf16 D128, 176-key tile): a last key tile of at most 48 keys (S = 4096: 48)
 * runs first as a step of its own, Q K^T with N = 48 and P V with K = 48, instead of
 * 176 columns of padding-laden work; the pipelined steps then take the whole tiles.
 * TMA reads the 5-D view {64, S, D/64, H, B} of each BSHD operand so that one box fills
 * [D/64][rows][64] with the 128B swizzle; rows past the sequence end read as zero and the
 * mask gives their scores -inf. O is written from registers (rows < Sq only): four bytes a
 * lane, or (kFlSt16) 16 after a transpose within each row quad.
 *
 * Ring phases (K, V, Q) and the pingpong turns run on across a CTA's tiles; the Q stage is
 * released once a tile's last Q K^T completes, so the next tile's Q and K load during the
 * last P V and the epilogue.
 *
 * (NC = 1, 64-row CTAs two per SM, OT_ATTN_SM90_WG=1 in experiment builds: lost 2026-12-01,
 * D64 S1k causal 0.986x, full 0.961x, S4k full 0.903x (attention_fwd_wg1.json); removed, code
 * in 617e339.)
 *
 * Switches (environment, read per call -- one scan for any OT_ATTN_SM90_* -- except
 * OT_ATTN_SM90, read once; for measurements and tests): OT_ATTN_SM90=0 off,
 * OT_ATTN_SM90_TILE=small|wide, OT_ATTN_SM90_NONPERSISTENT=1, OT_ATTN_SM90_GRID=n (cap on
 * persistent CTAs), OT_ATTN_SM90_WG=2|3 (consumer warpgroups at head dim 64),
 * OT_ATTN_SM90_RESC=0|1 (the template bit kFlResc: the row max moves only when it grows by
 * more than 2^8, and O is rescaled only in the steps where a row of the warp moved it;
 * default on at head dim 256 and for head dim 128 on the 128-key tile), OT_ATTN_SM90_NARROW=0|1
 * (kFlNarrow, see the dispatch), OT_ATTN_SM90_DIAG=0|1 (kFlDiag: the narrow step per
 * consumer warpgroup, 64 keys; default on for bf16 D64 masked calls of <= 8 query tiles,
 * see the dispatch), OT_ATTN_SM90_PIN=0|1 (kFlPin: the step's softmax before its P V's wait;
 * default on for bf16 unmasked calls on D128's 176-key and D64's 3-consumer tiles, see the
 * dispatch), OT_ATTN_SM90_ST16=0|1 (kFlSt16: O stored 16 bytes a lane; default on for bf16
 * D128 128-key, D256 masked and D64 kFlDiag tiles, see the dispatch), OT_ATTN_SM90_STAG=0|1
 * (kFlStag: a turn round the consumers at each softmax, see the enum; default on for bf16
 * D64 kFlDiag tiles with kFlSt16 and D64 causal 3-consumer tiles with kFlSkip | kFlShift, see
 * the dispatch), OT_ATTN_SM90_KSPLIT=0|1 (kFlKsplit: the last, short query tile of a head
 * on all three consumers; default on for bf16 D64 unmasked 3-consumer calls, see the
 * dispatch), OT_ATTN_SM90_SPLIT=1 (kFlSplit: the last round's tiles cut over every CTA; bf16
 * D256 and D128 128-key, opt-in: measured mixed, see the dispatch). Only in builds with
 * -DOT_ATTN_SM90_EXPERIMENTS (bf16; measured slower, docs/ATTENTION.md): kFlNarrow at D256;
 * OT_ATTN_SM90_SKIP=1 (kFlSkip; measured slower, docs/ATTENTION.md); kFlDiag at D128;
 * kFlPin on the other tiles (D64 2 consumers, D128 128-key, D256: measured, not used);
 * kFlStag on the other defaults (measured 0.96-0.99x there, 2026-12-02; D64 causal with
 * kFlSkip alone 0.99x). OT_ATTN_SM90_QPF=1 (kFlQpf: the next tile's Q prefetched to L2;
 * bf16 D256, opt-in, see the dispatch).
 *
 * Not covered here (handled = false; the portable kernel runs): varlen, softcap, head dims
 * other than 64/128/256, fp32, strides TMA cannot express (16-byte multiples), devices
 * other than cc 9.0, a negative softmax scale.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <vector>

#include "../attention_sm90.h"
#include "../common.cuh"
#include "../cuda_state.h"
#include "sm90_common.cuh"
#include "wgmma_ops.cuh"

namespace ot {
namespace sm90 {

constexpr int kBr = 128;          /* the smallest query tile (bound on the tile count) */
constexpr int kStages = 2;

/* Compile-time variants of the kernel (the FL template argument). */
enum {
  kFlResc = 1,    /* the row max moves only when it grows by more than 2^kRescThr (log2 units):
                   * O is rescaled only in the steps where some row of the warp moved */
  /* 2, 4: kFlPoly8 / kFlPoly4 until 2026-12-02 (poly8 0.87x at D128 S4k, removed; git 8f769c9) */
  kFlSplit = 8,   /* unmasked persistent launches: the tiles of the last, partial round cut
                   * along the keys into equal shares of every CTA, the pieces of a tile
                   * merged by the one that finishes it last (split_params, the kernel) */
  kFlNarrow = 16, /* with the width w in bits 8..11 (kFlNarrowW): a first-visited key tile
                   * of which no row sees more than 16 w keys (the partial one at the key
                   * end) runs as a step of its own, Q K^T with N and P V with K = 16 w */
  /* 32: kFlSnake until 2026-12-02 (0.91x / 0.92x at D256 causal S1k / 4k, removed; git 81f64b8) */
  kFlSkip = 64,   /* a consumer warpgroup skips the wgmmas and the softmax of the
                   * first-visited key tiles in which all of its 64 rows are masked (or
                   * past Sq), keeping every barrier arrival (see the kernel) */
  kFlDiag = 128,  /* with kFlNarrow: the narrow step's condition per consumer warpgroup (the
                   * keys of the first-visited tile that its own rows see), so that on a
                   * causal diagonal tile the first warpgroup of a 128-row tile runs Q K^T,
                   * softmax and P V over the 64 keys it can see (see the kernel) */
  /* 0x1000, 0x2000: kFlQ2 / kFlXT until 2026-12-02 (D64 S1k causal 0.899x, removed; git 71f9d4b) */
  /* 0x4000: kFlLate until 2026-12-02 (a tile's epilogue under the next tile's first Q K^T;
   * measured 0.88-0.98x the default and removed, docs/ATTENTION.md); since 2026-12-02
   * (eighteenth session) kFlShift: */
  kFlShift = 0x4000, /* masked calls with a right edge (causal): the query tiles aligned to
                      * the end of the rows instead of their start -- tile m covers rows
                      * m BR - pad .. m BR - pad + BR - 1, pad = num_m BR - Sq -- so that
                      * the partial tile is the first (its rows before 0: Q zero-filled by
                      * the TMA, never stored), the one with the fewest keys, not the last,
                      * the one with the most. With kFlSkip the padding warpgroups drop
                      * out. Default of bf16 D64 causal calls on 3 consumers with kFlSkip
                      * since 2026-12-02 (nineteenth session; see the dispatch) */
  kFlPin = 0x8000, /* the pipelined step's softmax pinned before its P V's wait (a never-taken
                   * branch on l between them, holding a nanosleep; default for bf16 unmasked
                   * D128 176-key and D64 3-consumer tiles, see the dispatch): ptxas
                   * otherwise hoists the WARPGROUP.DEPBAR of that wait to the top of the
                   * softmax's block. Pinning only the first half of the exponentials (V
                   * released after it: kFlPinH, OT_ATTN_SM90_PINH) measured 0.98-1.01x of
                   * it on 2026-12-01 and was removed (docs/PERFORMANCE.md) */
  kFlSt16 = 0x10000, /* the epilogue's O stores 16 bytes a lane: the four lanes of a row
                      * quad trade their packed pairs (two xor shuffles a 4 x 4 block:
                      * sm90_common.cuh's quad_transpose) so that each holds 8 consecutive
                      * columns, one STG.128 per 8 columns instead of four STG.32 (16-byte
                      * aligned O only; default for bf16 D128 128-key, D256 masked and D64
                      * kFlDiag tiles, see the dispatch) */
  /* 0x20000: kFlWgSplit until 2026-12-02 (measured 0.982x at D64 full S1k, removed; git cd26b0a);
   * then kFlTree (the softmax's row max and sum over 4 chains a row: 1.000x at D64 S1k causal,
   * within +-3% elsewhere, removed; git d141e27, attention_fwd_tree.json) */
  kFlStag = 0x40000, /* a second turn round the consumers at each softmax (named barriers
                      * kExpBar + c), written around the exponentials so that the consumers'
                      * MUFU phases would follow one another (ncu at D64 S1k causal: our
                      * MUFU.EX2 with 19.5% of the stall samples against cuDNN's 6.2%). As
                      * compiled it does something weaker: the barriers order only memory,
                      * and ptxas places the turn's BAR.SYNC and BAR.ARV next to each other
                      * amid the row max with every MUFU.EX2 after them (sm_90a, nvcc 13), so
                      * a consumer enters its softmax only once the other has entered its
                      * previous one -- a rhythm of softmax starts. Holding the exponentials
                      * inside the turn by data dependencies (kFlStagT, 2026-12-02) lost
                      * 4-12% everywhere (attention_fwd_stagt.json; removed): the gain is
                      * the rhythm's, not the serialization's. Every consumer takes one turn
                      * per key tile of a query tile (with kFlSkip a skipped tile takes an
                      * empty one). Default for bf16 D64 kFlDiag tiles with kFlSt16 and D64
                      * causal 3-consumer tiles with kFlSkip | kFlShift since 2026-12-02
                      * (twenty-first session; see the dispatch); elsewhere experiment
                      * builds only (measured slower) */
  kFlPad = 0x80000,  /* head dim 96 on the D = 128 tile (default since 2026-12-03;
                      * OT_ATTN_SM90_PAD96=0 declines): Q, K, V loaded by a 4-D map twice
                      * per tile (columns 0 and 64), columns 96..127 zero-filled by TMA (out
                      * of the map's bounds); O stored below column 96 */
  kFlN96 = 0x100000, /* with kFlPad: P V over V's first 96 columns only (wgmma N = 96: O's
                      * accumulators 48 a thread instead of 64; the B operand ends inside
                      * the second 64-column swizzle atom). The default for bf16 with kFlSt16
                      * since 2026-12-03 (1.00-1.05x the N = 128 kernel; tests 'pad96 n96'
                      * exact); fp16's instance the default too (1.04-1.18x R | PD);
                      * OT_ATTN_SM90_N96=0 turns it off */
  kFlQpf = 0x400000, /* static persistent launches: the producer prefetches the CTA's next
                      * tile's Q to L2 (cp.async.bulk.prefetch.tensor) once the current
                      * tile's first K load is issued, so that the Q load at the tile
                      * boundary, issued only after both consumers' last Q K^T and by every
                      * CTA at once in a static round, reads L2 instead of HBM (D256 S 1k's
                      * per-tile cost, docs/ATTENTION.md; opt-in OT_ATTN_SM90_QPF=1, bf16
                      * D256 only; H100 2026-12-07: 0.936x the plain kernel at D256 S1k) */
  kFlKsplit = 0x200000, /* 3 consumers, unmasked: a query tile with at most 64 rows before Sq
                         * (the last of a head where 192 does not divide Sq by more than
                         * 128 rows: S 1k / 4k / 16k leave 64) runs on all three consumer
                         * warpgroups, each over every third key tile for the same 64 rows
                         * (no pingpong turns in it), merged through shared memory by
                         * consumer 0; the tiles of a head rotated by the round that takes
                         * it (decode_tile's rot), so that every persistent CTA gets its
                         * share of those cheaper tiles (see the kernel and the dispatch) */
};
constexpr int kFlNarrowW = 0xF00;
constexpr int narrow_bits(int w16) { return kFlNarrow | (w16 << 8); }

/* The instances that carry the dynamic schedule (fwd_params::tile_ctr): 2 or 3 consumers
 * (3: D64 causal calls of 16 query tiles or more, since 2026-12-02, bf16 with kFlSkip),
 * not with kFlSplit (its work items look ahead along the static round-robin), nor
 * kFlPin where it is the unmasked defaults' bit (D 128 / 256, D64 on 3 consumers: those
 * kernels stay as they were); at D64 on 2 consumers kFlPin is the masked calls' default
 * (no kFlDiag) and carries it. */
constexpr bool dyn_ok(int fl, int nc, int d) {
  return (nc == 2 || nc == 3) && (fl & kFlSplit) == 0 &&
         ((fl & kFlPin) == 0 || (d == 64 && nc == 2));
}

/* NC consumer warpgroups of 64 query rows each (2, or 3 at head dim 64 as FA3 does): a
 * CTA of NC + 1 warpgroups covers 64 * NC query rows. */
template <int NC> struct fwd_cfg {
  static constexpr int br = 64 * NC;
  static constexpr int threads = 128 * (NC + 1);
  /* setmaxnreg: the producer keeps 24, the consumers share the rest of the 64K file. */
  static constexpr int cons_regs = NC == 2 ? 240 : 160;
  static_assert(NC == 2 || NC == 3, "2 or 3 consumer warpgroups");
  static_assert(24 * 128 + cons_regs * 128 * NC <= 65536, "register file");
};

template <int D, int BC, int NC> struct fwd_smem {
  static constexpr int q_bytes = fwd_cfg<NC>::br * D * 2;
  static constexpr int kv_bytes = BC * D * 2;              /* one K or V stage */
  static constexpr int q_off = 0;
  static constexpr int k_off = q_bytes;
  static constexpr int v_off = k_off + kStages * kv_bytes;
  static constexpr int bar_off = v_off + kStages * kv_bytes;
  static constexpr int bytes = bar_off + 128 + 1024;       /* barriers + alignment slack */
  static_assert(BC % 16 == 0 && BC <= 256, "key tile");
  static_assert(q_bytes % 1024 == 0 && kv_bytes % 1024 == 0, "swizzle atoms are 1024 B");
  static_assert(bytes <= kSmemOptin, "shared memory opt-in limit");
};

struct fwd_params {
  void *out;
  float *lse;
  int64_t o_bs, o_ts, o_hs;       /* elements */
  int64_t l_bs, l_ts, l_hs;
  int sq, sk, hq, group;          /* group = hq / hkv */
  int batch, num_m;               /* num_m = ceil(sq / BR) query tiles (64 NC rows) */
  int sect;                       /* > 0: sectioned tile order (see decode_tile) */
  int wl, wr;                     /* -1 unbounded */
  float scale, scale_log2;
  /* Non-null: the dynamic schedule (persistent launches of dyn_ok instances): CTA i runs
   * tile i, then each next tile is claimed from this counter (gridDim.x + the claim);
   * zero before the launch, and zero again after it (the launch's last claim resets it). */
  int *tile_ctr;
};
/* kFlSplit (a kernel argument of its own, so that fwd_params and the code of the other
 * instances stay as they were). The rem = n_tiles - split_full tiles of an unmasked
 * persistent launch's last, partial round hold units = rem * n_it key tiles; CTA b takes
 * the units [b len, min((b + 1) len, units)) of them in order (len >= units / grid, and
 * at least sqrt(n_it / 2): see launch()), which is at most two pieces
 * (len <= n_it): work item split_full + b, the piece in the tile of its first unit, and
 * split_full + grid + b, the next tile's if its share reaches there (else empty); n_items =
 * split_full + 2 grid. The pieces of tail tile r meet per consumer warpgroup c at
 * cnt[2 (r NC + c)] (key tiles finished) and cnt[2 (r NC + c) + 1] (key tiles published):
 * a piece that does not finish the tile leaves its unnormalised O (fp32) and (row max, row
 * sum) in part / ml at slot r pmax + (b - the tile's first CTA), then publishes; the one that
 * finishes it waits for the others' to be published (they are running: no CTA waits for one
 * that has not started), merges them into its registers, stores the tile as usual and
 * zeroes both counters for the next launch. */
struct split_params {
  int split_full, n_items, n_it, len, units, pmax;
  float *part;    /* [rem pmax][BR][D] */
  float2 *ml;     /* [rem pmax][BR] */
  int *cnt;       /* [rem NC][2], zero between launches */
};
/* launch()'s shares of the tail (n_tiles > grid): split_full, n_items, n_it, len, units and
 * pmax of sp (the pointers left alone). len: every CTA's share, but no shorter than
 * sqrt(n_it / 2) key tiles: the piece that finishes a tile reads the others' partials one
 * after the other, each (64-128 KB of fp32 from L2) costing about half a key tile's compute,
 * so that a tile of n_it key tiles cut into n_it / len pieces ends after about
 * len + n_it / (2 len) key tiles. */
static inline void split_plan(split_params &sp, int n_tiles, int grid, int n_it) {
  const int rem = n_tiles % grid, units = rem * n_it;
  sp.split_full = n_tiles - rem;
  sp.n_items = sp.split_full + 2 * grid;
  sp.n_it = n_it;
  sp.units = units;
  sp.len = max((units + grid - 1) / grid, (int)ceil(sqrt(0.5 * n_it)));
  sp.pmax = (n_it - 1) / sp.len + 2;   /* the most CTAs that share a tile */
}
/* The piece of work item split_full + u (u < 2 grid): tail tile r, key tiles [k0, k1); an
 * empty share: r = k0 = k1 = 0 */
__host__ __device__ __forceinline__ void split_share(const split_params &sp, int u, int grid,
                                                    int &r, int &k0, int &k1) {
  const int lo = (u % grid) * sp.len, hi = min(lo + sp.len, sp.units);
  r = lo / sp.n_it;
  k0 = lo - r * sp.n_it;
  k1 = min(hi - r * sp.n_it, sp.n_it);
  if (u >= grid) {   /* the next tile's piece */
    r++;
    k0 = 0;
    k1 = hi - r * sp.n_it;
  }
  if (lo >= hi || k1 <= k0) r = k0 = k1 = 0;
}
/* The CTAs b0 .. b1 that hold a piece of tail tile r (its partial slots r pmax + b - b0) */
__host__ __device__ __forceinline__ void split_ctas(const split_params &sp, int r, int &b0,
                                                   int &b1) {
  b0 = r * sp.n_it / sp.len;
  b1 = ((r + 1) * sp.n_it - 1) / sp.len;
}

/* a / b rounded toward -inf (b > 0) */
__host__ __device__ __forceinline__ int floor_div(int a, int b) {
  int q = a / b;
  return (a % b != 0 && (a < 0)) ? q - 1 : q;
}
/* Key tiles [n_min, n_max) of bc keys that any row of the query tile of rows row_first ..
 * row_last sees (masks bottom-right aligned, wl / wr < 0: unbounded); the kernels' decode_tile
 * and the host's static_balance */
__host__ __device__ __forceinline__ void tile_keys(int row_first, int row_last, int bc, int sq,
                                                   int sk, int wl, int wr, int &n_min,
                                                   int &n_max) {
  const int off = sk - sq;
  n_max = (sk + bc - 1) / bc;
  if (wr >= 0) n_max = min(n_max, floor_div(row_last + off + wr, bc) + 1);
  n_min = 0;
  if (wl >= 0) n_min = max(0, floor_div(row_first + off - wl, bc));
}

#ifdef OT_FWD_TRACE   /* (the stamps: OT_FWD_TRACE's comment above the kernel) */
constexpr int kFwdTrCtas = 1024, kFwdTrItems = 64;
__device__ unsigned long long fwd_tr_buf[kFwdTrCtas][kFwdTrItems][4][4];
#endif

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* kFlResc: the threshold (log2 units): P and l stay below 2^8 times their exact-max values. */
constexpr float kRescThr = 8.f;

/* Barrier slots in shared memory (8 bytes each). */
enum { BAR_FULL_Q = 0, BAR_EMPTY_Q = 1, BAR_FULL_K = 2, BAR_EMPTY_K = 4, BAR_FULL_V = 6,
       BAR_EMPTY_V = 8 /* 10, 11: kFlQ2's second Q stage until 2026-12-02 */ };
static_assert(BAR_FULL_K + kStages <= BAR_EMPTY_K && BAR_EMPTY_K + kStages <= BAR_FULL_V &&
                  BAR_FULL_V + kStages <= BAR_EMPTY_V && 8 * (BAR_EMPTY_V + kStages) <= 128,
              "barrier slots: kStages of each ring, all in fwd_smem's 128 bytes");
constexpr int kSchedBar = 8;          /* named barriers 8 + c: pingpong turn of consumer c */
constexpr int kExpBar = 12;           /* named barriers 12 + c: kFlStag's exponential turn */
constexpr int kMergeFull = 4;         /* kFlKsplit: the partials written (all consumers) */
constexpr int kMergeFree = 5;         /* kFlKsplit: the partials read (all consumers) */
constexpr int kSplitBar = 1;          /* named barriers 1 + c: kFlSplit's meeting of consumer c */
/* The dynamic schedule's tile slot: an int in the barrier area's 8-byte slot 12 (after
 * every mbarrier), written by the producer before it arrives on FULL_Q of the tile. */
constexpr int kTileSlot = 12;
static_assert(kTileSlot >= BAR_EMPTY_V + kStages && 8 * (kTileSlot + 1) <= 128, "tile slot");

/* Tile t of the launch: m fastest (the CTAs running at once share K/V in L2); with a
 * right-bounded mask (causal) the longest query tiles of a head first. */
struct tile_info {
  int m_block, head, batch, n_min, n_max, row_last;
};
/* SHIFT (kFlShift): the tiles aligned to the rows' end, the first row of tile m at m BR -
 * row_pad(p) (< 0 for the first tile where BR does not divide Sq) */
template <int BR>
__device__ __forceinline__ int row_pad(const fwd_params &p) { return p.num_m * BR - p.sq; }
/* ROT (kFlKsplit): the tiles of head hb rotated by rot = hb num_m / gridDim.x (mod num_m),
 * the round-robin round in which the head's tiles start, so that the head's last query tile
 * (the short one kFlKsplit runs cheaply) falls to a different CTA round by round: with 6
 * tiles a head on 132 CTAs (S 1k) the plain order gives every last tile to the same 22 CTAs
 * (132 is a multiple of 6), and those cheaper tiles would shorten nobody's sum. A rotation
 * within each head: still a bijection, the tiles of a head still in one round (K/V in L2). */
template <int BC, int BR, bool SHIFT = false, bool ROT = false>
__device__ __forceinline__ tile_info decode_tile(const fwd_params &p, int t) {
  tile_info ti;
  int mi, hb;
  if (p.sect > 0) {
    /* Sections of p.sect (head, batch) pairs whose K/V fit in L2 together; inside a
     * section the longest query tiles of all its heads first, so that the persistent
     * CTAs' round-robin turns get tiles of similar length. */
    const int per = p.sect * p.num_m, sec = t / per, hb0 = sec * p.sect;
    const int cnt = min(p.sect, p.hq * p.batch - hb0), w = t - sec * per;
    mi = w / cnt;
    hb = hb0 + w % cnt;
  } else {
    mi = t % p.num_m;
    hb = t / p.num_m;
    if (ROT) mi = (mi + (int)((int64_t)hb * p.num_m / (int)gridDim.x % p.num_m)) % p.num_m;
  }
  ti.m_block = p.wr >= 0 ? p.num_m - 1 - mi : mi;
  ti.head = hb % p.hq;
  ti.batch = hb / p.hq;
  const int first = ti.m_block * BR - (SHIFT ? row_pad<BR>(p) : 0);
  ti.row_last = min(first + BR - 1, p.sq - 1);
  tile_keys(first, ti.row_last, BC, p.sq, p.sk, p.wl, p.wr, ti.n_min, ti.n_max);
  return ti;
}
/* Work item t: a whole tile (piece -1), or (SPLIT, t >= split_full) this CTA's piece of
 * tail tile `piece`: the key tiles [n_min, n_max) of its share (split_params; an empty share:
 * n_max <= n_min). */
template <int BC, int BR, bool SPLIT, bool SHIFT = false, bool ROT = false>
__device__ __forceinline__ tile_info decode_item(const fwd_params &p, const split_params &sp,
                                                 int t, int &piece) {
  if (SPLIT && t >= sp.split_full) {
    int r, k0, k1;
    split_share(sp, t - sp.split_full, (int)gridDim.x, r, k0, k1);
    tile_info ti = decode_tile<BC, BR>(p, sp.split_full + r);
    ti.n_min = k0;
    ti.n_max = k1;
    piece = r;
    return ti;
  }
  piece = -1;
  return decode_tile<BC, BR, SHIFT, ROT>(p, t);
}

/* ---- OT_FWD_TRACE (a diagnostic build, -DOT_FWD_TRACE; other builds: no code): %globaltimer
 * stamps of the forward kernel per CTA (< kFwdTrCtas) and work item (the CTA's i-th, <
 * kFwdTrItems), in fwd_tr_buf[cta][item][w][k]: w = 0 the producer (k 0: EMPTY_Q passed, Q's
 * load issued; 1: the first K load issued; 2: the last V load issued), w = 1 + c consumer c,
 * its thread 0 (k 0: the item's top; 1: Q and the first K tile landed, before the prologue's
 * turn; 2: the last P V completed, before the epilogue; 3: the epilogue's stores issued).
 * 0 where not reached (kFlNarrow / kFlSkip / kFlKsplit tiles stamp k 1 only on the plain
 * prologue). Read back with ot_cuda_attn_fwd_trace (bench/attn_fwd_trace.py). */
#ifdef OT_FWD_TRACE
__device__ __forceinline__ void fwd_tr(int item, int w, int k) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if (blockIdx.x < kFwdTrCtas && item < kFwdTrItems) fwd_tr_buf[blockIdx.x][item][w][k] = t;
}
#define FWD_TR(cond, item, w, k) \
  do {                            \
    if (cond) fwd_tr(item, w, k); \
  } while (0)
#else
#define FWD_TR(cond, item, w, k) \
  do {                            \
  } while (0)
#endif

template <typename T, int D, int BC, int NC, int FL>
__global__ void __launch_bounds__(fwd_cfg<NC>::threads, 1)
    attn_fwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q,
                         const __grid_constant__ CUtensorMap tm_k,
                         const __grid_constant__ CUtensorMap tm_v, const fwd_params p,
                         const split_params sp) {
  using L = fwd_smem<D, BC, NC>;
  constexpr int BR = fwd_cfg<NC>::br;
  constexpr int kEmptyCount = 4 * NC;   /* lane 0 of each consumer warp releases a stage */
  constexpr bool F16 = is_half<T>::value;
  constexpr int NS = BC / 2;    /* S accumulators per thread */
  constexpr int NP = BC / 4;    /* P registers (2 x 16-bit) */
  constexpr bool N96 = (FL & kFlN96) != 0;
  constexpr int NPV = N96 ? 96 : D;   /* P V's N: O's columns held */
  constexpr int NO = NPV / 2;   /* O accumulators */
  constexpr bool RESC = (FL & kFlResc) != 0;
  constexpr bool SPLIT = (FL & kFlSplit) != 0;
  constexpr bool NARROW = (FL & kFlNarrow) != 0;
  constexpr int NW = ((FL & kFlNarrowW) >> 8) * 16;   /* NARROW's key width */
  static_assert(!NARROW || (NW > 0 && NW < BC), "narrow width");
  constexpr bool SKIP = (FL & kFlSkip) != 0;
  static_assert(!(SKIP && NARROW), "kFlSkip and kFlNarrow are not compiled together");
  constexpr bool DIAG = (FL & kFlDiag) != 0;
  static_assert(!DIAG || NARROW, "kFlDiag needs kFlNarrow's width");
  constexpr bool PIN = (FL & kFlPin) != 0;
  constexpr bool SHIFT = (FL & kFlShift) != 0;
  constexpr bool STAG = (FL & kFlStag) != 0;
  constexpr bool KSPLIT = (FL & kFlKsplit) != 0;
  constexpr bool QPF = (FL & kFlQpf) != 0;
  static_assert(!QPF || !SPLIT, "kFlQpf is not compiled with kFlSplit");
  static_assert(!KSPLIT || (NC == 3 && !SPLIT && !NARROW && !SKIP && !SHIFT && !STAG &&
                            (FL & kFlPad) == 0),
                "kFlKsplit: 3 consumers, not with the split, narrow, skip, shift, stag, pad bits");
  constexpr bool PAD = (FL & kFlPad) != 0;
  static_assert(!PAD || (D == 128 && !SPLIT), "kFlPad: head dim 96 on the D = 128 tile");
  static_assert(!N96 || PAD, "kFlN96: with kFlPad only");
  constexpr int DST = PAD ? 96 : D;   /* O's stored columns */
  /* Q K^T's k-steps: with kFlPad the last two (columns 96..127 of Q and K, zeros) are not
   * issued -- the products are exact zeros, so the scores do not change */
  constexpr int KQK = PAD ? 96 / 16 : D / 16;
  static_assert(!STAG || !SPLIT, "kFlStag is not compiled with kFlSplit");
  static_assert(!SHIFT || (!SPLIT && !NARROW),
                "kFlShift is not compiled with kFlSplit or the narrow steps");
  /* the first row of query tile m: m BR - rpad (kFlShift; 0 elsewhere) */
  const int rpad = SHIFT ? row_pad<BR>(p) : 0;
  extern __shared__ uint8_t smem_raw[];
  uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  const uint32_t s_base = smem_u32(smem);
  const uint32_t s_bar = s_base + L::bar_off;
  auto bar = [&](int i) { return s_bar + 8u * (uint32_t)i; };
  const int n_tiles = SPLIT ? sp.n_items : p.num_m * p.hq * p.batch;
  /* The dynamic schedule: the producer claims the CTA's next tile while it issues the
   * current one's loads (the consumers are then 3-4 key tiles from its end) and hands
   * each tile to the consumers in the tile slot, with FULL_Q of the tile: the slot is
   * written after EMPTY_Q of the tile before completed (every consumer warp read that one's
   * id before it arrived there) and read after FULL_Q completed (the producer's arrive
   * releases the write). -1 ends the consumers' loop. A tile without keys has no Q load:
   * the producer arrives on FULL_Q without bytes, the consumers release EMPTY_Q at once.
   * The last claim of the launch (claims: n_tiles - gridDim.x that get a tile and one that
   * fails per CTA, n_tiles in all) resets the counter for the next launch. */
  const bool dyn = dyn_ok(FL, NC, D) && p.tile_ctr != nullptr;
  volatile int *tile_slot = (volatile int *)(smem + L::bar_off + 8 * kTileSlot);

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) {
    mbar_init(bar(BAR_FULL_Q), 1);
    mbar_init(bar(BAR_EMPTY_Q), kEmptyCount);
    for (int s = 0; s < kStages; s++) {
      mbar_init(bar(BAR_FULL_K + s), 1);
      mbar_init(bar(BAR_FULL_V + s), 1);
      mbar_init(bar(BAR_EMPTY_K + s), kEmptyCount);
      mbar_init(bar(BAR_EMPTY_V + s), kEmptyCount);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  /* Ring positions run on across the tiles of a persistent CTA: kv counts K (and V) tiles
   * loaded so far, qn the query tiles. Producer and consumers advance them identically. */
  if (wg == 0) {
    /* ---------------- producer ---------------- */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (tid != 0) return;
    int kv = 0, qn = 0;
    /* The dynamic schedule's claim of the next tile: issued during the current tile, once
     * the K load of its key tile max(n - 2, 0) of n is issued (the consumers then 3-4 key
     * tiles from its end; the atomic's latency under the loads issued after it), resolved
     * at its end (n_tiles: none left). */
    int claimed = 0;
    auto resolve = [&]() {
      const int gs = (int)gridDim.x;
      if (claimed == n_tiles - 1) atomicExch(p.tile_ctr, 0);
      return claimed < n_tiles - gs ? gs + claimed : n_tiles;
    };
#ifdef OT_FWD_TRACE
    int tr_i = -1;
#endif
    for (int t0 = blockIdx.x; t0 < n_tiles; t0 = dyn ? resolve() : t0 + (int)gridDim.x) {
      int piece;
      const tile_info ti = decode_item<BC, BR, SPLIT, SHIFT, KSPLIT>(p, sp, t0, piece);
      const int n_iters = ti.n_max - ti.n_min;
#ifdef OT_FWD_TRACE
      tr_i++;
#endif
      if (n_iters <= 0) {
        if (dyn) {   /* no Q load: the id alone */
          claimed = atomicAdd(p.tile_ctr, 1);
          if (qn > 0) mbar_wait(bar(BAR_EMPTY_Q), (qn - 1) & 1);
          *tile_slot = t0;
          mbar_arrive(bar(BAR_FULL_Q));
          qn++;
        }
        continue;
      }
      const int kvh = ti.head / p.group;
      if (qn > 0) mbar_wait(bar(BAR_EMPTY_Q), (qn - 1) & 1);
      if (dyn) *tile_slot = t0;
      FWD_TR(true, tr_i, 0, 0);
      mbar_expect_tx(bar(BAR_FULL_Q), (uint32_t)L::q_bytes);
      tma_load_tile<PAD>(s_base + L::q_off, &tm_q, bar(BAR_FULL_Q), ti.m_block * BR - rpad, BR,
                         ti.head, ti.batch);
      qn++;
      for (int it = 0; it <= n_iters; it++) {
        if (it < n_iters) {
          const int g = kv + it, s = g % kStages;
          mbar_wait(bar(BAR_EMPTY_K + s), ((g / kStages) & 1) ^ 1);
          mbar_expect_tx(bar(BAR_FULL_K + s), (uint32_t)L::kv_bytes);
          tma_load_tile<PAD>(s_base + L::k_off + s * L::kv_bytes, &tm_k, bar(BAR_FULL_K + s),
                             (ti.n_max - 1 - it) * BC, BC, kvh, ti.batch);
          FWD_TR(it == 0, tr_i, 0, 1);
          if constexpr (QPF) {   /* the next tile's Q to L2 (static round-robin only) */
            if (it == 0 && !dyn && t0 + (int)gridDim.x < n_tiles) {
              int pn;
              const tile_info tn =
                  decode_item<BC, BR, SPLIT, SHIFT, KSPLIT>(p, sp, t0 + (int)gridDim.x, pn);
              if (tn.n_max > tn.n_min)
                tma_prefetch_tile<PAD>(&tm_q, tn.m_block * BR - rpad, tn.head, tn.batch);
            }
          }
          if (dyn && it == max(n_iters - 2, 0)) claimed = atomicAdd(p.tile_ctr, 1);
        }
        if (it > 0) {
          const int g = kv + it - 1, s = g % kStages;
          mbar_wait(bar(BAR_EMPTY_V + s), ((g / kStages) & 1) ^ 1);
          mbar_expect_tx(bar(BAR_FULL_V + s), (uint32_t)L::kv_bytes);
          tma_load_tile<PAD>(s_base + L::v_off + s * L::kv_bytes, &tm_v, bar(BAR_FULL_V + s),
                             (ti.n_max - it) * BC, BC, kvh, ti.batch);
          FWD_TR(it == n_iters, tr_i, 0, 2);
        }
      }
      kv += n_iters;
    }
    if (dyn) {   /* the end, to the consumers */
      if (qn > 0) mbar_wait(bar(BAR_EMPTY_Q), (qn - 1) & 1);
      *tile_slot = -1;
      mbar_arrive(bar(BAR_FULL_Q));
    }
    return;
  }

  /* ---------------- consumers ---------------- */
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(fwd_cfg<NC>::cons_regs) : "memory");
  const int c = wg - 1;                  /* consumer index 0 .. NC-1 */
  const int t128 = tid % 128;
  const int warp = t128 / 32, lane = t128 % 32, g = lane / 4, q4 = lane % 4;
  const bool releaser = lane == 0;
  /* Release a ring stage: lane 0 of each warp arrives once the whole warp is done with it
   * (the __syncwarp orders the other lanes' accesses before lane 0's arrive). The stages
   * are read only as wgmma operands here; the backward, whose consumers also read lse2 /
   * Dsum from a stage with plain loads, needed an arrive from every thread for racecheck. */
  auto release = [&](uint32_t b) {
    __syncwarp();
    if (releaser) mbar_arrive(b);
  };
  const float cl2 = p.scale_log2;
  const int off = p.sk - p.sq;
  /* The pingpong turn passes round the consumers 0 -> 1 (-> 2) -> 0: each waits for its
   * turn (barrier 8 + c: its 128 threads and the 128 of the consumer before it) and hands
   * it on once its GEMMs are issued. */
  const int my_bar = kSchedBar + c,
            other_bar = NC == 2 ? kSchedBar + 1 - c : kSchedBar + (c + 1) % NC;
  auto turn_wait = [&]() { named_sync(my_bar, 256); };
  auto turn_pass = [&]() { named_arrive(other_bar, 256); };
  if (c == NC - 1) named_arrive(kSchedBar, 256);   /* consumer 0 goes first */
  /* STAG: the exponential turn, passed round the consumers in the same order */
  const int my_ebar = kExpBar + c,
            other_ebar = NC == 2 ? kExpBar + 1 - c : kExpBar + (c + 1) % NC;
  if (STAG && c == NC - 1) named_arrive(kExpBar, 256);
  int kv = 0, qn = 0;
  float s[NS];   /* (here since kFlXT: inside the tile's block the default PTX differs) */
  uint32_t pr[NP];

#ifdef OT_FWD_TRACE
  int tr_i = -1;
#endif
  for (int t0 = blockIdx.x; dyn || t0 < n_tiles; t0 += gridDim.x) {
    if (dyn) {   /* the tile the producer claimed (-1: none left) */
      mbar_wait(bar(BAR_FULL_Q), qn & 1);
      /* read by lane 0, the warp's releaser (its arrive on EMPTY_Q then orders the read
       * before the producer's next write for compute-sanitizer's racecheck too) */
      t0 = __shfl_sync(0xffffffffu, releaser ? *tile_slot : 0, 0);
      if (t0 < 0) break;
    }
    int piece;
    const tile_info ti = decode_item<BC, BR, SPLIT, SHIFT, KSPLIT>(p, sp, t0, piece);
    const int n_iters = ti.n_max - ti.n_min, n_max = ti.n_max;
#ifdef OT_FWD_TRACE
    tr_i++;
#endif
    FWD_TR(t128 == 0, tr_i, 1 + c, 0);
    if (dyn && n_iters <= 0) {   /* its id came with FULL_Q (no Q): the slot is read */
      release(bar(BAR_EMPTY_Q));
      qn++;
    }
    const int tile_first = ti.m_block * BR - rpad;   /* the tile's first row (kFlShift: < 0) */
    /* KSPLIT: a tile of at most 64 rows before Sq (consumer 0's) runs split over the keys,
     * every consumer on those 64 rows (below) */
    const bool ks = KSPLIT && p.sq - tile_first <= 64;
    const int cq = KSPLIT && ks ? 0 : c;   /* the consumer whose 64 query rows this one runs */
    const int row0 = tile_first + cq * 64 + warp * 16 + g;   /* rows row0, row0 + 8 */
    float o[NO];
#pragma unroll
    for (int i = 0; i < NO; i++) o[i] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};

    if (n_iters > 0) {
      /* NARROW: the keys of the first-visited tile n_max - 1 that a row of the CTA tile
       * sees; at most NW: that tile runs as a step of its own over NW keys (below). Its
       * Q K^T leaves the accumulators past them as they were: finite (zero at first), and
       * masked to -inf by the softmax (past every row's last key). */
      bool narrow_step = false, other_narrow = false;
      if constexpr (NARROW) {
#pragma unroll
        for (int i = 0; i < NS; i++) s[i] = 0.f;
        if constexpr (DIAG) {
          /* per warpgroup: the keys of tile n_max - 1 that the rows of consumer w see (none
           * past Sq); c through lane 0 (warp-uniform to ptxas, as in SKIP) */
          const int cu = __shfl_sync(0xffffffffu, c, 0);
#pragma unroll
          for (int w = 0; w < NC; w++) {
            const int wf = ti.m_block * BR + w * 64, wl_ = min(wf + 63, p.sq - 1);
            const int end = p.wr >= 0 ? min(p.sk, wl_ + off + p.wr + 1) : p.sk;
            const bool nw = wf >= p.sq || end - (n_max - 1) * BC <= NW;
            if (w == cu) narrow_step = nw; else other_narrow |= nw;
          }
        } else {
          const int end = p.wr >= 0 ? min(p.sk, ti.row_last + off + p.wr + 1) : p.sk;
          narrow_step = end - (n_max - 1) * BC <= NW;
        }
      }
      float alpha[2] = {1.f, 1.f};
      bool resc = true;   /* RESC: some row of this warp moved its max in the last softmax */
      /* Visible key range of the two rows (sequence frame), for the element mask. */
      int hi[2], lo[2];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int r = row0 + 8 * h;
        hi[h] = p.wr >= 0 ? min(p.sk - 1, r + off + p.wr) : p.sk - 1;
        lo[h] = p.wl >= 0 ? r + off - p.wl : INT32_MIN;
      }
      const int row_last = ti.row_last;
      /* key tile n: needs the element mask */
      auto needs_mask = [&](int n) {
        return (n + 1) * BC > p.sk ||
               (p.wr >= 0 && (n + 1) * BC - 1 > tile_first + off + p.wr) ||
               (p.wl >= 0 && n * BC < row_last + off - p.wl);
      };
      const uint64_t q_desc = make_desc(s_base + L::q_off + cq * 64 * 128, 16, 1024);
      /* S = Q K^T over the tile's first N keys (N < BC: NARROW's step). */
      auto issue_qk_n = [&](auto ncol, int stage) {
        constexpr int N = decltype(ncol)::value;
        const uint64_t k_desc = make_desc(s_base + L::k_off + stage * L::kv_bytes, 16, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KQK; kk++) {
          const uint32_t oq = (kk / 4) * (BR * 128) + (kk % 4) * 32;
          const uint32_t ok = (kk / 4) * (BC * 128) + (kk % 4) * 32;
          wgmma_ss<N, F16>::run(s, q_desc + (oq >> 4), k_desc + (ok >> 4), kk > 0);
        }
        wgmma_commit();
      };
      /* P V over the tile's first KN keys (KN < BC: NARROW's step). */
      auto issue_pv_n = [&](auto kn, int stage) {
        constexpr int KN = decltype(kn)::value;
        const uint64_t v_desc =
            make_desc(s_base + L::v_off + stage * L::kv_bytes, BC * 128, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KN / 16; kk++)
          wgmma_rs<NPV, F16>::run(o, &pr[4 * kk], v_desc + ((kk * 2048) >> 4), 1);
        wgmma_commit();
      };
      auto issue_qk = [&](int stage) { issue_qk_n(std::integral_constant<int, BC>(), stage); };
      auto issue_pv = [&](int stage) { issue_pv_n(std::integral_constant<int, BC>(), stage); };
      /* Mask, then the online softmax of one S tile: s becomes P (unnormalised, fp32),
       * alpha the factor that rescales O from the previous row max to the new one. */
      auto softmax_n = [&](auto ncols, int n, bool mask) {
        constexpr int NSX = decltype(ncols)::value;   /* the first NSX of the NS accumulators */
        if (mask) {
          const int col0 = n * BC + 2 * q4;
#pragma unroll
          for (int i = 0; i < NSX; i++) {
            const int col = col0 + 8 * (i >> 2) + (i & 1);
            const int h = (i >> 1) & 1;
            if (col > hi[h] || col < lo[h]) s[i] = -INFINITY;
          }
        }
        float mx[2] = {m_r[0], m_r[1]};
#pragma unroll
        for (int i = 0; i < NSX; i++) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
        float sum[2] = {0.f, 0.f}, ms[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
          /* A row that has seen only masked keys keeps max -inf: use 0 so that
           * exp2(-inf - 0) = 0 instead of NaN. */
          if (RESC) {
            /* Keep the stale max unless the new one exceeds it by more than 2^kRescThr:
             * exact, since l and the lse use the same max as P (P <= 2^kRescThr). A row
             * whose max is still -inf stays there (-inf > -inf + thr is false). */
            if (mx[h] * cl2 > m_r[h] * cl2 + kRescThr) {
              alpha[h] = m_r[h] == -INFINITY ? 0.f : ex2(m_r[h] * cl2 - mx[h] * cl2);
              m_r[h] = mx[h];
            } else {
              alpha[h] = 1.f;
            }
            ms[h] = m_r[h] == -INFINITY ? 0.f : m_r[h] * cl2;
          } else {
            ms[h] = mx[h] == -INFINITY ? 0.f : mx[h] * cl2;
            alpha[h] = m_r[h] == -INFINITY ? 0.f : ex2(m_r[h] * cl2 - ms[h]);
            m_r[h] = mx[h];
          }
        }
        if (RESC) resc = __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f);
        /* STAG: the turn (what ptxas makes of it: the enum's comment) */
        if constexpr (STAG) named_sync(my_ebar, 256);
#pragma unroll
        for (int i = 0; i < NSX; i++) {
          const int h = (i >> 1) & 1;
          s[i] = ex2(fmaf(s[i], cl2, -ms[h]));
          sum[h] += s[i];
        }
        if constexpr (STAG) named_arrive(other_ebar, 256);
#pragma unroll
        for (int h = 0; h < 2; h++) l_r[h] = l_r[h] * alpha[h] + sum[h];
      };
      auto softmax = [&](int n, bool mask) {
        softmax_n(std::integral_constant<int, NS>(), n, mask);
      };
      auto convert_p_n = [&](auto npr) {
#pragma unroll
        for (int i = 0; i < decltype(npr)::value; i++) pr[i] = pack2<F16>(s[2 * i], s[2 * i + 1]);
      };
      auto convert_p = [&]() { convert_p_n(std::integral_constant<int, NP>()); };
      auto rescale_o = [&]() {
        if (RESC && !resc) return;   /* warp-uniform */
#pragma unroll
        for (int i = 0; i < NO; i++) o[i] *= alpha[(i >> 1) & 1];
      };

      /* The key tiles of the pipelined steps below: n_max_s - 1 down, n_it_s of them, ring
       * positions from kv_s (NARROW's step takes the first one). */
      int n_max_s = n_max, n_it_s = n_iters, kv_s = kv;
      /* KSPLIT's tile: consumer c takes the key tiles at ring positions kv + c, kv + c + NC,
       * ... (Q K^T, softmax, P V, each waited for: nothing in flight across the branches),
       * and for the others only waits for each stage and releases it, so that every
       * position still gets its 4 NC arrivals on EMPTY_K and EMPTY_V after its FULL wait
       * (kFlSkip's argument; FULL_Q waited for first, as there). No pingpong turn is taken
       * in the tile: every consumer takes none, so the turn order of the tiles after it
       * stays as in the default (equal counts per tile). No deadlock: each consumer walks
       * the positions in order, and FULL_V of position g needs only EMPTY_K of g - 1 and
       * EMPTY_V of g - 2, released by every consumer before it waits on anything of g.
       * The pipelined steps below then have nothing to run (n_it_s = 0); the partial
       * (O, m, l) of the three consumers are merged after them. */
      if constexpr (KSPLIT) {
        if (ks) {
          mbar_wait(bar(BAR_FULL_Q), qn & 1);
          const int cu = __shfl_sync(0xffffffffu, c, 0);   /* warp-uniform to ptxas */
#pragma unroll 1
          for (int it = 0; it < n_iters; it++) {
            const int gk = kv + it, st = gk % kStages, ph = (gk / kStages) & 1;
            mbar_wait(bar(BAR_FULL_K + st), ph);
            if (it % NC == cu) {
              const int n = n_max - 1 - it;
              issue_qk(st);
              wgmma_wait<0>();
              reg_fence<NS>(s);
              release(bar(BAR_EMPTY_K + st));
              softmax(n, needs_mask(n));
              convert_p();
              mbar_wait(bar(BAR_FULL_V + st), ph);
              rescale_o();
              issue_pv(st);
              wgmma_wait<0>();
              reg_fence<NO>(o);
              reg_fence<NP>(pr);
            } else {
              release(bar(BAR_EMPTY_K + st));
              mbar_wait(bar(BAR_FULL_V + st), ph);
            }
            release(bar(BAR_EMPTY_V + st));
          }
          n_it_s = 0;
        }
      }
      if constexpr (NARROW) {
        if (narrow_step) {
          /* NARROW's step: S_0 = Q K_0^T over NW keys, its softmax, O = P_0 V_0 over the
           * same keys, each GEMM waited for before the next, no wgmma in flight where the
           * branch joins. The width is the kernel's: a runtime choice of widths (branches
           * with a wgmma shape each) made ptxas serialize every wgmma of the kernel
           * (C7511 / C7518). Both consumers take the step (it is the CTA tile's), so the
           * pingpong turns stay paired; the pipelined steps then start from O, m and l
           * as it left them. DIAG: only the consumers whose own rows see at most NW keys
           * of the tile take it (the others an empty turn instead, after their prologue). */
          const int st = kv % kStages, ph = (kv / kStages) & 1;
          mbar_wait(bar(BAR_FULL_Q), qn & 1);
          mbar_wait(bar(BAR_FULL_K + st), ph);
          turn_wait();
          issue_qk_n(std::integral_constant<int, NW>(), st);
          turn_pass();
          wgmma_wait<0>();
          reg_fence<NS>(s);
          release(bar(BAR_EMPTY_K + st));
          /* DIAG: only the NW keys that the step's Q K^T wrote, which P V reads (the rest
           * of S is the zeros set above, past this warpgroup's visible keys: no exp2 there) */
          if constexpr (DIAG) {
            softmax_n(std::integral_constant<int, NW / 2>(), n_max - 1, true);
            convert_p_n(std::integral_constant<int, NW / 4>());
          } else {
            softmax(n_max - 1, true);
            convert_p();
          }
          mbar_wait(bar(BAR_FULL_V + st), ph);
          turn_wait();
          issue_pv_n(std::integral_constant<int, NW>(), st);
          turn_pass();
          wgmma_wait<0>();
          reg_fence<NO>(o);
          reg_fence<NP>(pr);
          release(bar(BAR_EMPTY_V + st));
          n_max_s--;
          n_it_s--;
          kv_s++;
        }
      }
      /* SKIP: this warpgroup's rows (all of them) see no key of the first-visited tiles
       * n >= n_vis (causal / right window, or Sq > Sk: n_vis <= 0), or are all past Sq (no
       * output): for those n_skip tiles it issues no wgmma and no softmax, and starts the
       * pipelined steps at the first tile that one of its rows sees. Exact: a fully masked
       * tile leaves m = -inf, l = 0 and O = 0 (P = 0), the state it starts from anyway, so
       * O, l and m are those of the default to the bit (the other warpgroups' too).
       * Why every barrier stays in step (a skipped tile at ring position g = kv_s + i,
       * stage g % kStages, parity (g / kStages) & 1, exactly as the steps below compute it):
       *  - EMPTY_K / EMPTY_V count one arrival per consumer warp per ring position. The
       *    skipped tile still arrives once on each (release(), lane 0 of each warp), so
       *    every position gets its 4 NC arrivals as in the default. Each arrival comes
       *    after this warpgroup waited for FULL_K (FULL_V) of position g: the producer loads
       *    g only after its wait on EMPTY of position g - kStages completed, i.e. after all
       *    4 NC arrivals of g - kStages, so this arrival cannot fall into that earlier
       *    phase. (Without the wait only the pingpong order below would keep a warpgroup
       *    that skips several tiles from arriving for g before another released
       *    g - kStages -- completing that phase early, so that the producer overwrites a
       *    stage in use; with it the phase is right whatever the turns allow.)
       *  - EMPTY_Q: one arrival per warp per query tile, after the steps (unchanged). A
       *    warpgroup that skips every tile (n_it_s == 0 below) waits for FULL_Q first, for
       *    the same reason (FULL_Q of tile qn completes only after EMPTY_Q of qn - 1 did).
       *  - the pingpong turns (named barriers 8 + c): a tile of n key tiles costs every
       *    consumer n + 1 turns in the default (the prologue's, one per step, the last
       *    P V's). Each skipped tile takes its turn here (sync, then hand on at once, no
       *    wait in between, so the turn is never held while waiting on the producer) and
       *    the steps below take the other n - n_skip + 1; with n_skip == n the last P V's
       *    turn is taken here too. The turn is a single token passed 0 -> 1 (-> 2) -> 0, so
       *    equal counts per tile keep the order of every later turn as in the default.
       *  - no deadlock: FULL_V of position g needs the producer past K of g + 1, i.e. past
       *    EMPTY_K of g - 1, which every consumer releases in its step g - 1 (whose turn
       *    this warpgroup has already passed on), and past EMPTY_V of g - 2 (likewise).
       * The skip loop holds no wgmma, so no wgmma is in flight across its branches (ptxas
       * would serialize them: C7511 / C7518); the prologue and the last P V are
       * conditional as in NARROW's kernels. */
      /* kFlSkip: the key tiles at ring positions g0 .. g0 + count - 1 taken without work
       * (the argument above) */
      auto skip_tiles = [&](int g0, int count) {
#pragma unroll 1
        for (int i = 0; i < count; i++) {
          const int gs = g0 + i, st = gs % kStages, ph = (gs / kStages) & 1;
          mbar_wait(bar(BAR_FULL_K + st), ph);
          turn_wait();
          turn_pass();
          release(bar(BAR_EMPTY_K + st));
          /* STAG: the skipped tile's softmax turn, empty, so that every consumer takes n of
           * them on a tile of n key tiles (scripts/model_fwd_sm90_skip.py checks the count) */
          if constexpr (STAG) {
            named_sync(my_ebar, 256);
            named_arrive(other_ebar, 256);
          }
          mbar_wait(bar(BAR_FULL_V + st), ph);
          release(bar(BAR_EMPTY_V + st));
        }
      };
      if constexpr (SKIP) {
        /* c through a shuffle from lane 0 (tells ptxas that it, hence n_skip and the ring
         * positions below, are warp-uniform): with c straight from threadIdx the
         * 160-register D64 kernel (3 consumers) spilled 40 bytes, with it none. */
        const int wg_first = tile_first + __shfl_sync(0xffffffffu, c, 0) * 64;
        const int wg_last = min(wg_first + 63, p.sq - 1);
        const int vis = p.wr >= 0 ? min(p.sk - 1, wg_last + off + p.wr) : p.sk - 1;
        /* (kFlShift: a warpgroup of rows before 0 skips all, as one past Sq) */
        const int n_skip = wg_first >= p.sq || (SHIFT && wg_last < 0)
                               ? n_it_s
                               : min(n_it_s, max(0, n_max_s - (floor_div(vis, BC) + 1)));
        skip_tiles(kv_s, n_skip);
        n_max_s -= n_skip;
        n_it_s -= n_skip;
        kv_s += n_skip;
        if (n_it_s == 0) {   /* every tile skipped: the last P V's turn; Q as said above */
          mbar_wait(bar(BAR_FULL_Q), qn & 1);
          turn_wait();
          turn_pass();
        }
      }
      /* prologue: S_0, softmax -> P_0 */
      if ((!NARROW && !SKIP && !KSPLIT) || n_it_s > 0) {
        const int sk_ = kv_s % kStages, pk = (kv_s / kStages) & 1;
        mbar_wait(bar(BAR_FULL_Q), qn & 1);
        mbar_wait(bar(BAR_FULL_K + sk_), pk);
        FWD_TR(t128 == 0, tr_i, 1 + c, 1);
        turn_wait();
        issue_qk(sk_);
        turn_pass();
        wgmma_wait<0>();
        reg_fence<NS>(s);
        release(bar(BAR_EMPTY_K + sk_));
        softmax(n_max_s - 1, needs_mask(n_max_s - 1));
        convert_p();
        /* DIAG: a warpgroup that took no narrow step while another one did takes one empty
         * turn, so that every consumer passes the same number of turns per tile (the step's
         * two, then n - 1 + 1 for the n - 1 tiles after it: n + 2 against the default's
         * n + 1, equal for n = 1). Here, after its own prologue, it comes where the other
         * one's P V of the narrow tile stands in the turn order; nothing is waited for
         * inside it. */
        if constexpr (DIAG) {
          if (!narrow_step && other_narrow && n_iters >= 2) {
            turn_wait();
            turn_pass();
          }
        }
      }
      /* A pipelined step's GEMMs in one pingpong turn: S = Q K^T (K stage sk_), O's rescale,
       * O += P V (V stage sv, phase pv); back once the Q K^T has completed (K released) and
       * the P V runs on. */
      auto step_gemms = [&](int sk_, int sv, int pv) {
        turn_wait();
        issue_qk(sk_);
        rescale_o();
        mbar_wait(bar(BAR_FULL_V + sv), pv);
        issue_pv(sv);
        turn_pass();
        wgmma_wait<1>();
        reg_fence<NS>(s);
        release(bar(BAR_EMPTY_K + sk_));
      };
      for (int it = 1; it < n_it_s; it++) {
        const int n = n_max_s - 1 - it;
        const int gk = kv_s + it, sk_ = gk % kStages, pk = (gk / kStages) & 1;
        const int gv = gk - 1, sv = gv % kStages, pv = (gv / kStages) & 1;
        mbar_wait(bar(BAR_FULL_K + sk_), pk);
        step_gemms(sk_, sv, pv);
        softmax(n, needs_mask(n));
        /* PIN: a branch on the softmax's last result (l < 0: never) between it and the
         * wait. Without it ptxas places the WARPGROUP.DEPBAR of wgmma_wait<0> at the top of
         * the softmax's basic block (after the element mask's branch): in every default
         * kernel all of the step's MUFU.EX2 follow the P V's completion (sm_90a SASS,
         * 2026-11-30 night), the consumer idles through its own P V, and the softmax is
         * overlapped only by the other consumer's GEMMs. With it, all of them precede it.
         * The branch holds a nanosleep, not a trap: with `trap` there ptxas allocated the
         * D128 kernels within 168 registers (the launch's, not setmaxnreg's 240; 308-2132
         * bytes of spills) and serialized their wgmmas (C7512); with a nanosleep (a plain
         * instruction that falls through) the D128 instances keep their registers (187 /
         * 224 as the defaults), no spills, no C75xx, and the step's 66 / 90 MUFU.EX2 all
         * precede the P V's DEPBAR (2 / 0 in the defaults). */
        if constexpr (PIN) {
          if (l_r[0] < 0.f) asm volatile("nanosleep.u32 0;" ::: "memory");
        }
        wgmma_wait<0>();
        reg_fence<NO>(o);
        reg_fence<NP>(pr);
        release(bar(BAR_EMPTY_V + sv));
        convert_p();
      }
      /* Every Q K^T of this tile has completed: the producer may load the next Q. */
      release(bar(BAR_EMPTY_Q));
      if ((!NARROW && !SKIP && !KSPLIT) || n_it_s > 0) {
        const int gv = kv_s + n_it_s - 1, sv = gv % kStages, pv = (gv / kStages) & 1;
        mbar_wait(bar(BAR_FULL_V + sv), pv);
        turn_wait();
        rescale_o();
        issue_pv(sv);
        turn_pass();
        wgmma_wait<0>();
        reg_fence<NO>(o);
        reg_fence<NP>(pr);
        release(bar(BAR_EMPTY_V + sv));
      }
      kv += n_iters;
      qn++;
      /* KSPLIT's merge: consumers 1 and 2 leave their (O, m, l) in shared memory, thread by
       * thread (the accumulator layout is the same in every warpgroup: thread t128 holds the
       * same rows and columns), and skip the epilogue; consumer 0 rescales the three to the
       * largest row max and stores. Two full barriers of the three consumers (bar.sync on
       * every side, which racecheck follows; with bar.arrive on the writers' and the
       * reader's side it reported 252 hazards): kMergeFull after the writes, kMergeFree
       * after consumer 0's reads, so that no later tile writes the buffer before. */
      if constexpr (KSPLIT) {
        if (ks) {
          float *mb = reinterpret_cast<float *>(smem + L::bar_off + 128);
          const int cu = __shfl_sync(0xffffffffu, c, 0);
          if (cu > 0) {
            float *w = mb + (cu - 1) * (NO + 4) * 128 + t128;
#pragma unroll
            for (int i = 0; i < NO; i++) w[i * 128] = o[i];
#pragma unroll
            for (int h = 0; h < 2; h++) {
              w[(NO + h) * 128] = m_r[h];
              w[(NO + 2 + h) * 128] = l_r[h];
            }
            named_sync_div(kMergeFull, 128 * NC);
            named_sync_div(kMergeFree, 128 * NC);
            continue;
          }
          named_sync_div(kMergeFull, 128 * NC);
          const float *w1 = mb + t128, *w2 = mb + (NO + 4) * 128 + t128;
          float a0[2], a1[2], a2[2];
#pragma unroll
          for (int h = 0; h < 2; h++) {
            const float m1 = w1[(NO + h) * 128], m2 = w2[(NO + h) * 128];
            const float mt = fmaxf(m_r[h], fmaxf(m1, m2));
            /* a row max of -inf (no visible key in that share) weighs 0 */
            a0[h] = m_r[h] == -INFINITY ? 0.f : ex2((m_r[h] - mt) * cl2);
            a1[h] = m1 == -INFINITY ? 0.f : ex2((m1 - mt) * cl2);
            a2[h] = m2 == -INFINITY ? 0.f : ex2((m2 - mt) * cl2);
            l_r[h] = a0[h] * l_r[h] + a1[h] * w1[(NO + 2 + h) * 128] +
                     a2[h] * w2[(NO + 2 + h) * 128];
            m_r[h] = mt;
          }
#pragma unroll
          for (int i = 0; i < NO; i++) {
            const int h = (i >> 1) & 1;
            o[i] = a0[h] * o[i] + a1[h] * w1[i * 128] + a2[h] * w2[i * 128];
          }
          named_sync_div(kMergeFree, 128 * NC);
        }
      }
    }

    /* kFlSplit: a piece of a tail tile meets the tile's other pieces (split_params): all
     * but the last to finish leave their partial and go on; the last merges them. */
    if (SPLIT && piece >= 0) {
      if (n_iters <= 0) continue;   /* an empty share (every consumer) */
      float lq[2];                  /* the rows' sums over the quad */
#pragma unroll
      for (int h = 0; h < 2; h++) {
        lq[h] = l_r[h];
        lq[h] += __shfl_xor_sync(0xffffffffu, lq[h], 1);
        lq[h] += __shfl_xor_sync(0xffffffffu, lq[h], 2);
      }
      const int r = piece;
      int b0, b1;
      split_ctas(sp, r, b0, b1);
      int *cnt = sp.cnt + 2 * (r * NC + c);
      /* the same in every thread; through lane 0 so that ptxas sees it warp-uniform (a
       * divergent continue here would cost the whole loop its uniform datapath) */
      const bool last = __shfl_sync(0xffffffffu,
                                    (int)named_sync_or(kSplitBar + c, 128,
                                                       t128 == 0 && atomicAdd(cnt, n_iters) +
                                                                            n_iters ==
                                                                        sp.n_it),
                                    0) != 0;
      if (!last) {
        const int64_t slot = (int64_t)r * sp.pmax + ((int)blockIdx.x - b0);
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int rl = c * 64 + warp * 16 + g + 8 * h;   /* row in the tile */
          float *prow = sp.part + (slot * BR + rl) * D + 2 * q4;
#pragma unroll
          for (int j = 0; j < D / 8; j++)   /* (never N96: no split with kFlPad) */
            __stcg((float2 *)(prow + 8 * j),
                   make_float2(o[(4 * j + 2 * h) % NO], o[(4 * j + 2 * h + 1) % NO]));
          if (q4 == 0) __stcg(sp.ml + slot * BR + rl, make_float2(m_r[h], lq[h]));
        }
        __threadfence();
        named_sync_div(kSplitBar + c, 128);
        if (t128 == 0) atomicAdd(cnt + 1, n_iters);
        continue;
      }
      if (t128 == 0) {   /* the others have finished: their partials are on the way */
        while (ld_acquire_gpu(cnt + 1) != sp.n_it - n_iters) __nanosleep(32);
        cnt[0] = 0;
        cnt[1] = 0;
      }
      named_sync_div(kSplitBar + c, 128);
      for (int b = b0; b <= b1; b++) {
        if (b == (int)blockIdx.x) continue;
        const int64_t slot = (int64_t)r * sp.pmax + (b - b0);
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int rl = c * 64 + warp * 16 + g + 8 * h;
          const float2 ml = __ldcg(sp.ml + slot * BR + rl);
          const float mn = fmaxf(m_r[h], ml.x);
          const float a0 = m_r[h] == -INFINITY ? 0.f : exp2f((m_r[h] - mn) * cl2);
          const float a1 = ml.x == -INFINITY ? 0.f : exp2f((ml.x - mn) * cl2);
          m_r[h] = mn;
          lq[h] = lq[h] * a0 + ml.y * a1;
          const float *prow = sp.part + (slot * BR + rl) * D + 2 * q4;
#pragma unroll
          for (int j = 0; j < D / 8; j++) {
            const float2 v = __ldcg((const float2 *)(prow + 8 * j));
            const int i = (4 * j + 2 * h) % NO;
            o[i] = o[i] * a0 + v.x * a1;
            o[i + 1] = o[i + 1] * a0 + v.y * a1;
          }
        }
      }
#pragma unroll
      for (int h = 0; h < 2; h++) l_r[h] = q4 == 0 ? lq[h] : 0.f;   /* the quad sum below */
    }

    /* ---------------- epilogue: O / l, lse ---------------- */
    FWD_TR(t128 == 0, tr_i, 1 + c, 2);
    float inv[2], lse[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float l = l_r[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if (m_r[h] == -INFINITY) l = 0.f;   /* no visible key (kFlPoly's guard, kept) */
      inv[h] = l > 0.f ? 1.f / l : 0.f;
      lse[h] = l > 0.f ? m_r[h] * p.scale + logf(l) : -INFINITY;
    }
    T *out = (T *)p.out + (int64_t)ti.batch * p.o_bs + (int64_t)ti.head * p.o_hs;
    if constexpr ((FL & kFlSt16) != 0) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        uint32_t v[D / 8];
#pragma unroll
        for (int j = 0; j < D / 8; j++) {   /* (N96: the groups past O's 96 columns are 0) */
          const int i = (4 * j + 2 * h) % NO;
          v[j] = 4 * j < NO ? pack2<F16>(o[i] * inv[h], o[i + 1] * inv[h]) : 0u;
        }
        quad_transpose_row(v, q4);   /* before the row test: every lane */
        const int r = row0 + 8 * h;
        if (r >= p.sq || (SHIFT && r < 0)) continue;
        store_row16<DST>(out + (int64_t)r * p.o_ts, v, q4);
        if (p.lse && q4 == 0)
          p.lse[(int64_t)ti.batch * p.l_bs + (int64_t)ti.head * p.l_hs + (int64_t)r * p.l_ts] =
              lse[h];
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int r = row0 + 8 * h;
        if (r >= p.sq || (SHIFT && r < 0)) continue;
        T *orow = out + (int64_t)r * p.o_ts + 2 * q4;
#pragma unroll
        for (int j = 0; j < DST / 8; j++) {
          const uint32_t v =
              pack2<F16>(o[4 * j + 2 * h] * inv[h], o[4 * j + 2 * h + 1] * inv[h]);
          *(uint32_t *)(orow + 8 * j) = v;
        }
        if (p.lse && q4 == 0)
          p.lse[(int64_t)ti.batch * p.l_bs + (int64_t)ti.head * p.l_hs + (int64_t)r * p.l_ts] =
              lse[h];
      }
    }
    FWD_TR(t128 == 0, tr_i, 1 + c, 3);
  }
  /* consumer NC-1 arrived once more on consumer 0's turn barrier (at the start); STAG: and
   * on its exponential turn's */
  if (c == 0) named_sync(kSchedBar, 256);
  if (STAG && c == 0) named_sync(kExpBar, 256);
}
#else
template <typename T, int D, int BC, int NC, int FL>
__global__ void attn_fwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q,
                                     const __grid_constant__ CUtensorMap tm_k,
                                     const __grid_constant__ CUtensorMap tm_v,
                                     const fwd_params p, const split_params sp) {}
#endif

/* ---------------- host ---------------- */

/* One call's kernel parameters and the launch switches the front end read (the
 * environment is scanned once per call, there). */
struct fwd_call {
  fwd_params p;
  int grid_cap;         /* OT_ATTN_SM90_GRID: > 0 caps the persistent CTAs */
  bool nonpersistent;   /* OT_ATTN_SM90_NONPERSISTENT */
  bool static_order;    /* OT_ATTN_SM90_DYN=0: masked persistent calls keep the static
                         * round-robin */
  bool sect_mha;        /* OT_ATTN_SM90_SECT=mha: L2 sections counted in query heads
                         * (the order before the dynamic schedule) */
  bool long_persist;    /* OT_ATTN_SM90_DYN=long: masked calls of > 64 query tiles
                         * persistent too (with the dynamic schedule) */
  bool force_dyn;       /* OT_ATTN_SM90_DYN=1 (or long): the dynamic schedule at any tile
                         * count per CTA */
  bool balance_gate;    /* default (OT_ATTN_SM90_DYN unset or auto; off with =count): the
                         * dynamic schedule also where the static order's modeled balance
                         * (static_balance) is below 0.97 */
};

/* The static round-robin's balance for a masked, sectioned persistent launch: the mean of
 * the CTAs' sums over the largest, each tile costing its key tiles + 0.5 (0 without keys) --
 * tile t of decode_tile's order runs on CTA t % grid. A model (the cost of a tile's prologue
 * and epilogue as half a key tile is a guess), not a measurement: H200, 2026-12-02, it put
 * D64 causal S 4k B 8 on 3 consumers at 0.830 (sections of 24 heads x 22 query tiles = 528
 * tiles, 4 x 132: every CTA takes the same positions of each section, longest first) where
 * that call measured 0.89x the 2-consumer kernel whose model is 0.999, and S 5k - 8k at
 * 0.94-1.00, where 3 consumers measured 1.07-1.11x (docs/ATTENTION.md). Each run of cnt
 * tiles of one query tile index adds its cost to cnt consecutive CTAs (a difference array):
 * O(sections x num_m + grid), no per-tile loop. pad: kFlShift's row offset (the first row of
 * query tile m is m br - pad). */
static double static_balance(int num_m, int nhb, int sect, int sq, int sk, int br, int bc,
                             int wl, int wr, int grid, int pad = 0) {
  if (grid < 1 || num_m < 1 || nhb < 1 || sect < 1) return 1.0;
  /* on the stack up to 1024 CTAs (the call's hot path: no heap allocation), else the heap */
  double stack_diff[1025];
  std::vector<double> heap_diff;
  double *diff = stack_diff;
  if (grid >= 1025) {
    heap_diff.resize((size_t)grid + 1);
    diff = heap_diff.data();
  }
  std::fill(diff, diff + grid + 1, 0.0);
  double base = 0.0, total = 0.0;
  int cta = 0;   /* the CTA of the run's first tile */
  for (int hb0 = 0; hb0 < nhb; hb0 += sect) {
    const int cnt = std::min(sect, nhb - hb0);
    for (int mi = 0; mi < num_m; mi++) {
      const int mb = wr >= 0 ? num_m - 1 - mi : mi;
      int n_min, n_max;
      const int first = mb * br - pad;
      tile_keys(first, std::min(first + br - 1, sq - 1), bc, sq, sk, wl, wr, n_min, n_max);
      const double cost = n_max > n_min ? n_max - n_min + 0.5 : 0.0;
      total += cost * cnt;
      base += cost * (cnt / grid);
      const int rem = cnt % grid, end = cta + rem;
      diff[cta] += cost;
      if (end <= grid) {
        diff[end] -= cost;
      } else {   /* wraps round to CTA 0 */
        diff[grid] -= cost;
        diff[0] += cost;
        diff[end - grid] -= cost;
      }
      cta = end % grid;
    }
  }
  double run = 0.0, mx = 0.0;
  for (int i = 0; i < grid; i++) mx = std::max(mx, base + (run += diff[i]));
  return mx > 0.0 ? total / grid / mx : 1.0;
}

/* What the last Hopper forward launch on this host thread ran (ot_cuda_attn_sm90_last_plan,
 * for tests and benchmarks): consumer warpgroups, key tile, CTAs, variant bits, flags (1
 * persistent, 2 the dynamic schedule, 4 masked) and the modeled static balance in
 * thousandths (0: not computed). */
struct fwd_plan {
  int nc, bc, grid, fl, flags, balance;
};
static thread_local fwd_plan last_plan;

/* An OT_ATTN_SM90_* switch (measurements and tests): getenv only where `any` (one
 * ot_env_any("OT_ATTN_SM90_") pass over the environment per call) found some set; in
 * normal use none is, and a call reads the environment once instead of once per switch. */
static inline const char *sm90_knob(bool any, const char *name) {
  return any ? getenv(name) : NULL;
}

template <typename T, int D, int BC, int NC, int FL>
static ot_status launch(ot_context *ctx, const ot_attention_args *a, const CUtensorMap *maps,
                        const fwd_call *fc) {
  static const char *op = "attention_forward";
  using L = fwd_smem<D, BC, NC>;
  auto kern = attn_fwd_sm90_kernel<T, D, BC, NC, FL>;
  /* kFlKsplit's merge buffer after the barriers: consumers 1 and 2's O, m and l, a float
   * per thread each ((D / 2 + 4) x 128 floats a consumer; 36 KB at head dim 64) */
  constexpr int kBytes = L::bytes + ((FL & kFlKsplit) ? 2 * (D / 2 + 4) * 128 * 4 : 0);
  static_assert(kBytes <= kSmemOptin, "shared memory opt-in limit");
  static std::atomic<uint64_t> attr_done{0};   /* sm90_common.cuh's smem_attr_once */
  OT_TRY(smem_attr_once(kern, kBytes, ctx, attr_done, op));
  /* One persistent CTA per SM walks the tiles round-robin, its epilogue overlapping the
   * loads of its next tile. Unmasked tiles all cost the same and go m-fastest (the CTAs
   * running together share one head's K/V in L2). Masked (causal) tiles differ: they go
   * in L2-sized sections of heads, longest tiles first inside a section, so that each
   * round of the round-robin hands out tiles of similar length.
   * OT_ATTN_SM90_NONPERSISTENT=1: one CTA per tile instead (m fastest, longest first per
   * head, the hardware's block scheduler balancing).
   * Masked calls on the instances that carry it take the tiles dynamically (dyn_ok,
   * fwd_params::tile_ctr): a static round-robin of tiles of falling length leaves CTAs
   * with unequal sums when there are few tiles per CTA -- B 1, 32 heads, S 2k (512 tiles
   * of 1..16 key tiles on 132 CTAs): the longest CTA's sum 1.40x the mean (the engine's
   * prefill), against 1.03x with each CTA claiming its next tile when it is near the end
   * of the current one (a list schedule, longest tiles first). */
  fwd_params q = fc->p;
  const int64_t n_tiles = (int64_t)q.num_m * q.hq * q.batch;
  /* OT_ATTN_SM90_GRID=n: at most n persistent CTAs (tests the multi-tile path on small
   * shapes, e.g. under compute-sanitizer). */
  const int sms = fc->grid_cap > 0 ? fc->grid_cap : ot_cuda_state_of(ctx)->sm_count;
  const bool masked = q.wl >= 0 || q.wr >= 0;
  /* Masked tiles with long sequences (> 64 query tiles) go one CTA per tile: the static
   * round-robin then balances worse than the hardware's block scheduler (H200, causal
   * S = 16k: D128 543 vs 556 TFLOP/s, D256 460 vs 684), while up to S = 8k persistence
   * wins (S = 4k causal: D128 565 vs 467, D256 624 vs 571; run of 90616f4). */
  constexpr bool kDyn = dyn_ok(FL, NC, D);
  const bool dyn_want = kDyn && masked && !fc->static_order;
  const bool persistent = !fc->nonpersistent && n_tiles > sms &&
                          (!masked || q.num_m <= 64 || (dyn_want && fc->long_persist));
  q.sect = 0;
  q.tile_ctr = nullptr;
  int balance = 0;
  if (persistent && masked) {
    /* The query heads of a section share the K/V of sect / group heads (GQA: group query
     * heads a K/V head, adjacent in the order) */
    const int64_t kv_bytes = 2 * (int64_t)q.sk * D * (int64_t)sizeof(T);
    const int64_t budget = (int64_t)24 << 20;   /* of the 50 MB L2 */
    int64_t sect = budget / (kv_bytes > 0 ? kv_bytes : 1) * (fc->sect_mha ? 1 : q.group);
    const int64_t nhb = (int64_t)q.hq * q.batch;
    q.sect = (int)(sect < 1 ? 1 : sect > nhb ? nhb : sect);
    /* The dynamic schedule where the CTAs get few tiles each (<= 16 on average): there the
     * static round-robin's unequal sums cost 3-24% (H200, 2026-12-02: B 1 S 2k 1.24x the old
     * order, B 1 S 8k 1.14x, B 4 S 2k 1.11x, D256 B 32 S 1k causal 1.026x); with more, the
     * static order is within 1% of balanced and the claims' cost shows (31 - 62 tiles a CTA:
     * D64 S 1k / 4k and D128 S 1k causal 0.98x the static order; D128 B 8 S 4k 1.00x).
     * OT_ATTN_SM90_DYN=1 takes it at any count, =0 never. */
    bool take = dyn_want && (fc->force_dyn || n_tiles <= 16 * (int64_t)sms);
    /* The balance gate (the default; OT_ATTN_SM90_DYN=count turns it off): also where the
     * static order's modeled balance is below 0.97 (the claims cost ~2% at 31-62 tiles a
     * CTA). H200, 2026-12-02 (attention_fwd_dynauto.json, 8 balanced rounds, paired against
     * the count rule): the rows it flags 1.010-1.047x (D64 causal S 5k-7k on 3 consumers,
     * models 0.935-0.948) and 1.036x / 1.074x (D128 causal S 3k / 6k, 0.953 / 0.951); rows
     * it leaves alone run the same kernel. */
    if (dyn_want && !take && fc->balance_gate) {
      constexpr int BR = fwd_cfg<NC>::br;
      const double b = static_balance(q.num_m, (int)nhb, q.sect, q.sq, q.sk, BR, BC, q.wl,
                                      q.wr, sms, (FL & kFlShift) ? q.num_m * BR - q.sq : 0);
      balance = (int)(b * 1000.0 + 0.5);
      take = b < 0.97;
    }
    if (take) q.tile_ctr = ot_cuda_tile_counter(ctx);   /* NULL: the static order */
  }
  const unsigned grid = (unsigned)(persistent ? sms : n_tiles);
  /* kFlSplit: the rem = n_tiles % grid tiles of the last round of an unmasked persistent
   * launch (all tiles cost the same) would run on rem SMs while the others idle; their key
   * tiles are cut instead into equal shares of every CTA (split_params), the pieces of a
   * tile merged in the kernel by the one that finishes it last. Needs the context's
   * zeroed counters and scratch for the partials (none: no split). */
  split_params sp;
  memset(&sp, 0, sizeof sp);
  sp.split_full = sp.n_items = (int)n_tiles;
  if constexpr ((FL & kFlSplit) != 0) {
    constexpr int BR = fwd_cfg<NC>::br;
    const int rem = (int)(n_tiles % sms), n_it = (q.sk + BC - 1) / BC;
    if (persistent && !masked && rem > 0 && (int64_t)rem * n_it < (1 << 30)) {
      split_params plan;
      memset(&plan, 0, sizeof plan);
      split_plan(plan, (int)n_tiles, sms, n_it);
      const int pmax = plan.pmax;
      int *cnt = ot_cuda_split_counters(ctx, 2 * rem * NC);
      const size_t part_bytes = (size_t)rem * pmax * BR * D * sizeof(float);
      void *scr = NULL;
      if (cnt) {
        const ot_status st = ot_cuda_scratch_try(
            ctx, part_bytes + (size_t)rem * pmax * BR * sizeof(float2), op, &scr);
        if (st != OT_OK) return st;
      }
      if (scr) {   /* (none, or out of memory with nothing recorded: no split) */
        sp = plan;
        sp.part = (float *)scr;
        sp.ml = (float2 *)((char *)scr + part_bytes);
        sp.cnt = cnt;
      }
    }
  }
  kern<<<grid, fwd_cfg<NC>::threads, kBytes, (cudaStream_t)ctx->stream>>>(maps[0], maps[1],
                                                                            maps[2], q, sp);
  OT_CUDA_CHECK_LAUNCH(op);
  last_plan = {NC, BC, (int)grid, FL,
               (persistent ? 1 : 0) | (q.tile_ctr ? 2 : 0) | (masked ? 4 : 0) |
                   (sp.cnt ? 8 : 0),
               balance};
  return OT_OK;
}

/* The compiled variant bits of one (dtype, D, BC, NC) configuration (each list holds 0). */
template <int... F> struct fl_list {};
template <int... F> static bool fl_has(int fl, fl_list<F...>) { return ((fl == F) || ...); }
template <typename T, int D, int BC, int NC, int F0, int... F>
static ot_status launch_in(ot_context *ctx, const ot_attention_args *a, const CUtensorMap *maps,
                           const fwd_call *p, int fl, fl_list<F0, F...>) {
  if constexpr (sizeof...(F) == 0) {
    return launch<T, D, BC, NC, F0>(ctx, a, maps, p);
  } else {
    if (fl == F0) return launch<T, D, BC, NC, F0>(ctx, a, maps, p);
    return launch_in<T, D, BC, NC>(ctx, a, maps, p, fl, fl_list<F...>());
  }
}
/* Runs the instance with the bits fl, or, where that one is not compiled, with fl's bits
 * dropped one by one (kFlShift first, the 16-byte stores, the pin, the skip, then the
 * narrow step, the rescale threshold: drop[]'s order; the Q prefetch, kFlKsplit, the tail
 * split and kFlN96 before all) until it is. */
template <typename T, int D, int BC, int NC, int... F>
static ot_status launch_sel(ot_context *ctx, const ot_attention_args *a, const CUtensorMap *maps,
                            const fwd_call *p, int fl, fl_list<F...> l) {
  static const int drop[] = {kFlQpf,   kFlKsplit, kFlSplit, kFlN96,
                             kFlStag,  kFlShift,  kFlSt16,  kFlPin,
                             kFlSkip,  kFlNarrow | kFlNarrowW | kFlDiag, kFlResc};
  for (int i = 0; i < (int)(sizeof drop / sizeof drop[0]) && !fl_has(fl, l); i++) fl &= ~drop[i];
  return launch_in<T, D, BC, NC>(ctx, a, maps, p, fl, l);
}

/* The instances of each configuration: kFlResc for head dim 256 and the 128-key tile of
 * head dim 128 (where it was measured faster, see the dispatch), kFlNarrow at 48 keys for
 * the bf16 176-key tile of head dim 128, kFlDiag for the bf16 128-key tile of head dim 64
 * with 2 consumers; kFlSt16 with the bf16 ones of the threshold and kFlDiag. A build with
 * -DOT_ATTN_SM90_EXPERIMENTS (never CI) adds the bf16 variants measured against them
 * (bench/attn_fwd_variants.py): at D128 176 the threshold, the split, and the threshold
 * with the narrow step (OT_ATTN_SM90_RESC=1 where the narrow step is on; H200, run 3 of
 * attention_fwd.json: S 4k 0.971x, 16k 1.022x the default, within noise, not used);
 * the narrow step at D256; kFlSkip at D64 (2 and 3 consumers), D128 128 and D256; kFlDiag
 * at D128 128; kFlPin at D64 128 with 2 consumers with kFlDiag (with and without kFlSt16)
 * and 3, D128 128 (with the threshold) and 176 (plain: S 16k; with the 48-key narrow step:
 * S 4k -- the unmasked defaults), D256 (with the threshold): prepared 2026-11-30 night;
 * since 2026-12-02 the default of D64's masked 2-consumer calls without kFlDiag (its
 * instance in every build, below). (kFlLate, prepared with it, measured 0.88-0.98x the
 * default on 2026-12-02 and removed: docs/ATTENTION.md.) kFlStag (SG) with the other
 * defaults' bits (D64 NC 2 with kFlPin, NC 3 with kFlPin and alone, NC 3 with kFlSkip alone,
 * D128 176 with the pin, with and without the narrow step, D128 128 with the threshold and
 * kFlSt16): measured 0.96-0.99x on 2026-12-02, not used; with kFlDiag and kFlSt16 (D64 NC 2)
 * and with kFlSkip and kFlShift (D64 NC 3) the default since then (those instances in every
 * build, below). */
template <typename T, int D, int BC, int NC>
static ot_status launch_fl(ot_context *ctx, const ot_attention_args *a, const CUtensorMap *maps,
                           const fwd_call *p, int fl) {
#ifdef OT_ATTN_SM90_EXPERIMENTS
  constexpr bool X = !is_half<T>::value;
#else
  constexpr bool X = false;
#endif
  constexpr int R = kFlResc, SP = kFlSplit, SK = kFlSkip;
  constexpr int DG = kFlDiag | narrow_bits(4);   /* per-warpgroup narrow step, 64 keys */
  constexpr int PN = kFlPin, ST = kFlSt16, SH = kFlShift, SG = kFlStag, PD = kFlPad;
  constexpr int N96 = kFlN96, KS = kFlKsplit, QP = kFlQpf;
  if constexpr (X && D == 128 && BC == 176) {
    return launch_sel<T, D, BC, NC>(ctx, a, maps, p, fl,
                                    fl_list<0, R, SP, narrow_bits(3), R | narrow_bits(3),
                                            PN, narrow_bits(3) | PN, narrow_bits(3) | PN | ST,
                                            PN | ST, narrow_bits(3) | PN | SG, PN | SG>());
  } else if constexpr (X && D == 256) {         /* narrow: S 4k; 1k and 16k */
    return launch_sel<T, D, BC, NC>(ctx, a, maps, p, fl,
                                    fl_list<0, R, R | narrow_bits(1), R | narrow_bits(4),
                                            R | SK, R | PN, R | ST, R | SP>());
  } else if constexpr (X && D == 128 && BC == 128) {   /* skip: the masked calls' tile */
    return launch_sel<T, D, BC, NC>(ctx, a, maps, p, fl,
                                    fl_list<0, R, R | SK, R | DG, R | PN, R | ST, R | ST | SG,
                                            R | PD, R | ST | PD, R | ST | SP>());
  } else if constexpr (X && D == 64 && BC == 128 && NC == 2) {
    return launch_sel<T, D, BC, NC>(ctx, a, maps, p, fl,
                                    fl_list<0, SK, DG, PN, DG | PN, DG | PN | ST, DG | ST, ST,
                                            DG | ST | SG, PN | SG>());
  } else if constexpr (X && D == 64 && BC == 128 && NC == 3) {   /* skip: 192-row tiles */
    /* kFlShift (with the skip the default, below; measured 2026-12-02): with and without
     * the skip */
    return launch_sel<T, D, BC, NC>(ctx, a, maps, p, fl,
                                    fl_list<0, SK, PN, PN | ST, SK | SH, SH, PN | SG, SG,
                                            SK | SH | SG, SK | SG, PN | KS>());
  } else if constexpr (D == 64 && BC == 128 && NC == 2 && !is_half<T>::value) {
    /* the per-warpgroup narrow step (masked calls of at most 8 query tiles), bf16, with the
     * 16-byte O stores and kFlStag (its default), with the stores alone (OT_ATTN_SM90_STAG=0)
     * and without them (OT_ATTN_SM90_ST16=0); kFlPin (masked calls
     * with a left window of 9..64 query tiles: the default; causal ones of 9..15 until
     * 2026-12-02, now on 3 consumers) */
    return launch_sel<T, D, BC, NC>(ctx, a, maps, p, fl,
                                    fl_list<0, DG, DG | ST, DG | ST | SG, PN>());
  } else if constexpr (D == 128 && BC == 176 && !is_half<T>::value) {
    /* the narrow step at 48 keys (a last key tile of 1..48 keys, e.g. S 4k), bf16; kFlPin
     * with and without it (the unmasked default, OT_ATTN_SM90_PIN=0 the plain order) */
    return launch_sel<T, D, BC, NC>(ctx, a, maps, p, fl,
                                    fl_list<0, narrow_bits(3), PN, narrow_bits(3) | PN>());
  } else if constexpr (D == 64 && BC == 128 && NC == 3 && !is_half<T>::value) {
    /* 192-row tiles: kFlPin the unmasked calls' default, kFlSkip with kFlShift and kFlStag
     * the causal ones' (kFlSkip alone where 192 divides Sq; kFlSkip | kFlShift under
     * OT_ATTN_SM90_STAG=0), bf16; kFlKsplit with kFlPin (unmasked calls whose last query
     * tile has at most 64 rows, see the dispatch) */
    return launch_sel<T, D, BC, NC>(ctx, a, maps, p, fl,
                                    fl_list<0, PN, SK, SK | SH, SK | SH | SG, PN | KS>());
  } else if constexpr (D == 128 && BC == 128 && !is_half<T>::value) {
    /* the threshold, with the 16-byte O stores; each also for head dim 96 (kFlPad), the
     * 16-byte one also with P V at N = 96 (kFlN96: its default; OT_ATTN_SM90_N96=0 off) */
    return launch_sel<T, D, BC, NC>(ctx, a, maps, p, fl,
                                    fl_list<0, R, R | ST, R | PD, R | ST | PD,
                                            R | ST | PD | N96, R | ST | SP>());
  } else if constexpr (D == 128 && BC == 128) {
    /* fp16: head dim 96 also with P V at N = 96 and the 16-byte stores (kFlN96's
     * instance, the default since 2026-12-03's twenty-fifth session: 1.04-1.18x R | PD;
     * OT_ATTN_SM90_ST16=0 or OT_ATTN_SM90_N96=0 keep R | PD) */
    return launch_sel<T, D, BC, NC>(ctx, a, maps, p, fl,
                                    fl_list<0, R, R | PD, R | ST | PD | N96>());
  } else if constexpr (D == 256 && !is_half<T>::value) {
    /* the threshold; bf16 with the 16-byte O stores too (D128 128-key and D256 masked
     * calls: the default), with the tail split (unmasked calls), and with the next tile's Q
     * prefetched to L2 (unmasked calls, OT_ATTN_SM90_QPF=1) */
    return launch_sel<T, D, BC, NC>(ctx, a, maps, p, fl,
                                    fl_list<0, R, R | ST, R | SP, R | QP>());
  } else if constexpr (D == 256) {
    return launch_sel<T, D, BC, NC>(ctx, a, maps, p, fl, fl_list<0, R>());
  } else {
    return launch_sel<T, D, BC, NC>(ctx, a, maps, p, fl, fl_list<0>());
  }
}

/* Key-tile width per head dim (and mask): the largest tile whose S, P and O registers fit
 * the consumers' 240 and whose 2-stage K/V rings fit shared memory (FA3's choices). */
template <typename T>
static ot_status dispatch(ot_context *ctx, const ot_attention_args *a, const CUtensorMap *maps,
                          const fwd_call *p, bool small_tile, int nc, int fl) {
  switch (a->d) {
    case 64:
      if (nc == 3) return launch_fl<T, 64, 128, 3>(ctx, a, maps, p, fl);
      return small_tile ? launch_fl<T, 64, 128, 2>(ctx, a, maps, p, fl)
                        : launch_fl<T, 64, 192, 2>(ctx, a, maps, p, fl);
    case 128:
      return small_tile ? launch_fl<T, 128, 128, 2>(ctx, a, maps, p, fl)
                        : launch_fl<T, 128, 176, 2>(ctx, a, maps, p, fl);
    default:
      return launch_fl<T, 256, 80, 2>(ctx, a, maps, p, fl);
  }
}

/* 3 consumer warpgroups (192-row tiles) hold 160 registers each: S, P and O of a 128-key
 * tile at head dim 64 (64 + 32 + 32) fit, a 192-key one would not. (At head dim 128 only
 * an 80-key tile fits, 40 + 20 + 64: measured 558 vs 644 TFLOP/s at S = 4k, H200, run of
 * d610a26, so D128 keeps 2 consumers.) */
static int key_tile(int64_t d, bool small_tile, int nc) {
  if (nc == 3) return 128;
  return d == 64 ? (small_tile ? 128 : 192) : d == 128 ? (small_tile ? 128 : 176) : 80;
}

}  // namespace sm90
}  // namespace ot

/* (tests) out[0..5] of the last Hopper forward launch on this host thread: fwd_plan's nc,
 * bc, grid, fl, flags, balance; all 0 before the first. */
extern "C" void ot_cuda_attn_sm90_last_plan(int out[6]) {
  const ot::sm90::fwd_plan &p = ot::sm90::last_plan;
  out[0] = p.nc, out[1] = p.bc, out[2] = p.grid, out[3] = p.fl, out[4] = p.flags;
  out[5] = p.balance;
}
/* (tests) static_balance of the forward's dynamic-schedule gate, host only */
extern "C" double ot_cuda_attn_sm90_static_balance(int num_m, int nhb, int sect, int sq,
                                                   int sk, int br, int bc, int wl, int wr,
                                                   int grid) {
  return ot::sm90::static_balance(num_m, nhb, sect, sq, sk, br, bc, wl, wr, grid);
}

/* (tests) kFlSplit's shares, host only: for n_tiles tiles of n_it key tiles on grid
 * persistent CTAs, out[0..5] = split_full, n_items, n_it, len, units, pmax of launch()'s
 * plan, then for each u < 2 grid (r, k0, k1) of split_share (3 ints each), then for each
 * tail tile r < n_tiles % grid (b0, b1) of split_ctas; out holds 6 + 6 grid + 2 grid ints */
#ifdef OT_FWD_TRACE
/* (OT_FWD_TRACE builds) the stamps of the launches since the last clear (OT_FWD_TRACE's
 * comment above the kernel): dst (kFwdTrCtas x kFwdTrItems x 4 x 4 u64) or NULL; clear != 0
 * zeroes them after the copy. Synchronizes the device. 0 on success. */
extern "C" int ot_cuda_attn_fwd_trace(unsigned long long *dst, int clear) {
  if (cudaDeviceSynchronize() != cudaSuccess) return -1;
  if (dst && cudaMemcpyFromSymbol(dst, ot::sm90::fwd_tr_buf, sizeof ot::sm90::fwd_tr_buf) !=
                 cudaSuccess)
    return -1;
  if (clear) {
    void *a = NULL;
    if (cudaGetSymbolAddress(&a, ot::sm90::fwd_tr_buf) != cudaSuccess ||
        cudaMemset(a, 0, sizeof ot::sm90::fwd_tr_buf) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
      return -1;
  }
  return 0;
}
#endif

extern "C" void ot_cuda_attn_sm90_split_shares(int n_tiles, int grid, int n_it, int *out) {
  ot::sm90::split_params sp;
  memset(&sp, 0, sizeof sp);
  ot::sm90::split_plan(sp, n_tiles, grid, n_it);
  const int v[6] = {sp.split_full, sp.n_items, sp.n_it, sp.len, sp.units, sp.pmax};
  for (int i = 0; i < 6; i++) out[i] = v[i];
  int *o = out + 6;
  for (int u = 0; u < 2 * grid; u++, o += 3) ot::sm90::split_share(sp, u, grid, o[0], o[1], o[2]);
  for (int r = 0; r < n_tiles % grid; r++, o += 2) ot::sm90::split_ctas(sp, r, o[0], o[1]);
}

extern "C" bool ot_cuda_attention_sm90_available(ot_context *ctx) {
  return ot::sm90::sm90_attention_enabled(ctx);
}

extern "C" ot_status ot_cuda_attention_sm90_refusal(ot_context *ctx, const char *op,
                                                    const char *which,
                                                    const ot_attention_args *a) {
  if (!ot::sm90::sm90_attention_enabled(ctx))
    return ot_error(OT_ERR_UNSUPPORTED, op,
                    "OT_ATTN_IMPL=sm90: no Hopper attention kernel here (it needs a build with "
                    "90a in OT_CUDA_ARCHS, a compute capability 9.0 device and OT_ATTN_SM90 "
                    "unset or not 0)");
  return ot_error(OT_ERR_UNSUPPORTED, op,
                  "OT_ATTN_IMPL=sm90: the Hopper %s does not cover this call (head dim %d, "
                  "%s%s%s%s%s; docs/ATTENTION.md lists what it takes)",
                  which, (int)a->d, a->dtype == OT_BF16 ? "bf16" : a->dtype == OT_F16 ? "fp16" : "fp32",
                  a->cu_q ? ", varlen" : "", a->softcap != 0.f ? ", softcap" : "",
                  a->deterministic ? ", deterministic" : "",
                  which[0] == 'f' && a->scale < 0.f ? ", negative scale" : "");
}

extern "C" ot_status ot_cuda_attention_forward_sm90(ot_context *ctx, const ot_attention_args *a,
                                                    bool *handled) {
  using namespace ot::sm90;
  *handled = false;
  /* A build with sm_90a, OT_ATTN_SM90 not 0, a 9.0 device (sm90_common.cuh). */
  if (!sm90_attention_enabled(ctx)) return OT_OK;
  if (a->dtype != OT_BF16 && a->dtype != OT_F16) return OT_OK;
  /* Head dim 96 on the D = 128 tile (kFlPad; the default since 2026-12-03: 1.11-1.23x
   * cuDNN's forward, bench/results/attention_d96_kstep.json; OT_ATTN_SM90_PAD96=0, read per
   * call, runs the portable forward instead): the rest of the dispatch sees D = 128 (the
   * 128-key tile, no narrow step), the maps and the stores 96 columns. */
  const char *p96 = a->d == 96 ? getenv("OT_ATTN_SM90_PAD96") : NULL;
  const bool pad96 = a->d == 96 && !(p96 && p96[0] == '0');
  const int64_t d_call = a->d;
  ot_attention_args a128;
  if (pad96) {
    a128 = *a;
    a128.d = 128;
    a = &a128;
  }
  if (a->d != 64 && a->d != 128 && a->d != 256) return OT_OK;
  if (a->cu_q || a->cu_k || a->softcap != 0.f) return OT_OK;
  /* The row max is taken over the unscaled scores (the max of s * scale only for scale > 0);
   * with kFlResc a negative scale would keep every row's max at -inf (output 0). */
  if (!(a->scale > 0.f)) return OT_OK;
  if (a->sq <= 0 || a->sk <= 0 || a->batch <= 0) return OT_OK;
  /* int32 index arithmetic in the kernel: row + (sk - sq) + window stays below 2^31. */
  if (a->sq > (1 << 28) || a->sk > (1 << 28) || a->hq > 65535 || a->batch > 65535) return OT_OK;
  if (a->hkv <= 0 || a->hq % a->hkv != 0) return OT_OK;
  if ((a->sq + kBr - 1) / kBr * a->hq * a->batch >= ((int64_t)1 << 31)) return OT_OK;
  if (!tma_ok(&a->q, a->batch, a->hq) || !tma_ok(&a->k, a->batch, a->hkv) ||
      !tma_ok(&a->v, a->batch, a->hkv))
    return OT_OK;
  /* O is written as 2-element (4-byte) words. */
  if (((uintptr_t)a->out.data & 3) != 0 || (a->out.tok_stride & 1) || (a->out.head_stride & 1) ||
      (a->out.batch_stride & 1))
    return OT_OK;
  /* The tile choice only: the smaller key tile (that of masked calls) also for short key
   * sequences, where the wide tile's extra per-tile cost is not amortised (S = 1k: D64 369
   * vs 348 TFLOP/s, D128 503 vs 492; at S = 4k the wide tile won, D128 650 vs 584, in
   * blocks of calls with no warm-up). At D = 128 the 128-key tile for every call since the
   * twenty-seventh session (2026-12-03): timed in the steady state (balanced order, 100 ms of
   * warm-up a block, where the chip runs at its power cap) it is 1.039x / 1.055x / 1.013x
   * the 176-key tile (with kFlPin and kFlNarrow) at unmasked Sk 4k / 8k / 16k in bf16, 1.017x
   * at 4k in fp16, against A/A controls of 0.994x / 1.014x / 0.992x / 1.000x
   * (bench/results/attention_fwd_tile128.json); the wide tile only under =wide. (D = 64's
   * unmasked calls run 3 consumers, whose tile is 128 keys either way; D = 256's is 80.)
   * OT_ATTN_SM90_TILE=small|wide forces one for every call. */
  const bool knobs = ot_env_any("OT_ATTN_SM90_");   /* the switches read below */
  const char *tile = sm90_knob(knobs, "OT_ATTN_SM90_TILE");
  const bool small_tile = pad96 || (tile ? tile[0] == 's'
                                         : a->window_left >= 0 || a->window_right >= 0 ||
                                               a->sk <= 2048 || a->d == 128);
  /* Head dim 64: 3 consumer warpgroups (192 query rows, 128 keys; FA3's shape) except
   * for masked calls of at most 64 query tiles of 128 -- 15 where no left window bounds the
   * keys (causal) -- (the persistent causal regime, with sectioned tile order). H200, run of
   * d610a26, TFLOP/s with 3 vs 2: non-causal S = 4k 504 vs 411, 16k 474 vs 433, causal 16k
   * 478 vs 418; but causal S = 1k / 4k 260 / 354 vs 284 / 397. 2026-12-02
   * (attention_fwd_wg3_sweep.json, 8 balanced rounds, 2 consumers with kFlPin): causal S 4k
   * 0.890x, but S 5k 1.067x, 6k 1.088x, 7k 1.075x, 8k 1.105x (B 4), 1.024x (B 2), 1.032x (B 1
   * GQA, against the dynamic schedule). Causal past 16 query tiles since the balance gate
   * (launch(): the static order's resonance at S 2k / 4k was the 3 consumers' loss there):
   * 2026-12-02 (attention_fwd_dynauto.json, 8 rounds, both with the gate) S 3k 1.100x, S 4k
   * 1.042x, S 2k 1.000x the 2-consumer default; with kFlSkip (below) S 2k 1.034x, so causal
   * from 16 query tiles on (attention_fwd_skip3.json); bf16 causal from 9 query tiles on
   * since 2026-12-02 (nineteenth session) with kFlSkip and kFlShift (below): S 1152 (a
   * multiple of 192, no shift) 1.055x, S 1280 / 1408 / 1792 1.069x / 1.070x / 1.072x the
   * 2-consumer default (attention_fwd_shift.json, 10 of 10 round pairs each); S 1k (8 tiles)
   * 1.004x, kept on 2. Windowed calls keep 64 (short tiles: unmeasured). OT_ATTN_SM90_WG=2|3
   * forces one. */
  const char *wgs = sm90_knob(knobs, "OT_ATTN_SM90_WG");
  const bool masked_call = (a->window_left >= 0 && a->window_left <= a->sq + a->sk) ||
                           (a->window_right >= 0 && a->window_right <= a->sq + a->sk);
  const bool left_window = a->window_left >= 0 && a->window_left <= a->sq + a->sk;
  const int64_t q_tiles = (a->sq + kBr - 1) / kBr;
  /* (bf16 causal from 9 query tiles: 3 consumers with kFlSkip and kFlShift, below; fp16 has
   * neither and keeps 2 up to 15) */
  const bool wg3_causal = !left_window && (q_tiles >= 16 || (q_tiles >= 9 && a->dtype == OT_BF16));
  int nc = a->d == 64 && (!masked_call || q_tiles > 64 || wg3_causal) ? 3 : 2;
  if (a->d == 64 && wgs && (wgs[0] == '2' || wgs[0] == '3')) nc = wgs[0] - '0';
  const int br = 64 * nc;
  const int bc = key_tile(a->d, small_tile, nc);
  CUtensorMap maps[3];
  auto enc = pad96 ? encode_map_pad : encode_map;
  if (!enc(&maps[0], &a->q, a->dtype, a->batch, a->sq, a->hq, d_call, br) ||
      !enc(&maps[1], &a->k, a->dtype, a->batch, a->sk, a->hkv, d_call, bc) ||
      !enc(&maps[2], &a->v, a->dtype, a->batch, a->sk, a->hkv, d_call, bc))
    return OT_OK;
  fwd_call call;
  memset(&call, 0, sizeof call);
  fwd_params &p = call.p;
  p.out = a->out.data;
  p.o_bs = a->out.batch_stride;
  p.o_ts = a->out.tok_stride;
  p.o_hs = a->out.head_stride;
  p.lse = (float *)a->lse.data;
  p.l_bs = a->lse.batch_stride;
  p.l_ts = a->lse.tok_stride;
  p.l_hs = a->lse.head_stride;
  p.sq = (int)a->sq;
  p.sk = (int)a->sk;
  p.hq = (int)a->hq;
  p.batch = (int)a->batch;
  p.num_m = (int)((a->sq + br - 1) / br);
  p.group = (int)(a->hq / a->hkv);
  /* A window wider than both sequences is no window. */
  p.wl = a->window_left > a->sq + a->sk ? -1 : (int)a->window_left;
  p.wr = a->window_right > a->sq + a->sk ? -1 : (int)a->window_right;
  p.scale = a->scale;
  p.scale_log2 = a->scale * 1.4426950408889634f;
  /* The row max moves only when it grows by more than 2^8 (O rescaled only in the steps
   * where a row of the warp moved it; exact): at head dim 256 and wherever head dim 128 runs
   * the 128-key tile (masked calls, Sk <= 2048). H200, run of a41fb34, interleaved A/B
   * rounds at S = 4k, TFLOP/s on / off: D256 610 / 583, causal 546 / 527, D128 causal 516 /
   * 500; D64 causal 391 / 389 (not compiled there). Since 2026-11-30 (run of 30e15d7,
   * balanced rounds, 6 of 6 rounds each) also unmasked calls on the 128-key tile: D128
   * S = 1k full 534 / 487 (cuDNN 540); causal 1k / 4k 394 / 369, 555 / 500. For unmasked
   * D128 on the 176-key tile (runs of b3ee4d5, 30e15d7): +4.5% / -4.5% at S = 4k / 16k, then
   * -2% / +2%, then +2% at 4k (against the narrow step): no consistent sign, not used;
   * with the narrow step (run 3 of attention_fwd.json): 0.971x / 1.022x, within noise.
   * OT_ATTN_SM90_RESC=0|1 forces it off / on (on only where instantiated, see launch_fl). */
  const char *rs = sm90_knob(knobs, "OT_ATTN_SM90_RESC");
  const bool resc = rs ? rs[0] == '1' : a->d == 256 || (a->d == 128 && bc == 128);
  /* The partial first-visited key tile on a narrower key range (kFlTail, b3ee4d5's
   * OT_ATTN_SM90_TAIL=1) lost: D128 S = 4k 0.90x, 16k 0.95x, D256 S = 4k 1.01x, 16k 0.87x
   * (its kernels twice the size; cause not established); removed (code in b3ee4d5). */
  /* kFlSplit: the tiles of an unmasked persistent launch's last, partial round cut along
   * the keys into equal shares of every CTA (launch(), split_params): D256 S 1k's 2048 tiles
   * are 15 rounds of 132 and one of 68, D128's 4096 31 of 132 and one of 4. Compiled for
   * bf16 D256 and D128's 128-key tile (with the threshold, and the 16-byte stores at
   * D128; the 176-key tile in experiment builds). OT_ATTN_SM90_SPLIT=0|1 forces it off /
   * on (on: unmasked calls where an instance is compiled). Off by default: measured on the
   * H200 (2026-12-06, bench/results/attention_split_ksplit_ab.json) D256 S1k 0.973x / S4k
   * 1.026x, D128 S1k 0.965x / S4k 1.006x the plain kernel, paired; on an H100
   * (attention_split_default_h100.json) D256 S4k 0.966x, S16k 0.971x, D128 S4k 0.968x: the
   * tile count's 2-3% is not there (cause not yet profiled). */
  const char *spv = sm90_knob(knobs, "OT_ATTN_SM90_SPLIT");
  const bool split_on = spv ? spv[0] == '1' : false;
  /* (never at D64, which has no instance: there it would only turn kFlKsplit off) */
  const int split = split_on && !masked_call && a->d != 64 ? kFlSplit : 0;
  /* kFlNarrow: an unmasked call whose last key tile is partial runs that tile as a step of
   * its own over the compiled width at or above its keys (D128 176-key tile: 48; D256, in
   * experiment builds: 16 / 64), instead of a whole tile of Q K^T and P V. Default on for
   * bf16 D128 with the 176-key tile (only under OT_ATTN_SM90_TILE=wide since the
   * twenty-seventh session) where the last tile has at most 48 keys and Sk <= 6400,
   * i.e. where the padding it saves is >= 2% of the key work: H200, two runs in one process
   * with cuDNN (docs/ATTENTION.md), S 4k (3.0% padding) 1.019x / 1.013x the plain kernel,
   * S 16k (1.0%) 1.004x / 0.991x; D256 (1.5%, 0.1%) 0.97-1.02x, not used.
   * OT_ATTN_SM90_NARROW=0|1 forces it off / on (on: where a width is compiled). */
  int narrow = 0;
  {
    const char *nw = sm90_knob(knobs, "OT_ATTN_SM90_NARROW");
    const int64_t rem = a->sk % bc;
    int w16 = 0;   /* the compiled width (16-key chunks) for this last tile */
    if (a->d == 128 && bc == 176 && rem > 0 && rem <= 48) w16 = 3;
#ifdef OT_ATTN_SM90_EXPERIMENTS
    if (a->d == 256 && rem > 0) w16 = rem <= 16 ? 1 : rem <= 64 ? 4 : 0;
#endif
    const bool on = nw ? nw[0] == '1' : a->dtype == OT_BF16 && a->sk <= 6400;
    if (on && !masked_call && w16 > 0) narrow = narrow_bits(w16);
  }
  /* OT_ATTN_SM90_SKIP=1: kFlSkip, a consumer warpgroup skips the first-visited key tiles in
   * which all of its rows are masked or past Sq (bf16 D64 on 3 consumers; experiment builds
   * also D64 on 2, the D128 128-key tile and D256 with the rescale threshold). Measured slower (H200, 2026-11-30 evening, attention_fwd_diag.json run 1): 0.954-0.984x
   * where it skips nothing (D64 / D128 causal, 2 consumers), D64 full 0.97-0.98x, D256
   * causal 1.010x / 1.008x at S 1k / 4k (ahead in 5 / 7 of 10 round pairs); with 3
   * consumers at D64 causal 1.107x the 3-consumer kernel at S 1k, but only level with the
   * 2-consumer default there, 0.957x at 4k. Warpgroup-tiles (64 rows x one key tile,
   * equal QK / PV work) it drops on the grid, Sq = Sk: D256 (80-key tiles) causal 7 of 122
   * at S 1k (5.7%), 26 of 1716 at 4k (1.5%); D64 with 3 consumers (192-row tiles) causal
   * 24 of 96 at 1k (25%: the last tile's 2 padding warpgroups 16, masked 8; only under
   * OT_ATTN_SM90_WG=3 there), 384 of 16896 at 16k (2.3%), full 16 of 144 at 1k (11%,
   * padding: 1152 rows for 1024), 64 of 2112 at 4k; D64 / D128 with 2 consumers on
   * 128-key tiles none (the tiles align: each warpgroup sees part of the diagonal tile;
   * Sq 1000, Sk 1024: 7 of 86).
   * Since 2026-12-02 (eighteenth session) the default of bf16 D64 causal calls (no left
   * window) on 3 consumers (below), where it skips a warpgroup's share of the 192-row tile's
   * diagonal: H200 (attention_fwd_skip3.json, 8 balanced rounds, paired) S 2k 1.034x the
   * 2-consumer default (8 of 8 round pairs ahead), S 4k 1.023x the 3-consumer kernel without
   * it (8 of 8), S 3k 1.001x. OT_ATTN_SM90_SKIP=0|1 forces it off / on (on: where an instance
   * is compiled -- experiment builds also D64 on 2 consumers, D128 128-key, D256). */
  int skip = 0;
  {
    const char *skv = sm90_knob(knobs, "OT_ATTN_SM90_SKIP");
    const bool on = skv ? skv[0] == '1'
                        : a->dtype == OT_BF16 && a->d == 64 && nc == 3 && masked_call &&
                              !left_window;
    if (on) skip = kFlSkip;
  }
  /* kFlShift: the query tiles of a call with a right mask edge (causal) aligned to the rows'
   * end, so that a partial tile is the first (the fewest keys) rather than the last (the
   * most); with kFlSkip its rows before 0 are skipped whole. Output and lse bit-equal to the
   * start-aligned tiles' where no left window bounds the keys (each row runs the same key
   * tiles in the same order; with a left window the tile's first key tile moves and lse may
   * differ in the last bit). Default on for bf16 D64 causal calls on 3 consumers with
   * kFlSkip (no left window) where 192 does not divide Sq: H200, 2026-12-02 (nineteenth
   * session, attention_fwd_shift.json, 8 + 10 balanced rounds in two calls, against the
   * start-aligned default) S 2k 1.008x / 1.042x (6 of 8 / 10 of 10 round pairs ahead), 4k
   * 1.025x / 1.017x (7 / 9), 8k 1.028x (8 of 10); with 3 consumers where 2 were the default
   * (9..15 query tiles, now the default above) S 1280 1.072x / 1.069x, 1408 1.070x, 1792
   * 1.072x (all pairs ahead), S 1k (8 tiles, 2 consumers kept) 1.004x.
   * OT_ATTN_SM90_ALIGN=start|end forces it off / on (on: masked calls with a right edge, where
   * an instance is compiled -- experiment builds also without kFlSkip). */
  int shift = 0;
  {
    const char *alv = sm90_knob(knobs, "OT_ATTN_SM90_ALIGN");
    const bool right_edge = a->window_right >= 0 && a->window_right <= a->sq + a->sk;
    const bool on = alv ? !strcmp(alv, "end")
                        : a->dtype == OT_BF16 && a->d == 64 && nc == 3 && skip && !left_window;
    if (on && right_edge && a->sq % br != 0) shift = kFlShift;
  }
  /* kFlDiag: the narrow step per consumer warpgroup at 64 keys on the 2-consumer 128-key
   * tile (D64 masked calls, D128 masked calls and Sk <= 2048): with causal Sq = Sk the
   * first warpgroup of each 128-row tile sees only the first 64 keys of its diagonal tile
   * and runs that tile's Q K^T (N = 64), softmax and P V (K = 64) as a step of its own, the
   * other warpgroup an empty turn (4 of 72 warpgroup-tiles' work at S 1k, 16 of 1056 at
   * 4k). Default on for bf16 D64 masked calls of at most 8 query tiles: H200, 2026-11-30
   * evening, balanced rounds in one process (attention_fwd_diag.json), causal S 1k 1.015x
   * the plain kernel in run 1 (10 of 10 round pairs ahead), 1.011x in run 2 (12 of 12,
   * an A/A pair 0.998-1.005); S 2k 1.000x, S 4k 0.983x / 0.992x (the step's P V is no
   * longer overlapped: it loses where it saves little); D128 causal 1.005x / 0.999x, noise
   * (its instance in experiment builds only).
   * OT_ATTN_SM90_DIAG=0|1 forces it off / on (on: where an instance is compiled). */
  {
    const char *dgv = sm90_knob(knobs, "OT_ATTN_SM90_DIAG");
    const bool on = dgv ? dgv[0] == '1'
                        : a->dtype == OT_BF16 && a->d == 64 && masked_call &&
                              (a->sq + kBr - 1) / kBr <= 8;
    if (on && nc == 2 && bc == 128 && (a->d == 64 || a->d == 128))
      narrow = kFlDiag | narrow_bits(4);
  }
  /* Read here for launch(): OT_ATTN_SM90_GRID=n (n > 0: at most n persistent CTAs) and
   * OT_ATTN_SM90_NONPERSISTENT (set: one CTA per tile). */
  const char *gs = sm90_knob(knobs, "OT_ATTN_SM90_GRID");
  call.grid_cap = gs && atoi(gs) > 0 ? atoi(gs) : 0;
  call.nonpersistent = sm90_knob(knobs, "OT_ATTN_SM90_NONPERSISTENT") != NULL;
  /* OT_ATTN_SM90_DYN=0: masked persistent calls keep the static round-robin (the dynamic
   * schedule is the default where an instance carries it: launch(), dyn_ok); =1: the dynamic
   * schedule at any tile count; =count: by the tile count only (no balance gate); =long:
   * masked calls of more than 64 query tiles persistent too. OT_ATTN_SM90_SECT=mha: L2 sections
   * counted in query heads, as before GQA was taken into account. */
  {
    const char *dy = sm90_knob(knobs, "OT_ATTN_SM90_DYN");
    call.static_order = dy && dy[0] == '0';
    call.long_persist = dy && !strcmp(dy, "long");
    call.force_dyn = dy && (dy[0] == '1' || call.long_persist);
    /* the balance gate is the default (unset or =auto); =count: the tile-count rule only */
    call.balance_gate = !dy || !strcmp(dy, "auto");
    const char *se = sm90_knob(knobs, "OT_ATTN_SM90_SECT");
    call.sect_mha = se && !strcmp(se, "mha");
  }
  /* kFlPin: the pipelined step's softmax pinned before its P V's wait (a never-taken branch
   * on the step's row sums, see the kernel). Default on for bf16 unmasked calls on D128's
   * 176-key tile (with and without the 48-key narrow step; that tile only under
   * OT_ATTN_SM90_TILE=wide since the twenty-seventh session) and D64's 3-consumer 128-key tile.
   * H200, 2026-11-30 (attention_fwd_pin.json, runs 1-2, balanced rounds in one process):
   * D128 S 4k full 1.058x / 1.053x the plain order (19 of 26 round pairs ahead), S 16k
   * 1.016x / 1.002x; D64 full S 4k 1.022x, 16k 1.019x (12 / 16 each); D256 full 0.996x /
   * 1.014x and causal D128 0.959x (S 4k) / 0.924x (16k): not used there. Outputs and lse bit-equal to
   * the plain order's (the same arithmetic). Also the default of bf16 D64 masked calls on
   * 2 consumers without kFlDiag (left windows of 9..64 query tiles; causal ones of 9..15 until
   * 2026-12-02, now on 3 consumers), where it
   * carries the dynamic schedule: H200, 2026-12-02 (attention_fwd_late.json, 10 balanced
   * rounds) S 4k causal 1.027x the plain order; attention_fwd_pin64.json (8 rounds) 1.025x
   * -1.044x at S 2k-8k (docs/ATTENTION.md). OT_ATTN_SM90_PIN=0|1 forces it off / on (on:
   * where an instance is compiled -- experiment builds also D64 with kFlDiag, D128 128-key,
   * D256). */
  int pin = 0;
  {
    const char *pnv = sm90_knob(knobs, "OT_ATTN_SM90_PIN");
    const bool on = pnv ? pnv[0] == '1'
                        : a->dtype == OT_BF16 &&
                              ((!masked_call && ((a->d == 128 && bc == 176) ||
                                                 (a->d == 64 && nc == 3))) ||
                               (masked_call && a->d == 64 && nc == 2 && !(narrow & kFlDiag)));
    if (on) pin = kFlPin;
  }
  /* kFlSt16: O stored 16 bytes a lane (a transpose within each row quad, then STG.128),
   * where O's pointer and strides are 16-byte multiples; not for kFlSplit's pieces. Default on for bf16 D128 on the 128-key tile
   * (masked calls, Sk <= 2048), D256 masked calls and D64's kFlDiag tile: H200, 2026-12-01
   * (attention_fwd_st16.json, 8 balanced rounds in one process, TFLOP/s against the same
   * kernel without it), D128 S 1k causal 443.5 / 398.1 (1.114x; cuDNN 404.0), full 1.087x,
   * S 4k causal 1.057x; D256 S 1k causal 1.129x (471.8, cuDNN 438.9), S 4k causal 1.045x; D64
   * S 1k causal 1.034x; where it was not used: the 176-key tile at S 4k full 1.001x, D256 full
   * 0.988x (S 1k) / 1.002x (4k). Head dim 96 in both dtypes (with kFlN96, whose fp16
   * instance was measured 2026-12-03, twenty-fifth session, attention_d96_fp16_fwd.json,
   * 8 rounds, paired against fp16's R | PD: S 1k 1.133x, causal 1.175x; S 4k 1.039x /
   * 1.082x; S 16k 1.037x / 1.053x). OT_ATTN_SM90_ST16=0|1 forces it off / on (on: where an
   * instance is compiled -- experiment builds also D128's 176-key tile with the narrow step
   * and the pin, and D256 unmasked calls). */
  int st16 = 0;
  {
    const char *stv = sm90_knob(knobs, "OT_ATTN_SM90_ST16");
    const bool on = stv ? stv[0] == '1'
                        : (a->dtype == OT_BF16 &&
                           ((a->d == 128 && bc == 128) || (a->d == 256 && masked_call) ||
                            (a->d == 64 && (narrow & kFlDiag)))) ||
                              pad96; /* fp16 too at head dim 96: its kFlN96 instance */
    /* 16-bit elements: 8-element multiples */
    const bool aligned = ((uintptr_t)a->out.data & 15) == 0 && (p.o_ts & 7) == 0 &&
                         (p.o_hs & 7) == 0 && (p.o_bs & 7) == 0;
    if (on && aligned) st16 = kFlSt16;
  }
  /* kFlStag: a turn round the consumers at each softmax (see the enum for what it compiles
   * to). Default on for bf16 D64 kFlDiag calls (masked, at most 8 query tiles, 2 consumers),
   * whose instance carries it with kFlSt16 (without the 16-byte stores it is dropped). H200, 2026-12-02 (twenty-first
   * session; attention_fwd_stag.json, 8 balanced rounds in one process, TFLOP/s against the
   * same kernel without it): D64 causal S 1k 297.6 / 291.3 (1.021x, 8 of 8 round pairs
   * ahead) in the experiment build; in the default build (attention_fwd_stag_default.json,
   * 10 rounds, against OT_ATTN_SM90_STAG=0) S 256 1.018x, 512 1.025x, 768 1.042x, 1k 1.047x
   * (39 of 40 round pairs ahead); where it was not used: D64 full S 1k-4k 0.977-0.996x, D128 both tiles
   * 0.960-0.989x, D64 causal S 1280-4k on 3 consumers without kFlSkip 1.003-1.006x over
   * that kernel, which the skip's default beats by 5-9%. OT_ATTN_SM90_STAG=0|1 forces it
   * off / on (on: where an instance is compiled -- experiment builds also the other defaults;
   * it is dropped first where none carries the call's bits).
   * Also the default of bf16 D64 causal calls on 3 consumers with kFlSkip and kFlShift (Sq >
   * 1024 not a multiple of 192; a skipped tile takes an empty turn): H200, 2026-12-02
   * (twenty-first session; attention_fwd_stagskip.json, experiment build, 8 balanced rounds
   * against that default) S 1280 1.017x (8 of 8 round pairs ahead), 2048 1.005x (6 / 8), 2560
   * 1.023x (8 / 8), 4096 1.026x (8 / 8), 8192 1.016x (6 / 8); not with kFlSkip alone (Sq a
   * multiple of 192: S 1152 0.994x, 1536 0.987x / 0.992x, 3072 0.995x). */
  int stag = 0;
  {
    const char *sgv = sm90_knob(knobs, "OT_ATTN_SM90_STAG");
    const bool on = sgv ? sgv[0] == '1'
                        : a->dtype == OT_BF16 && a->d == 64 && bc == 128 &&
                              ((nc == 2 && (narrow & kFlDiag)) || (nc == 3 && skip && shift));
    if (on) stag = kFlStag;
  }
  /* kFlN96 (head dim 96: P V with N = 96; with the 16-byte stores only, elsewhere
   * launch_sel drops it; fp16's instance the default since the twenty-fifth session, see
   * kFlSt16 above): on unless OT_ATTN_SM90_N96=0. H200, 2026-12-03, bf16
   * (bench/results/attention_d96_n96.json, paired with N = 128 in one process, 8 rounds):
   * S 1k 1.029x, causal 1.029x; S 4k 0.998x, causal 1.015x; S 16k 1.023x, causal 1.049x. */
  const char *n96v = pad96 ? sm90_knob(knobs, "OT_ATTN_SM90_N96") : NULL;
  const int n96 = pad96 && !(n96v && n96v[0] == '0') ? kFlN96 : 0;
  /* kFlKsplit: an unmasked call on 3 consumers whose last query tile of each head holds at
   * most 64 rows (Sq mod 192 in 1..64: S 1k, 4k and 16k leave 64) runs that tile on all
   * three consumers, each over a third of the key tiles, merged in shared memory, instead
   * of two warpgroups of padding rows beside one of work; the heads' tiles rotated so that
   * every persistent CTA gets its share of them (the kernel). At S 1k that tile is 1 of 6
   * a head: the default does 18 warpgroup-tiles of work for 16 of rows. OT_ATTN_SM90_KSPLIT=0|1
   * forces it off / on (on: where an instance is compiled -- bf16 D64 with kFlPin). */
  int ksplit = 0;
  {
    const char *ksv = sm90_knob(knobs, "OT_ATTN_SM90_KSPLIT");
    const int64_t tail = a->sq % br;
    /* on by default for bf16 D64 since the forty-second session: H200, paired against the
     * plain kernel, D64 S1k full 1.066x and 1.067x in two calls, S4k 1.018x, S16k 1.002x
     * (bench/results/attention_split_ksplit_ab.json, attention_ksplit_h200.json); H100 with
     * it the default, OT_ATTN_SM90_KSPLIT=0 0.961x (attention_split_default_h100.json);
     * memcheck, racecheck and synccheck clean (the merge's barriers non-aligned) */
    const bool on = ksv ? ksv[0] == '1' : a->dtype == OT_BF16 && a->d == 64;
    if (on && nc == 3 && !masked_call && !split && tail > 0 && tail <= 64) ksplit = kFlKsplit;
  }
  /* kFlQpf: the producer prefetches the CTA's next tile's Q to L2 during the current tile
   * (static persistent launches: unmasked calls). Compiled for bf16 D256 with the threshold
   * (R | QPF); opt-in, OT_ATTN_SM90_QPF=1: measured slower (H100, D256 S1k full 0.936x
   * paired, docs/ATTENTION.md). */
  const char *qpv = sm90_knob(knobs, "OT_ATTN_SM90_QPF");
  const int qpf = qpv && qpv[0] == '1' && !masked_call && !split ? kFlQpf : 0;
  const int fl = (resc ? kFlResc : 0) | split | narrow | skip | pin | st16 | shift | stag |
                 (pad96 ? kFlPad : 0) | n96 | ksplit | qpf;
  *handled = true;
  return a->dtype == OT_BF16 ? dispatch<__nv_bfloat16>(ctx, a, maps, &call, small_tile, nc, fl)
                             : dispatch<__half>(ctx, a, maps, &call, small_tile, nc, fl);
}
