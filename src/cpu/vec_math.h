/*
 * vec_math.h -- float32 helpers for the CPU kernels' inner loops that the compiler
 * can vectorize without -ffast-math: a branch-free exp, and row reductions (max, sum,
 * sum of exp, dot) kept in OT_VEC_LANES independent accumulators, since GCC will not
 * reorder a single float accumulator by itself. Used by glu.c, softmax.c and
 * cross_entropy.c.
 *
 * libm's expf is a call the compiler cannot vectorize without -ffast-math, and the
 * softmax / cross-entropy / SwiGLU loops spend most of their time in exp. This one
 * is straight-line code (selects, no branches) so loops over it vectorize:
 *   exp(x) = 2^n * exp(r),  n = round(x / ln 2),  r = x - n ln 2 in [-ln2/2, ln2/2],
 * exp(r) by its Taylor series to degree 7 (truncation error < 2e-8 relative), 2^n built
 * in the exponent bits. Relative error about 2 ulp over the normal range; results
 * below the smallest normal flush to 0, above FLT_MAX give +inf, NaN stays NaN.
 */
#ifndef OT_CPU_VEC_MATH_H
#define OT_CPU_VEC_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* GCC will not turn a float comparison into a vector select while it must preserve
 * floating-point exception flags (-ftrapping-math, the default), so the clamps and
 * selects below would keep every loop that uses them scalar. Nothing here reads the
 * flags and the results are unchanged (no reassociation, no finite-math
 * assumptions), so files that include this header drop that guarantee. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

/* Runtime dispatch of hot static functions to AVX-512 / AVX2 (the library is built
 * without -march=native). Off under the sanitizers, which do not mix with ifuncs. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(__SANITIZE_ADDRESS__)
#define OT_CLONES __attribute__((target_clones("avx512f", "avx2", "default"), unused))
#else
#define OT_CLONES __attribute__((unused))
#endif

static inline float ot_exp_f32(float x) {
  const float lo = -87.33654f, hi = 88.72283f; /* ln(FLT_MIN), ln(FLT_MAX) */
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  /* 1.5 * 2^23: adding and subtracting rounds to the nearest integer. */
  const float round_magic = 12582912.0f;
  float n = (xc * 1.44269504f + round_magic) - round_magic;
  /* ln 2 split so that n * ln2_hi is exact for |n| <= 128. */
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  /* n is in [-126, 128]; 2^128 is split as 2 * 2^127 so the exponent stays finite. */
  int32_t ni = (int32_t)n;
  int32_t half = ni > 127 ? 1 : 0;
  uint32_t bits = (uint32_t)(ni - half + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  float y = p * scale * (half ? 2.0f : 1.0f);
  y = x < lo ? 0.0f : y;
  y = x > hi ? __builtin_inff() : y;
  return x != x ? x : y;
}

/* Independent accumulators per reduction; 16 floats fill one AVX-512 register. */
#define OT_VEC_LANES 16
/* Partial sums are float32 within a block of this many elements and float64 across
 * blocks, so a 128k-long row keeps about float32 precision. */
#define OT_VEC_BLOCK 1024

/* max_i x[i]; NaNs are skipped here (they reach the result through exp / sum). */
OT_CLONES static float ot_vec_max(const float *restrict x, int64_t n) {
  float m[OT_VEC_LANES];
  for (int j = 0; j < OT_VEC_LANES; j++) m[j] = -INFINITY;
  int64_t i = 0;
  for (; i + OT_VEC_LANES <= n; i += OT_VEC_LANES)
    for (int j = 0; j < OT_VEC_LANES; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
  float r = -INFINITY;
  for (; i < n; i++) r = x[i] > r ? x[i] : r;
  for (int j = 0; j < OT_VEC_LANES; j++) r = m[j] > r ? m[j] : r;
  return r;
}

/* x[i] = exp(x[i] - shift) in place; returns the sum of the new values. */
OT_CLONES static double ot_vec_exp_sum_inplace(float *restrict x, int64_t n, float shift) {
  double total = 0.0;
  for (int64_t b = 0; b < n; b += OT_VEC_BLOCK) {
    int64_t e = n - b < OT_VEC_BLOCK ? n : b + OT_VEC_BLOCK, i = b;
    float acc[OT_VEC_LANES] = {0};
    for (; i + OT_VEC_LANES <= e; i += OT_VEC_LANES)
      for (int j = 0; j < OT_VEC_LANES; j++) {
        x[i + j] = ot_exp_f32(x[i + j] - shift);
        acc[j] += x[i + j];
      }
    for (; i < e; i++) {
      x[i] = ot_exp_f32(x[i] - shift);
      acc[0] += x[i];
    }
    float s = 0.0f;
    for (int j = 0; j < OT_VEC_LANES; j++) s += acc[j];
    total += s;
  }
  return total;
}

/* sum_i exp(x[i] - shift), x unchanged. */
OT_CLONES static double ot_vec_sum_exp(const float *restrict x, int64_t n, float shift) {
  double total = 0.0;
  for (int64_t b = 0; b < n; b += OT_VEC_BLOCK) {
    int64_t e = n - b < OT_VEC_BLOCK ? n : b + OT_VEC_BLOCK, i = b;
    float acc[OT_VEC_LANES] = {0};
    for (; i + OT_VEC_LANES <= e; i += OT_VEC_LANES)
      for (int j = 0; j < OT_VEC_LANES; j++) acc[j] += ot_exp_f32(x[i + j] - shift);
    for (; i < e; i++) acc[0] += ot_exp_f32(x[i] - shift);
    float s = 0.0f;
    for (int j = 0; j < OT_VEC_LANES; j++) s += acc[j];
    total += s;
  }
  return total;
}

/* sum_i a[i] * b[i]; b == NULL means sum_i a[i]. */
OT_CLONES static double ot_vec_dot(const float *restrict a, const float *restrict b, int64_t n) {
  double total = 0.0;
  for (int64_t blk = 0; blk < n; blk += OT_VEC_BLOCK) {
    int64_t e = n - blk < OT_VEC_BLOCK ? n : blk + OT_VEC_BLOCK, i = blk;
    float acc[OT_VEC_LANES] = {0};
    if (b) {
      for (; i + OT_VEC_LANES <= e; i += OT_VEC_LANES)
        for (int j = 0; j < OT_VEC_LANES; j++) acc[j] += a[i + j] * b[i + j];
      for (; i < e; i++) acc[0] += a[i] * b[i];
    } else {
      for (; i + OT_VEC_LANES <= e; i += OT_VEC_LANES)
        for (int j = 0; j < OT_VEC_LANES; j++) acc[j] += a[i + j];
      for (; i < e; i++) acc[0] += a[i];
    }
    float s = 0.0f;
    for (int j = 0; j < OT_VEC_LANES; j++) s += acc[j];
    total += s;
  }
  return total;
}

#endif /* OT_CPU_VEC_MATH_H */
