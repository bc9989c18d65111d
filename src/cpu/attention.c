/*
 * attention.c -- CPU flash attention, forward and backward (C11 + OpenMP + BLAS).
 *
 * Forward: one task per (sequence, query head, ATT_NSUB tiles of ATT_BQ queries),
 * head-major, scheduled dynamically, heaviest (last, under a causal mask) tiles of a
 * head first. A task walks the key tiles (ATT_BK keys) that some of its rows can see
 * and runs each of its query tiles on it, with an online softmax, all transposed:
 *     S^T = scale * K Q^T      [bk, bq]   (gemm64)
 *     softcap, mask (boundary tiles only), running max m / sum l
 *     O^T = O^T diag(alpha) + V^T P^T   [D, bq]   (gemm64)
 * so the Sq x Sk score matrix never exists. K (as K^T) and V tiles are converted to
 * float32 into a per-thread cache that the following tasks of the same head reuse.
 *
 * Backward, from the saved lse (P = exp(S - lse) is recomputed per tile):
 *   pass 0: delta_i = sum_d dout_i * out_i                 per (row, head)
 *   pass 1: dK, dV per (sequence, kv head, key tile), summing over the query heads of
 *           the group and the query tiles that see the keys;
 *   pass 2: dQ per (sequence, query head, query tile).
 * Each output element is owned by one task, so the result is race-free and bitwise
 * deterministic, at the price of recomputing S and dP once more in pass 2.
 *
 * The tile products use the register-blocked micro-kernel below (AVX-512 when the CPU
 * has it, plain C otherwise), not the BLAS: the tiles are small, the calls are made
 * from inside the OpenMP team, and the system OpenBLAS picks a generic SSE3 kernel on
 * CPUs it does not recognize (measured: 8 GFLOP/s against ~100 for this kernel).
 */
#include <math.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/attention.h"
#include "cpu/threads.h"
#include "cpu/temp.h"

#define ATT_BQ 64  /* query rows per tile */
#define ATT_BK 128 /* keys per tile */
_Static_assert(ATT_BQ == 64, "the forward's gemm64 kernel is written for 64-query tiles");

/* ---- vectorizable elementwise helpers ---------------------------------------------- */

#define OT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

/* exp(x) to ~1 ulp for x in [-87, 88] (0 below, clamped above), branch-free so that loops
 * over it vectorize: x = n ln2 + r, |r| <= ln2/2, exp(r) by its Taylor series to r^7. */
static inline float att_exp(float x) {
  float x_in = x;
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float round_magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  float t = x * 1.44269504088896341f + round_magic;
  float n = t - round_magic;
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t ni = (int32_t)n;
  union {
    int32_t i;
    float f;
  } two_n;
  two_n.i = (ni + 127) << 23;
  /* Masked scores are -inf: their weight must be exactly 0. */
  return x_in < -87.0f ? 0.0f : p * two_n.f;
}

/* s[j] = exp(s[j] - m); returns the sum. */
OT_CLONES static float row_exp_sum(float *restrict s, int64_t n, float m) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; j++) {
    float e = att_exp(s[j] - m);
    s[j] = e;
    sum += e;
  }
  return sum;
}

/* t[j] = tanh(s[j] / cap), s[j] = cap * t[j]; t may be NULL (forward). */
OT_CLONES static void row_softcap(float *restrict s, float *restrict t, int64_t n, float cap) {
  float inv = 2.0f / cap;
#pragma omp simd
  for (int64_t j = 0; j < n; j++) {
    float th = 1.0f - 2.0f / (att_exp(s[j] * inv) + 1.0f);
    s[j] = cap * th;
    if (t) t[j] = th;
  }
}

/* dS = P * (dP - delta) [* (1 - t^2) under softcap], in place in dp. */
OT_CLONES static void row_ds(float *restrict dp, const float *restrict p, const float *restrict t,
                             int64_t n, float delta) {
  if (t) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) dp[j] = p[j] * (dp[j] - delta) * (1.0f - t[j] * t[j]);
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) dp[j] = p[j] * (dp[j] - delta);
  }
}

/* ---- tile GEMM ------------------------------------------------------------------------ */

/*
 * C[m, n] (row stride ldc) = (accumulate ? C : 0) + alpha * A B, where
 * A(i, p) = a[i * ars + p * acs] (so A or A^T may be given) and B is row-major [k, n]
 * with row stride ldb. Every product of the attention tiles has this form once K and
 * V are stored transposed where needed.
 */
/* -DOT_ATT_NO_AVX512 builds the portable path only (to test it on an AVX-512 CPU). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(OT_ATT_NO_AVX512)
#include <immintrin.h>
#define ATT_X86 1

/* MR rows x 32 columns of C held in 2*MR zmm registers; columns past n are masked. */
#define ATT_MK_AVX512(MR)                                                                \
  do {                                                                                   \
    __m512 c0[MR], c1[MR];                                                               \
    for (int r = 0; r < MR; r++) c0[r] = c1[r] = _mm512_setzero_ps();                    \
    const float *ap = a + i * ars;                                                       \
    const float *bp = b + j;                                                             \
    for (int64_t p = 0; p < k; p++) {                                                    \
      __m512 b0 = _mm512_maskz_loadu_ps(m0, bp);                                         \
      __m512 b1 = _mm512_maskz_loadu_ps(m1, bp + 16);                                    \
      for (int r = 0; r < MR; r++) {                                                     \
        __m512 av = _mm512_set1_ps(ap[r * ars]);                                         \
        c0[r] = _mm512_fmadd_ps(av, b0, c0[r]);                                          \
        c1[r] = _mm512_fmadd_ps(av, b1, c1[r]);                                          \
      }                                                                                  \
      ap += acs;                                                                         \
      bp += ldb;                                                                         \
    }                                                                                    \
    for (int r = 0; r < MR; r++) {                                                       \
      float *cp = c + (i + r) * ldc + j;                                                 \
      __m512 v0 = _mm512_mul_ps(va, c0[r]), v1 = _mm512_mul_ps(va, c1[r]);               \
      if (accumulate) {                                                                  \
        v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, cp));                           \
        v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, cp + 16));                      \
      }                                                                                  \
      _mm512_mask_storeu_ps(cp, m0, v0);                                                 \
      _mm512_mask_storeu_ps(cp + 16, m1, v1);                                            \
    }                                                                                    \
  } while (0)

