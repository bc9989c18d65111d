/*
 * softmax.c -- CPU kernels of softmax over the last dimension, forward and backward.
 *
 * Forward, per row of [rows, cols]: the row is converted once to float32 scratch
 * (cols floats per thread), then max, exp(x - max) with its sum, scale, store: one
 * read, one exp and one write per element. Backward streams the row twice in
 * chunks (sum(dy * y), then dx), so it needs no heap scratch; each chunk is loaded
 * before it is stored, which keeps dx == dy in place safe.
 */
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/softmax.h"
#include "cpu/temp.h"
#include "cpu/threads.h"
#include "vec_math.h"

#define OT_SOFTMAX_CHUNK 1024

OT_CLONES static void scale_inplace(float *restrict x, int64_t n, float s) {
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* dx = y * (dy - dot), written over dy's scratch. */
OT_CLONES static void softmax_grad_chunk(float *restrict dy, const float *restrict y, int64_t n,
                                         float dot) {
  for (int64_t i = 0; i < n; i++) dy[i] = y[i] * (dy[i] - dot);
}

static char *row_at(const void *base, ot_dtype d, int64_t row, int64_t stride) {
  return (char *)base + row * stride * (int64_t)ot_dtype_size(d);
}

ot_status ot_cpu_softmax_forward(ot_context *ctx, const ot_softmax_forward_args *a) {
  if (a->rows == 0 || a->cols == 0) return OT_OK;
  const ot_dtype dt = a->dtype;
  const int nt = ot_cpu_threads_cap(ctx, a->rows * a->cols, a->rows);
  /* One row of float32 per thread (64-byte aligned), taken before the parallel region. */
  const int64_t ld = (a->cols + 15) / 16 * 16;
  float *bufs = (float *)ot_cpu_temp_alloc(ctx, "ot_softmax_forward", "the row scratch",
                                           (size_t)(ld * nt) * sizeof(float));
  if (!bufs) return OT_ERR_OOM;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
#ifdef _OPENMP
    float *buf = bufs + ld * omp_get_thread_num();
#else
    float *buf = bufs;
#endif
#pragma omp for schedule(static)
    for (int64_t r = 0; r < a->rows; r++) {
      ot_load_f32(buf, row_at(a->x, dt, r, a->x_stride), dt, a->cols);
      float m = ot_vec_max(buf, a->cols);
      double sum = ot_vec_exp_sum_inplace(buf, a->cols, m);
      scale_inplace(buf, a->cols, (float)(1.0 / sum));
      ot_store_f32(row_at(a->out, dt, r, a->out_stride), buf, dt, a->cols);
    }
  }
  ot_cpu_temp_free(ctx, bufs);
  return OT_OK;
}

ot_status ot_cpu_softmax_backward(ot_context *ctx, const ot_softmax_backward_args *a) {
  const ot_dtype dt = a->dtype;
  const int64_t es = (int64_t)ot_dtype_size(dt), n = a->cols;
  const int nt = ot_cpu_threads_cap(ctx, a->rows * a->cols, a->rows);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t r = 0; r < a->rows; r++) {
    float dy[OT_SOFTMAX_CHUNK], y[OT_SOFTMAX_CHUNK];
    const char *dyr = row_at(a->dy, dt, r, a->dy_stride);
    const char *yr = row_at(a->y, dt, r, a->y_stride);
    char *dxr = row_at(a->dx, dt, r, a->dx_stride);
    double dot = 0.0;
    for (int64_t c = 0; c < n; c += OT_SOFTMAX_CHUNK) {
      int64_t k = n - c < OT_SOFTMAX_CHUNK ? n - c : OT_SOFTMAX_CHUNK;
      ot_load_f32(dy, dyr + c * es, dt, k);
      ot_load_f32(y, yr + c * es, dt, k);
      dot += ot_vec_dot(dy, y, k);
    }
    for (int64_t c = 0; c < n; c += OT_SOFTMAX_CHUNK) {
      int64_t k = n - c < OT_SOFTMAX_CHUNK ? n - c : OT_SOFTMAX_CHUNK;
      ot_load_f32(dy, dyr + c * es, dt, k);
      ot_load_f32(y, yr + c * es, dt, k);
      softmax_grad_chunk(dy, y, k, (float)dot);
      ot_store_f32(dxr + c * es, dy, dt, k);
    }
  }
  return OT_OK;
}
