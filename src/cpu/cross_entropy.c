/*
 * cross_entropy.c -- CPU kernels of cross-entropy over [N, V] logits.
 *
 * Forward, per row: one streaming pass over V in chunks of OT_CE_CHUNK, keeping the
 * running max m and sum_j exp(z_j - m) (rescaled when m grows: the online softmax),
 * and sum_j z_j for label smoothing. Then
 *   lse = m + log(sum),  loss = (1-s) (lse - z_y) + s (lse - sum_j z_j / V)
 * in float64. Rows' losses are reduced serially in row order, so the result does
 * not depend on the thread count.
 * Backward, per row: lse (saved, or one more online pass), then one pass writing
 *   dz_j = g (exp(z_j - lse) - s/V) - g (1-s) [j == y]
 * chunk by chunk; a chunk is loaded before it is stored, so dlogits == logits works.
 */
#include <math.h>
#include <stdlib.h>

#include "core/softmax.h"
#include "cpu/threads.h"
#include "vec_math.h"
#include "cpu/temp.h"

#define OT_CE_CHUNK 2048

/* x[i] = g * x[i] + c in place. */
OT_CLONES static void axpb_inplace(float *restrict x, int64_t n, float g, float c) {
  for (int64_t i = 0; i < n; i++) x[i] = g * x[i] + c;
}

static const char *logits_row(const ot_cross_entropy_args *a, int64_t r) {
  return (const char *)a->logits + r * a->logits_stride * (int64_t)ot_dtype_size(a->dtype);
}

static int64_t label_of(const ot_cross_entropy_args *a, int64_t r) {
  return ot_load_index(a->labels, a->labels_dtype, r * a->labels_stride);
}

/* Online log-sum-exp of one row; *sum_z gets sum_j z_j when sum_z != NULL. */
static double row_lse(const ot_cross_entropy_args *a, int64_t r, double *sum_z) {
  const ot_dtype dt = a->dtype;
  const int64_t es = (int64_t)ot_dtype_size(dt), V = a->V;
  const char *row = logits_row(a, r);
  float buf[OT_CE_CHUNK];
  float m = -INFINITY;
  double s = 0.0, z = 0.0;
  for (int64_t c = 0; c < V; c += OT_CE_CHUNK) {
    int64_t k = V - c < OT_CE_CHUNK ? V - c : OT_CE_CHUNK;
    ot_load_f32(buf, row + c * es, dt, k);
    float cm = ot_vec_max(buf, k);
    if (cm > m) {
      s *= exp((double)m - (double)cm);
      m = cm;
    }
    s += ot_vec_sum_exp(buf, k, m);
    if (sum_z) z += ot_vec_dot(buf, NULL, k);
  }
  if (sum_z) *sum_z = z;
  return (double)m + log(s);
}

static double logit_at(const ot_cross_entropy_args *a, int64_t r, int64_t j) {
  float v;
  ot_load_f32(&v, logits_row(a, r) + j * (int64_t)ot_dtype_size(a->dtype), a->dtype, 1);
  return v;
}

ot_status ot_cpu_cross_entropy_forward(ot_context *ctx, const ot_cross_entropy_args *a) {
  const int64_t N = a->N;
  const bool none = a->reduction == OT_REDUCTION_NONE;
  const double s = a->label_smoothing;
  /* Per-row losses for the ordered reduction (MEAN / SUM). */
  double *row_loss = NULL;
  if (!none) {
    row_loss = (double *)ot_cpu_temp_alloc(ctx, "ot_cross_entropy_forward", "the row losses",
                                           (size_t)N * sizeof *row_loss);
    if (!row_loss) return OT_ERR_OOM;
  }
  const int nt = ot_cpu_threads_cap(ctx, N * a->V, N);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4) if (nt > 1)
  for (int64_t r = 0; r < N; r++) {
    int64_t y = label_of(a, r);
    bool ignored = y == a->ignore_index;
    double li = 0.0;
    if (!ignored || a->lse) {
      double sum_z = 0.0;
      double lse = row_lse(a, r, s > 0.0 ? &sum_z : NULL);
      if (a->lse) a->lse[r * a->lse_stride] = (float)lse;
      if (!ignored) {
        li = (1.0 - s) * (lse - logit_at(a, r, y));
        if (s > 0.0) li += s * (lse - sum_z / (double)a->V);
      }
    }
    if (none) a->loss[r * a->loss_stride] = (float)li;
    else row_loss[r] = li;
  }
  if (!none) {
    double total = 0.0;
    for (int64_t r = 0; r < N; r++) total += row_loss[r];
    ot_cpu_temp_free(ctx, row_loss);
    if (a->reduction == OT_REDUCTION_MEAN) total = a->count > 0 ? total / (double)a->count : NAN;
    a->loss[0] = (float)total;
  }
  return OT_OK;
}

ot_status ot_cpu_cross_entropy_backward(ot_context *ctx, const ot_cross_entropy_args *a) {
  const ot_dtype dt = a->dtype;
  const int64_t N = a->N, V = a->V, es = (int64_t)ot_dtype_size(dt);
  const double s = a->label_smoothing;
  const int nt = ot_cpu_threads_cap(ctx, N * V, N);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4) if (nt > 1)
  for (int64_t r = 0; r < N; r++) {
    float buf[OT_CE_CHUNK];
    char *out = (char *)a->dlogits + r * a->dlogits_stride * es;
    const char *row = logits_row(a, r);
    int64_t y = label_of(a, r);
    if (y == a->ignore_index) {
      for (int64_t j = 0; j < OT_CE_CHUNK && j < V; j++) buf[j] = 0.0f;
      for (int64_t c = 0; c < V; c += OT_CE_CHUNK)
        ot_store_f32(out + c * es, buf, dt, V - c < OT_CE_CHUNK ? V - c : OT_CE_CHUNK);
      continue;
    }
    double g;
    if (a->reduction == OT_REDUCTION_NONE) g = a->dloss[r * a->dloss_stride];
    else if (a->reduction == OT_REDUCTION_SUM) g = a->dloss[0];
    else g = (double)a->dloss[0] / (double)a->count;
    float lse = a->lse ? a->lse[r * a->lse_stride] : (float)row_lse(a, r, NULL);
    const float gf = (float)g, c0 = (float)(-g * s / (double)V);
    for (int64_t c = 0; c < V; c += OT_CE_CHUNK) {
      int64_t k = V - c < OT_CE_CHUNK ? V - c : OT_CE_CHUNK;
      ot_load_f32(buf, row + c * es, dt, k);
      ot_vec_exp_sum_inplace(buf, k, lse);
      axpb_inplace(buf, k, gf, c0);
      if (y >= c && y < c + k) buf[y - c] -= (float)(g * (1.0 - s));
      ot_store_f32(out + c * es, buf, dt, k);
    }
  }
  return OT_OK;
}