__attribute__((target("avx512f"))) static void gemm_avx512(int64_t m, int64_t n, int64_t k,
                                                           float alpha, const float *a,
                                                           int64_t ars, int64_t acs,
                                                           const float *b, int64_t ldb,
                                                           bool accumulate, float *c,
                                                           int64_t ldc) {
  const __m512 va = _mm512_set1_ps(alpha);
  /* Column panels outer: a [k, 32] panel of B stays in L1 across the row blocks. */
  for (int64_t j = 0; j < n; j += 32) {
    int64_t nj = n - j;
    __mmask16 m0 = nj >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nj) - 1u);
    __mmask16 m1 = nj >= 32 ? (__mmask16)0xffff
                            : (nj > 16 ? (__mmask16)((1u << (nj - 16)) - 1u) : (__mmask16)0);
    int64_t i = 0;
    for (; i + 12 <= m; i += 12) ATT_MK_AVX512(12);
    for (; i + 8 <= m; i += 8) ATT_MK_AVX512(8);
    for (; i + 4 <= m; i += 4) ATT_MK_AVX512(4);
    for (; i < m; i++) ATT_MK_AVX512(1);
  }
}

static bool cpu_has_avx512(void) {
  static int cached = -1; /* benign race: every thread computes the same value */
  if (cached < 0) {
    __builtin_cpu_init();
    cached = __builtin_cpu_supports("avx512f") ? 1 : 0;
  }
  return cached == 1;
}
#endif

/* Portable path: C row by C row, vectorized over n. */
OT_CLONES static void gemm_generic(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                                   int64_t ars, int64_t acs, const float *b, int64_t ldb,
                                   bool accumulate, float *c, int64_t ldc) {
  float acc[256];
  for (int64_t i = 0; i < m; i++)
    for (int64_t j0 = 0; j0 < n; j0 += 256) {
      int64_t nj = n - j0 < 256 ? n - j0 : 256;
      for (int64_t j = 0; j < nj; j++) acc[j] = 0.0f;
      for (int64_t p = 0; p < k; p++) {
        float av = a[i * ars + p * acs];
        const float *bp = b + p * ldb + j0;
#pragma omp simd
        for (int64_t j = 0; j < nj; j++) acc[j] += av * bp[j];
      }
      float *cp = c + i * ldc + j0;
      if (accumulate) {
        for (int64_t j = 0; j < nj; j++) cp[j] += alpha * acc[j];
      } else {
        for (int64_t j = 0; j < nj; j++) cp[j] = alpha * acc[j];
      }
    }
}

static void att_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t ars,
                     int64_t acs, const float *b, int64_t ldb, bool accumulate, float *c,
                     int64_t ldc) {
  if (m <= 0 || n <= 0) return;
#ifdef ATT_X86
  if (cpu_has_avx512()) {
    gemm_avx512(m, n, k, alpha, a, ars, acs, b, ldb, accumulate, c, ldc);
    return;
  }
#endif
  gemm_generic(m, n, k, alpha, a, ars, acs, b, ldb, accumulate, c, ldc);
}

/*
 * The forward's two products have one shape, C [m, 64] = A [m, k] B [k, 64] with
 * B packed (row stride 64) and A given by columns (A(i, p) = a[i + p * acs]):
 *   scores  S^T [bk, bq] = scale * K Q^T : A = K^T tile [D, BK], B = Q^T [D, BQ];
 *   output  O^T [D, bq] += V^T P^T      : A = V tile [bk, D] read as V^T, B = P^T.
 * gemm64 computes C = colscale (.) C + alpha A B (colscale NULL: C = alpha A B), where
 * colscale[c] scales column c: the online softmax's rescale of O^T rides on the store.
 * With 64 columns a 6 x 64 register block (24 accumulators) reads each A element
 * once per product and needs 4 vector loads + 6 broadcasts per 24 FMAs, fewer loads
 * per FMA than the 12 x 32 block above, and no masks. Measured on one core of the
 * 2-core AVX-512 VM (S = 2048, D = 128, float32): ~173 GFLOP/s alone (a pure FMA loop
 * reaches ~170), ~160 inside the forward, where the two products are ~87% of the time.
 */
#ifdef ATT_X86
#define ATT_MK64(MR)                                                                     \
  do {                                                                                   \
    __m512 c0[MR], c1[MR], c2[MR], c3[MR];                                               \
    for (int r = 0; r < MR; r++) c0[r] = c1[r] = c2[r] = c3[r] = _mm512_setzero_ps();    \
    const float *ap = a + i;                                                             \
    const float *bp = b;                                                                 \
    for (int64_t p = 0; p < k; p++) {                                                    \
      __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);                    \
      __m512 b2 = _mm512_loadu_ps(bp + 32), b3 = _mm512_loadu_ps(bp + 48);               \
      for (int r = 0; r < MR; r++) {                                                     \
        __m512 av = _mm512_set1_ps(ap[r]);                                               \
        c0[r] = _mm512_fmadd_ps(av, b0, c0[r]);                                          \
        c1[r] = _mm512_fmadd_ps(av, b1, c1[r]);                                          \
        c2[r] = _mm512_fmadd_ps(av, b2, c2[r]);                                          \
        c3[r] = _mm512_fmadd_ps(av, b3, c3[r]);                                          \
      }                                                                                  \
      ap += acs;                                                                         \
      bp += 64;                                                                          \
    }                                                                                    \
    for (int r = 0; r < MR; r++) {                                                       \
      float *cp = c + (i + r) * 64;                                                      \
      __m512 v0 = _mm512_mul_ps(va, c0[r]), v1 = _mm512_mul_ps(va, c1[r]);               \
      __m512 v2 = _mm512_mul_ps(va, c2[r]), v3 = _mm512_mul_ps(va, c3[r]);               \
      if (colscale) {                                                                    \
        v0 = _mm512_fmadd_ps(s0, _mm512_loadu_ps(cp), v0);                               \
        v1 = _mm512_fmadd_ps(s1, _mm512_loadu_ps(cp + 16), v1);                          \
        v2 = _mm512_fmadd_ps(s2, _mm512_loadu_ps(cp + 32), v2);                          \
        v3 = _mm512_fmadd_ps(s3, _mm512_loadu_ps(cp + 48), v3);                          \
      }                                                                                  \
      _mm512_storeu_ps(cp, v0);                                                          \
      _mm512_storeu_ps(cp + 16, v1);                                                     \
      _mm512_storeu_ps(cp + 32, v2);                                                     \
      _mm512_storeu_ps(cp + 48, v3);                                                     \
    }                                                                                    \
  } while (0)

__attribute__((target("avx512f"))) static void gemm64_avx512(int64_t m, int64_t k, float alpha,
                                                             const float *a, int64_t acs,
                                                             const float *b,
                                                             const float *colscale, float *c) {
  const __m512 va = _mm512_set1_ps(alpha);
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  if (colscale) {
    s0 = _mm512_loadu_ps(colscale);
    s1 = _mm512_loadu_ps(colscale + 16);
    s2 = _mm512_loadu_ps(colscale + 32);
    s3 = _mm512_loadu_ps(colscale + 48);
  }
  int64_t i = 0;
  for (; i + 6 <= m; i += 6) ATT_MK64(6);
  for (; i + 2 <= m; i += 2) ATT_MK64(2);
  for (; i < m; i++) ATT_MK64(1);
}
#endif

