/*
 * rope.c -- rotary position embedding on the CPU.
 *
 * Parallel over tokens. For each token the rd/2 (cos, sin) pairs are made once and
 * reused by every head of q and k; each head row's first rd features are converted to
 * float32 scratch, rotated and stored back; features [rd, D) are copied when the
 * output is another tensor and left alone in place.
 *
 * Angles: pos * inv_freq[i] is formed and reduced modulo 2*pi in float64, and only the
 * reduced angle (in [-pi, pi]) goes through float32 cosf / sinf. A float32 product
 * would be off by up to ulp(65536) / 2 = 0.004 rad at position 65535; the reduced
 * float32 angle is off by at most 1.2e-7 rad at any position.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/rope.h"
#include "cpu/threads.h"
#include "cpu/temp.h"

/* Runtime dispatch to AVX-512 / AVX2+F16C code for the row loops (the library is
 * built for baseline x86-64 unless OT_NATIVE). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define ROPE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ROPE_CLONES
#endif

/* x: [n] float32 <- one head row in storage dtype d. */
ROPE_CLONES static void load_row(float *restrict x, const void *restrict src, ot_dtype d,
                                 int64_t n) {
  if (d == OT_F32) {
    const float *in = (const float *)src;
    for (int64_t i = 0; i < n; i++) x[i] = in[i];
  } else if (d == OT_BF16) {
    const uint16_t *in = (const uint16_t *)src;
    for (int64_t i = 0; i < n; i++) x[i] = ot_bf16_to_f32(in[i]);
  } else {
    const uint16_t *in = (const uint16_t *)src;
    for (int64_t i = 0; i < n; i++) x[i] = ot_f16_to_f32(in[i]);
  }
}

#define ROPE_STORE_F32(v) (v)
/* One loop per (storage, mode); x, y pairs: NEOX (i, i + half), GPTJ (2i, 2i + 1). */
#define ROPE_ROTATE_LOOPS(T, STORE)                                  \
  do {                                                               \
    T *restrict o = (T *)dst;                                        \
    if (mode == OT_ROPE_GPTJ) {                                      \
      for (int64_t i = 0; i < half; i++) {                           \
        float x1 = x[2 * i], x2 = x[2 * i + 1];                      \
        o[2 * i] = STORE(x1 * c[i] - x2 * s[i]);                     \
        o[2 * i + 1] = STORE(x2 * c[i] + x1 * s[i]);                 \
      }                                                              \
    } else {                                                         \
      for (int64_t i = 0; i < half; i++) {                           \
        float x1 = x[i], x2 = x[i + half];                           \
        o[i] = STORE(x1 * c[i] - x2 * s[i]);                         \
        o[i + half] = STORE(x2 * c[i] + x1 * s[i]);                  \
      }                                                              \
    }                                                                \
  } while (0)

/* dst: the first 2 * half features of one output head row <- x rotated by (c, s).
 * dst may be the row x was loaded from (in place): x is a copy. */
ROPE_CLONES static void rotate_store(void *restrict dst, const float *restrict x,
                                     const float *restrict c, const float *restrict s,
                                     int64_t half, ot_dtype d, ot_rope_mode mode) {
  if (d == OT_F32)
    ROPE_ROTATE_LOOPS(float, ROPE_STORE_F32);
  else if (d == OT_BF16)
    ROPE_ROTATE_LOOPS(uint16_t, ot_f32_to_bf16);
  else
    ROPE_ROTATE_LOOPS(uint16_t, ot_f32_to_f16);
}

/* c, s: [rd/2] for one position; the backward negates s (rotation by -angle). */
static void token_cos_sin(const ot_rope_args *a, const double *inv_freq, int64_t pos,
                          float *restrict c, float *restrict s) {
  const int64_t half = a->rotary_dim / 2;
  if (a->cos_sin_cache) {
    const float *row = a->cos_sin_cache + pos * a->rotary_dim;
    for (int64_t i = 0; i < half; i++) {
      c[i] = row[i];
      s[i] = row[half + i];
    }
  } else {
    const double two_pi = 6.283185307179586476925, inv_two_pi = 0.15915494309189533577;
    const double p = (double)pos;
    for (int64_t i = 0; i < half; i++) {
      double ang = p * inv_freq[i];
      ang -= two_pi * nearbyint(ang * inv_two_pi);
      float af = (float)ang;
      c[i] = cosf(af);
      s[i] = sinf(af);
    }
  }
  if (a->inverse)
    for (int64_t i = 0; i < half; i++) s[i] = -s[i];
}

/* All heads of one token of `in` -> `out`. x: float32 scratch of rd elements. */
static void rotate_token_heads(const ot_rope_args *a, const ot_rope_heads *in,
                               const ot_rope_heads *out, int64_t b, int64_t t,
                               const float *c, const float *s, float *x) {
  const int64_t es = (int64_t)ot_dtype_size(a->dtype);
  const int64_t rd = a->rotary_dim, half = rd / 2, pass = a->head_dim - rd;
  const char *src0 = (const char *)in->data + (b * in->stride_b + t * in->stride_s) * es;
  char *dst0 = (char *)out->data + (b * out->stride_b + t * out->stride_s) * es;
  for (int64_t h = 0; h < in->heads; h++) {
    const char *src = src0 + h * in->stride_h * es;
    char *dst = dst0 + h * out->stride_h * es;
    load_row(x, src, a->dtype, rd);
    rotate_store(dst, x, c, s, half, a->dtype, a->mode);
    if (pass > 0 && dst != src) memcpy(dst + rd * es, src + rd * es, (size_t)(pass * es));
  }
}

ot_status ot_cpu_rope(ot_context *ctx, const ot_rope_args *a) {
  const char *op = a->op;
  const int64_t tokens = a->batch * a->seq;
  const int64_t rd = a->rotary_dim, half = rd / 2;

  double *inv_freq = NULL;
  if (!a->cos_sin_cache) {
    inv_freq = (double *)ot_cpu_temp_alloc(ctx, op, "the frequencies", (size_t)half * sizeof *inv_freq);
    if (!inv_freq) return OT_ERR_OOM;
    ot_rope_inv_freq(a, inv_freq);
  }

  const int64_t work = tokens * (a->q.heads + a->k.heads) * rd;
  const int nt = ot_cpu_threads_cap(ctx, work, tokens);
  /* per thread: cos [half], sin [half], x [rd] */
  const int64_t per_thread = 2 * half + rd;
  float *scratch = (float *)ot_cpu_temp_alloc(ctx, op, "CPU scratch",
                                              (size_t)(nt * per_thread) * sizeof *scratch);
  if (!scratch) {
    ot_cpu_temp_free(ctx, inv_freq);
    return OT_ERR_OOM;
  }

#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t i = 0; i < tokens; i++) {
#ifdef _OPENMP
    float *c = scratch + (int64_t)omp_get_thread_num() * per_thread;
#else
    float *c = scratch;
#endif
    float *s = c + half, *x = s + half;
    const int64_t b = i / a->seq, t = i % a->seq;
    const int64_t pos =
        ot_load_index(a->positions, a->pos_dtype, b * a->pos_stride_b + t * a->pos_stride_s);
    token_cos_sin(a, inv_freq, pos, c, s);
    rotate_token_heads(a, &a->q, &a->q_out, b, t, c, s, x);
    if (a->k.data) rotate_token_heads(a, &a->k, &a->k_out, b, t, c, s, x);
  }

  ot_cpu_temp_free(ctx, scratch);
  ot_cpu_temp_free(ctx, inv_freq);
  return OT_OK;
}
