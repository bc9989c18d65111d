/*
 * fast_exp.h -- a branch-free float32 exp for the CPU kernels' inner loops.
 *
 * libm's expf is a call the compiler cannot vectorize without -ffast-math, and the
 * softmax / cross-entropy / SwiGLU loops spend most of their time in exp. This one
 * is straight-line code (selects, no branches) so loops over it vectorize:
 *   exp(x) = 2^n * exp(r),  n = round(x / ln 2),  r = x - n ln 2 in [-ln2/2, ln2/2],
 * exp(r) by its Taylor series to degree 7 (truncation error < 2e-8 relative), 2^n built
 * in the exponent bits. Relative error about 2 ulp over the normal range; results
 * below the smallest normal flush to 0, above FLT_MAX give +inf, NaN stays NaN.
 */
#ifndef OT_CPU_FAST_EXP_H
#define OT_CPU_FAST_EXP_H

#include <stdint.h>
#include <string.h>

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

#endif /* OT_CPU_FAST_EXP_H */