static void att_gemm64(int64_t m, int64_t k, float alpha, const float *a, int64_t acs,
                       const float *b, const float *colscale, float *c) {
  if (m <= 0) return;
#ifdef ATT_X86
  if (cpu_has_avx512()) {
    gemm64_avx512(m, k, alpha, a, acs, b, colscale, c);
    return;
  }
#endif
  if (colscale)
    for (int64_t i = 0; i < m; i++)
      for (int64_t x = 0; x < 64; x++) c[i * 64 + x] *= colscale[x];
  gemm_generic(m, 64, k, alpha, a, 1, acs, b, 64, colscale != NULL, c, 64);
}

/* ---- shapes of a task ------------------------------------------------------------- */

typedef struct att_task {
  int64_t b;    /* sequence */
  int64_t tile; /* tile index along the sequence (query or key tiles) */
} att_task;

/* Tiles of size `tile` over every sequence's queries (use_k = 0) or keys (1), longest
 * work first: tiles are listed from the end of each sequence, where a causal mask makes
 * them heaviest. Returns the count; *out is an ot_cpu_temp_alloc block (NULL with count 0
 * is fine; on failure *oom is set and the error recorded). */
static int64_t make_tasks(const ot_context *ctx, const ot_attention_args *a, bool use_k,
                          int64_t tile, att_task **out, bool *oom) {
  int64_t n = 0, maxt = 0;
  for (int64_t b = 0; b < a->batch; b++) {
    int64_t q0, sq, k0, sk;
    ot_attn_seq(a, b, &q0, &sq, &k0, &sk);
    int64_t len = use_k ? sk : sq;
    int64_t nt = (len + tile - 1) / tile;
    n += nt;
    if (nt > maxt) maxt = nt;
  }
  *out = NULL;
  *oom = false;
  if (n == 0) return 0;
  att_task *t = (att_task *)ot_cpu_temp_alloc(ctx, "ot_attention_backward", "the task list",
                                              (size_t)n * sizeof *t);
  if (!t) {
    *oom = true;
    return 0;
  }
  /* Round-robin over sequences by descending tile index keeps big tiles first. */
  int64_t k = 0;
  for (int64_t r = maxt - 1; r >= 0; r--)
    for (int64_t b = 0; b < a->batch; b++) {
      int64_t q0, sq, k0, sk;
      ot_attn_seq(a, b, &q0, &sq, &k0, &sk);
      int64_t len = use_k ? sk : sq;
      if (r < (len + tile - 1) / tile) t[k++] = (att_task){b, r};
    }
  *out = t;
  return n;
}

static inline char *elem(const ot_attn_operand *o, ot_dtype dt, int64_t b, int64_t tok,
                         int64_t h) {
  return (char *)o->data +
         (b * o->batch_stride + tok * o->tok_stride + h * o->head_stride) *
             (int64_t)ot_dtype_size(dt);
}

/* n rows of D elements at `src` (row stride in elements) into dense float32 dst. */
static void load_rows(float *dst, const char *src, int64_t tok_stride, ot_dtype dt, int64_t n,
                      int64_t d) {
  int64_t bytes = tok_stride * (int64_t)ot_dtype_size(dt);
  for (int64_t r = 0; r < n; r++) ot_load_f32(dst + r * d, src + r * bytes, dt, d);
}

/* n rows of D elements into float32 dst transposed: dst[x * ldt + r] = row r, elem x.
 * Blocks of 16 rows go through `tmp` ([16, D] floats) so that the transposing loop
 * writes 16 contiguous floats per x instead of scattering single floats. */
OT_CLONES static void transpose_block(float *restrict dst, int64_t ldt, const float *restrict tmp,
                                      int64_t nr, int64_t d) {
  if (nr == 16) {
    for (int64_t x = 0; x < d; x++) {
      float *o = dst + x * ldt;
#pragma omp simd
      for (int64_t r = 0; r < 16; r++) o[r] = tmp[r * d + x];
    }
  } else {
    for (int64_t x = 0; x < d; x++)
      for (int64_t r = 0; r < nr; r++) dst[x * ldt + r] = tmp[r * d + x];
  }
}

static void load_rows_t(float *dst, int64_t ldt, const char *src, int64_t tok_stride,
                        ot_dtype dt, int64_t n, int64_t d, float *tmp) {
  int64_t bytes = tok_stride * (int64_t)ot_dtype_size(dt);
  for (int64_t r0 = 0; r0 < n; r0 += 16) {
    int64_t nr = n - r0 < 16 ? n - r0 : 16;
    for (int64_t r = 0; r < nr; r++) ot_load_f32(tmp + r * d, src + (r0 + r) * bytes, dt, d);
    transpose_block(dst + r0, ldt, tmp, nr, d);
  }
}

static void store_rows(char *dst, int64_t tok_stride, const float *src, ot_dtype dt, int64_t n,
                       int64_t d) {
  int64_t bytes = tok_stride * (int64_t)ot_dtype_size(dt);
  for (int64_t r = 0; r < n; r++) ot_store_f32(dst + r * bytes, src + r * d, dt, d);
}

/* Visible key range of rows i0 .. i0+bq-1: per row (lo[r] > hi[r] when empty) and the
 * union [*kmin, *kmax]; returns false when no row sees a key. */
static bool tile_key_ranges(const ot_attention_args *a, int64_t i0, int64_t bq, int64_t sq,
                            int64_t sk, int64_t *lo, int64_t *hi, int64_t *kmin, int64_t *kmax) {
  bool any = false;
  *kmin = sk;
  *kmax = -1;
  for (int64_t r = 0; r < bq; r++) {
    ot_attn_key_range(a, i0 + r, sq, sk, &lo[r], &hi[r]);
    if (lo[r] > hi[r]) continue;
    any = true;
    if (lo[r] < *kmin) *kmin = lo[r];
    if (hi[r] > *kmax) *kmax = hi[r];
  }
  return any;
}

