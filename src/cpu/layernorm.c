/*
 * layernorm.c -- CPU LayerNorm forward and backward (C11 + OpenMP).
 *
 * Same structure as rmsnorm.c: each row is converted once into a float32 scratch row
 * of the thread; the mean and the variance are then two passes over that scratch
 * (two-pass variance: no cancellation for rows with a large mean).
 *
 *   forward:  mean = sum(h) / H;  rstd = 1 / sqrt(sum((h - mean)^2) / H + eps)
 *             xhat = (h - mean) * rstd;  out = xhat * w + b
 *   backward: g = dy * w
 *             dx = rstd * (g - sum(g) / H - xhat * sum(g * xhat) / H)  (+ dresidual_out)
 *             dweight = sum over rows of dy * xhat;  dbias = sum over rows of dy
 */
#include <math.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/norm.h"
#include "cpu/threads.h"
#include "cpu/temp.h"

static inline void ln_stats(const float *h, int64_t n, float eps, float *mean, float *rstd) {
  float mu = ot_norm_sum(h, n) / (float)n;
  *mean = mu;
  *rstd = 1.0f / sqrtf(ot_norm_sum_sq(h, mu, n) / (float)n + eps);
}

static inline int thread_id(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/* h: scratch [2][H]; w, b: weight and bias in float32 or NULL. */
OT_NORM_CLONES
static void ln_forward_rows(const ot_norm_forward_args *a, int64_t r0, int64_t r1, float *h,
                            const float *w, const float *b) {
  int64_t n = a->cols;
  float *tmp = h + ot_norm_pad(n);
  size_t es = ot_dtype_size(a->dtype);
  for (int64_t row = r0; row < r1; row++) {
    ot_norm_load_h(h, tmp, a, row);
    float mu, r;
    ln_stats(h, n, a->eps, &mu, &r);
    if (a->mean) a->mean[row] = mu;
    if (a->rstd) a->rstd[row] = r;
    for (int64_t i = 0; i < n; i++) h[i] = (h[i] - mu) * r;
    if (w)
      for (int64_t i = 0; i < n; i++) h[i] *= w[i];
    if (b)
      for (int64_t i = 0; i < n; i++) h[i] += b[i];
    ot_norm_store_row((char *)a->out + row * a->out_stride * (int64_t)es, h, a->dtype, n);
  }
}

ot_status ot_cpu_layernorm_forward(ot_context *ctx, const ot_norm_forward_args *a) {
  int64_t n = a->cols, pad = ot_norm_pad(n);
  int nt = ot_cpu_threads_cap(ctx, a->rows * n, a->rows);
  /* [weight | bias | thread 0: h, tmp | thread 1: h, tmp | ...] */
  float *buf = (float *)ot_cpu_temp_alloc(ctx, "ot_layernorm_forward", "CPU scratch",
                                          (size_t)(pad * (2 + 2 * (int64_t)nt)) * sizeof(float));
  if (!buf) return OT_ERR_OOM;
  const float *w = NULL, *b = NULL;
  if (a->weight) {
    ot_norm_load_row(buf, a->weight, a->dtype, n);
    w = buf;
  }
  if (a->bias) {
    ot_norm_load_row(buf + pad, a->bias, a->dtype, n);
    b = buf + pad;
  }
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    int t = thread_id();
    int64_t r0, r1;
    ot_norm_block(a->rows, t, nt, &r0, &r1);
    ln_forward_rows(a, r0, r1, buf + pad * (2 + 2 * (int64_t)t), w, b);
  }
  ot_cpu_temp_free(ctx, buf);
  return OT_OK;
}

/* s: scratch [2][H]; dw, db: this thread's partial dweight / dbias [H] or NULL. */
OT_NORM_CLONES
static void ln_backward_rows(const ot_norm_backward_args *a, int64_t r0, int64_t r1, float *s,
                             const float *w, float *dw, float *db) {
  int64_t n = a->cols;
  float *g = s, *xh = s + ot_norm_pad(n);
  size_t es = ot_dtype_size(a->dtype);
  for (int64_t row = r0; row < r1; row++) {
    ot_norm_load_row(g, (const char *)a->dy + row * a->dy_stride * (int64_t)es, a->dtype, n);
    ot_norm_load_row(xh, (const char *)a->h + row * a->h_stride * (int64_t)es, a->dtype, n);
    float mu, r;
    if (a->rstd) {
      mu = a->mean[row];
      r = a->rstd[row];
    } else {
      ln_stats(xh, n, a->eps, &mu, &r);
    }
    for (int64_t i = 0; i < n; i++) xh[i] = (xh[i] - mu) * r;
    if (db)
      for (int64_t i = 0; i < n; i++) db[i] += g[i];
    if (dw)
      for (int64_t i = 0; i < n; i++) dw[i] += g[i] * xh[i];
    if (w)
      for (int64_t i = 0; i < n; i++) g[i] *= w[i];
    float mean_g = ot_norm_sum(g, n) / (float)n;
    float mean_gx = ot_norm_dot(g, xh, n) / (float)n;
    for (int64_t i = 0; i < n; i++) g[i] = r * (g[i] - mean_g - xh[i] * mean_gx);
    if (a->dresidual_out) {
      ot_norm_load_row(xh, (const char *)a->dresidual_out + row * a->dresidual_out_stride * (int64_t)es,
                       a->dtype, n);
      for (int64_t i = 0; i < n; i++) g[i] += xh[i];
    }
    /* dx may be dy or dresidual_out: the whole row was read above. */
    ot_norm_store_row((char *)a->dx + row * a->dx_stride * (int64_t)es, g, a->dtype, n);
  }
}

ot_status ot_cpu_layernorm_backward(ot_context *ctx, const ot_norm_backward_args *a) {
  return ot_cpu_norm_backward_driver(ctx, a, "ot_layernorm_backward", ln_backward_rows);
}
