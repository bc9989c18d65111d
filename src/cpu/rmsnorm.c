/*
 * rmsnorm.c -- CPU RMSNorm forward and backward (C11 + OpenMP).
 *
 * One pass per row over memory: the row (x, plus residual when fused) is converted
 * into a float32 scratch row of the thread (H floats, L1/L2 resident), reduced, scaled
 * and stored. Rows are split into contiguous blocks, one per thread.
 *
 *   forward:  rstd = 1 / sqrt(sum(h^2) / H + eps);  out = h * rstd * w
 *   backward: g = dy * w
 *             dx = rstd * g - h * rstd^3 * sum(g * h) / H  (+ dresidual_out)
 *             dweight = sum over rows of dy * h * rstd
 */
#include <math.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/norm.h"
#include "cpu/threads.h"
#include "cpu/temp.h"

static inline float rms_rstd(const float *h, int64_t n, float eps) {
  return 1.0f / sqrtf(ot_norm_sum_sq(h, 0.0f, n) / (float)n + eps);
}

static inline int thread_id(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/* h: scratch [2][H]; w: weight in float32 or NULL. */
OT_NORM_CLONES
static void rms_forward_rows(const ot_norm_forward_args *a, int64_t r0, int64_t r1, float *h,
                             const float *w) {
  int64_t n = a->cols;
  float *tmp = h + ot_norm_pad(n);
  size_t es = ot_dtype_size(a->dtype);
  for (int64_t row = r0; row < r1; row++) {
    ot_norm_load_h(h, tmp, a, row);
    float r = rms_rstd(h, n, a->eps);
    if (a->rstd) a->rstd[row] = r;
    if (w)
      for (int64_t i = 0; i < n; i++) h[i] = h[i] * r * w[i];
    else
      for (int64_t i = 0; i < n; i++) h[i] = h[i] * r;
    ot_norm_store_row((char *)a->out + row * a->out_stride * (int64_t)es, h, a->dtype, n);
  }
}

ot_status ot_cpu_rmsnorm_forward(ot_context *ctx, const ot_norm_forward_args *a) {
  int64_t n = a->cols, pad = ot_norm_pad(n);
  int nt = ot_cpu_threads_cap(ctx, a->rows * n, a->rows);
  /* [weight | thread 0: h, tmp | thread 1: h, tmp | ...] */
  float *buf = (float *)ot_cpu_temp_alloc(ctx, "ot_rmsnorm_forward", "CPU scratch",
                                          (size_t)(pad * (1 + 2 * (int64_t)nt)) * sizeof(float));
  if (!buf) return OT_ERR_OOM;
  const float *w = NULL;
  if (a->weight) {
    ot_norm_load_row(buf, a->weight, a->dtype, n);
    w = buf;
  }
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    int t = thread_id();
    int64_t r0, r1;
    ot_norm_block(a->rows, t, nt, &r0, &r1);
    rms_forward_rows(a, r0, r1, buf + pad * (1 + 2 * (int64_t)t), w);
  }
  ot_cpu_temp_free(ctx, buf);
  return OT_OK;
}

/* s: scratch [2][H]; dw: this thread's partial dweight [H] or NULL. */
OT_NORM_CLONES
static void rms_backward_rows(const ot_norm_backward_args *a, int64_t r0, int64_t r1, float *s,
                              const float *w, float *dw, float *db) {
  (void)db; /* RMSNorm has no bias */
  int64_t n = a->cols;
  float *g = s, *h = s + ot_norm_pad(n);
  size_t es = ot_dtype_size(a->dtype);
  for (int64_t row = r0; row < r1; row++) {
    ot_norm_load_row(g, (const char *)a->dy + row * a->dy_stride * (int64_t)es, a->dtype, n);
    ot_norm_load_row(h, (const char *)a->h + row * a->h_stride * (int64_t)es, a->dtype, n);
    float r = a->rstd ? a->rstd[row] : rms_rstd(h, n, a->eps);
    if (dw)
      for (int64_t i = 0; i < n; i++) dw[i] += g[i] * h[i] * r;
    if (w)
      for (int64_t i = 0; i < n; i++) g[i] *= w[i];
    float c = r * r * r * ot_norm_dot(g, h, n) / (float)n;
    for (int64_t i = 0; i < n; i++) g[i] = r * g[i] - h[i] * c;
    if (a->dresidual_out) {
      ot_norm_load_row(h, (const char *)a->dresidual_out + row * a->dresidual_out_stride * (int64_t)es,
                       a->dtype, n);
      for (int64_t i = 0; i < n; i++) g[i] += h[i];
    }
    /* dx may be dy or dresidual_out: the whole row was read above. */
    ot_norm_store_row((char *)a->dx + row * a->dx_stride * (int64_t)es, g, a->dtype, n);
  }
}

ot_status ot_cpu_rmsnorm_backward(ot_context *ctx, const ot_norm_backward_args *a) {
  return ot_cpu_norm_backward_driver(ctx, a, "ot_rmsnorm_backward", rms_backward_rows);
}