static inline int thread_id(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/* ---- forward ------------------------------------------------------------------------ */

/*
 * The forward works on transposed score tiles S^T [bk, bq] = scale * K Q^T: Q^T is
 * built once per task and K, V are used as stored (converted to float32), so no tile
 * is transposed inside the key loop, and the softmax statistics of the bq queries are
 * updated with loops that run along a row of S^T, i.e. vectorized over queries.
 */
/* A task covers ATT_NSUB query tiles of ATT_BQ rows ("sub-tiles") and, for each key
 * tile, runs them one after the other: the K/V tile is fetched from L3 once and reused
 * from L2 (measured at S = 2048, D = 128, one thread: with every K/V tile hot the
 * forward was 13% faster than with each query tile streaming the head's 2 MiB of K/V). */
#define ATT_NSUB 4

typedef struct fwd_scratch {
  /* Per sub-tile u, at offset u * ATT_BQ * D (qt, ot) or u * ATT_BQ (the others): */
  float *qt;    /* [D, BQ] Q transposed */
  float *ot;    /* [D, BQ] unnormalized output, transposed */
  float *m, *l; /* [BQ] running max and sum */
  float *mu, *alpha; /* [BQ] max used for this tile's exp, rescale factor */
  int64_t *lo, *hi;  /* [BQ] visible key range per row */
  float *st;    /* [BK, BQ] scores, then probabilities, transposed */
  float *tmp;   /* [16, D] */
  /* K/V tile cache, `nslots` direct-mapped slots (key tile t -> slot t % nslots):
   *   kc[slot] = K^T of the tile [D, BK], vc[slot] = V of the tile [BK, D], float32;
   *   tag[slot] = (sequence, kv head, tile) it holds, {-1, ...} when empty.
   * Tasks are ordered head-major, so a thread runs many query tiles of one (sequence,
   * kv head) in a row and converts each key tile once per head instead of once per
   * query tile (measured at S=2048, D=128: the per-tile copies were ~10% of the time,
   * more for bf16). K is cached transposed so that the score kernel's broadcasts of
   * K(key i..i+5, dim p) read 6 adjacent floats of one row of K^T. */
  float *kc, *vc;
  int64_t *tag; /* [nslots][3] */
  int64_t nslots;
} fwd_scratch;

/* Cache slots per thread: every key tile of the longest sequence when that stays under
 * ATT_CACHE_BYTES per thread (S = 2048, D = 128: 2 MiB), else as many as fit (>= 1). */
#define ATT_CACHE_BYTES ((int64_t)4 << 20)

static int64_t fwd_cache_slots(const ot_attention_args *a) {
  int64_t skmax = 0;
  for (int64_t b = 0; b < a->batch; b++) {
    int64_t q0, sq, k0, sk;
    ot_attn_seq(a, b, &q0, &sq, &k0, &sk);
    if (sk > skmax) skmax = sk;
  }
  int64_t ntiles = (skmax + ATT_BK - 1) / ATT_BK;
  int64_t fit = ATT_CACHE_BYTES / (2 * ATT_BK * a->d * (int64_t)sizeof(float));
  if (fit < 1) fit = 1;
  if (ntiles < 1) ntiles = 1;
  return ntiles < fit ? ntiles : fit;
}

static size_t fwd_scratch_floats(int64_t d, int64_t nslots) {
  return (size_t)(ATT_NSUB * (2 * ATT_BQ * d + 4 * ATT_BQ)) +
         (size_t)(ATT_NSUB * 4 * ATT_BQ) /* lo/hi as int64 = 2 floats each */ +
         (size_t)(ATT_BQ * ATT_BK + 16 * d) + (size_t)(nslots * 2 * ATT_BK * d) +
         (size_t)(nslots * 6) /* tags, 3 int64 */;
}

static fwd_scratch fwd_scratch_at(float *base, int64_t d, int64_t nslots) {
  fwd_scratch w;
  w.kc = base; /* first: the caller keeps base 64-byte aligned */
  w.vc = w.kc + nslots * ATT_BK * d;
  w.qt = w.vc + nslots * ATT_BK * d;
  w.ot = w.qt + ATT_NSUB * ATT_BQ * d;
  w.st = w.ot + ATT_NSUB * ATT_BQ * d;
  w.m = w.st + ATT_BQ * ATT_BK;
  w.l = w.m + ATT_NSUB * ATT_BQ;
  w.mu = w.l + ATT_NSUB * ATT_BQ;
  w.alpha = w.mu + ATT_NSUB * ATT_BQ;
  w.lo = (int64_t *)(void *)(w.alpha + ATT_NSUB * ATT_BQ);
  w.hi = w.lo + ATT_NSUB * ATT_BQ;
  w.tag = w.hi + ATT_NSUB * ATT_BQ;
  w.tmp = (float *)(void *)(w.tag + 3 * nslots);
  w.nslots = nslots;
  for (int64_t s = 0; s < nslots; s++) w.tag[3 * s] = -1;
  return w;
}

/* K^T [D, BK] and V [BK, D] (float32) of the key tile that starts at kt (a multiple of
 * ATT_BK) of (sequence b, kv head g), converted into the cache on a miss. */
static void fwd_kv_tile(const ot_attention_args *a, int64_t b, int64_t g, int64_t k0,
                        int64_t sk, int64_t kt, fwd_scratch *w, const float **kT,
                        const float **v) {
  const int64_t d = a->d;
  const int64_t bk = sk - kt < ATT_BK ? sk - kt : ATT_BK;
  const ot_dtype dt = a->dtype;
  int64_t tile = kt / ATT_BK;
  int64_t s = tile % w->nslots;
  float *kc = w->kc + s * ATT_BK * d, *vc = w->vc + s * ATT_BK * d;
  int64_t *tag = w->tag + 3 * s;
  if (tag[0] != b || tag[1] != g || tag[2] != tile) {
    load_rows_t(kc, ATT_BK, elem(&a->k, dt, b, k0 + kt, g), a->k.tok_stride, dt, bk, d, w->tmp);
    load_rows(vc, elem(&a->v, dt, b, k0 + kt, g), a->v.tok_stride, dt, bk, d);
    tag[0] = b;
    tag[1] = g;
    tag[2] = tile;
  }
  *kT = kc;
  *v = vc;
}

/* Online-softmax step on S^T [bk, bq] (row stride ATT_BQ): softcap, mask
 * (when `masked`: key kt + r is visible to query c iff lo[c] <= kt + r <= hi[c]),
 * running max / sum, and P^T in place. alpha[c] is the factor for row c of O. */
OT_CLONES static void fwd_softmax_tile(float *restrict st, int64_t bk, int64_t bq, int64_t kt,
                                       bool masked, float cap, const int64_t *restrict lo,
                                       const int64_t *restrict hi, float *restrict m,
                                       float *restrict l, float *restrict mu,
                                       float *restrict alpha) {
  for (int64_t r = 0; r < bk; r++) {
    float *row = st + r * ATT_BQ;
    if (cap > 0) {
      float inv = 2.0f / cap;
#pragma omp simd
      for (int64_t c = 0; c < bq; c++) row[c] = cap * (1.0f - 2.0f / (att_exp(row[c] * inv) + 1.0f));
    }
    if (masked) {
      int64_t key = kt + r;
#pragma omp simd
      for (int64_t c = 0; c < bq; c++) row[c] = (lo[c] <= key && key <= hi[c]) ? row[c] : -INFINITY;
    }
  }
  for (int64_t c = 0; c < bq; c++) alpha[c] = -INFINITY; /* tile max, for now */
  for (int64_t r = 0; r < bk; r++) {
    const float *row = st + r * ATT_BQ;
#pragma omp simd
    for (int64_t c = 0; c < bq; c++) alpha[c] = row[c] > alpha[c] ? row[c] : alpha[c];
  }
#pragma omp simd
  for (int64_t c = 0; c < bq; c++) {
    float mn = alpha[c] > m[c] ? alpha[c] : m[c];
    /* A query with no visible key yet keeps m = -inf; exp against 0 then gives 0. */
    float base = mn == -INFINITY ? 0.0f : mn;
    alpha[c] = att_exp(m[c] - base);
    mu[c] = base;
    m[c] = mn;
    l[c] *= alpha[c];
  }
  for (int64_t r = 0; r < bk; r++) {
    float *row = st + r * ATT_BQ;
#pragma omp simd
    for (int64_t c = 0; c < bq; c++) {
      float p = att_exp(row[c] - mu[c]);
      row[c] = p;
      l[c] += p;
    }
  }
}

#ifdef ATT_X86
/* att_exp on 16 lanes for x <= 0 (every softmax argument is a score minus a max):
 * 2^n by vscalefps instead of exponent-field arithmetic; same range reduction and
 * polynomial, same 0 below -87, so masked -inf scores give exactly 0. No clamping:
 * lanes below -87 (even -inf, where r is NaN) are zeroed by the final mask. */
__attribute__((target("avx512f"))) static inline __m512 att_exp16(__m512 x) {
  __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

/* fwd_softmax_tile for a full, unmasked tile without softcap (bq = ATT_BQ = 64): the
 * 64 queries' m, l, mu live in 4 registers each across the bk rows instead of being
 * reloaded per row (measured: the generic loop cost ~15% of the forward). */
__attribute__((target("avx512f"))) static void fwd_softmax_full64(float *restrict st, int64_t bk,
                                                                  float *restrict m,
                                                                  float *restrict l,
                                                                  float *restrict alpha) {
  __m512 mx[4], mu[4], ls[4];
  for (int v = 0; v < 4; v++) mx[v] = _mm512_set1_ps(-INFINITY);
  for (int64_t r = 0; r < bk; r++)
    for (int v = 0; v < 4; v++) mx[v] = _mm512_max_ps(mx[v], _mm512_loadu_ps(st + r * 64 + 16 * v));
  for (int v = 0; v < 4; v++) {
    __m512 mo = _mm512_loadu_ps(m + 16 * v);
    __m512 mn = _mm512_max_ps(mx[v], mo);
    /* A query with no visible key yet keeps m = -inf; exp against 0 then gives 0. */
    mu[v] = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mn, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ),
                                mn);
    __m512 al = att_exp16(_mm512_sub_ps(mo, mu[v]));
    _mm512_storeu_ps(alpha + 16 * v, al);
    _mm512_storeu_ps(m + 16 * v, mn);
    ls[v] = _mm512_mul_ps(_mm512_loadu_ps(l + 16 * v), al);
  }
  for (int64_t r = 0; r < bk; r++)
    for (int v = 0; v < 4; v++) {
      float *sp = st + r * 64 + 16 * v;
      __m512 p = att_exp16(_mm512_sub_ps(_mm512_loadu_ps(sp), mu[v]));
      _mm512_storeu_ps(sp, p);
      ls[v] = _mm512_add_ps(ls[v], p);
    }
  for (int v = 0; v < 4; v++) _mm512_storeu_ps(l + 16 * v, ls[v]);
}
#endif

/* State of sub-tile u of a task: rows i0 .. i0+bq-1 and the keys they see. */
typedef struct fwd_sub {
  float *qt, *ot, *m, *l, *mu, *alpha;
  int64_t *lo, *hi;
  int64_t i0, bq;
  int64_t kmin, kmax;     /* union of the rows' key ranges */
  int64_t lo_max, hi_min; /* a key tile inside [lo_max, hi_min] needs no mask */
  bool any;               /* some row sees a key */
} fwd_sub;

/* Rows i0 .. i0+rows-1 (rows <= ATT_NSUB * ATT_BQ) of query head h of sequence b. */
static void fwd_tile(const ot_attention_args *a, int64_t b, int64_t h, int64_t i0, int64_t rows,
                     fwd_scratch *w) {
  const int64_t d = a->d;
  const ot_dtype dt = a->dtype;
  int64_t q0, sq, k0, sk;
  ot_attn_seq(a, b, &q0, &sq, &k0, &sk);
  const int64_t g = h / (a->hq / a->hkv);
  const int64_t nsub = (rows + ATT_BQ - 1) / ATT_BQ;
  fwd_sub sub[ATT_NSUB];
  int64_t kmin = sk, kmax = -1;

  for (int64_t u = 0; u < nsub; u++) {
    fwd_sub *t = &sub[u];
    t->qt = w->qt + u * ATT_BQ * d;
    t->ot = w->ot + u * ATT_BQ * d;
    t->m = w->m + u * ATT_BQ;
    t->l = w->l + u * ATT_BQ;
    t->mu = w->mu + u * ATT_BQ;
    t->alpha = w->alpha + u * ATT_BQ;
    t->lo = w->lo + u * ATT_BQ;
    t->hi = w->hi + u * ATT_BQ;
    t->i0 = i0 + u * ATT_BQ;
    t->bq = rows - u * ATT_BQ < ATT_BQ ? rows - u * ATT_BQ : ATT_BQ;
    t->any = tile_key_ranges(a, t->i0, t->bq, sq, sk, t->lo, t->hi, &t->kmin, &t->kmax);
    for (int64_t r = 0; r < ATT_BQ; r++) {
      t->m[r] = -INFINITY;
      t->l[r] = 0.0f;
      t->alpha[r] = 0.0f; /* columns >= bq keep it: the softmax only updates c < bq */
    }
    for (int64_t x = 0; x < ATT_BQ * d; x++) t->ot[x] = 0.0f;
    if (!t->any) continue;
    if (t->kmin < kmin) kmin = t->kmin;
    if (t->kmax > kmax) kmax = t->kmax;
    /* Query rows whose range is empty must never see a key: make their range empty
     * in the kt frame too (lo > every key). */
    t->lo_max = -1;
    t->hi_min = sk;
    for (int64_t r = 0; r < t->bq; r++) {
      if (t->lo[r] > t->hi[r]) t->lo[r] = sk, t->hi[r] = -1;
      if (t->lo[r] > t->lo_max) t->lo_max = t->lo[r];
      if (t->hi[r] < t->hi_min) t->hi_min = t->hi[r];
    }
    /* Even float32 operands are copied: packed tiles avoid the cache-set conflicts of
     * rows a token stride (H * D elements) apart. */
    load_rows_t(t->qt, ATT_BQ, elem(&a->q, dt, b, q0 + t->i0, h), a->q.tok_stride, dt, t->bq,
                d, w->tmp);
    /* A partial tile's missing queries are zeros: finite scores, never stored. */
    if (t->bq < ATT_BQ)
      for (int64_t x = 0; x < d; x++)
        for (int64_t c = t->bq; c < ATT_BQ; c++) t->qt[x * ATT_BQ + c] = 0.0f;
  }

  /* Key tiles aligned to ATT_BK (the cache's unit); keys of a tile outside a row's
   * range are masked like any other. */
  for (int64_t kt = kmin / ATT_BK * ATT_BK; kt <= kmax; kt += ATT_BK) {
    const float *kT, *v;
    fwd_kv_tile(a, b, g, k0, sk, kt, w, &kT, &v);
    for (int64_t u = 0; u < nsub; u++) {
      fwd_sub *t = &sub[u];
      if (!t->any || kt > t->kmax || kt + ATT_BK <= t->kmin) continue;
      int64_t bk = t->kmax + 1 - kt < ATT_BK ? t->kmax + 1 - kt : ATT_BK; /* keys used */
      /* S^T = scale * K Q^T   [bk, bq], K read from K^T [D, BK] */
      att_gemm64(bk, d, a->scale, kT, ATT_BK, t->qt, NULL, w->st);
      bool masked = t->lo_max > kt || t->hi_min < kt + bk - 1;
#ifdef ATT_X86
      if (!masked && t->bq == ATT_BQ && !(a->softcap > 0) && cpu_has_avx512())
        fwd_softmax_full64(w->st, bk, t->m, t->l, t->alpha);
      else
#endif
        fwd_softmax_tile(w->st, bk, t->bq, kt, masked, a->softcap, t->lo, t->hi, t->m, t->l,
                         t->mu, t->alpha);
      /* O^T = O^T diag(alpha) + V^T P^T   [D, bq] */
      att_gemm64(d, bk, 1.0f, v, d, w->st, t->alpha, t->ot);
    }
  }

  for (int64_t u = 0; u < nsub; u++) {
    fwd_sub *t = &sub[u];
    float *lse = a->lse.data ? (float *)(void *)elem(&a->lse, OT_F32, b, q0 + t->i0, h) : NULL;
    for (int64_t r = 0; r < t->bq; r++) {
      float l = t->l[r];
      t->alpha[r] = l > 0.0f ? 1.0f / l : 0.0f;
      if (lse) lse[r * a->lse.tok_stride] = l > 0.0f ? t->m[r] + logf(l) : -INFINITY;
    }
    /* Normalized rows of O, 16 at a time through tmp [16, D]. */
    char *out = elem(&a->out, dt, b, q0 + t->i0, h);
    for (int64_t r0 = 0; r0 < t->bq; r0 += 16) {
      int64_t nr = t->bq - r0 < 16 ? t->bq - r0 : 16;
      for (int64_t x = 0; x < d; x++)
        for (int64_t r = 0; r < nr; r++)
          w->tmp[r * d + x] = t->ot[x * ATT_BQ + r0 + r] * t->alpha[r0 + r];
      store_rows(out + r0 * a->out.tok_stride * (int64_t)ot_dtype_size(dt), a->out.tok_stride,
                 w->tmp, dt, nr, d);
    }
  }
}

#define ATT_FQ (ATT_NSUB * ATT_BQ) /* query rows per forward task */

typedef struct fwd_task {
  int64_t b, h, tile;
} fwd_task;

ot_status ot_cpu_attention_forward(ot_context *ctx, const ot_attention_args *a) {
  static const char *op = "ot_attention_forward";
  if (a->hq == 0) return OT_OK;
  /* Tasks (sequence, query head, query tile), head-major so that a thread's consecutive
   * tasks share the kv head (and its cached K/V tiles); within a head the last query
   * tiles first, as they see the most keys under a causal mask. */
  int64_t total = 0, pairs = 0; /* pairs: (query, key) of all sequences, mask ignored */
  for (int64_t b = 0; b < a->batch; b++) {
    int64_t q0, sq, k0, sk;
    ot_attn_seq(a, b, &q0, &sq, &k0, &sk);
    total += (sq + ATT_FQ - 1) / ATT_FQ * a->hq;
    pairs += sq * sk;
  }
  if (total == 0) return OT_OK;
  fwd_task *tasks = (fwd_task *)ot_cpu_temp_alloc(ctx, op, "the task list",
                                                  (size_t)total * sizeof *tasks);
  if (!tasks) return OT_ERR_OOM;
  int64_t n = 0;
  for (int64_t b = 0; b < a->batch; b++) {
    int64_t q0, sq, k0, sk;
    ot_attn_seq(a, b, &q0, &sq, &k0, &sk);
    for (int64_t h = 0; h < a->hq; h++)
      for (int64_t tile = (sq + ATT_FQ - 1) / ATT_FQ - 1; tile >= 0; tile--)
        tasks[n++] = (fwd_task){b, h, tile};
  }
  /* work: FLOPs / 8 (QK^T and PV: 4 D per pair and head; see cpu/threads.h). Every
   * task's result is independent of the thread running it. */
  int nthreads = ot_cpu_threads_cap(ctx, 4 * a->d * a->hq * pairs / 8, total);
  int64_t nslots = fwd_cache_slots(a);
  /* Rounded to 16 floats: each thread's block starts 64-byte aligned. */
  size_t per = (fwd_scratch_floats(a->d, nslots) + 15) / 16 * 16;
  float *scratch = (float *)ot_cpu_temp_alloc(ctx, op, "CPU scratch",
                                              per * (size_t)nthreads * sizeof(float));
  if (!scratch) {
    ot_cpu_temp_free(ctx, tasks);
    return OT_ERR_OOM;
  }
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    fwd_scratch w = fwd_scratch_at(scratch + per * (size_t)thread_id(), a->d, nslots);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < total; t++) {
      const fwd_task *tk = &tasks[t];
      int64_t q0, sq, k0, sk;
      ot_attn_seq(a, tk->b, &q0, &sq, &k0, &sk);
      int64_t i0 = tk->tile * ATT_FQ;
      int64_t rows = sq - i0 < ATT_FQ ? sq - i0 : ATT_FQ;
      fwd_tile(a, tk->b, tk->h, i0, rows, &w);
    }
  }
  ot_cpu_temp_free(ctx, scratch);
  ot_cpu_temp_free(ctx, tasks);
  return OT_OK;
}

/* ---- backward ----------------------------------------------------------------------- */

typedef struct bwd_scratch {
  float *q, *dout;   /* [BQ, D] */
  float *k;          /* [BK, D] */
  float *kt, *vt;    /* [D, BK] */
  float *s, *dp, *t; /* [BQ, BK]: P, dP then dS, tanh of the softcap */
  float *acc1;       /* [max(BQ, BK), D]: dq or dk */
  float *acc2;       /* [BK, D]: dv */
  float *lse, *delta;/* [BQ] */
  float *tmp;        /* [16, D] */
  int64_t *lo, *hi;  /* [BQ] */
} bwd_scratch;

#define ATT_BMAX (ATT_BQ > ATT_BK ? ATT_BQ : ATT_BK)

static size_t bwd_scratch_floats(int64_t d) {
  return (size_t)(2 * ATT_BQ * d + 3 * ATT_BK * d + 3 * ATT_BQ * ATT_BK + ATT_BMAX * d +
                  ATT_BK * d + 2 * ATT_BQ + 16 * d + 4 * ATT_BQ);
}

static bwd_scratch bwd_scratch_at(float *base, int64_t d) {
  bwd_scratch w;
  w.q = base;
  w.dout = w.q + ATT_BQ * d;
  w.k = w.dout + ATT_BQ * d;
  w.kt = w.k + ATT_BK * d;
  w.vt = w.kt + ATT_BK * d;
  w.s = w.vt + ATT_BK * d;
  w.dp = w.s + ATT_BQ * ATT_BK;
  w.t = w.dp + ATT_BQ * ATT_BK;
  w.acc1 = w.t + ATT_BQ * ATT_BK;
  w.acc2 = w.acc1 + ATT_BMAX * d;
  w.lse = w.acc2 + ATT_BK * d;
  w.delta = w.lse + ATT_BQ;
  w.tmp = w.delta + ATT_BQ;
  w.lo = (int64_t *)(void *)(w.tmp + 16 * d);
  w.hi = w.lo + ATT_BQ;
  return w;
}

/* Row index of token i of sequence b in the [Hq, rows] delta buffer. */
static inline int64_t delta_row(const ot_attention_args *a, int64_t b, int64_t q0, int64_t i) {
  return a->cu_q ? q0 + i : b * a->sq + i;
}

/* Loads the query-side tile (q, dout, lse, delta) of rows i0 .. i0+bq-1, head h. */
static void bwd_load_q(const ot_attention_args *a, const float *delta, int64_t rows, int64_t b,
                       int64_t h, int64_t q0, int64_t i0, int64_t bq, bwd_scratch *w) {
  const ot_dtype dt = a->dtype;
  load_rows(w->q, elem(&a->q, dt, b, q0 + i0, h), a->q.tok_stride, dt, bq, a->d);
  load_rows(w->dout, elem(&a->dout, dt, b, q0 + i0, h), a->dout.tok_stride, dt, bq, a->d);
  const float *lse = (const float *)(const void *)elem(&a->lse, OT_F32, b, q0 + i0, h);
  const float *dl = delta + h * rows + delta_row(a, b, q0, i0);
  for (int64_t r = 0; r < bq; r++) {
    w->lse[r] = lse[r * a->lse.tok_stride];
    w->delta[r] = dl[r];
  }
}

/* For the loaded q tile (rows i0..) and k/v tile (keys kt..): P into w->s and dS
 * (without the factor scale) into w->dp. */
static void bwd_p_ds(const ot_attention_args *a, int64_t i0, int64_t bq, int64_t kt, int64_t bk,
                     int64_t sq, int64_t sk, bwd_scratch *w) {
  const int64_t d = a->d;
  /* S = scale * Q K^T, dP = dO V^T   [bq, bk] */
  att_gemm(bq, bk, d, a->scale, w->q, d, 1, w->kt, ATT_BK, false, w->s, ATT_BK);
  att_gemm(bq, bk, d, 1.0f, w->dout, d, 1, w->vt, ATT_BK, false, w->dp, ATT_BK);
  float *t = a->softcap > 0 ? w->t : NULL;
  for (int64_t r = 0; r < bq; r++) {
    float *srow = w->s + r * ATT_BK;
    int64_t lo, hi;
    ot_attn_key_range(a, i0 + r, sq, sk, &lo, &hi);
    int64_t jl = lo > kt ? lo - kt : 0;
    int64_t jh = hi < kt + bk - 1 ? hi - kt : bk - 1;
    if (jl > jh || w->lse[r] == -INFINITY) {
      jl = 0;
      jh = -1;
    }
    for (int64_t j = 0; j < jl; j++) srow[j] = 0.0f;
    for (int64_t j = jh + 1 > jl ? jh + 1 : jl; j < bk; j++) srow[j] = 0.0f;
    int64_t n = jh - jl + 1;
    if (n > 0) {
      if (t) row_softcap(srow + jl, t + r * ATT_BK + jl, n, a->softcap);
      row_exp_sum(srow + jl, n, w->lse[r]);
      row_ds(w->dp + r * ATT_BK + jl, srow + jl, t ? t + r * ATT_BK + jl : NULL, n, w->delta[r]);
    }
    float *dprow = w->dp + r * ATT_BK;
    for (int64_t j = 0; j < jl; j++) dprow[j] = 0.0f;
    for (int64_t j = jh + 1 > jl ? jh + 1 : jl; j < bk; j++) dprow[j] = 0.0f;
  }
}

/* Pass 1: dk, dv of keys kt .. kt+bk-1 of kv head g. */
static void bwd_kv_tile(const ot_attention_args *a, const float *delta, int64_t rows, int64_t b,
                        int64_t g, int64_t kt, int64_t bk, bwd_scratch *w) {
  const int64_t d = a->d;
  const ot_dtype dt = a->dtype;
  int64_t q0, sq, k0, sk;
  ot_attn_seq(a, b, &q0, &sq, &k0, &sk);
  load_rows_t(w->kt, ATT_BK, elem(&a->k, dt, b, k0 + kt, g), a->k.tok_stride, dt, bk, d, w->tmp);
  load_rows_t(w->vt, ATT_BK, elem(&a->v, dt, b, k0 + kt, g), a->v.tok_stride, dt, bk, d, w->tmp);
  for (int64_t x = 0; x < bk * d; x++) w->acc1[x] = w->acc2[x] = 0.0f;
  /* Rows i that see a key of [kt, kt + bk - 1]: hi(i) >= kt and lo(i) <= kt + bk - 1. */
  int64_t off = sk - sq;
  int64_t imin = a->window_right < 0 ? 0 : kt - off - a->window_right;
  int64_t imax = a->window_left < 0 ? sq - 1 : kt + bk - 1 - off + a->window_left;
  if (imin < 0) imin = 0;
  if (imax > sq - 1) imax = sq - 1;
  int64_t group = a->hq / a->hkv;
  for (int64_t h = g * group; h < (g + 1) * group; h++)
    for (int64_t i0 = imin; i0 <= imax; i0 += ATT_BQ) {
      int64_t bq = imax + 1 - i0 < ATT_BQ ? imax + 1 - i0 : ATT_BQ;
      bwd_load_q(a, delta, rows, b, h, q0, i0, bq, w);
      bwd_p_ds(a, i0, bq, kt, bk, sq, sk, w);
      /* dV += P^T dO; dK += scale * dS^T Q   ([bk, D]) */
      att_gemm(bk, d, bq, 1.0f, w->s, 1, ATT_BK, w->dout, d, true, w->acc2, d);
      att_gemm(bk, d, bq, a->scale, w->dp, 1, ATT_BK, w->q, d, true, w->acc1, d);
    }
  store_rows(elem(&a->dk, dt, b, k0 + kt, g), a->dk.tok_stride, w->acc1, dt, bk, d);
  store_rows(elem(&a->dv, dt, b, k0 + kt, g), a->dv.tok_stride, w->acc2, dt, bk, d);
}

/* Pass 2: dq of rows i0 .. i0+bq-1 of head h. */
static void bwd_q_tile(const ot_attention_args *a, const float *delta, int64_t rows, int64_t b,
                       int64_t h, int64_t i0, int64_t bq, bwd_scratch *w) {
  const int64_t d = a->d;
  const ot_dtype dt = a->dtype;
  int64_t q0, sq, k0, sk;
  ot_attn_seq(a, b, &q0, &sq, &k0, &sk);
  const int64_t g = h / (a->hq / a->hkv);
  for (int64_t x = 0; x < bq * d; x++) w->acc1[x] = 0.0f;
  int64_t kmin, kmax;
  if (tile_key_ranges(a, i0, bq, sq, sk, w->lo, w->hi, &kmin, &kmax)) {
    bwd_load_q(a, delta, rows, b, h, q0, i0, bq, w);
    for (int64_t kt = kmin; kt <= kmax; kt += ATT_BK) {
      int64_t bk = kmax + 1 - kt < ATT_BK ? kmax + 1 - kt : ATT_BK;
      const char *ksrc = elem(&a->k, dt, b, k0 + kt, g);
      load_rows(w->k, ksrc, a->k.tok_stride, dt, bk, d);
      load_rows_t(w->kt, ATT_BK, ksrc, a->k.tok_stride, dt, bk, d, w->tmp);
      load_rows_t(w->vt, ATT_BK, elem(&a->v, dt, b, k0 + kt, g), a->v.tok_stride, dt, bk, d,
                  w->tmp);
      bwd_p_ds(a, i0, bq, kt, bk, sq, sk, w);
      /* dQ += scale * dS K   ([bq, D]) */
      att_gemm(bq, d, bk, a->scale, w->dp, ATT_BK, 1, w->k, d, true, w->acc1, d);
    }
  }
  store_rows(elem(&a->dq, dt, b, q0 + i0, h), a->dq.tok_stride, w->acc1, dt, bq, d);
}

ot_status ot_cpu_attention_backward(ot_context *ctx, const ot_attention_args *a) {
  static const char *op = "ot_attention_backward";
  const int64_t d = a->d;
  int64_t rows = a->cu_q ? a->cu_q[a->batch] : a->batch * a->sq;
  bool oom_q, oom_k;
  att_task *qtasks, *ktasks;
  int64_t nq = make_tasks(ctx, a, false, ATT_BQ, &qtasks, &oom_q);
  int64_t nk = oom_q ? 0 : make_tasks(ctx, a, true, ATT_BK, &ktasks, &oom_k);
  if (oom_q) ktasks = NULL, oom_k = false;
  /* work: FLOPs / 8 (5 products of 2 D per (query, key) pair and head, mask ignored;
   * see cpu/threads.h), at most the largest pass's task count */
  int64_t pairs = 0;
  for (int64_t b = 0; b < a->batch; b++) {
    int64_t q0, sq, k0, sk;
    ot_attn_seq(a, b, &q0, &sq, &k0, &sk);
    pairs += sq * sk;
  }
  int64_t most = a->batch * a->hq;
  if (nk * a->hkv > most) most = nk * a->hkv;
  if (nq * a->hq > most) most = nq * a->hq;
  int nthreads = ot_cpu_threads_cap(ctx, 10 * d * a->hq * pairs / 8, most);
  size_t per = bwd_scratch_floats(d) + 16;
  float *scratch = NULL, *delta = NULL;
  if (!oom_q && !oom_k)
    scratch = (float *)ot_cpu_temp_alloc(ctx, op, "CPU scratch",
                                         per * (size_t)nthreads * sizeof(float));
  if (scratch)
    delta = (float *)ot_cpu_temp_alloc(ctx, op, "the row deltas",
                                       (size_t)(rows * a->hq + 1) * sizeof(float));
  if (!delta) { /* the first failure's error is recorded */
    ot_cpu_temp_free(ctx, qtasks);
    ot_cpu_temp_free(ctx, ktasks);
    ot_cpu_temp_free(ctx, scratch);
    return OT_ERR_OOM;
  }
  const ot_dtype dt = a->dtype;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    bwd_scratch w = bwd_scratch_at(scratch + per * (size_t)thread_id(), d);
    /* pass 0: delta[h, row] = dout . out */
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < a->batch * a->hq; bh++) {
      int64_t b = bh / a->hq, h = bh % a->hq;
      int64_t q0, sq, k0, sk;
      ot_attn_seq(a, b, &q0, &sq, &k0, &sk);
      for (int64_t i = 0; i < sq; i++) {
        ot_load_f32(w.q, elem(&a->out, dt, b, q0 + i, h), dt, d);
        ot_load_f32(w.dout, elem(&a->dout, dt, b, q0 + i, h), dt, d);
        float s = 0.0f;
        for (int64_t x = 0; x < d; x++) s += w.q[x] * w.dout[x];
        delta[h * rows + delta_row(a, b, q0, i)] = s;
      }
    }
    /* pass 1: dk, dv */
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < nk * a->hkv; t++) {
      const att_task *tk = &ktasks[t / a->hkv];
      int64_t g = t % a->hkv;
      int64_t q0, sq, k0, sk;
      ot_attn_seq(a, tk->b, &q0, &sq, &k0, &sk);
      int64_t kt = tk->tile * ATT_BK;
      int64_t bk = sk - kt < ATT_BK ? sk - kt : ATT_BK;
      bwd_kv_tile(a, delta, rows, tk->b, g, kt, bk, &w);
    }
    /* pass 2: dq */
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < nq * a->hq; t++) {
      const att_task *tk = &qtasks[t / a->hq];
      int64_t h = t % a->hq;
      int64_t q0, sq, k0, sk;
      ot_attn_seq(a, tk->b, &q0, &sq, &k0, &sk);
      int64_t i0 = tk->tile * ATT_BQ;
      int64_t bq = sq - i0 < ATT_BQ ? sq - i0 : ATT_BQ;
      bwd_q_tile(a, delta, rows, tk->b, h, i0, bq, &w);
    }
  }
  ot_cpu_temp_free(ctx, scratch);
  ot_cpu_temp_free(ctx, delta);
  ot_cpu_temp_free(ctx, qtasks);
  ot_cpu_temp_free(ctx, ktasks);
  return OT_OK;
}
